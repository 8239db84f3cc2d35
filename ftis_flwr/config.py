"""Typed configuration: one dataclass per concern, merged from defaults, YAML and flwr run-config.

Every field says its default and where it comes from ("paper" = Blagoev et al., F-TIS, 2026,
see SPEC.md). Incompatible settings are rejected in one place, :func:`validate`, with a message
that names the offending keys. Merging goes defaults <- YAML experiment file <- flat
``flwr run --run-config`` keys (dotted, e.g. ``loss.method``; dashes and underscores are equal).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from omegaconf import OmegaConf

LOSS_METHODS = ("nois", "vis", "tis", "f-nois", "f-vis", "f-tis")


def default_cache_dir(configured: str = "") -> Path:
    """``configured``, else ``$FTIS_CACHE``, else ``~/.cache/ftis-flwr`` (never the app directory)."""
    root = configured or os.environ.get("FTIS_CACHE") or "~/.cache/ftis-flwr"
    return Path(root).expanduser()


class ConfigError(ValueError):
    """A configuration value, or a combination of values, that cannot run."""


@dataclass
class LossConfig:
    """The F-TIS loss family and its filter (SPEC §5-6)."""

    method: str = "f-tis"
    """Loss method, one of nois, vis, tis, f-nois, f-vis, f-tis. Default f-tis (paper)."""
    trunc_c: float = 2.0
    """C: the truncated importance weight is min(pi_theta/pi_gen, C). Default 2 (paper)."""
    clip_eps: float = 0.2
    """eps of the PPO-style clip used by vis and tis. Default 0.2 (paper)."""
    kl_threshold: float = 50.0
    """g: a sample whose per-sequence KL estimate exceeds g may be filtered. Default 50 (paper).
    Overridden each round by the node's g schedule when one is set on its model card."""
    filter_rule: str = "and"
    """"and": filter when A<=0 and KL>g (what the authors ran, default); "or": A<=0 or KL>g."""
    filter_scope: str = "foreign"
    """"foreign" (default): filter received samples only; "all": own samples too."""
    filter_action: str = "zero"
    """"zero" (default, paper): the filtered sample's advantage is 0 but it stays in the
    denominator; "drop": it is removed from the loss and its denominator."""
    kl_estimator: str = "k3"
    """Per-token KL estimator: "k3" = exp(d)-d-1 (default, paper) or "k1" = d, d = gen - lp."""
    reduction: str = "sequence"
    """"sequence" (default, paper): mean over a sequence's tokens, then over sequences;
    "token": sum of token losses / number of tokens (Dr.GRPO-style)."""


@dataclass
class AdvantageConfig:
    """Group advantages and the collaboration mode (SPEC §2-3)."""

    mode: str = "vertical"
    """"vertical" (default, paper): a node generates whole groups for its own prompts;
    "horizontal" (ablation): every node generates G/m of each prompt and groups are pooled;
    "alone" (baseline): no sharing."""
    scale_rewards: str = "group"
    """"group" (default): (r - mean) / (std + eps); "none": mean-centring only (authors' code)."""
    eps: float = 1e-6
    """Added to the group std. Default 1e-6."""


@dataclass
class WireConfig:
    """What crosses the network and the caps a receiver enforces (DESIGN: Data on the wire)."""

    logprob_dtype: str = "fp32"
    """Log-prob encoding: "fp32" (default, paper: 8 bytes/token with int32 ids), "fp16" or
    "bf16" (sent as uint16)."""
    max_completions_per_group: int = 64
    """A received group with more completions is rejected. Default 64."""
    max_tokens_per_completion: int = 4096
    """A received completion longer than this is rejected. Default 4096."""
    max_groups: int = 4096
    """A payload with more groups is rejected. Default 4096."""


@dataclass
class RolloutConfig:
    """Sampling of groups (SPEC §1, §4)."""

    group_size: int = 12
    """G, completions per prompt. Default 12 (paper)."""
    temperature: float = 1.0
    """Sampling temperature; the learner's log-probs use the same. Default 1.0 (paper)."""
    top_k: int = 0
    """Keep the k most likely tokens (0 = off, default). gen log-probs are renormalised."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0 = off, default). gen log-probs are renormalised."""
    max_new_tokens: int = 640
    """Completion length cap. Default 640 (paper: ~640)."""
    batch_size: int = 64
    """Sequences per generate call (memory bound). Default 64."""


