"""Typed configuration: one dataclass per concern, merged from defaults, YAML and flwr run-config.

Every field says its default and where it comes from ("paper" = Blagoev et al., F-TIS, 2026).
Merging goes defaults <- YAML preset <- YAML file <- flat ``flwr run --run-config`` keys (dotted,
e.g. ``loss.method``; dashes and underscores are equal): see :mod:`ftis_flwr.config.merge`.
Incompatible settings are rejected in one place, :func:`ftis_flwr.config.validation.validate`, all
at once, each message naming its key; allowed values come from :mod:`ftis_flwr.config.choices`,
and each number's bounds are declared on its field, ``field(default=..., metadata={"ge": 1})``
(``gt``, ``ge``, ``lt``, ``le``, and a ``note`` the message adds), read by one generic check.
Every scalar field here is a ``--run-config`` key: ``[tool.flwr.app.config]`` in pyproject.toml is
generated from these dataclasses (``python -m ftis_flwr.config.keys --write``). The loss's and the
g schedule's settings are the maths' own (:mod:`ftis_flwr.maths.params`), composed here.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ftis_flwr.maths.params import GSchedule, LossConfig


def default_cache_dir(configured: str = "") -> Path:
    """``configured``, else ``$FTIS_CACHE``, else ``~/.cache/ftis-flwr`` (never the app directory)."""
    root = configured or os.environ.get("FTIS_CACHE") or "~/.cache/ftis-flwr"
    return Path(root).expanduser()


class ConfigError(ValueError):
    """A configuration value, or a combination of values, that cannot run."""


@dataclass
class AdvantageConfig:
    """Group advantages and the collaboration mode (algorithm §2-3)."""

    mode: str = "vertical"
    """"vertical" (default, paper): a node generates whole groups for its own prompts;
    "horizontal" (ablation): every node generates G/m of each prompt and groups are pooled;
    "alone" (baseline): no sharing."""
    scale_rewards: str = "group"
    """"group" (default): (r - mean) / (std + eps); "none": mean-centring only (authors' code)."""
    eps: float = field(default=1e-6, metadata={"ge": 0})
    """Added to the group std. Default 1e-6."""


@dataclass
class WireConfig:
    """What crosses the network and the caps a receiver enforces (docs/performance.md#wire-cost, docs/security.md)."""

    format: str = "compact"
    """What a node sends: "compact" (default, format 2: one byte container, bit-packed ids,
    see ftis_flwr/wire/compact.py) or "arrays" (format 1: seven npy arrays + per-group string
    lists). Receivers read both."""
    logprob_dtype: str = "fp16"
    """Log-prob encoding: "fp16" (default: 2 bytes, rounding error <= 2^-11 relative, the
    default's learning unchanged over 3 seeds; see docs/performance.md#wire-cost), "fp32" (lossless;
    the paper's 8 bytes/token with int32 ids) or "bf16" (sent as uint16; 8x coarser than fp16
    on log-probs, which are <= 0 and mostly near 0)."""
    compress: str = "zlib"
    """The compact container's body compressor: "zlib" (default: halves the offline default's
    payloads for ~5 ms per payload, see benchmarks/wire_bytes.py) or "none"."""
    max_completions_per_group: int = field(default=64, metadata={"ge": 1})
    """A received group with more completions is rejected. Default 64."""
    max_tokens_per_completion: int = field(default=4096, metadata={"ge": 1})
    """A received completion longer than this is rejected. Default 4096."""
    max_groups: int = field(default=4096, metadata={"ge": 1})
    """A payload with more groups is rejected. Default 4096."""
    max_tokens_per_payload: int = field(default=1_048_576, metadata={"ge": 1})
    """A payload with more completion tokens in total is rejected before it is decoded.
    Default 2^20 (~8 MB at fp32): 11x the paper presets' 12 prompts x 12 completions x 640."""
    max_payload_bytes: int = field(default=33_554_432, metadata={"ge": 1})
    """A payload whose bytes (compact: container, and its body once inflated) exceed this is
    rejected before it is unpacked or inflated. Default 32 MiB (4x the token cap at fp32)."""


@dataclass
class RolloutConfig:
    """Sampling of groups (algorithm §1, §4)."""

    group_size: int = field(default=12, metadata={"ge": 2, "note": "advantages need a group"})
    """G, completions per prompt. Default 12 (paper)."""
    temperature: float = field(default=1.0, metadata={
        "gt": 0, "note": "for training rollouts; evaluation is always greedy"})
    """Sampling temperature; the learner's log-probs use the same. Default 1.0 (paper)."""
    top_k: int = field(default=0, metadata={"ge": 0, "note": "0 = off"})
    """Keep the k most likely tokens (0 = off, default). gen log-probs are renormalised."""
    top_p: float = field(default=1.0, metadata={"gt": 0, "le": 1})
    """Nucleus sampling mass (1.0 = off, default). gen log-probs are renormalised."""
    max_new_tokens: int = field(default=640, metadata={"ge": 1})
    """Completion length cap. Default 640 (paper: ~640)."""
    batch_size: int = field(default=64, metadata={"ge": 1})
    """Sequences per generate call (memory bound). Default 64."""
    share_prompts: bool = True
    """Prefill the common prefix of a generate call's prompts (the system prompt and worked
    examples) once and each distinct prompt once, and sample its G completions from that cache
    (hf engine): the same tokens and log-probs (to float32 rounding) with the prompts run once
    instead of once per sequence (what it saves: docs/real-models.md, benchmarks/shared_prefill.py).
    False: every sequence prefills its own prompt. The vllm engine caches prefixes itself."""


@dataclass
class TrainConfig:
    """The optimiser step each node takes per round (algorithm §5, §10)."""

    lr: float = field(default=1e-6, metadata={"gt": 0})
    """Adam learning rate. Default 1e-6 (paper, full fine-tuning); LoRA cards use 1e-4."""
    weight_decay: float = field(default=0.0, metadata={"ge": 0})
    """AdamW weight decay. Default 0 (paper: Adam)."""
    warmup_rounds: int = field(default=0, metadata={"ge": 0})
    """Linear lr warm-up over this many rounds. Default 0 (Adam dips without one on
    tiny models; the CPU presets set it)."""
    updates_per_round: int = field(default=1, metadata={"ge": 1})
    """Optimiser steps per round over the same batch. Default 1 (paper). Above 1, as PPO / TRL's
    ``num_iterations``: every step takes its ratio against the round-start policy pi_old (the
    first step's log-probs), so the tis clip binds; w, the KL and the filter stay pi_old's."""
    micro_batch_size: int = field(default=16, metadata={"ge": 1})
    """Sequences per forward/backward; gradients are accumulated. Default 16."""
    grad_clip: float = field(default=1.0, metadata={"gt": 0})
    """Max global gradient norm. Default 1.0 (paper)."""
    share_prompts: bool = True
    """Run each distinct prompt of a micro-batch once and its completions on its cached keys and
    values (gradients flow back into the one prompt forward): the same log-probs and gradients
    (to float32 rounding) on P + G*T tokens instead of G*(P + T) (what it saves: docs/real-models.md,
    benchmarks/shared_prompts.py). False: every sample runs its prompt again (the packed path)."""


@dataclass
class RoundConfig:
    """The federation's schedule, read by the strategy (docs/how-it-works.md)."""

    num_rounds: int = field(default=50, metadata={"ge": 1})
    """Rounds (paper: ~50)."""
    prompts_per_node: int = field(default=12, metadata={"ge": 1})
    """Prompts each node generates groups for per round (vertical). Default 12 (paper)."""
    eval_every: int = field(default=5, metadata={"ge": 0, "note": "0 = only after the last round"})
    """Evaluate every N rounds (and after the last). 0 = only after the last."""
    eval_size: int = field(default=64, metadata={"ge": 0, "note": "0 = the whole split"})
    """Problems per evaluation split (0 = the whole split)."""
    round_timeout: float = field(default=600.0, metadata={"gt": 0})
    """Seconds the strategy waits for replies in one round."""
    startup_timeout: float = field(default=3600.0, metadata={"ge": 0})
    """Seconds the strategy waits for the first round of a run (or of a resumed run), in which
    every node builds its model: a model the package does not ship is warm-started, converted or
    downloaded then. Never less than round_timeout. Default 3600."""
    min_nodes: int = field(default=1, metadata={"ge": 1})
    """A round with fewer replying nodes aborts the run."""
    state_every: int = field(default=1, metadata={"ge": 0, "note": "0 = never save node state"})
    """Every N rounds (and after the last) each node's worker saves its training state (trainable
    weights, optimiser, update counter, pending groups, RNG) under its worker folder, so that a
    worker that dies, or a resumed run, continues from it instead of the base model. 0 = never.
    Default 1 (cost measured in docs/failures.md: a fraction of a round on the CPU presets)."""
    seed: int = 0
    """Seed of the run: offsets the prompt schedule and is mixed into every node's sampling
    seed. A card's own ``seed`` picks its model (warm-start, LoRA init); this one picks the run's
    randomness, so repeats of one federation differ only here. Default 0."""

    def evaluates(self, rnd: int) -> bool:
        """Whether round ``rnd`` evaluates: round 0 (the baseline), every ``eval_every``-th, the last."""
        return rnd == 0 or rnd == self.num_rounds or (self.eval_every > 0 and rnd % self.eval_every == 0)


@dataclass
class ExchangeConfig:
    """How many foreign groups each node gets per round (docs/performance.md), read by the strategy.

    With m nodes a node otherwise receives (and trains on) the groups of all m - 1 others: its
    bytes received and update time grow with m. A budget keeps them flat."""

    max_foreign_groups: int = field(default=0, metadata={"ge": 0, "note": "0 = all"})
    """At most this many foreign groups forwarded to each node per round, across all sources.
    0 (default) = all of them (no budget). Needs ``select`` other than "all"."""
    select: str = "all"
    """Which foreign groups fill the budget: "all" (default; no budget), "random" (seeded by run
    seed, round and receiver), "reward_variance" (highest variance of the source's claimed
    rewards first: groups that carry a learning signal), "low_kl" (groups of the sources with the
    lowest KL to the receiver, from its own report of the round before, first; sources it has not
    measured yet come first), or an import path ``"<module>:<rule>"`` / ``"<file.py>:<rule>"`` to a rule
    of your own, ``rule(source, payload, kl) -> one score per group`` (higher first). See
    ftis_flwr.server.budget."""
    schedule: str = "sync"
    """"sync" (default): every round waits for every node, so a fast node idles while the slowest
    generates. "async": bounded staleness (as in asynchronous RL, e.g. AReaL): a node gets its
    next round as soon as it replies, with the other nodes' groups that arrived since its last
    round; a node that has taken ``rounds.num_rounds`` rounds keeps going until every node has,
    then takes a final round. The importance weights already correct for the older policy that
    sampled a group. A stopped run resumes as a synchronous one does. See ftis_flwr.server.async_rounds."""
    cross_tokenizer: str = "auto"
    """Peers whose tokenizers differ (cross-tokenizer F-TIS, algorithm §4): "auto" (default) trains
    on their samples through the completion text aligned into chunks, and on same-tokenizer
    peers' token ids as before; "always" takes the text path for every foreign sample (between
    identical tokenizers it trains exactly as the token path); "off" refuses a peer with another
    tokenizer (the run stops before round 1 with the two cards named)."""
    max_staleness: int = field(default=0, metadata={"ge": 0, "note": "0 = newest groups only"})
    """Async only: a foreign group is forwarded only while its source has taken at most this many
    updates since generating it; older ones are dropped and counted
    (``foreign_groups_stale_dropped``). Default 0: only each source's newest groups, so a slow
    node trains on as many foreign groups per round as in synchronous rounds (k > 0 gives it up
    to k + 1 rounds' worth of a faster source's groups, and a longer update)."""


@dataclass
class LoraConfig:
    """LoRA adapter of a node with a small trainable budget (algorithm §10)."""

    r: int = field(default=128, metadata={"ge": 1})
    """Rank. Default 128 (paper)."""
    alpha: int = field(default=256, metadata={"gt": 0})
    """Scale. Default 256 (paper)."""
    dropout: float = field(default=0.0, metadata={"ge": 0, "lt": 1})
    """Dropout. Default 0 (paper)."""
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Modules that get adapters. Default: all linear layers of a Qwen2 block."""


@dataclass
class ModelCard:
    """One node's identity: which model, how it trains, where it runs (docs/deployment.md: a card per SuperNode)."""

    name: str = "node"
    """Node name, used in logs and on the wire."""
    source: str = "tiny"
    """"tiny" (built and warm-started locally, offline), a local directory, or a hub id."""
    tiny_tokenizer: str = "char"
    """tiny source only: "char" (default: one token per character, shared by the default's
    models), "bpe" (a byte-level BPE trained offline on the arithmetic data, whose tokens span
    several characters: a tiny peer with *another* tokenizer, for cross-tokenizer runs) or
    "unigram" (a SentencePiece-style unigram model with metaspace and no byte fallback: a third
    segmentation, and a receiver that refuses characters outside its vocabulary)."""
    tiny_size: str = "small"
    """tiny source only: "small" (~0.5M params: hidden 128, 2 layers) or "large" (~1.6M params:
    hidden 192, 3 layers). The tokenizer is tiny_tokenizer's."""
    warmstart_ops: str = "+-"
    """tiny source only: operations seen in supervised warm-start ("+", "-" or "+-")."""
    warmstart_steps: int = field(default=2500, metadata={"ge": 0})
    """tiny source only: at most this many supervised warm-start steps (batch 128); training stops
    earlier once the model answers 70% of a check slice of its warm-start data exactly
    (warmstart_target), which gives every seed about the same starting skill (~70% test).
    Cached on disk after the first run."""
    warmstart_target: float = field(default=0.7, metadata={"ge": 0, "le": 1})
    """tiny source only: warm-start stops once the model answers this fraction of a check slice
    of its warm-start data exactly (0 = always run all warmstart_steps). Default 0.7, the
    starting skill of the CPU-scale study (algorithm §11)."""
    warmstart_tools: float = field(default=0.0, metadata={"ge": 0, "le": 1})
    """tiny source only: after the arithmetic warm start, a short supervised stage on episodes of the
    shipped calculator environment (``arithmetic-chain`` rows): this share of them call the calculator
    and copy its result, the rest answer directly. 0 (default) = no such stage. Leaves both paths
    open for reinforcement learning to choose between (preset cpu-pair-calc: 0.5)."""
    seed: int = 0
    """Seed of the model's initialisation, warm-start data and sampling."""
    dtype: str = "float32"
    """Weights dtype: float32 (default, paper), bfloat16, float16 or "auto" (bfloat16 where the
    node's device computes it natively, float32 elsewhere: the node logs which it chose). Adam's state follows it, so
    a fully fine-tuned node needs float32 for small learning rates (a bf16 weight cannot move by
    1e-6 of itself); a LoRA node's adapters are float32 whatever this is (peft)."""
    compute_dtype: str = ""
    """Matmul precision of generation and the learner's forward, through ``torch.autocast``,
    while the weights stay in ``dtype``: "" (default: ``dtype``), "bfloat16", "float16" or "auto"
    (bfloat16 where the device computes it natively, else ``dtype``; what it changes on a CPU:
    docs/real-models.md)."""
    device: str = "cpu"
    """"cpu", "cuda" or "cuda:N" (the worker pins CUDA_VISIBLE_DEVICES to N)."""
    stop_tokens: list[str] = field(default_factory=list)
    """Extra tokens that end a completion, besides the tokenizer's EOS, the generation config's
    EOS ids and the chat template's end-of-turn token (``<|im_end|>``, ``<|eot_id|>``, ...),
    which are found automatically. Default: none."""
    engine: str = "hf"
    """Rollout engine: "hf" (transformers generate, default), "vllm" (optional extra), or an import
    path ``"<module>:<factory>"`` / ``"<file.py>:<factory>"`` to an engine of your own,
    ``factory(model, tokenizer, *, card, share_prompts, **options)`` (see ftis_flwr.node.engines)."""
    lora: bool = False
    """Train a LoRA adapter instead of all weights."""
    lora_config: LoraConfig = field(default_factory=LoraConfig)
    """LoRA settings when lora is true."""
    lr: float | None = field(default=None, metadata={"gt": 0})
    """Learning rate of this node; None = TrainConfig.lr."""
    g: GSchedule = field(default_factory=GSchedule)
    """This node's filter threshold schedule."""
    torch_threads: int = field(default=1, metadata={"ge": 1})
    """CPU threads of this node's process (1 lets two nodes share 2 cores)."""
    ranks: int = field(default=1, metadata={"ge": 1, "note": "1: one process, no sharding"})
    """Processes this node's learner is sharded over with ``torch.distributed`` FSDP2 (PyTorch's
    ``fully_shard``; docs/sharded-node.md). Default 1: one process, no sharding. With N > 1 the
    node's worker starts N ranks (gloo on the CPU, NCCL on CUDA; ``device: cuda`` takes
    ``cuda:0..N-1``); parameters, gradients and Adam's state are split N ways, each rank trains
    on its share of the round's samples and the loss is normalised over all of them, so the update
    equals the one-rank update on the same groups. Generation and evaluation run in lockstep on
    the ranks, each on its share of the prompts."""
    public_key: str = ""
    """Pins this card to one SuperNode: the text of the OpenSSH public key it authenticates with
    (its ``.pub`` file's line, as given to ``flwr supernode register``), or a PEM public key. Only
    the SuperNode whose key the SuperLink reports may claim the card; another is left out and
    named. Needs an authenticated deployment (SuperLink ``--enable-supernode-auth``): a simulation
    has no node keys, so a pinned card is never served there. Default "": any SuperNode."""
    vllm_gpu_memory_utilization: float = field(default=0.0, metadata={"ge": 0, "le": 1, "note": "0: planned"})
    """engine=vllm only: fraction of the GPU's memory vLLM may take for its weights, activations
    and KV cache (vLLM's ``gpu_memory_utilization``; vLLM refuses to start unless that much of the
    card is free). Default 0: planned at start from what the learner leaves on its device: the
    free memory less what the learner still allocates (gradients, AdamW's state and, without
    ``vllm_sleep``, its activations), refused with the numbers when the engine's weights and KV
    cache do not fit (docs/vllm.md, "Memory"). A value in (0, 1] is used as given."""
    vllm_max_model_len: int = field(default=0, metadata={"ge": 0, "note": "0: the model's"})
    """engine=vllm only: longest prompt + completion vLLM plans for (its ``max_model_len``).
    Default 0: the model's own limit (large for Qwen2.5, which costs KV-cache memory)."""
    vllm_kv_cache_gib: float = field(default=0.0, metadata={"ge": 0, "note": "0: the round's"})
    """engine=vllm only: KV-cache size in GiB (vLLM's ``kv_cache_memory_bytes``). Default 0: on a
    GPU, what the round's sequences need (``rounds.prompts_per_node`` x ``rollout.group_size``
    sequences of the longest prompt plus ``rollout.max_new_tokens``); on a CPU, vLLM's own rule."""
    vllm_dtype: str = ""
    """engine=vllm only: the dtype vLLM samples in. Default "": the card's ``compute_dtype`` (else
    ``dtype``), except a LoRA card on a GPU in float32, which samples in bfloat16 (vLLM's GPU LoRA
    kernels take float16 or bfloat16 only). π_gen is the distribution sampled in that dtype, so
    the importance weight corrects the difference to the learner (docs/vllm.md, "Dtypes")."""
    vllm_sleep: bool = True
    """engine=vllm on a GPU only: put the engine to sleep during the update (vLLM's sleep mode:
    a LoRA node's base weights move to host memory, a full node's are discarded and reloaded with
    the update; the KV cache is freed), so the learner's activations can use that memory.
    Default True. Ignored on a CPU (vLLM's CPU build has no sleep mode)."""
    vllm_weight_sync: str = "file"
    """engine=vllm, full fine-tuning only: how the updated weights reach the engine. "file"
    (default, the path that has run: one safetensors file that vLLM's worker reloads) or "ipc"
    (vLLM 0.33's weight-transfer API over CUDA IPC, no disk; GPU only and not yet run: docs/vllm.md)."""
    vllm_enforce_eager: bool = True
    """engine=vllm only: run without CUDA graphs / torch.compile (vLLM's ``enforce_eager``).
    Default True: faster start and no compile step; False can be faster for long runs on a GPU."""


@dataclass
class TaskConfig:
    """Which problems are trained and evaluated (algorithm §8-9)."""

    name: str = "arithmetic"
    """A built-in task: "arithmetic" (offline, generated, for the tiny character models),
    "arithmetic-chain" (three-term sums, offline, whose rows go to an environment: the shipped
    calculator's task, preset cpu-pair-calc),
    "basic-math" (offline, generated one-step questions in words for small real chat models),
    "uppercase" (a word written in capitals, for small real chat models; the ``[tasks]`` extra),
    "gsm8k" or "math500"; or "dataset" (rows read by ``datasets.load_dataset``: ``dataset``,
    ``data_files``), "reasoning-gym:<generator>" (procedural, offline; the ``[tasks]`` extra), or
    "<module>:<factory>" / "<file.py>:<factory>": a callable returning a
    :class:`ftis_flwr.tasks.base.Task`."""
    train_path: str = ""
    """gsm8k/math: local JSONL file or empty for the hub data set."""
    eval_paths: dict[str, str] = field(default_factory=dict)
    """gsm8k/math: named evaluation splits -> JSONL path (or hub id)."""
    seed: int = 1234
    """arithmetic/basic-math/uppercase: seed of the generated problems (and of every task's shuffle)."""
    shots: int = field(default=0, metadata={"ge": 0})
    """Chat tasks (basic-math, uppercase, gsm8k, math500): worked examples shown as earlier chat turns
    after the paper's system prompt, each answered in the strict <think>/<answer> format.
    Default 0 (paper). A 135M model follows the format in ~1 of 64 samples without one."""
    dataset: str = ""
    """``task.name=dataset``: what ``datasets.load_dataset`` takes first: ``"json"``, ``"csv"``,
    ``"parquet"`` (with ``data_files``), a local folder, or a hub id (needs network)."""
    data_files: dict[str, str] = field(default_factory=dict)
    """``task.name=dataset``: split name -> file. ``train`` is trained on; every other split is
    evaluated and reported under its name (``eval/<split>/accuracy``)."""
    prompt_field: str = "prompt"
    """``task.name=dataset``: the column holding the prompt (unless ``prompt_template`` is set)."""
    prompt_template: str = ""
    """``task.name=dataset``: a Python format string over the row's columns, e.g.
    ``"{question}"``; empty (default): the ``prompt_field`` column as it is."""
    answer_field: str = "answer"
    """``task.name=dataset``: the column holding the reference answer (the built-in rewards'
    gold; a reward function gets every column anyway)."""
    chat: bool = False
    """``task.name=dataset``: render the prompt through the model's chat template with the
    paper's system prompt, as the built-in chat tasks do. Default False: plain text (the tiny
    models and base models)."""
    reward: str = ""
    """The reward: empty (default) = the task's own; a built-in name (``exact``, ``math-verify``,
    ``strict-math``) or ``"<module>:<function>"`` / ``"<file.py>:<function>"`` with TRL's
    ``reward_funcs`` signature ``f(completions, **columns) -> list[float | None]``."""
    rewards: list[str] = field(default_factory=list)
    """Several rewards at once (names or import paths as in ``reward``), summed with
    ``reward_weights`` as TRL's GRPOTrainer does. Empty (default): ``reward`` alone."""
    reward_weights: list[float] = field(default_factory=list)
    """Weights of ``rewards``, in order; empty (default): 1.0 each (TRL's ``reward_weights``)."""
    size: int = field(default=0, metadata={"ge": 0, "note": "0 = the task's own size"})
    """Generated tasks (``reasoning-gym:<generator>``): problems in the train split; 0 (default)
    = the task's own default size."""
    partial_credit: bool = True
    """``reasoning-gym:<generator>``: score an answer with the generator's checker as it is, partial
    credit included (default; ``spell_backward`` pays per letter in place, so the word's last letter
    repeated earns about 0.18). False: 1.0 only for an answer the checker gives full credit, else 0
    (an exact answer). ``ftis-flwr check`` warns when a cheap answer earns more than a tenth of the
    gold's score (:mod:`ftis_flwr.tasks.reward_probe`)."""
    environment: str = ""
    """``task.name`` dataset or arithmetic-chain: a multi-turn, tool-using environment written for TRL's
    ``environment_factory`` (``"<module>:<factory>"`` / ``"<file.py>:<factory>"``; issue #57,
    algorithm §13): each prompt's G completions become episodes; each row's columns go to
    ``reset(**row)``, the class's public methods are the tools, and ``get_reward()`` scores an
    episode (else the task's reward over the episode's last model turn). Empty (default): none,
    one completion per sample. Shipped: ``ftis_flwr.tasks.calculator:Calculator``. An OpenEnv
    ``Environment`` class is taken too, its action as one tool, or an ``MCPEnvironment``'s MCP tools
    (``pip install -e ".[openenv]"``)."""
    max_turns: int = field(default=4, metadata={"ge": 1})
    """``task.environment``: model turns per episode at most (each but the last may call tools)."""
    tool_timeout: float = field(default=10.0, metadata={"gt": 0})
    """``task.environment``: seconds a tool call may take; a slower or failing call becomes an
    error observation the model reads (counted in ``env/tool_errors``)."""
    episode_tokens: int = field(default=0, metadata={"ge": 0, "note": "0 = rollout.max_new_tokens x task.max_turns"})
    """``task.environment``: tokens of one episode after its prompt, the model's turns and the
    tools' results together. 0 (default): ``rollout.max_new_tokens`` x ``task.max_turns``; each model
    turn samples at most ``rollout.max_new_tokens``."""
    tool_format: str = ""
    """``task.environment``: how the model writes a tool call: ``hermes``
    (``<tool_call>{json}</tool_call>``: Qwen2.5/Qwen3), ``llama3-json`` (the turn is
    ``{"name": ..., "parameters": {...}}``: Llama 3.1-3.3), ``tiny`` (``#name(v1,v2)``: the tiny
    character models). Empty (default): chosen from the tokenizer (a chat template that writes
    ``<tool_call>``: hermes; one that writes ``"parameters"`` and an ``ipython`` turn: llama3-json;
    no template: tiny)."""


@dataclass
class ReportConfig:
    """Where the server's per-round metrics go besides metrics.jsonl (TRL's ``report_to``)."""

    to: list[str] = field(default_factory=lambda: ["tensorboard"])
    """Trackers: any of ``tensorboard`` (default), ``mlflow`` (``MLFLOW_TRACKING_URI``, else a store
    in the run's folder), ``wandb`` (honours ``WANDB_MODE=offline``), or ``none``; comma-separated
    on the command line. mlflow and wandb are optional extras (``pip install -e ".[trackers]"``)."""
    samples_per_node: int = field(default=2, metadata={"ge": 0, "note": "0 = none"})
    """Completions per node logged to the trackers as a table at each evaluated round (its
    prompt id, text and reward; 0: none). They travel in the node's reply, a few hundred bytes."""
    run_name: str = ""
    """The run's name: its folder is ``<date>-<time>-<run name>-<4 hex>`` under ``run_dir``, and
    the plot's title and the trackers' run carry it. Default "": the folder is named after the
    task, the preset, the mode and the method (``<date>-<time>-<task>-<preset>-<mode>-<method>-<4 hex>``).
    Characters other than letters, digits, ``.`` and ``-`` become ``_`` in the folder's name."""


@dataclass
class ExperimentConfig:
    """Everything one run needs; the strategy and every node read the same one."""

    loss: LossConfig = field(default_factory=LossConfig)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    wire: WireConfig = field(default_factory=WireConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    rounds: RoundConfig = field(default_factory=RoundConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    exchange: ExchangeConfig = field(default_factory=ExchangeConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    nodes: list[ModelCard] = field(default_factory=lambda: [ModelCard(name="a"), ModelCard(name="b")])
    """The federation's model cards; in simulation node k gets nodes[partition_id]."""
    run_dir: str = "runs"
    """Where the server writes metrics, plots and summary; nodes save their final models under
    ``<run_dir>/<run name>/checkpoints/<node>`` unless their node config names an output dir."""
    cache_dir: str = ""
    """Where warm-started tiny models and node workers' state live. Empty (default): the
    ``FTIS_CACHE`` environment variable, else ``~/.cache/ftis-flwr``. Never inside the app
    directory (Flower's app bundle is capped at 10 MB)."""
    worker_idle_timeout: float = field(default=0.0, metadata={"ge": 0, "note": "0 = auto"})
    """A node worker that hears nothing for this many seconds exits (its node is lost). 0
    (default): three times ``rounds.round_timeout``. Must be at least twice the round timeout:
    a fast node waits up to a round for a slow partner and must not reset itself meanwhile."""

    def idle_timeout(self) -> float:
        """The worker idle timeout in effect (see ``worker_idle_timeout``)."""
        return self.worker_idle_timeout or 3 * self.rounds.round_timeout

    def episode_budget(self) -> int:
        """Tokens one episode may hold after its prompt (see ``task.episode_tokens``)."""
        return self.task.episode_tokens or self.rollout.max_new_tokens * self.task.max_turns

    def completion_tokens(self) -> int:
        """Tokens one sequence may hold after its prompt: ``rollout.max_new_tokens``, or an
        episode's budget with ``task.environment`` (what memory plans size sequences by)."""
        return self.episode_budget() if self.task.environment else self.rollout.max_new_tokens
    preset: str = ""
    """Name or path of the YAML preset this config was built from (informational)."""


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain nested dict (for logging, the wire and the worker)."""
    return dataclasses.asdict(cfg)
