"""Per-node memory estimates and a placement for an experiment, without downloading anything.

    python -m ftis_flwr.config.plan paper-size-base          # or any preset name / YAML path

A lab checks a preset before it asks for GPUs: for each node, the bytes of its weights,
gradients and AdamW state (trainable parameters only: LoRA trains a few), the KV cache of one
generation batch (``rollout.batch_size`` sequences of prompt + ``max_new_tokens``) and the
learner's largest activation (the float32 logits of one micro-batch over the vocabulary, which
dominates at Qwen's 151,936 rows) plus the saved activations of one micro-batch
(:data:`ACTIVATION_ELEMENTS`). Architectures are read from the hub config when the model is
cached locally, else from :data:`KNOWN` (the Qwen2.5 family of the paper's presets). The figures
are estimates: the framework's own buffers and fragmentation come on top (allow ~20%). The
activations are those of the packed path (every sample runs its prompt); with
``train.share_prompts`` (the default) the learner runs fewer tokens, so the estimate is an upper
bound there. A node compares its own estimate with what its machine has before it builds
(:func:`memory_warning`).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ftis_flwr.config.dtypes import resolve_dtypes, warn_slow_bf16
from ftis_flwr.config.merge import load_experiment
from ftis_flwr.config.schema import ConfigError, ExperimentConfig, ModelCard

_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
GIB = 1024 ** 3
ACTIVATION_ELEMENTS = 26
"""Saved activation elements per token, layer and hidden unit in the learner's backward:
calibrated on an H200 (benchmarks/gpu_check.py, float32, micro-batch 8 x 896 tokens): measured
update peaks 69.6 GiB (Qwen2.5-1.5B) and 110.7 GiB (3B) against 69.5 and 116.8 estimated."""
PROMPT_TOKENS = 256
"""Assumed prompt length (system prompt + a GSM8K question through the chat template)."""


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
    node: str
    params: int
    trainable: int
    weights: float
    gradients: float
    optimizer: float
    kv_cache: float
    activations: float

    @property
    def total(self) -> float:
        # generation and the update do not run at once: KV cache and activations never coexist
        return self.weights + self.gradients + self.optimizer + max(self.kv_cache, self.activations)


def estimate(card: ModelCard, exp: ExperimentConfig) -> Estimate | None:
    """Bytes one node needs (see the module docstring); None for an unknown architecture."""
    arch = architecture(card.source)
    if arch is None:
        return None
    card, _ = resolve_dtypes(card)  # "auto" as this machine resolves it
    w = _BYTES[card.dtype]
    total = arch.params()
    trainable = arch.lora_params(card.lora_config.r, list(card.lora_config.target_modules)) \
        if card.lora else total
    tw = 4 if card.lora else w  # peft keeps adapters in float32
    seq = PROMPT_TOKENS + exp.rollout.max_new_tokens
    kv = 2 * arch.layers * arch.kv_heads * arch.head_dim * seq * exp.rollout.batch_size * w
    mb = exp.train.micro_batch_size
    logits = 2 * mb * exp.rollout.max_new_tokens * arch.vocab * 4  # fp32 logits + log-softmax
    act_bytes = _BYTES[card.compute_dtype or card.dtype]
    hidden = mb * seq * arch.hidden * arch.layers * ACTIVATION_ELEMENTS * act_bytes
    # float32 attention runs PyTorch's math kernel, which keeps the probabilities for backward
    scores = mb * arch.heads * seq * seq * arch.layers * 4 if act_bytes == 4 else 0
    return Estimate(card.name, total, trainable, total * w, trainable * tw, 2 * trainable * tw,
                    kv, logits + hidden + scores)


def available_bytes(device: str) -> float | None:
    """Memory the device has free now: MemAvailable for "cpu", the free GPU memory for "cuda[:i]";
    None when it cannot be told."""
    if device.startswith("cuda"):
        try:
            import torch

            return float(torch.cuda.mem_get_info(torch.device(device))[0])
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
    if est is None or free is None or est.total * 1.2 <= free:
        return None
    return (f"node {card.name}: needs about {est.total * 1.2 / GIB:.1f} GiB (python -m ftis_flwr.config.plan, with 20% "
            f"margin; an upper bound with train.share_prompts) and {card.device} has {free / GIB:.1f} GiB free: "
            "it may be killed mid-run; lower train.micro_batch_size or rollout.batch_size, or use dtype: auto")


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
    machine's memory for a CPU card; a ``device_gib`` device, or the smallest common one."""
    lines = []
    for card, est in zip(exp.nodes, estimates):
        if est is None:
            lines.append(f"{card.name}: architecture unknown offline; cannot estimate")
            continue
        need = est.total * 1.2 / GIB
        if card.device == "cpu":
            have = available_bytes("cpu") / GIB
            where = (f"runs on the CPU: {have:.1f} GiB free on this machine now"
                     + ("" if need <= have else " (not enough: lower train.micro_batch_size)"))
        else:
            sizes = (device_gib,) if device_gib else DEVICE_GIB
            fits = next((gib for gib in sizes if gib >= need), None)
            where = (f"fits one {fits:g} GiB device" if fits else
                     f"needs more than one {sizes[-1]:g} GiB device: lower train.micro_batch_size (activations "
                     "scale with it) or set compute_dtype: bfloat16 on the card")
        lines.append(f"{card.name}: {need:.1f} GiB with 20% margin -> {where} (card device: {card.device})")
    return lines


def report(exp: ExperimentConfig, device_gib: float | None = None) -> str:
    ests = [estimate(c, exp) for c in exp.nodes]
    rows = ["| node | source | params | trainable | weights | grads | AdamW | KV cache | activations | total |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for card, e in zip(exp.nodes, ests):
        if e is None:
            rows.append(f"| {card.name} | {card.source} | ? | ? | ? | ? | ? | ? | ? | ? |")
            continue
        g = lambda b: f"{b / GIB:.1f} GiB"  # noqa: E731
        rows.append(f"| {card.name} | {card.source}{' (LoRA)' if card.lora else ''} | {e.params / 1e9:.2f} B | "
                    f"{e.trainable / 1e6:.1f} M | {g(e.weights)} | {g(e.gradients)} | {g(e.optimizer)} | "
                    f"{g(e.kv_cache)} | {g(e.activations)} | {g(e.total)} |")
    return "\n".join(rows + ["", "Placement:"] + ["  " + line for line in placement(exp, ests, device_gib)])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ftis_flwr.config.plan",
                                     description="Validate an experiment and estimate each node's memory.")
    parser.add_argument("preset", help="preset name (ftis_flwr/config/presets) or YAML path")
    parser.add_argument("--device-gib", type=float, default=None, metavar="N",
                        help="the memory of one of your GPUs in GiB (default: the smallest common one that fits)")
    args = parser.parse_args(argv)
    try:
        exp = load_experiment(args.preset)
    except ConfigError as exc:  # a bad preset name or value: named, never a traceback
        parser.exit(2, f"{parser.prog}: {exc}\n")
    print(f"{args.preset}: valid; {len(exp.nodes)} nodes, G={exp.rollout.group_size}, "
          f"{exp.rollout.max_new_tokens} new tokens, generation batch {exp.rollout.batch_size}, "
          f"micro-batch {exp.train.micro_batch_size}")
    print(report(exp, args.device_gib))


if __name__ == "__main__":
    main()
