"""Every choice key's allowed values, in one torch-free place, so a configuration is checked in
about a second (``ftis-flwr check``) without importing the code that implements the choices.

The maths' vocabularies are its own (:mod:`ftis_flwr.maths.params`); the rest are declared here
and imported by the module that implements them (the engines, the tiny models, the wire, the
server's exchange, the tasks). Where a kind has a registry (losses, tasks, engines, selection
rules), ``tests/test_registries.py`` fails when its names and the tuple here differ; the other
vocabularies are checked in ``tests/test_config.py``. A new value is added here and in its
implementation, together.
"""

from __future__ import annotations

from ftis_flwr.maths.params import (
    BUILTIN_LOSSES,
    CROSS_TOKENIZER_RATIOS,
    FILTER_ACTIONS,
    FILTER_RULES,
    FILTER_SCOPES,
    G_KINDS,
    KL_ESTIMATORS,
    REDUCTIONS,
    SCALES,
)

ADVANTAGE_MODES = ("vertical", "horizontal", "alone")
"""``advantage.mode``: whole groups per node, G/m of each prompt per node pooled, or no sharing."""
CROSS_TOKENIZER_MODES = ("auto", "always", "off")
"""``exchange.cross_tokenizer``: when a foreign sample takes the text (chunk) path."""
LOGPROB_CODECS = ("fp32", "fp16", "bf16")
"""``wire.logprob_dtype``: how the log-probs travel."""
WIRE_FORMATS = ("compact", "arrays")
"""``wire.format``: format 2 (one byte container) or format 1 (npy arrays)."""
COMPRESSORS = ("none", "zlib")
"""``wire.compress``: the compact container's body compressor."""
NO_SELECTION = "all"
"""``exchange.select`` without a budget (``max_foreign_groups`` 0): every group goes, no rule chooses."""
SELECT_RULES = (NO_SELECTION, "random", "reward_variance", "low_kl")
"""``exchange.select``: NO_SELECTION, or a rule registered in :mod:`ftis_flwr.server.budget`."""
SCHEDULES = ("sync", "async")
"""``exchange.schedule``: rounds in lockstep, or nodes that train on what has arrived."""
TASK_NAMES = ("arithmetic", "arithmetic-heldout", "basic-math", "basic-math-20", "gsm8k", "math500",
              "dataset")
"""``task.name``'s registered names (:func:`ftis_flwr.tasks.make_task`); besides them a name may be
``<prefix>:<name>`` for a prefix in TASK_PREFIXES, or an import path ``<module>:<factory>``."""
TASK_PREFIXES = ("reasoning-gym",)
"""``task.name`` prefixes: ``reasoning-gym:<generator>``."""
GENERATED_TASKS = ("arithmetic", "arithmetic-heldout")
"""The tasks the tiny character-level models know (they were warm-started on arithmetic)."""
ENGINES = ("hf", "vllm")
"""``nodes.N.engine``: the rollout engine (transformers, or vLLM on a GPU), as registered in
:mod:`ftis_flwr.node.engines`."""
TINY_SIZES = ("small", "large")
"""``nodes.N.tiny_size``: the offline tiny models' sizes (:data:`ftis_flwr.node.tiny.TINY_SIZES`)."""
TINY_TOKENIZERS = ("char", "bpe", "unigram")
"""``nodes.N.tiny_tokenizer``: character-level, or the offline byte-level BPE or unigram."""
CARD_DTYPES = ("float32", "bfloat16", "float16", "auto")
"""``nodes.N.dtype`` / ``compute_dtype``; "auto" = bfloat16 only where the device computes it natively."""
TRACKERS = ("tensorboard", "mlflow", "wandb", "none")
"""``report.to``: where the per-round metrics go besides metrics.jsonl (TRL's ``report_to``;
:mod:`ftis_flwr.server.trackers`); "none" = no tracker, alone."""

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
}
"""Experiment key -> its allowed values (``loss.method`` is open: see BUILTIN_LOSSES)."""

CARD_CHOICES: dict[str, tuple] = {
    "engine": ENGINES,
    "tiny_size": TINY_SIZES,
    "tiny_tokenizer": TINY_TOKENIZERS,
    "g.kind": G_KINDS,
}
"""Model-card key -> its allowed values (``dtype`` and ``compute_dtype``: CARD_DTYPES, the latter may be "")."""

__all__ = ["BUILTIN_LOSSES", "CARD_CHOICES", "EXPERIMENT_CHOICES"] + [
    n for n in list(globals()) if n.isupper() and n not in ("CARD_CHOICES", "EXPERIMENT_CHOICES")]
