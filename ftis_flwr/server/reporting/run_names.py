"""What a run is called: its folder's name, its title (the plot's, the summary's, the first
line of the server's stream) and the words for its task.

Why apart: every output names the run the same way, from its configuration alone, so two runs
of one preset on different tasks are told apart by their folders and their plots; a run named
with ``report.run_name`` carries that name instead of the preset's.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ftis_flwr.config.schema import to_dict

LOADERS = ("json", "csv", "parquet", "text", "arrow", "webdataset", "imagefolder")
"""``task.dataset`` values that name a file format of ``datasets.load_dataset``, not a data set:
the task is then named after its train file."""
GENERIC_STEMS = ("train", "training", "data", "dataset", "rows", "all")
"""Train-file names that say nothing of the task: the task is named after the file's folder."""
MAX_PART = 48
"""Characters a name's part keeps in a folder name."""


def _safe(text: str) -> str:
    """Letters, digits, ``.`` and ``-`` kept, every other run of characters one ``_``."""
    return re.sub(r"[^A-Za-z0-9.-]+", "_", str(text)).strip("_")[:MAX_PART].strip("_")


def task_label(task: Mapping[str, Any]) -> str:
    """A task's name in words a folder can hold: the registered name (``arithmetic``), a
    reasoning-gym generator's (``chain_sum``), a factory's (``my_task`` of ``tasks.py:my_task``),
    or, for ``task.name=dataset``, the data set's: its hub id or folder's last part, else its
    train file's name (its folder's when the file is called ``train.jsonl`` or alike)."""
    name = str(task.get("name") or "")
    if name == "dataset":
        dataset = str(task.get("dataset") or "").rstrip("/")
        if dataset and dataset not in LOADERS:
            return Path(dataset).name or "dataset"
        train = Path(str((task.get("data_files") or {}).get("train") or ""))
        if not train.name:
            return "dataset"
        stem = train.name.split(".")[0]
        return (train.parent.name or stem) if stem.lower() in GENERIC_STEMS else stem
    if ":" in name:
        target, _, attr = name.rpartition(":")
        if target == "reasoning-gym":
            return attr
        return attr or Path(target).stem
    return name or "task"


def _config(experiment: Any) -> Mapping[str, Any]:
    return experiment if isinstance(experiment, Mapping) else to_dict(experiment)


def run_name(experiment: Any) -> str:
    """The run's folder name: ``<date>-<time>-<report.run_name>-<4 hex>``, or without a run name
    ``<date>-<time>-<task>-<preset>-<mode>-<method>-<4 hex>``; runs that differ in task, method or
    mode are told apart by their folders alone (the ServerApp's and a strategy's default name).

    Args:
        experiment: The run's configuration (an ExperimentConfig, or its dict).

    Returns:
        A name of letters, digits, ``.``, ``-`` and ``_``.
    """
    cfg = _config(experiment)
    own = _safe((cfg.get("report") or {}).get("run_name") or "")
    parts = [own] if own else [task_label(cfg.get("task") or {}), Path(str(cfg.get("preset") or "")).stem or "run",
                               (cfg.get("advantage") or {}).get("mode", ""), (cfg.get("loss") or {}).get("method", "")]
    safe = "-".join(p for p in (_safe(x) for x in parts) if p)
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{safe}-{secrets.token_hex(2)}"


def run_title(config: Mapping[str, Any]) -> str:
    """``"<task> on <preset>: <mode> <method>"`` from a run's config, e.g. ``"arithmetic on cpu-pair:
    vertical f-tis"``; a run named with ``report.run_name`` is ``"<run name>: <task> on ..."``."""
    preset = Path(str(config.get("preset") or "")).stem or "run"
    mode = (config.get("advantage") or {}).get("mode", "")
    method = (config.get("loss") or {}).get("method", "")
    own = str((config.get("report") or {}).get("run_name") or "")
    what = f"{task_label(config.get('task') or {})} on {preset}: {mode} {method}".strip().rstrip(":")
    return f"{own}: {what}" if own else what


def rounds_said(num_rounds: int | None, rows: list[dict], steps: bool = False, failed: bool = False) -> str:
    """How many rounds a run had, as the title and the summary both say it: ``"40 rounds"`` (a run
    of R rounds logs rounds 0..R: round 0 only generates and evaluates the starting models),
    ``"failed, last round logged 3 of 40"``, ``"stopped after round 12 of 40"``, or ``"57 steps"``."""
    if steps:
        said = f"{len(rows)} step{'s' * (len(rows) != 1)}"
        return f"failed after {said}" if failed else said
    if num_rounds is None:
        return f"{len(rows)} round{'s' * (len(rows) != 1)} logged"
    last = rows[-1]["round"] if rows else None
    if failed:
        return f"failed before round 0 of {num_rounds}" if last is None else \
            f"failed, last round logged {last} of {num_rounds}"
    if last is None or last < num_rounds:
        return f"stopped after round {last} of {num_rounds}" if last is not None else f"0 of {num_rounds} rounds"
    return f"{num_rounds} round{'s' * (num_rounds != 1)}"
