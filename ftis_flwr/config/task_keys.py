"""Which task reads which ``task.*`` key: a key set for another task is an error, never ignored.

Why: ``task.dataset`` and ``task.data-files.*`` without ``task.name='dataset'`` used to pass the
check and train the built-in arithmetic task in silence (a reward reading the user's columns then
died at round 0 with ``KeyError``). Each key below is read only by the tasks listed; a value other
than the field's default, with any other ``task.name``, is reported once per task that would read
it, naming each key, its value and the ``task.name`` to set.

A preset's own settings for its own task (``cpu-smollm2`` sets ``shots: 1`` for ``basic-math``)
are not the user's: with another ``task.name`` they are left out, not reported. ``task.name`` as
an import path (``<module>:<factory>``) takes the whole ``TaskConfig``, so every key may be read
there. ``task.partial-credit`` has its own rule in :mod:`ftis_flwr.tasks.checks`; ``seed`` and the
rewards are read by every task.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ftis_flwr.config.choices import TASK_NAMES, TASK_PREFIXES
from ftis_flwr.config.schema import ExperimentConfig, TaskConfig

RG = "reasoning-gym:<generator>"
CHAT_TASKS = ("basic-math", "basic-math-20", "uppercase", "gsm8k", "math500", RG)
READERS: dict[str, tuple[str, ...]] = {
    "dataset": ("dataset",), "data_files": ("dataset",), "prompt_field": ("dataset",),
    "prompt_template": ("dataset",), "answer_field": ("dataset",), "chat": ("dataset",),
    "train_path": ("gsm8k", "math500"), "eval_paths": ("gsm8k", "math500"),
    "shots": CHAT_TASKS, "size": (RG,),
}
"""``TaskConfig`` field -> the tasks that read it (``<prefix>:<name>`` for a prefix's tasks)."""
FIXES = {("dataset",): "set task.name='dataset' to train on these rows",
         ("gsm8k", "math500"): "set task.name='gsm8k' or 'math500' to read these files",
         (RG,): "set task.name='reasoning-gym:<generator>'"}
"""What to set, by the tasks that read a key; otherwise: one of them."""


def _kind(name: str) -> str | None:
    """The task kind ``name`` is, as :data:`READERS` names it; None for a user's factory."""
    if name in TASK_NAMES:
        return name
    prefix, sep, rest = name.partition(":")
    return f"{prefix}:<generator>" if sep and rest and prefix in TASK_PREFIXES else None


def _preset_task(preset: str) -> dict[str, Any]:
    """The ``task:`` section of the preset ``preset`` names ({} when it cannot be read)."""
    if not preset:
        return {}
    try:
        import yaml

        from ftis_flwr.config.preset_files import resolve_preset

        section = (yaml.safe_load(resolve_preset(preset).read_text()) or {}).get("task") or {}
    except Exception:  # a preset that cannot be read here: every set key counts as the user's
        return {}
    return {str(k).replace("-", "_"): v for k, v in section.items()} if isinstance(section, dict) else {}


def _shown(key: str, value: Any) -> list[str]:
    """``task.<key>=<value>`` as the user wrote it; a dict one entry per split."""
    if isinstance(value, dict):
        return [f"task.{key}.{split}={v!r}" for split, v in value.items()]
    return [f"task.{key}={value!r}"]


def unread_task_keys(cfg: ExperimentConfig) -> list[str]:
    """One message per task that would read keys set here that ``task.name`` does not read."""
    task, kind = cfg.task, _kind(cfg.task.name)
    if kind is None:
        return []
    defaults = {f.name: (f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default)
                for f in dataclasses.fields(TaskConfig)}
    preset = _preset_task(cfg.preset)
    preset_kind = _kind(str(preset.get("name", "")))
    by_readers: dict[tuple[str, ...], list[str]] = {}
    for key, readers in READERS.items():
        value = getattr(task, key)
        if kind in readers or value == defaults[key]:
            continue
        if preset_kind in readers and key in preset and preset[key] == value:
            continue  # the preset's setting for its own task, not the user's
        by_readers.setdefault(readers, []).extend(_shown(key, value))
    out = []
    for readers, shown in by_readers.items():
        which = "it" if len(shown) == 1 else "them"
        who = " or ".join(repr(r) for r in readers)
        fix = FIXES.get(readers) or f"set task.name to one of {', '.join(readers)}"
        out.append(f"{', '.join(shown)}: read only by task.name={who}; task.name={task.name!r} does not read "
                   f"{which}, so the run would train {task.name!r} and ignore {which}: {fix}, or leave {which} out")
    return out
