"""Finding and stopping node workers: their folders, whether a pid is still one of them, and
killing a worker with everything it started (a vLLM engine core, a reward judge). Split from
:mod:`ftis_flwr.node.host.worker` so that the ClientApp, the simulation's cleanup and the tests can stop
workers without the worker's server code."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path


def safe_name(text: str) -> str:
    """A single path component from server-sent text: letters, digits, - _ . only, never "."
    or ".." (a run name or node name can never climb out of the folder it is put in)."""
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in str(text))[:128]
    return safe if safe.strip(".") else "_" + safe


def worker_dir(cache_dir: Path, run_key: str, node: str) -> Path:
    return Path(cache_dir) / "workers" / safe_name(run_key) / safe_name(node)


def _pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie (dead, not yet reaped by the ClientApp process that started
    it) does not, and its empty command line must not make it look like some other program."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _is_worker(pid: int) -> bool:
    """Whether live ``pid`` runs this module (a pid reused by another program is never killed)."""
    try:
        return b"ftis_flwr.node.host.worker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc (not Linux): trust the pid we wrote


def kill_worker_group(pid: int) -> None:
    """SIGKILL a worker and everything it started (a vLLM engine core, a reward judge).

    A worker is started in its own session, so its process group id is its pid and its children
    share it; killing only the pid would orphan them (a vLLM ``EngineCore`` holds GBs). If the
    worker is already dead, its group is killed all the same: Linux keeps a pid unused while a
    process group of that id exists, so a live group with the dead worker's id is its orphans."""
    if _pid_alive(pid) and not _is_worker(pid):
        return
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def worker_runs(cache_dir: Path) -> set[str]:
    """The run folders under ``<cache>/workers`` now (see :func:`kill_workers_of_new_runs`)."""
    return {p.name for p in (Path(cache_dir) / "workers").glob("*") if p.is_dir()}


def kill_workers_of_new_runs(cache_dir: Path, before: set[str]) -> int:
    """SIGKILL (with their process groups) the workers of the runs started since ``before`` was
    taken with :func:`worker_runs`: for a run whose name is not known to the caller (a
    deployment's ServerApp names it). A concurrent run that started after ``before`` is killed
    too: when the run name is known, use :func:`kill_workers_of_run`. Returns how many workers
    were signalled."""
    return _kill_listed([a for a in (Path(cache_dir) / "workers").glob("*/*/address.json")
                         if a.parent.parent.name not in before])


def kill_workers_of_run(cache_dir: Path, run_name: str) -> int:
    """SIGKILL (with their process groups) the workers of run ``run_name`` under ``cache_dir``:
    what a finished or failed simulation left, nothing of any other run sharing the cache (a
    concurrent run that started later included, which :func:`kill_workers_of_new_runs` cannot
    tell apart). Returns how many workers were signalled."""
    return _kill_listed(list((Path(cache_dir) / "workers" / run_name).glob("*/address.json")))


def _kill_listed(addresses: list[Path], wait: float = 10.0) -> int:
    """Kill the worker group named by each ``address.json`` and wait (up to ``wait`` s) until
    those workers are gone, so the caller may remove or reuse what they wrote; how many were
    signalled."""
    n, live = 0, []
    for address in sorted(addresses):
        try:
            pid = int(json.loads(address.read_text())["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _pid_alive(pid) and _is_worker(pid):
            live.append(pid)
        kill_worker_group(pid)
        n += 1
    deadline = time.monotonic() + wait
    while any(_pid_alive(pid) for pid in live) and time.monotonic() < deadline:
        time.sleep(0.05)
    return n


def _kill_own_group_but_me() -> int:
    """On a worker's exit: SIGKILL what is left in its process group besides itself (children
    an engine's own shutdown missed); only when it leads its group, as :func:`connect_or_spawn`
    starts it. Returns how many were killed."""
    me = os.getpid()
    if os.getpgid(0) != me:
        return 0
    killed = 0
    for entry in Path("/proc").glob("[0-9]*"):
        pid = int(entry.name)
        try:
            if pid != me and os.getpgid(pid) == me:
                os.kill(pid, signal.SIGKILL)
                killed += 1
        except (ProcessLookupError, PermissionError):
            pass
    return killed