@dataclass
class TrainConfig:
    """The optimiser step each node takes per round (SPEC §5, §10)."""

    lr: float = 1e-6
    """Adam learning rate. Default 1e-6 (paper, full fine-tuning); LoRA cards use 1e-4."""
    weight_decay: float = 0.0
    """AdamW weight decay. Default 0 (paper: Adam)."""
    warmup_rounds: int = 0
    """Linear lr warm-up over this many rounds. Default 0 (SPEC §11: Adam dips without one on
    tiny models; the CPU presets set it)."""
    updates_per_round: int = 1
    """Optimiser steps per round over the same batch. Default 1 (paper)."""
    micro_batch_size: int = 16
    """Sequences per forward/backward; gradients are accumulated. Default 16."""
    grad_clip: float = 1.0
    """Max global gradient norm. Default 1.0 (paper)."""


@dataclass
class RoundConfig:
    """The federation's schedule, read by the strategy (DESIGN: One round)."""

    num_rounds: int = 50
    """Rounds (paper: ~50)."""
    prompts_per_node: int = 12
    """Prompts each node generates groups for per round (vertical). Default 12 (paper)."""
    eval_every: int = 5
    """Evaluate every N rounds (and after the last). 0 = only after the last."""
    eval_size: int = 64
    """Problems per evaluation split (0 = the whole split)."""
    round_timeout: float = 600.0
    """Seconds the strategy waits for replies in one round."""
    min_nodes: int = 1
    """A round with fewer replying nodes aborts the run."""
    seed: int = 0
    """Seed of the run: offsets the prompt schedule and is mixed into every node's sampling
    seed. A card's own ``seed`` picks its model (warm-start, LoRA init); this one picks the run's
    randomness, so repeats of one federation differ only here. Default 0."""


@dataclass
class GSchedule:
    """Per-node filter threshold g over rounds (SPEC §6, beyond the paper)."""

    kind: str = "constant"
    """"constant" (default: LossConfig.kl_threshold) or "linear" from start to end."""
    start: float = 50.0
    """g at the first round (linear)."""
    end: float = 50.0
    """g at the last round (linear)."""


@dataclass
class LoraConfig:
    """LoRA adapter of a node with a small trainable budget (SPEC §10)."""

    r: int = 128
    """Rank. Default 128 (paper)."""
    alpha: int = 256
    """Scale. Default 256 (paper)."""
    dropout: float = 0.0
    """Dropout. Default 0 (paper)."""
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Modules that get adapters. Default: all linear layers of a Qwen2 block."""


@dataclass
class ModelCard:
    """One node's identity: which model, how it trains, where it runs (DESIGN: Identity)."""

    name: str = "node"
    """Node name, used in logs and on the wire."""
    source: str = "tiny"
    """"tiny" (built and warm-started locally, offline), a local directory, or a hub id."""
    tiny_size: str = "small"
    """tiny source only: "small" (~0.5M params: hidden 128, 2 layers) or "large" (~1.6M params:
    hidden 192, 3 layers). Both share the character-level tokenizer."""
    warmstart_ops: str = "+-"
    """tiny source only: operations seen in supervised warm-start ("+", "-" or "+-")."""
    warmstart_steps: int = 2500
    """tiny source only: at most this many supervised warm-start steps (batch 128); training stops
    earlier once the model answers 70% of a check slice of its warm-start data exactly
    (warmstart_target), which gives every seed about the same starting skill (~70% test).
    Measured on 2 shared cores, 1 thread: small ~15 steps/s, 700-1700 steps (45-115 s); large
    ~6 steps/s, ~1150 steps (~200 s). Cached on disk after the first run."""
    warmstart_target: float = 0.7
    """tiny source only: warm-start stops once the model answers this fraction of a check slice
    of its warm-start data exactly (0 = always run all warmstart_steps). Default 0.7, the
    starting skill of the CPU-scale study (SPEC §11)."""
    seed: int = 0
    """Seed of the model's initialisation, warm-start data and sampling."""
    dtype: str = "float32"
    """Weights dtype: float32 (default, paper), bfloat16 or float16."""
    device: str = "cpu"
    """"cpu", "cuda" or "cuda:N" (the worker pins CUDA_VISIBLE_DEVICES to N)."""
    engine: str = "hf"
    """Rollout engine: "hf" (transformers generate, default) or "vllm" (optional extra)."""
    lora: bool = False
    """Train a LoRA adapter instead of all weights."""
    lora_config: LoraConfig = field(default_factory=LoraConfig)
    """LoRA settings when lora is true."""
    lr: float | None = None
    """Learning rate of this node; None = TrainConfig.lr."""
    g: GSchedule = field(default_factory=GSchedule)
    """This node's filter threshold schedule."""
    torch_threads: int = 1
    """CPU threads of this node's process (1 lets two nodes share 2 cores)."""


