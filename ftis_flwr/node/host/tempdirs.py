"""Temporary folders named after their owner's pid (``<tmp>/<prefix><pid>-<random>``), so that a
later process deletes those of one killed with SIGKILL, which cannot clean up after itself: the
vLLM engine's weights (1 GB or more) and a node worker's private socket folder."""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

from ftis_flwr.node.host.processes import _pid_alive

log = logging.getLogger(__name__)

__all__ = ["VLLM_PREFIX", "WORKER_PREFIX", "make_owned_tempdir", "remove_stale_tempdirs"]

VLLM_PREFIX = "ftis-vllm-"
"""The vLLM engine's folder: the model's weights as vLLM loads them (1 GB or more)."""
WORKER_PREFIX = "ftis-worker-"
"""A node worker's private (0700) folder holding its Unix socket."""


def make_owned_tempdir(prefix: str) -> Path:
    """A new private (0700) temporary folder ``<tmp>/<prefix><this pid>-<random>``; first deletes
    the folders with the same prefix whose owners are gone (``remove_stale_tempdirs``)."""
    for folder in remove_stale_tempdirs(prefix):
        log.info("deleted %s, left by a process that is gone", folder)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-"))


def remove_stale_tempdirs(prefix: str, root: str | Path | None = None) -> list[Path]:
    """Delete the ``<prefix><pid>-*`` folders in ``root`` (default: the temp dir) that belong to
    this user and whose pid no longer runs: those left by a process killed before it could remove
    them. A name without a pid is left alone. Returns what it deleted."""
    root = Path(root) if root is not None else Path(tempfile.gettempdir())
    removed = []
    for folder in root.glob(f"{prefix}*"):
        m = re.match(rf"{re.escape(prefix)}(\d+)-", folder.name)
        try:
            mine = folder.is_dir() and folder.stat().st_uid == os.getuid()
        except OSError:
            continue
        if m is None or not mine or _pid_alive(int(m.group(1))):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed
