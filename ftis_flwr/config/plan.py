"""Per-node memory estimates and a placement for an experiment, without downloading anything.

    ftis-flwr plan paper-size-base --device-gib 80          # or any preset name / YAML path

A lab checks a preset before it asks for GPUs: for each node, the bytes of its weights, gradients
and AdamW state (trainable parameters only: LoRA trains a few), the KV cache of one generation
batch (``rollout.batch_size`` sequences of prompt + ``max_new_tokens``, or an episode's budget with
``task.environment``) and the learner's largest activation (the float32 logits of one micro-batch
over the vocabulary, which dominates at Qwen's 151,936 rows) plus the saved activations of one
micro-batch (:data:`ACTIVATION_ELEMENTS`). Architectures are read from the hub config when the
model is cached locally, else from :data:`KNOWN` (the Qwen2.5 family of the paper's presets); the
shipped tiny models' from :mod:`ftis_flwr.config.tiny_models` (their sequences: 64 positions). The
figures are estimates: the framework's own buffers and fragmentation come on top (allow ~20%). The
activations are those of the packed path (every sample runs its prompt); with
``train.share_prompts`` (the default) the learner runs fewer tokens, so the estimate is an upper
bound there. A node sharded over ``ranks`` processes (FSDP2) holds 1/ranks of its weights,
gradients and AdamW state on each rank, and whole: a plain copy of the weights that its rollout
engine samples from (:mod:`ftis_flwr.node.sharding`), the KV cache and the activations of its own
micro-batch: the figures are per rank. A node on vLLM (``engine: vllm``, one rank) holds the
engine's own copy of the weights, the KV cache of the round's sequences and vLLM's runtime
(:mod:`ftis_flwr.config.engine_memory`); on a GPU with ``vllm_sleep`` the engine sleeps during the
update, so its memory and the update's activations take turns. A node compares its own estimate
with what its machine has before it builds (:func:`memory_warning`).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, replace

from ftis_flwr.config.choices import CardDtype, Engine
from ftis_flwr.config.dtypes import resolve_dtypes, warn_slow_bf16
from ftis_flwr.config.engine_memory import DTYPE_BYTES as _BYTES
from ftis_flwr.config.engine_memory import GIB, PLAN_NOTE, PROMPT_TOKENS, engine_parts, fixes, new_tokens, vllm_part
from ftis_flwr.config.schema import ExperimentConfig, ModelCard
from ftis_flwr.config.tiny_models import TINY_MAX_POSITIONS, TINY_SIZES, TINY_VOCAB

ACTIVATION_ELEMENTS = 26
"""Saved activation elements per token, layer and hidden unit in the learner's backward:
calibrated on an H200 (benchmarks/gpu_check.py, float32, micro-batch 8 x 896 tokens): measured
update peaks 69.6 GiB (Qwen2.5-1.5B) and 110.7 GiB (3B) against 69.5 and 116.8 estimated."""
MAX_RANKS = 8
"""The most ranks the plan suggests: the GPUs of one host (a node's ranks run on one machine)."""


@dataclass(frozen=True)
class Arch:
    """What the estimate needs of a decoder-only transformer."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool
    head_size: int = 0
    """Attention head size where it is not ``hidden // heads`` (Gemma 3: 256)."""
    positions: int = 0
    """The longest sequence the model takes, where it bounds a batch's (the tiny models' 64); 0: none."""

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden // self.heads

    def params(self) -> int:
        h, kv, q = self.hidden, self.kv_heads * self.head_dim, self.heads * self.head_dim
        attn = h * q + q + 2 * (h * kv + kv) + q * h  # q (bias), k, v (bias), o
        block = attn + 3 * h * self.intermediate + 2 * h
        return self.vocab * h * (1 if self.tied else 2) + self.layers * block + h

    def lora_params(self, r: int, targets: list[str]) -> int:
        h, kv, i, q = self.hidden, self.kv_heads * self.head_dim, self.intermediate, self.heads * self.head_dim
        shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                  "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
        return self.layers * sum(r * (a + b) for t, (a, b) in shapes.items() if t in targets)


# Published configs (config.json of each model; the Coder models share their size's shape).
_QWEN_15B = Arch(hidden=1536, layers=28, heads=12, kv_heads=2, intermediate=8960, vocab=151936, tied=True)
_QWEN_3B = Arch(hidden=2048, layers=36, heads=16, kv_heads=2, intermediate=11008, vocab=151936, tied=True)
KNOWN: dict[str, Arch] = {
    "Qwen/Qwen2.5-0.5B": Arch(896, 24, 14, 2, 4864, 151936, True),
    "Qwen/Qwen2.5-1.5B": _QWEN_15B, "Qwen/Qwen2.5-Coder-1.5B": _QWEN_15B,
    "Qwen/Qwen2.5-3B": _QWEN_3B, "Qwen/Qwen2.5-Coder-3B": _QWEN_3B,
    "Qwen/Qwen2.5-7B": Arch(3584, 28, 28, 4, 18944, 152064, False),
    "smollm2": Arch(576, 30, 9, 3, 1536, 49152, True),
    "gemma3-270m": Arch(640, 18, 4, 1, 2048, 262144, True, head_size=256),
}


def card_architecture(card: ModelCard) -> Arch | None:
    """A card's architecture: a shipped tiny model's from :mod:`ftis_flwr.config.tiny_models` (the
    numbers of ``node.tiny.models.tiny_config``: a tied Qwen2 over its tokenizer), else its source's."""
    if card.source != "tiny":
        return architecture(card.source)
    shape, vocab = TINY_SIZES.get(card.tiny_size), TINY_VOCAB.get(card.tiny_tokenizer)
    return None if shape is None or vocab is None else Arch(
        shape["hidden_size"], shape["num_hidden_layers"], shape["num_attention_heads"], shape["num_key_value_heads"],
        shape["intermediate_size"], vocab, True, positions=TINY_MAX_POSITIONS)


def architecture(source: str) -> Arch | None:
    """The architecture of a model source: known, or from a locally cached config; else None."""
    if source in KNOWN:
        return KNOWN[source]
    try:
        from transformers import AutoConfig

        c = AutoConfig.from_pretrained(source, local_files_only=True)
    except Exception:
        return None
    return Arch(c.hidden_size, c.num_hidden_layers, c.num_attention_heads,
                getattr(c, "num_key_value_heads", c.num_attention_heads), c.intermediate_size,
                c.vocab_size, bool(getattr(c, "tie_word_embeddings", False)), getattr(c, "head_dim", 0) or 0)


@dataclass
class Estimate:
    """Bytes one rank of a node holds: the FSDP2 shards (weights, gradients, AdamW state: the
    node's whole figures divided by ``ranks``) and what every rank holds whole (the KV cache of
    its generation batch, the activations of its micro-batch)."""

    node: str
    params: int
    trainable: int
    weights: float
    gradients: float
    optimizer: float
    kv_cache: float
    activations: float
    ranks: int = 1
    engine_copy: float = 0.0
    """The plain copy of the whole weights a sharded node's rollout engine samples from (every
    rank holds one; none with one rank, whose engine samples from the learner itself); a vLLM
    node's: its engine's weights (``kv_cache`` then is the engine's, ``engine_runtime`` vLLM's own)."""
    engine_runtime: float = 0.0
    vllm: bool = False
    engine_sleeps: bool = False
    """A vLLM node on a GPU with ``vllm_sleep``: its engine and the update's activations take turns."""

    @property
    def sharded(self) -> float:
        return self.weights + self.gradients + self.optimizer

    @property
    def whole(self) -> float:
        # generation and the update do not run at once: KV cache and activations never coexist
        if not self.vllm:
            return self.engine_copy + max(self.kv_cache, self.activations)
        engine = self.engine_copy + self.kv_cache + self.engine_runtime  # resident unless asleep
        return max(engine, self.activations) if self.engine_sleeps else engine + self.activations

    @property
    def total(self) -> float:
        """One rank's bytes (the node's, with one rank)."""
        return self.sharded + self.whole

    def with_ranks(self, ranks: int) -> Estimate:
        """The same node sharded over ``ranks`` processes instead."""
        scale = self.ranks / ranks
        full = self.weights * self.ranks
        copy = self.engine_copy if self.vllm else full if ranks > 1 else 0.0
        return replace(self, weights=self.weights * scale, gradients=self.gradients * scale,
                       optimizer=self.optimizer * scale, ranks=ranks, engine_copy=copy)

    def ranks_to_fit(self, device_bytes: float, margin: float = 1.2) -> int | None:
        """The fewest ranks, one device of ``device_bytes`` each, that hold this node with
        ``margin``; None when none up to :data:`MAX_RANKS` does (what every rank holds whole is
        too large)."""
        one = self.with_ranks(1)
        fits = one.total * margin <= device_bytes
        if fits or self.vllm:  # a vLLM node runs on one GPU
            return 1 if fits else None
        several = self.with_ranks(2)  # from two ranks on, each also holds the engine's copy
        room = device_bytes / margin - several.whole
        ranks = max(2, math.ceil(one.sharded / room)) if room > 0 else MAX_RANKS + 1
        return ranks if ranks <= MAX_RANKS else None


def estimate(card: ModelCard, exp: ExperimentConfig, arch: Arch | None = None) -> Estimate | None:
    """Bytes one rank of a node needs (see the module docstring); None for an unknown architecture
    (``arch``: the card's, default :func:`architecture` of its source)."""
    arch = arch or card_architecture(card)
    if arch is None:
        return None
    card, _ = resolve_dtypes(card)  # "auto" as this machine resolves it
    w = _BYTES[card.dtype]
    total = arch.params()
    trainable = arch.lora_params(card.lora_config.r, list(card.lora_config.target_modules)) \
        if card.lora else total
    tw = 4 if card.lora else w  # peft keeps adapters in float32
    seq = PROMPT_TOKENS + new_tokens(exp)
    seq = min(seq, arch.positions) if arch.positions else seq
    kv = 2 * arch.layers * arch.kv_heads * arch.head_dim * seq * exp.rollout.batch_size * w
    mb = exp.train.micro_batch_size
    logits = 2 * mb * new_tokens(exp) * arch.vocab * 4  # fp32 logits + log-softmax
    act_bytes = _BYTES[card.compute_dtype or card.dtype]
    hidden = mb * seq * arch.hidden * arch.layers * ACTIVATION_ELEMENTS * act_bytes
    # float32 attention runs PyTorch's math kernel, which keeps the probabilities for backward
    scores = mb * arch.heads * seq * seq * arch.layers * 4 if act_bytes == 4 else 0
    n = max(1, card.ranks)  # FSDP2 shards the parameters, their gradients and AdamW's state
    est = Estimate(card.name, total, trainable, total * w / n, trainable * tw / n, 2 * trainable * tw / n,
                   kv, logits + hidden + scores, n, total * w if n > 1 else 0.0)
    if card.engine != Engine.VLLM:
        return est
    copy, kv, runtime, sleeps = engine_parts(card, exp, arch)
    return replace(est, engine_copy=copy, kv_cache=kv, engine_runtime=runtime, vllm=True, engine_sleeps=sleeps)


def available_bytes(device: str) -> float | None:
    """Memory the device has free now: MemAvailable for "cpu", the free GPU memory for "cuda[:i]"
    (the first of "cuda:i,j"); None when it cannot be told."""
    if device.startswith("cuda"):
        try:
            import torch

            return float(torch.cuda.mem_get_info(torch.device(device.split(",")[0]))[0])
        except Exception:
            return None
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def memory_warning(card: ModelCard, exp: ExperimentConfig) -> str | None:
    """A line saying a card may not fit its machine (its estimate with 20% margin above what the
    device has free), said by the node before it builds instead of being killed mid-run; None
    when it fits or cannot be told."""
    est, free = estimate(card, exp), available_bytes(card.device)
    need = None if est is None else machine_bytes(est, card) * 1.2
    if need is None or free is None or need <= free:
        return None
    return (f"node {card.name}: needs about {need / GIB:.1f} GiB (ftis-flwr plan, with 20% "
            f"margin; an upper bound with train.share_prompts) and {card.device} has {free / GIB:.1f} GiB free: "
            "it may be killed mid-run; lower train.micro_batch_size or rollout.batch_size, or use dtype: auto")


def machine_bytes(est: Estimate, card: ModelCard) -> float:
    """What one device holds: a rank's bytes on a GPU (one GPU per rank), every rank's on the
    CPU (the ranks share the machine's memory)."""
    return est.total * est.ranks if card.device == "cpu" else est.total


def build_notes(card: ModelCard, exp: ExperimentConfig) -> list[str]:
    """What a node says before it builds, on its own machine: how it resolved ``auto`` dtypes, a
    bfloat16 card on a CPU without native bfloat16 (40-60x slower), an estimate above the memory
    it has free. Its HELLO answer carries them, so they reach the server's stream when the run
    starts instead of only the worker's log after minutes of "waiting for <node>"."""
    resolved, dtype_note = resolve_dtypes(card)
    return [n for n in (dtype_note, warn_slow_bf16(resolved), memory_warning(card, exp)) if n]


DEVICE_GIB = (22.5, 40, 48, 80, 139)
"""Common accelerators' usable memory in GiB (a "24 GB" card, A100 40/80, L40S 48, H200 ~139)."""


def placement(exp: ExperimentConfig, estimates: list[Estimate | None],
              device_gib: float | None = None) -> list[str]:
    """One line per node, in GiB: its estimate with 20% to spare and where it fits: this
    machine's memory for a CPU card; a ``device_gib`` device per rank (else what would make it
    fit: more ranks, bfloat16 compute, a smaller micro-batch), or the smallest common device."""
    return [_place(card, est, exp, device_gib) for card, est in zip(exp.nodes, estimates)]


def _place(card: ModelCard, est: Estimate | None, exp: ExperimentConfig, device_gib: float | None) -> str:
    """One node's line: a CPU card on this machine (never a GPU's advice), a GPU card on a device."""
    if est is None:
        return f"{card.name}: architecture unknown offline; cannot estimate"
    per_rank = est.total * 1.2 / GIB
    head = f"{card.name}: {per_rank:.1f} GiB with 20% margin" + (
        f" per rank, {est.ranks} ranks" if est.ranks > 1 else "") + (est.vllm and vllm_part(est) or "")
    if card.device == "cpu":
        need, have = machine_bytes(est, card) * 1.2 / GIB, (available_bytes("cpu") or 0) / GIB
        together = f" ({need:.1f} GiB for its {est.ranks} ranks together)" if est.ranks > 1 else ""
        short = "" if need <= have else " (not enough: lower train.micro_batch_size)"
        return f"{head} -> runs on the CPU{together}: {have:.1f} GiB free on this machine now{short} (card device: cpu)"
    sizes = (device_gib,) if device_gib else DEVICE_GIB
    fits = next((gib for gib in sizes if gib >= per_rank), None)
    each = " per rank" if est.ranks > 1 else ""
    if fits:
        return f"{head} -> fits one {fits:g} GiB device{each} (card device: {card.device})"
    advice = _advice(card, est, exp, device_gib) if device_gib else \
        fixes(card.name, activations=True, sleeps=est.engine_sleeps) if est.vllm else \
        f"{SHRINK}; --device-gib N names the ranks (FSDP2) it needs on devices of N GiB"
    return f"{head} -> needs more than one {sizes[-1]:g} GiB device{each}: {advice} (card device: {card.device})"


SHRINK = "lower train.micro_batch_size (activations scale with it) or set compute_dtype: bfloat16 on the card"


def _advice(card: ModelCard, est: Estimate, exp: ExperimentConfig, device_gib: float) -> str:
    """What makes a GPU node fit devices of ``device_gib``, one per rank: the fewest ranks; where
    sharding alone cannot (what every rank holds whole is too large), bfloat16 compute with the
    ranks it then needs, or the largest micro-batch that fits on the card's ranks."""
    budget = device_gib * GIB
    ranks = est.ranks_to_fit(budget)
    if ranks is not None:
        return f"set {_ranks(card, ranks)} ({_per_rank(est.with_ranks(ranks), device_gib)}), or {SHRINK}"
    options = []
    if card.compute_dtype != CardDtype.BFLOAT16:
        bf16 = estimate(replace(card, compute_dtype="bfloat16"), exp)
        n = bf16.ranks_to_fit(budget) if bf16 else None
        if n is not None:
            options.append(f"set nodes.{card.name}.compute_dtype=bfloat16" + (f" {_ranks(card, n)}" if n > 1 else "")
                           + f" ({_per_rank(bf16.with_ranks(n), device_gib)})")
    smaller = _smaller_micro_batch(card, exp, budget)
    if smaller is not None:
        mb, n, e = smaller
        options.append(f"set train.micro_batch_size={mb}" + (f" {_ranks(card, n)}" if n != est.ranks else "")
                       + f" ({_per_rank(e, device_gib)})")
    if est.vllm:  # one GPU: no ranks to suggest
        more = fixes(card.name, activations=not options, sleeps=est.engine_sleeps)
        return f"{' or '.join(options)}, or {more}" if options else more
    whole = (f"sharding alone cannot fit it: with 2 ranks or more every rank holds "
             f"{est.with_ranks(2).whole * 1.2 / GIB:.1f} GiB whole (the engine's copy of the weights, "
             "activations; with the margin)")
    return f"{whole}; {' or '.join(options) if options else SHRINK}"


def _smaller_micro_batch(card: ModelCard, exp: ExperimentConfig, budget: float) -> tuple[int, int, Estimate] | None:
    """(micro-batch, ranks, estimate): the largest micro-batch that fits on the card's own ranks,
    else the largest that fits on the fewest ranks; None when none does."""
    sizes = range(exp.train.micro_batch_size - 1, 0, -1)
    ests = [(mb, estimate(card, replace(exp, train=replace(exp.train, micro_batch_size=mb)))) for mb in sizes]
    own = next(((mb, e.ranks, e) for mb, e in ests if e.total * 1.2 <= budget), None)
    sharded = next(((mb, n, e.with_ranks(n)) for mb, e in ests if (n := e.ranks_to_fit(budget))), None)
    return own or sharded


def _ranks(card: ModelCard, ranks: int) -> str:
    """The keys that shard ``card`` over ``ranks`` GPUs, one per rank, the card's own GPU first
    (``cuda:1`` -> ``cuda:1,2``): a single ``cuda:i`` holds one rank only."""
    first = card.device.removeprefix("cuda:")
    if card.device == "cuda" or card.device.count(",") + 1 == ranks:
        device = ""
    elif first.isdigit():
        device = f" nodes.{card.name}.device=cuda:{','.join(str(int(first) + i) for i in range(ranks))}"
    else:
        device = f" nodes.{card.name}.device=cuda"
    return f"nodes.{card.name}.ranks={ranks}{device}"


def _per_rank(est: Estimate, device_gib: float) -> str:
    """What a suggestion leads to, so the reader can see it fits."""
    where = f"on {est.ranks} devices of {device_gib:g} GiB" if est.ranks > 1 else f"on one {device_gib:g} GiB device"
    return f"{est.total * 1.2 / GIB:.1f} GiB per rank with the margin {where}"


def report(exp: ExperimentConfig, device_gib: float | None = None) -> str:
    """The per-rank table and the placement, every figure in GiB."""
    ests = [estimate(c, exp) for c in exp.nodes]
    vllm = any(e is not None and e.vllm for e in ests)
    rows = ["| node | source | params | trainable | ranks | weights | grads | AdamW | engine copy | KV cache "
            f"{'| vLLM runtime ' if vllm else ''}| activations | per rank |",
            "| --- " * (13 if vllm else 12) + "|"]
    for card, e in zip(exp.nodes, ests):
        if e is None:
            rows.append(f"| {card.name} | {card.source} | ? | ? | {card.ranks} |" + " ? |" * (8 if vllm else 7))
            continue
        digits = 4 if e.params < 1e8 else 1  # a tiny model's weights are megabytes: 0.0020 GiB, not 0.0
        g = lambda b, d=digits: f"{b / GIB:.{d}f} GiB"  # noqa: E731
        params = f"{e.params / 1e9:.2f} B" if e.params >= 1e8 else f"{e.params / 1e6:.2f} M"
        rows.append(f"| {card.name} | {card.source}{' (LoRA)' if card.lora else ''}{' (vllm)' if e.vllm else ''} | "
                    f"{params} | {e.trainable / 1e6:.1f} M | {e.ranks} | {g(e.weights)} | "
                    f"{g(e.gradients)} | {g(e.optimizer)} | {g(e.engine_copy)} | {g(e.kv_cache)} | "
                    f"{g(e.engine_runtime) + ' | ' if vllm else ''}{g(e.activations)} | {g(e.total)} |")
    note = ("Each rank holds 1/ranks of the weights, grads and AdamW state (FSDP2 shards them) and whole: "
            "with 2 ranks or more a copy of the weights its rollout engine samples from, and its own KV cache "
            "and activations; generation and the update do not overlap: per rank = weights + grads + AdamW + "
            "engine copy + the larger of KV cache and activations.")
    if vllm:
        note += PLAN_NOTE
    return "\n".join(rows + ["", note, "", "Placement:"] + ["  " + line for line in placement(exp, ests, device_gib)])



def headline(name: str, exp: ExperimentConfig) -> str:
    """What the plan was made for: the experiment's shape that the figures scale with."""
    return (f"{name}: valid; {len(exp.nodes)} nodes, G={exp.rollout.group_size}, "
            f"{new_tokens(exp)} new tokens, generation batch {exp.rollout.batch_size}, "
            f"micro-batch {exp.train.micro_batch_size}")


def device_gib(text: str) -> float:
    """``--device-gib``: a positive number of GiB (argparse's type: a bad one is a usage error)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"--device-gib={text!r}: give one GPU's memory in GiB, a number > 0 "
                                         "(e.g. 80)")
    return value