@dataclass
class TaskConfig:
    """Which problems are trained and evaluated (SPEC §8-9)."""

    name: str = "arithmetic"
    """"arithmetic" (offline, generated), "gsm8k" or "math500"."""
    train_path: str = ""
    """gsm8k/math: local JSONL file or empty for the hub data set."""
    eval_paths: dict[str, str] = field(default_factory=dict)
    """gsm8k/math: named evaluation splits -> JSONL path (or hub id)."""
    seed: int = 1234
    """arithmetic: seed of the generated problems."""


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
    nodes: list[ModelCard] = field(default_factory=lambda: [ModelCard(name="a"), ModelCard(name="b")])
    """The federation's model cards; in simulation node k gets nodes[partition_id]."""
    run_dir: str = "runs"
    """Where the server writes metrics, plots and summary; nodes save their final models under
    ``<run_dir>/<run name>/checkpoints/<node>`` unless their node config names an output dir."""
    cache_dir: str = ""
    """Where warm-started tiny models and node workers' state live. Empty (default): the
    ``FTIS_CACHE`` environment variable, else ``~/.cache/ftis-flwr``. Never inside the app
    directory (Flower's app bundle is capped at 10 MB)."""
    worker_idle_timeout: float = 900.0
    """A node worker that hears nothing for this many seconds saves nothing and exits."""
    preset: str = ""
    """Name or path of the YAML preset this config was built from (informational)."""


_CHOICES: dict[str, tuple[str, ...]] = {
    "loss.method": LOSS_METHODS,
    "loss.filter_rule": ("and", "or"),
    "loss.filter_scope": ("foreign", "all"),
    "loss.filter_action": ("zero", "drop"),
    "loss.kl_estimator": ("k3", "k1"),
    "loss.reduction": ("sequence", "token"),
    "advantage.mode": ("vertical", "horizontal", "alone"),
    "advantage.scale_rewards": ("group", "none"),
    "wire.logprob_dtype": ("fp32", "fp16", "bf16"),
    "task.name": ("arithmetic", "gsm8k", "math500"),
}


