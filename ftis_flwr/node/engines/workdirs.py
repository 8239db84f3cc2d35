"""The vLLM engine's temporary folders: named after their owner's pid, so that a later engine
deletes the folder (1 GB or more: the model's weights) of one killed without ``close()``."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

from ftis_flwr.node.processes import _pid_alive

__all__ = ["WORKDIR_PREFIX", "remove_stale_workdirs"]

WORKDIR_PREFIX = "ftis-vllm-"
"""An engine's own temporary folder is ``<tmp>/ftis-vllm-<pid>-<random>``: the owner's pid in the
name lets a later engine find and delete the folder of one that was killed (1 GB or more each)."""


def remove_stale_workdirs(root: str | Path | None = None) -> list[Path]:
    """Delete the temporary folders that engines killed without ``close()`` left behind (a node
    worker stopped with SIGKILL, or a crash): ``ftis-vllm-<pid>-*`` folders in ``root`` (default:
    the temp dir) that belong to this user and whose pid no longer runs. Returns what it deleted."""
    root = Path(root) if root is not None else Path(tempfile.gettempdir())
    removed = []
    for folder in root.glob(f"{WORKDIR_PREFIX}*"):
        m = re.match(rf"{re.escape(WORKDIR_PREFIX)}(\d+)-", folder.name)
        try:
            mine = folder.is_dir() and folder.stat().st_uid == os.getuid()
        except OSError:
            continue
        if m is None or not mine or _pid_alive(int(m.group(1))):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed
