"""A long-lived process per node and run that holds the Node; ClientApps reach it over a socket.

Why: Flower starts a fresh ClientApp process per message in deployment and moves simulated
clients between Ray workers every round, but a model, its optimiser state and a rollout engine
cannot be rebuilt every round. So the first ClientApp call for a (run, node) spawns this worker
(detached, its own session), later calls connect to it; a file lock makes sure only one is ever
spawned. Requests travel over ``multiprocessing.connection`` on a Unix socket in a private (0700)
folder under the temp dir, with a random auth key
kept in a 0600 file. The worker exits on ``finish``/``stop``, or after ``idle_timeout`` seconds
without a request.

Layout of a worker's directory ``<cache>/workers/<run>/<node>/``:
``spec.json`` (card + experiment), ``address.json`` (host, port, pid, authkey; 0600),
``starts.log`` (one line per process start), ``worker.log`` (its stdout/stderr), ``lock``,
a sharded node's ``ranks.json`` (the pids of its ranks > 0) and ``rank-N.log`` (their output),
``state/round-NNNNNN/`` (the node's training state, :mod:`ftis_flwr.node.state`): a worker that
is started again for the same run (after a crash, a kill or its idle timeout) resumes from it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import shutil
import socket
import threading
import time
import traceback
from multiprocessing.connection import Listener, answer_challenge, deliver_challenge
from pathlib import Path
from typing import Any

from ftis_flwr.node.host.handle import HANDSHAKE_TIMEOUT, WorkerError, WorkerHandle
from ftis_flwr.node.host.processes import _kill_own_group_but_me
from ftis_flwr.node.host.rank_group import RankGroup, run
from ftis_flwr.node.host.ranks import Ranks
from ftis_flwr.node.host.tempdirs import WORKER_PREFIX, make_owned_tempdir

log = logging.getLogger(__name__)

# ----------------------------------------------------------------------------- worker side


class _Server:
    """Serves one node's requests, one at a time, in the worker process."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.spec = json.loads((directory / "spec.json").read_text())
        self.idle_timeout = float(self.spec.get("idle_timeout", 900.0))
        self.last_request = time.monotonic()
        self.deadline: float | None = None
        """monotonic time by which the next request must come if the run goes on: the server's
        promise with each round (``next_within``); past it, the run has ended (stopped, failed,
        or its ServerApp died without a STOP) and the worker exits, freeing its memory."""
        self.deadline_s = 0.0
        self.busy = False
        self.node = None
        self.load_error: str | None = None
        self.resumed_from: int | None = None
        """The round of the state the node was last restored from, reported once in a reply."""
        self.progress = _LastLine()
        """What the node is doing while it builds: the last line the package's loggers wrote."""
        logging.getLogger("ftis_flwr").addHandler(self.progress)
        self._build_thread: threading.Thread | None = None
        self._build_guard = threading.Lock()
        self.build_started: float | None = None
        self.build_seconds: float | None = None
        self.ranks = Ranks(0, int(self.spec["card"].get("ranks", 1) or 1))
        """This worker is rank 0 of the node's ranks (one, unless the card shards the learner)."""
        self.group: RankGroup | None = None
        """Ranks 1..N-1 of a sharded node, started with the first build (:mod:`ftis_flwr.node.host.rank_group`)."""

    def _run(self, name: str, *args: Any) -> Any:
        """Run a node command here and on every other rank (:data:`ftis_flwr.node.host.rank_group.COMMANDS`)."""
        return run(self, name, *args, group=self.group)

    def _load(self) -> None:
        """Build the node (again, for a replayed round 0) on every rank."""
        if self.ranks.sharded and self.group is None:
            self.group = RankGroup.start(self.directory, self.ranks.world,
                                         str(self.spec["card"].get("device", "cpu")))
        self._run("build")

    def _watchdog(self):
        while True:
            time.sleep(1.0)
            if not self.busy and time.monotonic() - self.last_request > self.idle_timeout:
                log.info("idle for %.0f s: exiting", self.idle_timeout)
                self._cleanup()
                os._exit(0)
            if not self.busy and self.deadline is not None and time.monotonic() > self.deadline:
                log.warning("no message within %.0f s of the last round's start, as the server promised "
                            "while the run goes on: the run has ended; exiting (the saved state stays for "
                            "a resume)", self.deadline_s)
                self._cleanup()
                os._exit(0)

    def _cleanup(self):
        """Before ``os._exit``: shut the rollout engine down (no destructor runs after it), kill
        whatever it left in the group, and remove the address and the private folder."""
        engine = getattr(self.node, "engine", None)
        close = getattr(engine, "close", None)
        if close is not None:
            try:
                close()
            except Exception as exc:  # exiting anyway: the group kill below is the backstop
                log.warning("engine shutdown failed: %s", exc)
        try:
            n = _kill_own_group_but_me()
            if n:
                log.info("killed %d leftover process(es) of this worker's group", n)
        except OSError as exc:
            log.warning("could not clear this worker's process group: %s", exc)
        handle = WorkerHandle.read(self.directory)
        if handle is not None and handle.pid == os.getpid():
            (self.directory / "address.json").unlink(missing_ok=True)
        if getattr(self, "private", None) is not None:
            shutil.rmtree(self.private, ignore_errors=True)

    def _ensure_node(self) -> None:
        """Build the node if it is not built (under the request lock). Built on the first request,
        or ahead of it by ``build``; a failure is retried on the next request (a transient cause,
        e.g. out of memory at load, can go away)."""
        if self.node is not None:
            return
        t0 = time.monotonic()
        try:
            self._load()
            self.load_error = None
        except Exception:
            self.load_error = traceback.format_exc()
            raise WorkerError(f"the node could not be built:\n{self.load_error}") from None
        self._resume(None)
        self.build_seconds = time.monotonic() - t0

    def start_build(self) -> dict[str, Any]:
        """``build``: start building the node in the background, if it is neither built nor being
        built nor failed to build (the next request tries again), and say how far it is (answered
        at once, without the request lock)."""
        with self._build_guard:
            running = self._build_thread is not None and self._build_thread.is_alive()
            if self.node is None and not running and not self.busy and self.load_error is None:
                self.build_started = time.monotonic()
                self.busy = True  # the idle watchdog must not end a worker that is building
                self._build_thread = threading.Thread(target=self._build_ahead, daemon=True)
                self._build_thread.start()
        return self.build_status()

    def _build_ahead(self) -> None:
        with self._lock:  # a request that comes meanwhile waits for the node, as it would anyway
            try:
                self._ensure_node()
            except WorkerError:
                log.error("building the node failed (the first round tries again):\n%s", self.load_error)
                if self.group is not None:  # ranks out of step: a fresh worker builds them all again
                    self._cleanup()
                    os._exit(1)
            finally:
                self.busy = False
                self.last_request = time.monotonic()

    def build_status(self) -> dict[str, Any]:
        """``state`` (ready, building, failed or idle), the seconds it has taken, the last progress
        line and, when it failed, the error's last line."""
        building = self._build_thread is not None and self._build_thread.is_alive()
        state = ("ready" if self.node is not None else "building" if building
                 else "failed" if self.load_error else "idle")
        if self.node is not None and self.build_seconds is not None:
            seconds = self.build_seconds
        else:
            seconds = time.monotonic() - self.build_started if self.build_started is not None else 0.0
        error = (self.load_error or "").strip().splitlines()[-1:] if state == "failed" else []
        return {"state": state, "seconds": round(seconds, 1), "progress": self.progress.line,
                "error": error[0] if error else ""}

    def handle(self, op: str, payload: Any) -> tuple[Any, bool]:
        """-> (reply value, stop after replying)."""
        if op == "stop":  # ("ping" and "build" are answered in _serve_one, without the lock)
            return {"pid": os.getpid()}, True
        self._ensure_node()
        if op == "step":
            return self._step(payload), False
        if op == "finish":
            path = self._run("save", str(payload["out_dir"]))
            shutil.rmtree(self.state_root, ignore_errors=True)  # the final model is saved
            return {"checkpoint": str(path), "updates": self.node.updates}, True
        raise WorkerError(f"unknown request {op!r}")

    @property
    def state_root(self) -> Path:
        return self.directory / "state"

    def _resume(self, at_most: int | None) -> None:
        """Load the newest saved state (at most round ``at_most``) into the node, if there is one."""
        before = (self.node.round, self.node.updates)
        found = self._run("resume", at_most)
        if found is not None:
            self.resumed_from = found
            log.info("node %s resumed from its state of round %d (updates %d; it was at round %d, "
                     "updates %d)", self.node.card.name, found, self.node.updates, *before)

    def _step(self, payload: dict[str, Any]) -> dict[str, Any]:
        """One round; a round this node already ran (a resumed server) is replayed from the state
        saved before it, never applied on top of it. Saves the state before replying."""
        t0 = time.perf_counter()
        payload = dict(payload)
        within = float(payload.pop("next_within", 0.0) or 0.0)
        self.deadline, self.deadline_s = (time.monotonic() + within, within) if within > 0 else (None, 0.0)
        rnd = int(payload["round"])
        if rnd <= self.node.round:
            log.info("node %s is at round %d and is asked for round %d again: rewinding",
                     self.node.card.name, self.node.round, rnd)
            if rnd == 0:
                self._load()
                self.resumed_from = -1
            else:
                self._resume(rnd - 1)
                if self.node.round >= rnd:
                    raise WorkerError(
                        f"round {rnd} was already run by this node (it is at round {self.node.round}) "
                        f"and no state saved at or before round {rnd - 1} is left to replay it from "
                        f"(rounds.state_every={self.node.cfg.rounds.state_every})")
        reply = self._run("step", payload)
        if self.resumed_from is not None:
            reply["metrics"]["resumed_from_round"] = float(self.resumed_from)
            self.resumed_from = None
        every = self.node.cfg.rounds.state_every
        if every and (rnd % every == 0 or rnd == int(payload["num_rounds"])):
            info = self._run("save_state", rnd)
            reply["metrics"].update(state_save_seconds=info.seconds, state_bytes=float(info.nbytes))
        # the whole request: compute plus decoding, checks and encoding (``ftis-flwr report``)
        reply["metrics"]["worker_seconds"] = time.perf_counter() - t0
        return reply

    def serve(self):
        authkey = secrets.token_bytes(32)
        private = make_owned_tempdir(WORKER_PREFIX)  # 0700: other users cannot connect
        self.private = private
        path = str(private / "sock")  # short: Unix socket paths are capped at 108 bytes
        listener = Listener(path, family="AF_UNIX")
        os.chmod(path, 0o600)
        with open(self.directory / "starts.log", "a") as fh:
            fh.write(f"{time.time():.3f} pid={os.getpid()}\n")
        tmp = self.directory / f"address.json.{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump({"socket": path, "pid": os.getpid(), "authkey": authkey.hex()}, fh)
        os.replace(tmp, self.directory / "address.json")
        threading.Thread(target=self._watchdog, daemon=True).start()
        log.info("node worker pid %d listening on %s", os.getpid(), path)
        self._lock = threading.Lock()
        while True:  # the process ends in _serve_one (stop, finish) or in _watchdog (idle)
            try:
                conn = listener.accept()  # no handshake here: it runs on the connection's thread
            except OSError as exc:
                log.warning("accept failed: %s", exc)
                continue
            threading.Thread(target=self._serve_one, args=(conn, authkey), daemon=True).start()

    def _serve_one(self, conn, authkey: bytes) -> None:
        """Authenticate within HANDSHAKE_TIMEOUT, then answer one request (requests run one at a
        time under a lock; the node is not thread-safe)."""
        guard, pending = threading.Lock(), [True]

        def expire() -> None:  # only while the request is still awaited: never a received one,
            with guard:        # nor (once closed) a later connection that reuses the descriptor
                if pending[0]:
                    _shutdown(conn)

        timer = threading.Timer(HANDSHAKE_TIMEOUT, expire)
        timer.start()
        try:
            deliver_challenge(conn, authkey)  # mutual, as Listener(authkey=...) does
            answer_challenge(conn, authkey)
            if not conn.poll(HANDSHAKE_TIMEOUT):
                raise TimeoutError("no request after the handshake")
            op, payload = conn.recv()
        except Exception as exc:  # a bad key, a silent or vanished peer: only this thread ends
            log.warning("rejected a connection: %s", exc or type(exc).__name__)
            with guard:
                pending[0] = False
                conn.close()
            return
        finally:
            with guard:
                pending[0] = False
            timer.cancel()
        if op in ("ping", "build"):  # no lock: a busy worker still proves it is alive
            try:
                value = ({"pid": os.getpid(), "ready": self.node is not None, "busy": self.busy}
                         if op == "ping" else self.start_build())
                conn.send(("ok", value))
            except (OSError, EOFError):
                pass
            conn.close()
            return
        with self._lock:
            self.busy = True
            self.last_request = time.monotonic()
            stop = False
            try:
                try:
                    value, stop = self.handle(op, payload)
                    conn.send(("ok", value))
                except Exception as exc:
                    log.error("request %r failed:\n%s", op, traceback.format_exc())
                    if self.group is not None:  # the ranks may be out of step: end them all; the
                        stop = True             # next round starts a fresh worker from the saved state
                        exc = WorkerError(f"{type(exc).__name__}: {exc} (this node's {self.ranks.world} "
                                          "ranks are stopped; the next round rebuilds them from the saved state)")
                    conn.send(("error", f"{type(exc).__name__}: {exc}"))
            except (EOFError, OSError) as exc:
                log.warning("connection lost: %s", exc)
            finally:
                conn.close()
                self.busy = False
                self.last_request = time.monotonic()
            if stop:
                self._cleanup()
                os._exit(0)


class _LastLine(logging.Handler):
    """Keeps the last INFO-or-above line of the package's loggers (a building node's progress)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.line = ""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.line = record.getMessage()[:300]
        except Exception:  # a bad log call must not break the worker
            pass


def _shutdown(conn) -> None:
    """Wake a thread blocked reading ``conn`` (closing the fd alone would not)."""
    try:
        socket.socket(fileno=os.dup(conn.fileno())).shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="ftis-flwr node worker (started by the ClientApp)")
    parser.add_argument("--dir", required=True, type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    _keep_niceness()
    _Server(args.dir).serve()


def _keep_niceness() -> None:
    """A worker leads its own session, and Linux's autogroup scheduler shares the CPU between
    sessions before it looks at nice values: a worker of a niced sweep (``nice -n 15``, or Ray's
    own actors at 15) would compete at full weight with the shell's work. Give this session's
    autogroup the nice value the worker inherited (no-op where autogroups do not exist)."""
    nice = os.nice(0)
    if nice > 0:
        try:
            Path("/proc/self/autogroup").write_text(str(nice))
        except OSError:
            pass


if __name__ == "__main__":
    main()
