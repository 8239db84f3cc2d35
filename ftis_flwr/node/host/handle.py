"""Reaching a node's worker from the ClientApp: find it or start it (one per run and node, under a
file lock), call it over its authenticated Unix socket, replace it when it hangs, stop it.
The worker process itself is :mod:`ftis_flwr.node.host.worker`; finding and killing workers by pid,
:mod:`ftis_flwr.node.host.processes`."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import AuthenticationError, Client
from pathlib import Path
from typing import Any

from ftis_flwr.node.host.processes import _pid_alive, kill_worker_group

log = logging.getLogger(__name__)

SPAWN_TIMEOUT = 120.0
HANDSHAKE_TIMEOUT = 20.0
"""A connection that has not authenticated and sent its request within this many seconds is
closed: a silent peer occupies one thread of the worker for at most this long and never delays a
request. Generous, because a ClientApp on a loaded machine can stall for seconds: at 5 s a
request was once cut off with a broken pipe after the worker had received it, in
tests/test_resume.py beside a sweep (the suspected cause; the expiry now also spares any request
already received)."""
REQUEST_TIMEOUT = 7200.0
"""Default wait for a reply; the ClientApp passes the experiment's round timeout instead."""
PING_TIMEOUT = 30.0


class WorkerError(RuntimeError):
    """The node's worker failed to start or failed a request; the message says why."""


class WorkerTimeout(WorkerError):
    """The worker sent no reply in time: it is hung or far too slow (the caller replaces it)."""


@contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@dataclass
class WorkerHandle:
    """How to reach a running worker: a Unix socket in a private (0700) folder, plus an auth key."""

    directory: Path
    socket: str
    pid: int
    authkey: bytes

    @classmethod
    def read(cls, directory: Path) -> WorkerHandle | None:
        try:
            data = json.loads((directory / "address.json").read_text())
            return cls(directory, str(data["socket"]), int(data["pid"]), bytes.fromhex(data["authkey"]))
        except (FileNotFoundError, json.JSONDecodeError, KeyError, ValueError):
            return None

    def call(self, op: str, payload: Any = None, timeout: float = REQUEST_TIMEOUT) -> Any:
        """Send one request and wait at most ``timeout`` seconds for its reply."""
        try:
            conn = Client(self.socket, family="AF_UNIX", authkey=self.authkey)
        except (OSError, EOFError, AuthenticationError) as exc:
            raise WorkerError(f"cannot reach node worker pid {self.pid} at {self.socket}: {exc}") from exc
        with conn:
            conn.send((op, payload))
            try:
                if not conn.poll(timeout):
                    raise WorkerTimeout(f"node worker pid {self.pid} sent no reply to {op!r} within "
                                        f"{timeout:.0f} s; see {self.directory / 'worker.log'}")
                status, value = conn.recv()
            except (EOFError, OSError):
                raise WorkerError(f"node worker pid {self.pid} died during {op!r}; see "
                                  f"{self.directory / 'worker.log'}") from None
        if status == "error":
            raise WorkerError(f"node worker failed {op!r}: {value}")
        return value

    ready: bool = False
    """Whether the worker had built its node at the last ping (a new worker has not)."""

    def alive(self) -> bool:
        """Answers a ping (answered even while a request runs: it takes no lock)."""
        if not _pid_alive(self.pid):
            return False
        try:
            self.ready = bool(self.call("ping", timeout=PING_TIMEOUT).get("ready"))
        except WorkerError:
            return False
        return True

    def kill(self, why: str) -> None:
        """Replace a hung worker: SIGKILL its pid (the next message starts a new one, which
        resumes from the node's saved state)."""
        log.warning("killing node worker pid %d: %s", self.pid, why)
        kill_worker_group(self.pid)
        (self.directory / "address.json").unlink(missing_ok=True)


def connect_or_spawn(directory: Path, spec: dict[str, Any], *, env: dict[str, str] | None = None,
                     timeout: float = SPAWN_TIMEOUT) -> WorkerHandle:
    """Return the node's running worker, starting it first if there is none (one, ever)."""
    directory = Path(directory)
    with _locked(directory / "lock"):
        handle = WorkerHandle.read(directory)
        if handle is not None and handle.alive():
            return handle
        if handle is not None:  # dead or deaf: it (or what it left, e.g. a vLLM engine core) goes
            kill_worker_group(handle.pid)
        (directory / "address.json").unlink(missing_ok=True)
        (directory / "spec.json").write_text(json.dumps(spec))
        child_env = dict(os.environ)
        child_env.update(env or {})
        pkg_root = str(Path(__file__).resolve().parents[3])
        child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [pkg_root, child_env.get("PYTHONPATH", "")]))
        with open(directory / "worker.log", "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "ftis_flwr.node.host.worker", "--dir", str(directory)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=child_env, start_new_session=True, cwd=str(directory))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            handle = WorkerHandle.read(directory)
            if handle is not None and handle.pid == proc.pid:
                return handle
            if proc.poll() is not None:
                tail = (directory / "worker.log").read_text(errors="replace")[-2000:]
                raise WorkerError(f"node worker exited with code {proc.returncode} before listening:\n{tail}")
            time.sleep(0.05)
        kill_worker_group(proc.pid)
        raise WorkerError(f"node worker did not start listening within {timeout:.0f} s")


def stop_worker(directory: Path) -> bool:
    """Ask the node's worker in ``directory`` to exit, if one is running; True if one was."""
    handle = WorkerHandle.read(Path(directory))
    if handle is None or not _pid_alive(handle.pid):
        return False
    try:
        handle.call("stop", timeout=PING_TIMEOUT)
    except WorkerError:  # busy past the timeout or already gone: its idle timeout ends it
        return False
    return True
