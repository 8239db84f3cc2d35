"""Validation of an :class:`~ftis_flwr.config.schema.ExperimentConfig`: every error at once, by key.

Three kinds of check, each declared once and all torch-free, so validating costs about a second:

- **choices**: the allowed values of each choice key, from :mod:`ftis_flwr.config.choices` (the
  maths' own from :mod:`ftis_flwr.maths.params`), checked by :func:`choice_errors`;
- **bounds**: each number's, declared on its field (``field(metadata={"gt": 0})`` in
  :mod:`ftis_flwr.config.schema` and :mod:`ftis_flwr.maths.params`), checked for every field by
  :func:`bound_errors`;
- **rules** between fields: one small named function each, returning its messages, listed in
  :data:`EXPERIMENT_RULES` and :data:`CARD_RULES` (as prime-rl names each ``model_validator``).

Every message names one key and the value given, then what is allowed
(``train.lr=0.0 must be > 0``), and all of them are reported at once.

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

import dataclasses
import importlib
import operator
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ftis_flwr.config.choices import (
    BUILTIN_LOSSES,
    CARD_CHOICES,
    CARD_DTYPES,
    EXPERIMENT_CHOICES,
    GENERATED_TASKS,
    OPEN_CHOICES,
    ROW_TASKS,
    SELECT_RULES,
    TASK_NAMES,
    TASK_PREFIXES,
    TRACKERS,
    AdvantageMode,
    CardDtype,
    Engine,
    Schedule,
    SelectRule,
    Tracker,
    WeightSync,
)
from ftis_flwr.config.device_fit import device_fit_errors
from ftis_flwr.config.imports import ImportPathError, import_object, is_import_path
from ftis_flwr.config.schema import ConfigError, ExperimentConfig, ModelCard, TaskConfig
from ftis_flwr.config.task_keys import unread_task_keys


def _get(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _choice_error(key: str, value: Any, choices: tuple) -> list[str]:
    if value in choices:
        return []
    return [f"{key}={value!r} is not one of {', '.join(choices)}"]


def _loss_registry(import_registries: bool) -> dict[str, Callable] | None:
    """The loss registry (it imports torch: only when asked, or already imported)."""
    if import_registries or "ftis_flwr.maths.loss" in sys.modules:
        from ftis_flwr.maths.loss import LOSS_REGISTRY

        return LOSS_REGISTRY
    return None


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


Checks = Sequence[Callable[[ExperimentConfig], list[str]]]
"""Checks a layer above the configuration adds (the task's own: :mod:`ftis_flwr.experiment`), run
after the configuration's, with ``import_registries``, their messages listed with the rest."""


def task_errors(cfg: ExperimentConfig, import_registries: bool = True, checks: Checks = ()) -> list[str]:
    """``task.name`` names a registered task, a prefix's task or an import path; with
    ``import_registries``, no key is set that the task does not read
    (:func:`ftis_flwr.config.task_keys.unread_task_keys`), then each of ``checks``: what only the
    task itself can check (its files, rewards, prompts, environment) is not the configuration's to
    know, so a layer above gives it (:mod:`ftis_flwr.experiment` gives the task's)."""
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
    return unread_task_keys(cfg) + [message for check in checks for message in check(cfg)]


# ------------------------------------------------------------------ declared choices and bounds

BOUNDS = {"gt": (">", operator.gt), "ge": (">=", operator.ge), "lt": ("<", operator.lt),
          "le": ("<=", operator.le)}
"""The bounds a field's ``metadata`` may declare (as pydantic's ``Field(gt=...)``), with their
symbol and test; a ``note`` beside them is added to the message (``"0 = off"``)."""


def choice_errors(obj: Any, choices: dict[str, tuple], prefix: str = "", *, import_registries: bool = True
                  ) -> list[str]:
    """Each key of ``choices`` (dotted, under ``obj``) whose value is not one of its choices (for
    an open key, :data:`~ftis_flwr.config.choices.OPEN_CHOICES`: nor what its registry takes)."""
    return [message for key, allowed in choices.items()
            for message in (open_choice_error(prefix + key, _get(obj, key), allowed, OPEN_CHOICES[key],
                                              import_registries) if key in OPEN_CHOICES
                            else _choice_error(prefix + key, _get(obj, key), allowed))]


def open_choice_error(key: str, value: Any, builtins: tuple, what: str, import_registries: bool) -> list[str]:
    """A value of an open key (:data:`~ftis_flwr.config.choices.OPEN_CHOICES`) is what its registry
    takes from a configuration: a built-in name, or an import path to a callable of one's own,
    imported here when ``import_registries`` (as the node or the server will import it). (A name
    a module of one's own registers is seen only where that module is imported, never by the
    server that checks: such a module is named by its import path instead.)"""
    if value in builtins:
        return []
    if not (isinstance(value, str) and is_import_path(value)):
        return [f"{key}={value!r} is not one of {', '.join(builtins)}, nor an import path "
                f"'<module>:<name>' / '<file.py>:<name>' to a {what} of your own"]
    if not import_registries:
        return []
    try:
        obj = import_object(value)
    except ImportPathError as exc:
        return [f"{key}={value!r}: {exc}"]
    except Exception as exc:  # the user's module: report, don't crash the validator
        return [f"{key}={value!r}: importing it raised {type(exc).__name__}: {exc}"]
    return [] if callable(obj) else [f"{key}={value!r} is a {type(obj).__name__}, not a callable {what}"]


def _allowed(meta: Any) -> str:
    """What a field's declared bounds allow: ``> 0``, ``>= 1``, ``in (0, 1]``..."""
    low = next((op for op in ("gt", "ge") if op in meta), None)
    high = next((op for op in ("lt", "le") if op in meta), None)
    if low and high:
        return f"in {'(' if low == 'gt' else '['}{meta[low]}, {meta[high]}{')' if high == 'lt' else ']'}"
    op = low or high
    return f"{BOUNDS[op][0]} {meta[op]}"


def bound_errors(obj: Any, prefix: str = "") -> list[str]:
    """Each number of the dataclass ``obj`` (and of the dataclasses it holds, not of lists) outside
    the bounds its field declares, named ``<prefix><field>``: one check for every field of
    :mod:`ftis_flwr.config.schema` and :mod:`ftis_flwr.maths.params`. NaN keeps no bound; None
    is a field's "unset" and has none."""
    errors: list[str] = []
    for f in dataclasses.fields(obj):
        value, key = getattr(obj, f.name), prefix + f.name
        if dataclasses.is_dataclass(value):
            errors += bound_errors(value, key + ".")
        elif value is None or not any(op in f.metadata for op in BOUNDS):
            continue
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            errors.append(f"{key}={value!r} is not a number")
        elif not all(test(value, f.metadata[op]) for op, (_, test) in BOUNDS.items() if op in f.metadata):
            note = f.metadata.get("note")
            errors.append(f"{key}={value!r} must be {_allowed(f.metadata)}" + (f" ({note})" if note else ""))
    return errors


# ------------------------------------------------------------- the experiment's cross-field rules
# One small function per rule, returning its messages. Each message starts with the one key it
# blames and its value (``key=value ...``: a YAML layer's reader adds that key's file and line),
# then says what is allowed.

def group_fits_the_wire(cfg: ExperimentConfig) -> list[str]:
    """A group must pass the receivers' cap on completions per group."""
    g, cap = cfg.rollout.group_size, cfg.wire.max_completions_per_group
    return [f"rollout.group_size={g} exceeds wire.max_completions_per_group={cap}: receivers would "
            "reject every group"] if g > cap else []


def completion_fits_the_wire(cfg: ExperimentConfig) -> list[str]:
    """A completion must pass the receivers' cap on tokens per completion."""
    t, cap = cfg.rollout.max_new_tokens, cfg.wire.max_tokens_per_completion
    return [f"rollout.max_new_tokens={t} exceeds wire.max_tokens_per_completion={cap}"] if t > cap else []


def payload_fits_the_wire(cfg: ExperimentConfig) -> list[str]:
    """A full payload (each prompt's whole group at full length) must pass the token cap."""
    p, g, t = cfg.rounds.prompts_per_node, cfg.rollout.group_size, cfg.rollout.max_new_tokens
    cap = cfg.wire.max_tokens_per_payload
    return [f"wire.max_tokens_per_payload={cap} must be >= rounds.prompts_per_node x rollout.group_size x "
            f"rollout.max_new_tokens = {p} x {g} x {t} = {p * g * t}: receivers would reject full "
            "payloads"] if p * g * t > cap else []


def byte_cap_holds_the_token_cap(cfg: ExperimentConfig) -> list[str]:
    """The byte cap must admit what the token cap admits (at most 8 bytes a token)."""
    w = cfg.wire
    return [f"wire.max_payload_bytes={w.max_payload_bytes} is under 8 bytes per token of "
            f"wire.max_tokens_per_payload={w.max_tokens_per_payload}: receivers would reject payloads "
            "the token cap admits"] if 8 * w.max_tokens_per_payload > w.max_payload_bytes else []


def worker_outlasts_a_round(cfg: ExperimentConfig) -> list[str]:
    """A worker's idle timeout, when set, must outlast a fast node's wait for a slow partner."""
    idle, limit = cfg.worker_idle_timeout, cfg.rounds.round_timeout
    return [f"worker_idle_timeout={idle} must be at least twice rounds.round_timeout={limit}: a fast "
            "node waits up to a round for a slow partner, and an idle worker exits and loses its "
            "node"] if 0 < idle < 2 * limit else []


def cards_are_named_once(cfg: ExperimentConfig) -> list[str]:
    """At least one model card, and no card name twice (a node's name is its name on the wire)."""
    if not cfg.nodes:
        return ["nodes=[] must list at least one model card"]
    names = [n.name for n in cfg.nodes]
    return [f"nodes[{name}].name={name!r} is given to {names.count(name)} model cards: names must be unique"
            for name in dict.fromkeys(names) if names.count(name) > 1]


def enough_cards_for_min_nodes(cfg: ExperimentConfig) -> list[str]:
    """A round cannot need more replies than there are cards."""
    m, n = cfg.rounds.min_nodes, len(cfg.nodes)
    return [f"rounds.min_nodes={m} exceeds the {n} model cards"] if m > max(n, 1) else []


def horizontal_groups_split_evenly(cfg: ExperimentConfig) -> list[str]:
    """Horizontal mode splits each group across the nodes: G must divide by their number."""
    g, n = cfg.rollout.group_size, len(cfg.nodes)
    if cfg.advantage.mode != AdvantageMode.HORIZONTAL or not n or not g % n:
        return []
    return [f"rollout.group_size={g} must be divisible by the {n} nodes with advantage.mode=horizontal, "
            "which splits each group across the nodes"]


def budget_needs_a_rule(cfg: ExperimentConfig) -> list[str]:
    """A foreign-group budget needs a rule that chooses, and a rule a budget to choose within."""
    ex = cfg.exchange
    if ex.max_foreign_groups > 0 and ex.select == SelectRule.ALL:
        return [f"exchange.max_foreign_groups={ex.max_foreign_groups} needs exchange.select to name a rule "
                f"({', '.join(r for r in SELECT_RULES if r != SelectRule.ALL)}, or an import path to a rule of your "
                "own), not 'all'"]
    if ex.max_foreign_groups == 0 and ex.select != SelectRule.ALL:
        return [f"exchange.select={ex.select!r} chooses within a budget: set exchange.max_foreign_groups "
                "> 0 (0 = all groups, nothing to choose)"]
    return []


def horizontal_takes_every_share(cfg: ExperimentConfig) -> list[str]:
    """Horizontal mode pools every node's share of a prompt: no budget may leave one out."""
    n = cfg.exchange.max_foreign_groups
    return [f"exchange.max_foreign_groups={n} must be 0 with advantage.mode=horizontal: horizontal pools "
            "every node's share of a prompt into one group, so no share may be left out"
            ] if n > 0 and cfg.advantage.mode == AdvantageMode.HORIZONTAL else []


def async_needs_vertical(cfg: ExperimentConfig) -> list[str]:
    """Asynchronous rounds never wait for every node, which horizontal mode's pooled groups need."""
    schedule = cfg.exchange.schedule
    return [f"exchange.schedule={schedule!r} must be 'sync' with advantage.mode=horizontal: horizontal "
            "pools every node's share of one prompt into one group, so every round waits for every node; "
            "use vertical (or schedule=sync)"
            ] if schedule == Schedule.ASYNC and cfg.advantage.mode == AdvantageMode.HORIZONTAL else []


def tiny_models_know_arithmetic(cfg: ExperimentConfig) -> list[str]:
    """A built-in task for real models (words, GSM8K, MATH) cannot run on the tiny models."""
    name = cfg.task.name
    real = name in TASK_NAMES and name not in (*GENERATED_TASKS, "dataset")
    return [f"task.name={name!r} needs real models: the tiny character-level models only know the "
            "arithmetic task"] if real and any(c.source == "tiny" for c in cfg.nodes) else []


def vllm_fits_its_gpu(cfg: ExperimentConfig) -> list[str]:
    """A vLLM card on a GPU this machine shows must fit it: the learner and the engine (weights, the
    round's KV cache, vLLM's runtime) with a margin (:func:`ftis_flwr.config.device_fit.device_fit_errors`;
    torch is imported only where an NVIDIA driver is present). No GPU here: nothing (``ftis-flwr plan``
    shows the figures); a card with other errors is left to them."""
    return [m for card in cfg.nodes if card.engine == Engine.VLLM and not card_errors(card, import_registries=False)
            for m in device_fit_errors(card, cfg, f"nodes[{card.name}]")]


EPISODE_KEYS = ("max_turns", "tool_timeout", "episode_tokens", "tool_format")
"""``task.*`` keys read only with ``task.environment`` set."""


def environment_reads_dataset_rows(cfg: ExperimentConfig) -> list[str]:
    """``task.environment`` takes each row's columns in ``reset(**row)``: only the tasks of ``ROW_TASKS``
    have rows with columns (other generated tasks' problems have none); the episode keys mean nothing
    without an environment."""
    task = cfg.task
    if not task.environment:
        defaults = TaskConfig()
        return [f"task.{key}={getattr(task, key)!r} is read only with task.environment set (episodes): set "
                "task.environment or leave it out"
                for key in EPISODE_KEYS if getattr(task, key) != getattr(defaults, key)]
    errors = []
    if task.name not in ROW_TASKS:
        errors.append(f"task.environment={task.environment!r} needs a task with rows (task.name "
                      f"{' or '.join(map(repr, ROW_TASKS))}: their columns go to reset(**row)); "
                      f"task.name={task.name!r} has no such rows")
    if cfg.advantage.mode == AdvantageMode.HORIZONTAL:
        errors.append(f"task.environment={task.environment!r} needs advantage.mode 'vertical' or 'alone': "
                      "horizontal mode pools every node's share of a group, and a share its receivers cannot replay "
                      "(another tokenizer, an environment that is not deterministic) would leave every group broken")
    return errors


def episodes_fit_the_wire(cfg: ExperimentConfig) -> list[str]:
    """An episode's whole budget must pass the receivers' cap on tokens per completion."""
    if not cfg.task.environment:
        return []
    budget, cap = cfg.episode_budget(), cfg.wire.max_tokens_per_completion
    return [f"task.episode_tokens={cfg.task.episode_tokens} (an episode of {budget} tokens) exceeds "
            f"wire.max_tokens_per_completion={cap}"] if budget > cap else []


EXPERIMENT_RULES: tuple[Callable[[ExperimentConfig], list[str]], ...] = (
    group_fits_the_wire, completion_fits_the_wire, payload_fits_the_wire, byte_cap_holds_the_token_cap,
    worker_outlasts_a_round, cards_are_named_once, enough_cards_for_min_nodes,
    horizontal_groups_split_evenly, budget_needs_a_rule, horizontal_takes_every_share,
    async_needs_vertical, tiny_models_know_arithmetic, vllm_fits_its_gpu, environment_reads_dataset_rows,
    episodes_fit_the_wire)
"""The experiment's cross-field rules, in the order their messages are listed."""


def experiment_errors(cfg: ExperimentConfig, *, import_registries: bool = True, checks: Checks = ()) -> list[str]:
    """Every problem of ``cfg``, one message per problem, each naming its key and value: the loss
    method, the declared choices and bounds, each of :data:`EXPERIMENT_RULES`, each card
    (:func:`card_errors`), the task and the trackers, then ``checks`` (with ``import_registries``)."""
    method_error = resolve_loss_method(cfg.loss.method, import_registries)
    errors = [method_error] if method_error else []
    errors += choice_errors(cfg, EXPERIMENT_CHOICES, import_registries=import_registries) + bound_errors(cfg)
    for rule in EXPERIMENT_RULES:
        errors += rule(cfg)
    for card in cfg.nodes:
        errors += card_errors(card, import_registries=import_registries)
    return errors + task_errors(cfg, import_registries, checks) + report_errors(cfg)


# ------------------------------------------------------------------------ a model card's rules
# ``rule(card, where)``, ``where`` being ``nodes[<name>]``; messages as the experiment's.

def dtypes_are_known(card: ModelCard, where: str) -> list[str]:
    """``dtype`` is one of CARD_DTYPES; so is ``compute_dtype`` when set ("" = ``dtype``)."""
    errors = _choice_error(f"{where}.dtype", card.dtype, CARD_DTYPES)
    if card.compute_dtype:
        errors += _choice_error(f"{where}.compute_dtype", card.compute_dtype, CARD_DTYPES)
    return errors


def warmstart_ops_are_plus_minus(card: ModelCard, where: str) -> list[str]:
    """The tiny models' warm-start operations are '+' and '-'."""
    ops = card.warmstart_ops
    return [] if ops and not set(ops) - {"+", "-"} else [
        f"{where}.warmstart_ops={ops!r} must use '+' and/or '-'"]


def vllm_has_a_device(card: ModelCard, where: str) -> list[str]:
    """vLLM runs on a cuda device, or on the CPU with its CPU build only."""
    if card.engine == Engine.VLLM and card.device == "cpu" and not vllm_cpu_build_installed():
        return [f"{where}.engine=vllm needs a cuda device, got device={card.device!r}, unless vLLM's CPU "
                "build is installed here (vllm-cpu: run from the environment scripts/vllm_cpu_env.sh builds)"]
    return []


def vllm_dtype_is_known(card: ModelCard, where: str) -> list[str]:
    """``vllm_dtype`` is "" (the card's own, :func:`ftis_flwr.config.engine_memory.engine_dtype`) or
    one of CARD_DTYPES."""
    return _choice_error(f"{where}.vllm_dtype", card.vllm_dtype, CARD_DTYPES) if card.vllm_dtype else []


def vllm_lora_samples_in_half(card: ModelCard, where: str) -> list[str]:
    """A LoRA card on vLLM on a GPU samples in float16 or bfloat16: vLLM's LoRA kernels assert it."""
    on_gpu = card.engine == Engine.VLLM and card.device.startswith("cuda")
    if on_gpu and card.lora and card.vllm_dtype == CardDtype.FLOAT32:
        return [f"{where}.vllm_dtype='float32' with lora: true on {card.device}: vLLM's GPU LoRA kernels take "
                "float16 or bfloat16 only (vllm/lora/ops/triton_ops/lora_shrink_op.py: assert inputs.dtype in "
                "[torch.float16, torch.bfloat16]): set vllm_dtype to bfloat16, or leave it empty (a float32 LoRA "
                "card on a GPU then samples in bfloat16; the learner keeps its dtype)"]
    return []


def ipc_sync_needs_a_full_gpu_card(card: ModelCard, where: str) -> list[str]:
    """``vllm_weight_sync: ipc`` hands vLLM the weights' CUDA memory: a GPU, and every weight."""
    if card.engine != Engine.VLLM or card.vllm_weight_sync != WeightSync.IPC:
        return []
    key, errors = f"{where}.vllm_weight_sync='ipc'", []
    if not card.device.startswith("cuda"):
        errors.append(f"{key} needs a cuda device, got device={card.device!r}: it shares the weights' GPU "
                      "memory with vLLM's worker through CUDA IPC; use vllm_weight_sync=file")
    if card.lora:
        errors.append(f"{key} is for full fine-tuning: a LoRA node (lora: true) sends only its adapter, as a "
                      "file vLLM loads; use vllm_weight_sync=file")
    return errors


def device_is_cpu_or_cuda(card: ModelCard, where: str) -> list[str]:
    """A device is cpu, cuda or cuda:N."""
    ok = card.device == "cpu" or card.device.startswith("cuda")
    return [] if ok else [f"{where}.device={card.device!r} must be cpu, cuda or cuda:N"]


def public_key_reads(card: ModelCard, where: str) -> list[str]:
    """A pinned SuperNode key reads as an OpenSSH or PEM public key."""
    if not card.public_key:
        return []
    from ftis_flwr.config.node_keys import PinError, pinned_der

    try:
        pinned_der(card.public_key)
    except PinError as exc:
        return [f"{where}.public_key: {exc}"]
    return []


def lora_adapts_a_module(card: ModelCard, where: str) -> list[str]:
    """A LoRA node adapts at least one module."""
    targets = card.lora_config.target_modules
    return [f"{where}.lora_config.target_modules={targets!r} must name at least one module when lora "
            "is true"] if card.lora and not targets else []


def _rank_errors(card: ModelCard, where: str) -> list[str]:
    """A sharded node (``ranks`` > 1): its devices and engine must be able to hold N ranks
    (``ranks`` >= 1 is the field's declared bound)."""
    if card.ranks <= 1:
        return []
    errors = []
    if card.engine == Engine.VLLM:  # refused on every device: nothing here could test it
        errors.append(f"{where}.ranks={card.ranks} with engine=vllm is not supported yet (a tensor-parallel "
                      "vLLM engine per node is not built: it needs a multi-GPU machine with vLLM to be tested "
                      "on): use engine=hf with ranks, or engine=vllm with ranks=1")
    if card.device.startswith("cuda:"):
        listed = [d for d in card.device[len("cuda:"):].split(",") if d.strip()]
        if len(listed) != card.ranks:
            errors.append(f"{where}.device={card.device!r} lists {len(listed)} GPU(s) for "
                          f"ranks={card.ranks}: give one per rank (e.g. cuda:0,1) or device=cuda "
                          "(then ranks take cuda:0..N-1)")
    return errors


CARD_RULES: tuple[Callable[[ModelCard, str], list[str]], ...] = (
    dtypes_are_known, warmstart_ops_are_plus_minus, vllm_has_a_device, vllm_dtype_is_known,
    vllm_lora_samples_in_half, ipc_sync_needs_a_full_gpu_card, device_is_cpu_or_cuda,
    public_key_reads, lora_adapts_a_module, _rank_errors)
"""A model card's rules beyond its declared choices and bounds, in the order their messages are listed."""


def card_errors(card: ModelCard, *, import_registries: bool = True) -> list[str]:
    """Every problem of one model card, each named ``nodes[<name>].<field>``: its declared choices
    and bounds, then each of :data:`CARD_RULES`."""
    where = f"nodes[{card.name}]"
    errors = choice_errors(card, CARD_CHOICES, f"{where}.", import_registries=import_registries) + \
        bound_errors(card, f"{where}.")
    for rule in CARD_RULES:
        errors += rule(card, where)
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


def validate(cfg: ExperimentConfig, *, import_registries: bool = True, checks: Checks = ()) -> ExperimentConfig:
    """Reject impossible or contradictory settings, all at once, naming each key."""
    raise_errors(experiment_errors(cfg, import_registries=import_registries, checks=checks))
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
    to, errors = list(cfg.report.to), []
    unknown = [n for n in to if n not in TRACKERS]
    if unknown:
        errors.append(f"report.to={to!r}: {', '.join(map(repr, unknown))} not one of {', '.join(TRACKERS)}")
    if Tracker.NONE in to and len(to) > 1:
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
