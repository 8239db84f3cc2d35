"""What ``ftis-flwr check`` asks of a task before anything starts: that ``task.name`` builds a
task, that its data files exist and hold the named columns and rows, and that every reward
function can take the rows' columns. Each problem is one message naming the key (the validator
collects them with the rest of the configuration's, :mod:`ftis_flwr.config.validation`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ftis_flwr.config.imports import ImportPathError
from ftis_flwr.tasks.base import Task
from ftis_flwr.tasks.dataset import DatasetError, DatasetTask
from ftis_flwr.tasks.registry import TaskError, make_task
from ftis_flwr.tasks.reward_funcs import RewardError, signature_fault

if TYPE_CHECKING:
    from ftis_flwr.config.schema import TaskConfig

BUILTIN_CHECKED = ("arithmetic", "arithmetic-heldout", "basic-math", "basic-math-20")
"""Built-in generated tasks: nothing to read, so a check builds nothing for them."""
TRL_ONLY = ("completion_ids", "trainer_state", "log_extra", "log_metric")
"""Keyword arguments TRL's GRPOTrainer gives a reward function that a node does not (it scores the
decoded text, outside any trainer). ``environments`` it gives only with ``task.environment``, as
TRL gives it only with ``environment_factory``."""
_BUILT: dict[str, Task] = {}
"""The last task :func:`task_errors` built without a problem, by its settings' ``repr``: the reward
probe (:mod:`ftis_flwr.tasks.reward_probe`) reuses it, its train split already generated or read."""


def _named(cfg: TaskConfig, exc: Exception, what: str) -> str:
    """``exc``'s message as it is when it names its key (``task...``), else prefixed with task.name."""
    return str(exc) if str(exc).startswith("task") else f"task.name={cfg.name!r}: {what}{exc}"


def task_errors(cfg: TaskConfig) -> list[str]:
    """Every problem with ``cfg`` that shows before a run, each naming its key; [] when none."""
    if not cfg.partial_credit and not cfg.name.startswith("reasoning-gym:"):
        return [f"task.partial-credit=false applies to reasoning-gym:<generator> tasks (their checkers' "
                f"partial credit); task {cfg.name!r} scores with its own reward: leave it true"]
    env_errors = environment_errors(cfg)
    if cfg.name in BUILTIN_CHECKED and not (cfg.reward or cfg.rewards):
        return env_errors
    if cfg.name in ("gsm8k", "math500") and not (cfg.reward or cfg.rewards):
        return []  # their files are checked when read (a hub source needs the network)
    try:
        task = make_task(cfg)
    except (TaskError, DatasetError, RewardError, ImportPathError) as exc:
        return [_named(cfg, exc, ""), *env_errors]
    except Exception as exc:  # a user's factory failed: named, never a traceback
        return [f"task.name={cfg.name!r}: building the task raised {type(exc).__name__}: {exc}", *env_errors]
    errors, columns = list(env_errors), None
    if not isinstance(task, DatasetTask):  # generated (a reward set on a built-in one too) or the user's
        try:
            columns = [*task.problems(task.train_split)[0].columns, "answer"]  # the gold, as RewardSet passes it
        except Exception as exc:
            errors.append(_named(cfg, exc, f"its train split cannot be built: {type(exc).__name__}: "))
    if isinstance(task, DatasetTask):
        for split in task.splits:
            try:
                problems = task.problems(split)
            except (DatasetError, ValueError, FileNotFoundError) as exc:
                if str(exc) not in errors:  # a source's fault (an unreachable hub id) once, not per split
                    errors.append(str(exc))
                continue
            if columns is None:  # the gold goes to a reward as ``answer`` where the answer column holds it
                columns = list(dict.fromkeys([*problems[0].columns, *(["answer"] if task.answer_field in
                                                                         problems[0].columns else [])]))
    if task.reward_set is not None and columns is not None:
        extra = ["environments"] if cfg.environment else []
        for name, fn in zip(task.reward_set.names, task.reward_set.fns):
            why = signature_fault(fn, columns, extra)
            if why:
                key = "task.rewards" if cfg.rewards else "task.reward"
                asked = why.split(", which")[0]
                trl = [n for n in TRL_ONLY if repr(n) in asked]
                note = f" ({', '.join(trl)}: TRL's GRPOTrainer passes {'them' if len(trl) > 1 else 'it'}, this " \
                    "project does not: docs/your-own-task.md)" if trl else ""
                if "'environments'" in asked and not cfg.environment:
                    note += " (environments: given with task.environment, each episode's instance, as TRL gives it " \
                        "with environment_factory)"
                errors.append(f"{key}={name!r} cannot be called with these rows: {why}{note}")
    _BUILT.clear()
    if not errors:
        _BUILT[repr(cfg)] = task
    return errors


def environment_errors(cfg: TaskConfig) -> list[str]:
    """``task.environment`` loaded as a node loads it (:func:`ftis_flwr.tasks.environment.load_environment`:
    the import path, one instance built, TRL's contract and every tool's schema checked); its
    message under the key, [] when it loads or none is set."""
    if not cfg.environment:
        return []
    from ftis_flwr.tasks.environment import EnvironmentContractError, load_environment

    _LOADED.clear()
    try:
        _LOADED[_env_key(cfg)] = load_environment(cfg.environment, tool_timeout=cfg.tool_timeout)
    except (EnvironmentContractError, ValueError) as exc:
        return [f"task.environment={cfg.environment!r}: {exc}"]
    return []


_LOADED: dict[tuple, Any] = {}
"""The environment :func:`environment_errors` loaded last, by its settings: the check's later steps
(a reset on the first row, the reward probe) reuse it rather than import and build it again."""


def _env_key(cfg: TaskConfig) -> tuple:
    from ftis_flwr.config.imports import source_of

    try:
        source = source_of(cfg.environment)
        stamp = source.stat().st_mtime_ns if source and source.is_file() else None
    except Exception:  # noqa: BLE001 - a path that does not resolve: no stamp (loading it names why)
        stamp = None
    return cfg.environment, cfg.tool_timeout, stamp


def loaded_environment(cfg: TaskConfig) -> Any:
    """The environment :func:`environment_errors` loaded for these settings, else loaded now."""
    from ftis_flwr.tasks.environment import load_environment

    return _LOADED.get(_env_key(cfg)) or load_environment(cfg.environment, tool_timeout=cfg.tool_timeout)


def built_task(cfg: TaskConfig) -> Task:
    """The task :func:`task_errors` built for these settings, else a new one."""
    return _BUILT.get(repr(cfg)) or make_task(cfg)
