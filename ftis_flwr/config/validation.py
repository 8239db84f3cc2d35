"""Validation of an :class:`~ftis_flwr.config.schema.ExperimentConfig`: every error at once, by key.

The allowed values of each choice come from :mod:`ftis_flwr.config.choices` (the maths' own from
:mod:`ftis_flwr.maths.params`), torch-free, so validating costs about a second.

``loss.method`` is open: a built-in name, a name registered with
:func:`ftis_flwr.maths.loss.register_loss`, or an import path ``"package.module:function"`` (or
``"f-package.module:function"`` for the filtered variant, by the ``f-`` convention of
:mod:`ftis_flwr.maths.loss`): validation imports the module and registers the function under that exact
name, so it works in every process that validates the experiment (the ServerApp, and each node
worker when it builds its Node). The module must be importable there (installed, or on
``PYTHONPATH``; the app directory is on the workers' path). ``function`` may also be a name the
module registers with ``register_loss`` when it is imported.

A name that is not built in needs the loss registry, which imports torch (seconds).
``validate(cfg)`` imports it; ``validate(cfg, import_registries=False)`` (what the per-message
ClientApp uses through ``from_dict``) checks such a name only when the registry is already
imported and otherwise leaves it to the server, which validated the same experiment before
sending it.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable

from ftis_flwr.config.choices import (
    BUILTIN_LOSSES,
    CARD_CHOICES,
    CARD_DTYPES,
    EXPERIMENT_CHOICES,
    GENERATED_TASKS,
    TASK_NAMES,
    TASK_PREFIXES,
    TRACKERS,
)
from ftis_flwr.config.schema import ConfigError, ExperimentConfig, ModelCard


def _get(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _choice_error(key: str, value: Any, choices: tuple) -> list[str]:
    if value in choices:
        return []
    return [f"{key}={value!r} is not one of {', '.join(choices)}"]


def _loss_registry(import_registries: bool) -> dict[str, Callable] | None:
    module = sys.modules.get("ftis_flwr.maths.loss")
    if module is None and import_registries:
        module = importlib.import_module("ftis_flwr.maths.loss")
    return None if module is None else module.LOSS_REGISTRY


def resolve_loss_method(name: str, import_registries: bool = True) -> str | None:
    """Make ``name`` usable as ``loss.method``; returns an error message, or None when it is.

    A registered name is used as is. ``"[f-]package.module:function"`` imports the module and
    registers ``function`` (an attribute, or a name the module registered) under ``name``.
    """
    if name in BUILTIN_LOSSES:
        return None
    registry = _loss_registry(import_registries)
    if registry is None or name in registry:
        return None
    if ":" not in name:
        return (f"loss.method={name!r} is not one of {', '.join(sorted(registry))}, "
                "nor an import path 'package.module:function'")
    target = name[2:] if name.startswith("f-") else name
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the user's module: report, don't crash the validator
        return (f"loss.method={name!r}: cannot import {module_name!r} "
                f"({type(exc).__name__}: {exc}); it must be importable on the server and every node")
    if name in registry:  # the module registered the full name itself
        return None
    fn = getattr(module, attr, None) if attr.isidentifier() else None
    if fn is None:
        fn = registry.get(attr)
    if not callable(fn):
        return f"loss.method={name!r}: {module_name!r} has no loss function or registered loss {attr!r}"
    from ftis_flwr.maths.loss import register_loss

    register_loss(name, replace=True)(fn)
    return None


def task_errors(cfg: ExperimentConfig, import_registries: bool = True) -> list[str]:
    """``task.name`` names a registered task, a prefix's task or an import path; with
    ``import_registries``, the task is built and its files, columns and rewards checked
    (:func:`ftis_flwr.tasks.checks.task_errors`, imported by name: checking stays torch-free)."""
    name = cfg.task.name
    prefix, sep, rest = name.partition(":")
    if name not in TASK_NAMES and not (sep and rest and (prefix in TASK_PREFIXES or ":" in name)):
        return [f"task.name={name!r} is not one of {', '.join(TASK_NAMES)}, nor "
                f"{', '.join(p + ':<name>' for p in TASK_PREFIXES)}, nor an import path "
                "'<module>:<factory>' / '<file.py>:<factory>'"]
    if len(cfg.task.reward_weights) and len(cfg.task.reward_weights) != len(cfg.task.rewards):
        return [f"task.reward_weights={cfg.task.reward_weights} has {len(cfg.task.reward_weights)} weights "
                f"for the {len(cfg.task.rewards)} task.rewards"]
    if not import_registries:
        return []
    return importlib.import_module("ftis_flwr.tasks.checks").task_errors(cfg.task)


def experiment_errors(cfg: ExperimentConfig, *, import_registries: bool = True) -> list[str]:
    """Every problem of ``cfg``, one message per problem, each naming its key."""
    errors: list[str] = []
    method_error = resolve_loss_method(cfg.loss.method, import_registries)
    if method_error:
        errors.append(method_error)
    for key, choices in EXPERIMENT_CHOICES.items():
        errors += _choice_error(key, _get(cfg, key), choices)
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
    most = cfg.rounds.prompts_per_node * r.group_size * r.max_new_tokens
    if most > cfg.wire.max_tokens_per_payload:
        errors.append(f"rounds.prompts_per_node x rollout.group_size x rollout.max_new_tokens = {most} "
                      f"exceeds wire.max_tokens_per_payload={cfg.wire.max_tokens_per_payload}: "
                      "receivers would reject full payloads")
    if 8 * cfg.wire.max_tokens_per_payload > cfg.wire.max_payload_bytes:
        errors.append(f"wire.max_payload_bytes={cfg.wire.max_payload_bytes} is under 8 bytes per "
                      f"token of wire.max_tokens_per_payload={cfg.wire.max_tokens_per_payload}: "
                      "receivers would reject payloads the token cap admits")
    t = cfg.train
    errors += [f"train.{k}={getattr(t, k)} must be > 0" for k in ("lr", "grad_clip") if getattr(t, k) <= 0]
    errors += [f"train.{k}={getattr(t, k)} must be >= 1" for k in ("micro_batch_size", "updates_per_round")
               if getattr(t, k) < 1]
    if t.warmup_rounds < 0:
        errors.append(f"train.warmup_rounds={t.warmup_rounds} must be >= 0")
    rd = cfg.rounds
    errors += [f"rounds.{k}={getattr(rd, k)} must be >= 1" for k in ("num_rounds", "prompts_per_node")
               if getattr(rd, k) < 1]
    if rd.state_every < 0:
        errors.append(f"rounds.state_every={rd.state_every} must be >= 0 (0 = never save node state)")
    if rd.min_nodes < 1 or rd.round_timeout <= 0 or rd.eval_every < 0 or rd.eval_size < 0:
        errors.append("rounds.min_nodes >= 1, rounds.round_timeout > 0, rounds.eval_every >= 0 "
                      "and rounds.eval_size >= 0 are required")
    if cfg.worker_idle_timeout < 0:
        errors.append(f"worker_idle_timeout={cfg.worker_idle_timeout} must be >= 0 (0 = auto)")
    elif 0 < cfg.worker_idle_timeout < 2 * cfg.rounds.round_timeout:
        errors.append(f"worker_idle_timeout={cfg.worker_idle_timeout} must be at least twice "
                      f"rounds.round_timeout={cfg.rounds.round_timeout}: a fast node waits up to a "
                      "round for a slow partner, and an idle worker exits and loses its node")
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
    errors += exchange_errors(cfg)
    for card in cfg.nodes:
        errors.extend(card_errors(card, import_registries=import_registries))
    errors += task_errors(cfg, import_registries)
    if cfg.task.name in TASK_NAMES and cfg.task.name not in (*GENERATED_TASKS, "dataset") and any(
            c.source == "tiny" for c in cfg.nodes):
        errors.append(f"task.name={cfg.task.name!r} needs real models: the tiny character-level "
                      "models only know the arithmetic task")
    errors += report_errors(cfg)
    return errors


def exchange_errors(cfg: ExperimentConfig) -> list[str]:
    """The foreign-group budget (``exchange.*``): a budget needs a rule and a rule a budget
    (the rule's name itself is checked against ``ftis_flwr.config.choices.SELECT_RULES``)."""
    ex, errors = cfg.exchange, []
    if ex.max_foreign_groups < 0:
        errors.append(f"exchange.max_foreign_groups={ex.max_foreign_groups} must be >= 0 (0 = all)")
    elif ex.max_foreign_groups > 0 and ex.select == "all":
        errors.append(f"exchange.max_foreign_groups={ex.max_foreign_groups} needs exchange.select to "
                      "name a rule (random, reward_variance, low_kl), not 'all'")
    elif ex.max_foreign_groups == 0 and ex.select != "all":
        errors.append(f"exchange.select={ex.select!r} chooses within a budget: set "
                      "exchange.max_foreign_groups > 0 (0 = all groups, nothing to choose)")
    if ex.max_foreign_groups > 0 and cfg.advantage.mode == "horizontal":
        errors.append("exchange.max_foreign_groups > 0 with advantage.mode=horizontal: horizontal "
                      "pools every node's share of a prompt into one group, so no share may be left out")
    if ex.max_staleness < 0:
        errors.append(f"exchange.max_staleness={ex.max_staleness} must be >= 0 (0 = newest groups only)")
    if ex.schedule == "async" and cfg.advantage.mode == "horizontal":
        errors.append("exchange.schedule=async with advantage.mode=horizontal: horizontal pools every "
                      "node's share of one prompt into one group, so every round waits for every node; "
                      "use vertical (or schedule=sync)")
    return errors

def card_errors(card: ModelCard, *, import_registries: bool = True) -> list[str]:
    """Every problem of one model card, each named ``nodes[<name>].<field>``."""
    where = f"nodes[{card.name}]"
    errors = []
    for key, choices in CARD_CHOICES.items():
        errors += _choice_error(f"{where}.{key}", _get(card, key), choices)
    errors += _choice_error(f"{where}.dtype", card.dtype, CARD_DTYPES)
    if card.compute_dtype:
        errors += _choice_error(f"{where}.compute_dtype", card.compute_dtype, CARD_DTYPES)
    if not card.warmstart_ops or set(card.warmstart_ops) - {"+", "-"}:
        errors.append(f"{where}.warmstart_ops={card.warmstart_ops!r} must use '+' and/or '-'")
    if not 0 <= card.warmstart_target <= 1:
        errors.append(f"{where}.warmstart_target={card.warmstart_target} must be in [0, 1]")
    if card.engine == "vllm" and card.device == "cpu" and not vllm_cpu_build_installed():
        errors.append(f"{where}: engine=vllm needs a cuda device, got device={card.device!r}, "
                      "unless vLLM's CPU build is installed here (vllm-cpu: run from the "
                      "environment scripts/vllm_cpu_env.sh builds)")
    if card.engine == "vllm":
        if not 0 < card.vllm_gpu_memory_utilization <= 1:
            errors.append(f"{where}.vllm_gpu_memory_utilization={card.vllm_gpu_memory_utilization} "
                          "must be in (0, 1]")
        if card.vllm_max_model_len < 0:
            errors.append(f"{where}.vllm_max_model_len={card.vllm_max_model_len} must be >= 0 (0: the model's)")
        if card.vllm_kv_cache_gib < 0:
            errors.append(f"{where}.vllm_kv_cache_gib={card.vllm_kv_cache_gib} must be >= 0 (0: vLLM decides)")
    if not (card.device == "cpu" or card.device.startswith("cuda")):
        errors.append(f"{where}.device={card.device!r} must be cpu, cuda or cuda:N")
    if card.lr is not None and card.lr <= 0:
        errors.append(f"{where}.lr={card.lr} must be > 0")
    if card.public_key:
        from ftis_flwr.config.node_keys import PinError, pinned_der
        try:
            pinned_der(card.public_key)
        except PinError as exc:
            errors.append(f"{where}.public_key: {exc}")
    if card.g.start < 0 or card.g.end < 0:
        errors.append(f"{where}.g: start and end must be >= 0")
    if card.lora and (card.lora_config.r < 1 or not card.lora_config.target_modules):
        errors.append(f"{where}.lora_config: r >= 1 and at least one target module are required")
    if card.torch_threads < 1:
        errors.append(f"{where}.torch_threads must be >= 1")
    return errors


def vllm_cpu_build_installed() -> bool:
    """Whether the vLLM installed here is its CPU build: the third-party ``vllm-cpu``
    distribution, or a ``vllm`` whose version carries ``+cpu`` (built from source for CPU)."""
    from importlib import metadata

    try:
        metadata.version("vllm-cpu")
        return True
    except metadata.PackageNotFoundError:
        pass
    try:
        return "+cpu" in metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return False


def raise_errors(errors: list[str], what: str = "configuration") -> None:
    """One :class:`ConfigError` listing every message, or nothing when there are none."""
    if errors:
        n = f"{len(errors)} error{'s' if len(errors) > 1 else ''}"
        raise ConfigError(f"invalid {what} ({n}):\n  - " + "\n  - ".join(errors))


def validate(cfg: ExperimentConfig, *, import_registries: bool = True) -> ExperimentConfig:
    """Reject impossible or contradictory settings, all at once, naming each key."""
    raise_errors(experiment_errors(cfg, import_registries=import_registries))
    return cfg


TRACKER_PACKAGES = {"mlflow": "mlflow", "wandb": "wandb"}
"""``report.to`` tracker -> the package it imports (what ``pip install`` installs)."""


def _find_spec(name: str):
    """``importlib.util.find_spec``: whether a package is installed, without importing it."""
    import importlib.util

    return importlib.util.find_spec(name)


def report_errors(cfg: ExperimentConfig) -> list[str]:
    """``report.to``: known trackers (:data:`ftis_flwr.config.choices.TRACKERS`) and ``none`` alone.
    Whether their packages are installed is the server's question (:func:`tracker_package_errors`):
    a node validates the same configuration and needs no tracker."""
    from ftis_flwr.config.choices import TRACKERS

    to, errors = list(cfg.report.to), []
    unknown = [n for n in to if n not in TRACKERS]
    if unknown:
        errors.append(f"report.to={to!r}: {', '.join(map(repr, unknown))} not one of {', '.join(TRACKERS)}")
    if "none" in to and len(to) > 1:
        errors.append(f"report.to={to!r}: 'none' means no tracker and cannot be combined with another")
    return errors


def tracker_package_errors(cfg: ExperimentConfig) -> list[str]:
    """Each tracker of ``report.to`` whose package is not installed on this machine (the server's:
    ``ftis-flwr check`` and ``run`` ask it before a local run starts)."""
    to, errors = list(cfg.report.to), []
    for name in dict.fromkeys(to):
        package = TRACKER_PACKAGES.get(name)
        if package and _find_spec(package) is None:
            errors.append(f"report.to={to!r}: {name!r} needs the {package} package, not installed here: "
                          f'pip install {package} (or pip install -e ".[trackers]")')
    return errors
