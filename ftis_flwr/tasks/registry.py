"""Where ``task.name`` finds its task: one registry for the built-in names, one for name prefixes
(``reasoning-gym:<generator>``), and import paths for everything else.

Why a registry: a lab brings its own task without editing the package (``"<module>:<factory>"``
or ``"<file.py>:<factory>"``, a callable that takes the :class:`~ftis_flwr.config.schema.TaskConfig`
and returns a :class:`~ftis_flwr.tasks.base.Task`), and a built-in task is one registration, not a
branch of an if-chain. A second, different registration of a name is refused (as
:func:`ftis_flwr.maths.loss.register_loss` does).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ftis_flwr.config.imports import ImportPathError, import_object, is_import_path, register_unique
from ftis_flwr.tasks.base import Task

if TYPE_CHECKING:
    from ftis_flwr.config.schema import TaskConfig

TaskFactory = Callable[["TaskConfig"], Task]
PrefixFactory = Callable[["TaskConfig", str], Task]

_TASKS: dict[str, TaskFactory] = {}
_PREFIXES: dict[str, PrefixFactory] = {}
TASK_REGISTRY = _TASKS
"""Task name -> factory (read it; register with :func:`register_task`), as ``LOSS_REGISTRY`` is for
losses: the names ``config.choices.TASK_NAMES`` lists (a test checks)."""
TASK_PREFIX_REGISTRY = _PREFIXES
"""Name prefix -> factory: the prefixes ``config.choices.TASK_PREFIXES`` lists."""


class TaskError(ValueError):
    """A ``task.name`` that names no task, or a factory that builds none; the message says which."""


def register_task(name: str, factory: TaskFactory) -> TaskFactory:
    """Make ``task.name=<name>`` build ``factory(cfg)``; a second, different factory is refused."""
    return register_unique(_TASKS, name, factory, "task", TaskError)


def register_task_prefix(prefix: str, factory: PrefixFactory) -> PrefixFactory:
    """Make ``task.name=<prefix>:<rest>`` build ``factory(cfg, rest)`` (e.g. a generator's name)."""
    return register_unique(_PREFIXES, prefix, factory, "task prefix", TaskError)


def task_names() -> tuple[str, ...]:
    """The registered names, then ``<prefix>:…`` for each prefix (what an error lists)."""
    return (*_TASKS, *(f"{p}:<name>" for p in _PREFIXES))


def make_task(cfg: TaskConfig) -> Task:
    """Build the task ``cfg.name`` names; nothing is read until problems are first asked for."""
    name = cfg.name
    if name in _TASKS:
        task = _TASKS[name](cfg)
    elif name.partition(":")[0] in _PREFIXES and name.partition(":")[2]:
        prefix, _, rest = name.partition(":")
        task = _PREFIXES[prefix](cfg, rest)
    elif is_import_path(name):
        try:
            factory = import_object(name)
        except ImportPathError as exc:
            raise TaskError(f"task.name={name!r}: {exc}") from None
        task = factory(cfg)
        if not isinstance(task, Task):
            raise TaskError(f"task.name={name!r}: the factory returned {type(task).__name__}, not a "
                            "ftis_flwr.tasks.base.Task")
    else:
        raise TaskError(f"unknown task {name!r}; valid tasks: {', '.join(task_names())}, or "
                        "'<module>:<factory>' / '<file.py>:<factory>'")
    if cfg.reward or cfg.rewards:
        from ftis_flwr.tasks.reward_funcs import RewardSet

        task.reward_set = RewardSet.build(list(cfg.rewards) or [cfg.reward], cfg.reward_weights)
    return task
