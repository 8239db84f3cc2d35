"""Every choice key's allowed values, in one torch-free place, so a configuration is checked in
about a second (``ftis-flwr check``) without importing the code that implements the choices.

The maths' vocabularies are its own (:mod:`ftis_flwr.maths.params`); the rest are declared here
and imported by the module that implements them (the engines, the tiny models, the wire, the
server's exchange, the tasks). Where a kind has a registry (losses, tasks, engines, selection
rules), ``tests/test_registries.py`` fails when its names and the tuple here differ; the other
vocabularies are checked in ``tests/test_config.py``. A new value is added here and in its
implementation, together.

Each closed vocabulary is declared once, as a ``str`` Enum (``AdvantageMode``, ``Schedule``, ...;
verl's ``AdvantageEstimator`` is the same idea), with its values as a tuple of plain strings
(``ADVANTAGE_MODES``) for validation messages. Configurations, JSON and the wire keep the plain
strings; a member equals its string, so the code compares with members
(``cfg.advantage.mode == AdvantageMode.HORIZONTAL``) and a typo fails at attribute lookup.
"""

from __future__ import annotations

from enum import StrEnum

# The names marked re-exported are unused here: every choice is importable from this module
# (the node, the config reference and the tests import them from here).
from ftis_flwr.maths.params import (
    BUILTIN_LOSSES,  # noqa: F401 (re-exported)
    CROSS_TOKENIZER_RATIOS,
    FILTER_ACTIONS,
    FILTER_RULES,
    FILTER_SCOPES,
    G_KINDS,
    KL_ESTIMATORS,
    REDUCTIONS,
    SCALES,
    CrossTokenizerRatio,  # noqa: F401 (re-exported)
    FilterAction,  # noqa: F401 (re-exported)
    FilterRule,  # noqa: F401 (re-exported)
    FilterScope,  # noqa: F401 (re-exported)
    GKind,  # noqa: F401 (re-exported)
    KlEstimator,  # noqa: F401 (re-exported)
    Reduction,  # noqa: F401 (re-exported)
    Scale,  # noqa: F401 (re-exported)
    names,
)


class AdvantageMode(StrEnum):
    """``advantage.mode``: whole groups per node, G/m of each prompt per node pooled, or no sharing."""

    VERTICAL = "vertical"
    HORIZONTAL = "horizontal"
    ALONE = "alone"


class CrossTokenizerMode(StrEnum):
    """``exchange.cross_tokenizer``: when a foreign sample takes the text (chunk) path."""

    AUTO = "auto"
    ALWAYS = "always"
    OFF = "off"


class LogprobCodec(StrEnum):
    """``wire.logprob_dtype``: how the log-probs travel."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"


class WireFormat(StrEnum):
    """``wire.format``: format 2 (one byte container) or format 1 (npy arrays)."""

    COMPACT = "compact"
    ARRAYS = "arrays"


class Compressor(StrEnum):
    """``wire.compress``: the compact container's body compressor."""

    NONE = "none"
    ZLIB = "zlib"


class SelectRule(StrEnum):
    """``exchange.select``: ``all`` (no budget, no rule chooses), or a rule registered in
    :mod:`ftis_flwr.server.budget`."""

    ALL = "all"
    RANDOM = "random"
    REWARD_VARIANCE = "reward_variance"
    LOW_KL = "low_kl"


class Schedule(StrEnum):
    """``exchange.schedule``: rounds in lockstep, or nodes that train on what has arrived."""

    SYNC = "sync"
    ASYNC = "async"


class Engine(StrEnum):
    """``nodes.N.engine``: the rollout engine (transformers, or vLLM on a GPU), as registered in
    :mod:`ftis_flwr.node.engines`."""

    HF = "hf"
    VLLM = "vllm"


class WeightSync(StrEnum):
    """``nodes.N.vllm_weight_sync``: how a full node's updated weights reach its vLLM engine."""

    FILE = "file"
    IPC = "ipc"


class TinySize(StrEnum):
    """``nodes.N.tiny_size``: the offline tiny models' sizes (:data:`ftis_flwr.node.tiny.models.TINY_SIZES`)."""

    SMALL = "small"
    LARGE = "large"


class TinyTokenizer(StrEnum):
    """``nodes.N.tiny_tokenizer``: character-level, or the offline byte-level BPE or unigram."""

    CHAR = "char"
    BPE = "bpe"
    UNIGRAM = "unigram"


class CardDtype(StrEnum):
    """``nodes.N.dtype`` / ``compute_dtype``; "auto" = bfloat16 only where the device computes it
    natively."""

    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    AUTO = "auto"


class Tracker(StrEnum):
    """``report.to``: where the per-round metrics go besides metrics.jsonl (TRL's ``report_to``;
    :mod:`ftis_flwr.server.reporting.trackers`); "none" = no tracker, alone."""

    TENSORBOARD = "tensorboard"
    MLFLOW = "mlflow"
    WANDB = "wandb"
    NONE = "none"


ADVANTAGE_MODES = names(AdvantageMode)
CROSS_TOKENIZER_MODES = names(CrossTokenizerMode)
LOGPROB_CODECS = names(LogprobCodec)
WIRE_FORMATS = names(WireFormat)
COMPRESSORS = names(Compressor)
NO_SELECTION = SelectRule.ALL.value
"""``exchange.select`` without a budget (``max_foreign_groups`` 0): every group goes, no rule chooses."""
SELECT_RULES = names(SelectRule)
SCHEDULES = names(Schedule)
ENGINES = names(Engine)
WEIGHT_SYNCS = names(WeightSync)
TINY_SIZES = names(TinySize)
TINY_TOKENIZERS = names(TinyTokenizer)
CARD_DTYPES = names(CardDtype)
TRACKERS = names(Tracker)
TASK_NAMES = ("arithmetic", "arithmetic-heldout", "arithmetic-chain", "basic-math", "basic-math-20", "gsm8k", "math500",
              "uppercase", "dataset")
"""``task.name``'s registered names (:func:`ftis_flwr.tasks.make_task`); besides them a name may be
``<prefix>:<name>`` for a prefix in TASK_PREFIXES, or an import path ``<module>:<factory>``."""
TASK_PREFIXES = ("reasoning-gym",)
"""``task.name`` prefixes: ``reasoning-gym:<generator>``."""
TOOL_FORMATS = ("", "hermes", "llama3-json", "tiny")
"""``task.tool_format``: "" (chosen from the tokenizer) or a format of :mod:`ftis_flwr.node.turns`
(its ``TOOL_FORMATS``, kept equal by a test)."""
GENERATED_TASKS = ("arithmetic", "arithmetic-heldout", "arithmetic-chain")
"""The tasks the tiny character-level models know (they were warm-started on arithmetic)."""
ROW_TASKS = ("dataset", "arithmetic-chain")
"""The tasks whose problems carry rows (columns) that an environment's ``reset(**row)`` takes."""

EXPERIMENT_CHOICES: dict[str, tuple] = {
    "loss.filter_rule": FILTER_RULES,
    "loss.filter_scope": FILTER_SCOPES,
    "loss.filter_action": FILTER_ACTIONS,
    "loss.kl_estimator": KL_ESTIMATORS,
    "loss.reduction": REDUCTIONS,
    "loss.cross_tokenizer_ratio": CROSS_TOKENIZER_RATIOS,
    "advantage.mode": ADVANTAGE_MODES,
    "advantage.scale_rewards": SCALES,
    "wire.logprob_dtype": LOGPROB_CODECS,
    "wire.format": WIRE_FORMATS,
    "wire.compress": COMPRESSORS,
    "exchange.select": SELECT_RULES,
    "exchange.schedule": SCHEDULES,
    "exchange.cross_tokenizer": CROSS_TOKENIZER_MODES,
    "task.tool_format": TOOL_FORMATS,
}
"""Experiment key -> its allowed values (``loss.method`` is open: see BUILTIN_LOSSES)."""

CARD_CHOICES: dict[str, tuple] = {
    "engine": ENGINES,
    "vllm_weight_sync": WEIGHT_SYNCS,
    "tiny_size": TINY_SIZES,
    "tiny_tokenizer": TINY_TOKENIZERS,
    "g.kind": G_KINDS,
}
"""Model-card key -> its allowed values (``dtype`` and ``compute_dtype``: CARD_DTYPES, the latter may be "")."""

OPEN_CHOICES = {"exchange.select": "selection rule", "engine": "engine factory"}
"""Keys of the two dicts above (-> what their registry holds) that also take an import path
``"<module>:<name>"`` / ``"<file.py>:<name>"`` to one of one's own: their listed values are the
built-in ones (:func:`ftis_flwr.config.validation.open_choice_error`)."""

__all__ = ["names"] + sorted(
    n for n, v in list(globals().items())
    if n.isupper() or (isinstance(v, type) and issubclass(v, StrEnum) and v is not StrEnum))
