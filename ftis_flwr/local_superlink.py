"""The local SuperLink that ``flwr run`` starts for a simulation and leaves running (Flower 1.42):
found by the port it listens on, and stopped by its pid (``ftis-flwr stop``).

Why by port: it is the one thing that names it for sure; a process is never chosen by its name.
Linux only (``/proc``): the listening socket's inode leads to the process holding it.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

PORT = 39091
"""The local SuperLink's Fleet/Exec port in Flower 1.42 (``127.0.0.1:39091``)."""


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) > 9 and parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(parts[9])  # state 0A = LISTEN
    return inodes


def listening_pids(port: int = PORT) -> list[int]:
    """The pids of the processes that listen on ``port`` on this machine (sorted)."""
    wanted = {f"socket:[{i}]" for i in _listening_inodes(port)}
    pids = set()
    if not wanted:
        return []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in wanted for fd in (proc / "fd").iterdir()):
                pids.add(int(proc.name))
        except OSError:  # gone, or not ours to read
            continue
    return sorted(pids)


def stop(port: int = PORT, timeout: float = 15.0) -> list[int]:
    """SIGTERM every process listening on ``port`` (SIGKILL after ``timeout`` s); their pids."""
    pids = listening_pids(port)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.2)
    for pid in pids:
        if Path(f"/proc/{pid}").exists():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return pids