def _get(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def validate(cfg: ExperimentConfig) -> ExperimentConfig:
    """Reject impossible or contradictory settings, all at once, naming each key."""
    errors: list[str] = []
    for key, choices in _CHOICES.items():
        value = _get(cfg, key)
        if value not in choices:
            errors.append(f"{key}={value!r} is not one of {', '.join(choices)}")
    if cfg.loss.trunc_c <= 0:
        errors.append(f"loss.trunc_c={cfg.loss.trunc_c} must be > 0")
    if not 0 < cfg.loss.clip_eps < 1:
        errors.append(f"loss.clip_eps={cfg.loss.clip_eps} must be in (0, 1)")
    if cfg.loss.kl_threshold < 0:
        errors.append(f"loss.kl_threshold={cfg.loss.kl_threshold} must be >= 0")
    r = cfg.rollout
    if r.group_size < 2:
        errors.append(f"rollout.group_size={r.group_size} must be >= 2 (advantages need a group)")
    if r.temperature <= 0:
        errors.append(f"rollout.temperature={r.temperature} must be > 0 for training rollouts "
                      "(evaluation is always greedy)")
    if r.top_k < 0:
        errors.append(f"rollout.top_k={r.top_k} must be >= 0 (0 = off)")
    if not 0 < r.top_p <= 1:
        errors.append(f"rollout.top_p={r.top_p} must be in (0, 1]")
    if r.max_new_tokens < 1 or r.batch_size < 1:
        errors.append("rollout.max_new_tokens and rollout.batch_size must be >= 1")
    if r.group_size > cfg.wire.max_completions_per_group:
        errors.append(f"rollout.group_size={r.group_size} exceeds wire.max_completions_per_group="
                      f"{cfg.wire.max_completions_per_group}: receivers would reject every group")
    if r.max_new_tokens > cfg.wire.max_tokens_per_completion:
        errors.append(f"rollout.max_new_tokens={r.max_new_tokens} exceeds "
                      f"wire.max_tokens_per_completion={cfg.wire.max_tokens_per_completion}")
    t = cfg.train
    if t.lr <= 0 or t.grad_clip <= 0 or t.micro_batch_size < 1 or t.updates_per_round < 1:
        errors.append("train.lr and train.grad_clip must be > 0, train.micro_batch_size and "
                      "train.updates_per_round >= 1")
    if t.warmup_rounds < 0:
        errors.append(f"train.warmup_rounds={t.warmup_rounds} must be >= 0")
    rd = cfg.rounds
    if rd.num_rounds < 1 or rd.prompts_per_node < 1:
        errors.append("rounds.num_rounds and rounds.prompts_per_node must be >= 1")
    if rd.min_nodes < 1 or rd.round_timeout <= 0 or rd.eval_every < 0 or rd.eval_size < 0:
        errors.append("rounds.min_nodes >= 1, rounds.round_timeout > 0, rounds.eval_every >= 0 "
                      "and rounds.eval_size >= 0 are required")
    if cfg.worker_idle_timeout <= 0:
        errors.append(f"worker_idle_timeout={cfg.worker_idle_timeout} must be > 0")
    if not cfg.nodes:
        errors.append("nodes: at least one model card is required")
    names = [n.name for n in cfg.nodes]
    if len(set(names)) != len(names):
        errors.append(f"nodes: names must be unique, got {names}")
    if rd.min_nodes > max(len(cfg.nodes), 1):
        errors.append(f"rounds.min_nodes={rd.min_nodes} exceeds the {len(cfg.nodes)} model cards")
    if cfg.advantage.mode == "horizontal" and cfg.nodes and r.group_size % len(cfg.nodes):
        errors.append(f"advantage.mode=horizontal splits each group across nodes: "
                      f"rollout.group_size={r.group_size} must be divisible by the "
                      f"{len(cfg.nodes)} nodes")
    for card in cfg.nodes:
        errors.extend(_card_errors(card))
    if cfg.task.name != "arithmetic" and any(c.source == "tiny" for c in cfg.nodes):
        errors.append(f"task.name={cfg.task.name!r} needs real models: the tiny character-level "
                      "models only know the arithmetic task")
    if errors:
        raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(errors))
    return cfg


def _card_errors(card: ModelCard) -> list[str]:
    where = f"nodes[{card.name}]"
    errors = []
    if card.tiny_size not in ("small", "large"):
        errors.append(f"{where}.tiny_size={card.tiny_size!r} is not one of small, large")
    if not card.warmstart_ops or set(card.warmstart_ops) - {"+", "-"}:
        errors.append(f"{where}.warmstart_ops={card.warmstart_ops!r} must use '+' and/or '-'")
    if not 0 <= card.warmstart_target <= 1:
        errors.append(f"{where}.warmstart_target={card.warmstart_target} must be in [0, 1]")
    if card.dtype not in ("float32", "bfloat16", "float16"):
        errors.append(f"{where}.dtype={card.dtype!r} is not one of float32, bfloat16, float16")
    if card.engine not in ("hf", "vllm"):
        errors.append(f"{where}.engine={card.engine!r} is not one of hf, vllm")
    if card.engine == "vllm" and not card.device.startswith("cuda"):
        errors.append(f"{where}: engine=vllm needs a cuda device, got device={card.device!r}")
    if not (card.device == "cpu" or card.device.startswith("cuda")):
        errors.append(f"{where}.device={card.device!r} must be cpu, cuda or cuda:N")
    if card.lr is not None and card.lr <= 0:
        errors.append(f"{where}.lr={card.lr} must be > 0")
    if card.g.kind not in ("constant", "linear"):
        errors.append(f"{where}.g.kind={card.g.kind!r} is not one of constant, linear")
    if card.g.start < 0 or card.g.end < 0:
        errors.append(f"{where}.g: start and end must be >= 0")
    if card.lora and (card.lora_config.r < 1 or not card.lora_config.target_modules):
        errors.append(f"{where}.lora_config: r >= 1 and at least one target module are required")
    if card.torch_threads < 1:
        errors.append(f"{where}.torch_threads must be >= 1")
    return errors


# ---------------------------------------------------------------------------------------------
# Merging


def _normalise_key(key: str) -> str:
    return key.strip().replace("-", "_")


def _known_keys(cls: type, prefix: str = "") -> dict[str, Any]:
    """Dotted keys of a dataclass tree -> field type (for nice errors on unknown keys)."""
    keys: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        dotted = f"{prefix}{f.name}"
        default = (f.default_factory() if f.default_factory is not dataclasses.MISSING  # type: ignore[misc]
                   else f.default)
        if dataclasses.is_dataclass(default):
            keys.update(_known_keys(type(default), dotted + "."))
        keys[dotted] = f.type
    return keys


