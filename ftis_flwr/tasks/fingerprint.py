"""A fingerprint of what a node's rewards are computed from: the task settings, the code of the
task and reward functions, and the data files' contents.

Why: every receiver recomputes the rewards of every sample it trains on from the text, so the
reward is part of the run: a peer with another reward function, another answer column or another
data file would silently train on other numbers. Each node reports its parts with its replies and
the server refuses, before round 1, a federation whose nodes disagree, naming the parts that
differ (:mod:`ftis_flwr.server.task_agreement`). Paths are not part of it (two institutions keep
the same file in different places), their contents are.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
from pathlib import Path
from typing import Any

from ftis_flwr.config.imports import is_import_path, source_of

PATH_FIELDS = ("train_path", "eval_paths", "data_files")
"""Task fields that name files: fingerprinted by content, not by name."""


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:12]


def _file(path: str) -> str:
    p = Path(path).expanduser()
    return _digest(p.read_bytes()) if p.is_file() else f"not a file: {path}"


def _code(name: str) -> str:
    src = source_of(name) if is_import_path(name) else None
    return _digest(src.read_bytes()) if src is not None and src.is_file() else "built-in"


def _short(name: str) -> str:
    """An import path without its file or module (which may sit elsewhere on each machine)."""
    return name.rpartition(":")[2] if is_import_path(name) else name


def task_parts(cfg: Any, task: Any) -> dict[str, str]:
    """Part name -> short hash: ``settings``, ``task code``, the task's own
    :meth:`~ftis_flwr.tasks.base.Task.source_parts` (e.g. ``uppercase``'s word lists),
    ``reward <name>`` for each reward, ``environment <factory>`` (its code: ``task.environment``)
    and ``data <split>`` for each file (a hub source is named, not read)."""
    settings = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in PATH_FIELDS}
    settings.update(name=_short(cfg.name), reward=_short(cfg.reward), rewards=[_short(r) for r in cfg.rewards])
    if getattr(cfg, "environment", ""):  # an episode's reward is its environment's (task.environment)
        settings["environment"] = _short(cfg.environment)
    parts = {"settings": _digest(json.dumps(settings, sort_keys=True, default=str).encode())}
    module = inspect.getmodule(type(task))
    file = getattr(module, "__file__", None)
    parts["task code"] = _digest(Path(file).read_bytes()) if file and Path(file).is_file() else "unknown"
    parts.update(task.source_parts())
    for name in list(cfg.rewards) or ([cfg.reward] if cfg.reward else []):
        parts[f"reward {_short(name)}"] = _code(name)
    if getattr(cfg, "environment", ""):
        parts[f"environment {_short(cfg.environment)}"] = _code(cfg.environment)
    files = {"train": cfg.train_path, **dict(cfg.eval_paths), **dict(cfg.data_files)}
    for split, path in files.items():
        if path:
            local = Path(path).expanduser().is_file()
            parts[f"data {split}"] = _file(path) if local else f"source {path}"
    return parts


def fingerprint(parts: dict[str, str]) -> str:
    """One short hash of all parts (equal iff every part is)."""
    return _digest(json.dumps(parts, sort_keys=True).encode())