# flwr run-config keys that are not experiment fields (read by the apps themselves).
APP_KEYS = {"preset", "config_file"}


def flat_to_nested(flat: Mapping[str, Any]) -> dict[str, Any]:
    """``{"loss.method": "tis"}`` -> ``{"loss": {"method": "tis"}}``; rejects unknown keys."""
    known = _known_keys(ExperimentConfig)
    nested: dict[str, Any] = {}
    unknown = []
    for raw_key, value in flat.items():
        key = _normalise_key(raw_key)
        if key in APP_KEYS:
            continue
        if key not in known and not key.startswith("nodes."):
            unknown.append(raw_key)
            continue
        node = nested
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    if unknown:
        raise ConfigError(f"unknown configuration keys: {', '.join(sorted(unknown))}. "
                          f"Known keys look like: loss.method, rollout.group_size, rounds.num_rounds")
    return nested


PRESET_DIR = Path(__file__).resolve().parent.parent / "simulations" / "presets"


def resolve_preset(preset: str) -> Path:
    """A preset name (file stem under simulations/presets) or a path to a YAML file."""
    path = Path(preset).expanduser()
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path
    candidate = PRESET_DIR / f"{preset}.yaml"
    if candidate.is_file():
        return candidate
    available = sorted(p.stem for p in PRESET_DIR.glob("*.yaml")) if PRESET_DIR.is_dir() else []
    raise ConfigError(f"preset {preset!r} is neither a YAML file nor one of: "
                      f"{', '.join(available) or '(none found)'}")


def _nodes_overrides(nested: dict[str, Any], base_nodes: list[Any]) -> None:
    """``nodes.0.lr`` style keys patch one card; OmegaConf would replace the whole list."""
    node_patch = nested.pop("nodes", None)
    if node_patch is None:
        return
    if isinstance(node_patch, list):
        nested["nodes"] = node_patch
        return
    for idx, patch in node_patch.items():
        try:
            i = int(idx)
            base_nodes[i]
        except (ValueError, IndexError):
            raise ConfigError(f"nodes.{idx}: no model card with that index "
                              f"(the preset has {len(base_nodes)})") from None
        base_nodes[i] = OmegaConf.merge(base_nodes[i], patch)


def load_experiment(preset: str | None = None, overrides: Mapping[str, Any] | None = None,
                    yaml_text: str | None = None) -> ExperimentConfig:
    """defaults <- YAML preset (name or path) <- YAML text <- flat dotted overrides; validated."""
    schema = OmegaConf.structured(ExperimentConfig)
    layers = []
    if preset:
        layers.append(OmegaConf.load(resolve_preset(preset)))
    if yaml_text:
        layers.append(OmegaConf.create(yaml_text))
    try:
        merged = OmegaConf.merge(schema, *layers)
        if overrides:
            nested = flat_to_nested(overrides)
            nodes = list(merged.nodes)
            _nodes_overrides(nested, nodes)
            merged.nodes = nodes
            merged = OmegaConf.merge(merged, OmegaConf.create(nested))
        if preset:
            merged.preset = preset
        cfg = OmegaConf.to_object(merged)
    except ConfigError:
        raise
    except Exception as exc:  # OmegaConf's type/key errors: keep the message, lose the trace
        raise ConfigError(f"invalid configuration: {exc}") from None
    return validate(cfg)  # type: ignore[arg-type]


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain nested dict (for logging, the wire and the worker)."""
    return dataclasses.asdict(cfg)


def from_dict(data: Mapping[str, Any]) -> ExperimentConfig:
    """Inverse of :func:`to_dict`, validated."""
    merged = OmegaConf.merge(OmegaConf.structured(ExperimentConfig), OmegaConf.create(dict(data)))
    return validate(OmegaConf.to_object(merged))  # type: ignore[arg-type]


def card_from_dict(data: Mapping[str, Any]) -> ModelCard:
    merged = OmegaConf.merge(OmegaConf.structured(ModelCard), OmegaConf.create(dict(data)))
    card = OmegaConf.to_object(merged)
    errors = _card_errors(card)  # type: ignore[arg-type]
    if errors:
        raise ConfigError("invalid model card:\n  - " + "\n  - ".join(errors))
    return card  # type: ignore[return-value]
