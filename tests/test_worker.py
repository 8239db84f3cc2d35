"""The long-lived node worker: one process per (run, node), reached over an authenticated socket."""

import json
import os
import signal
import subprocess
import sys
import time
from multiprocessing.connection import Client
from pathlib import Path

import pytest

from ftis_flwr.config.schema import to_dict
from ftis_flwr.experiment import load_experiment
from ftis_flwr.node.host.handle import WorkerError, WorkerHandle, connect_or_spawn
from ftis_flwr.node.host.processes import worker_dir

SHIPPED = {"warmstart_target": 0.6}
"""With it the default's first card is cpu-pair's small model, which ships with the package: a
worker installs it in a second rather than warm-starting a model for a minute or two."""


def _spec(tmp_path, idle=60.0, **card_overrides):
    exp = load_experiment(overrides={"cache_dir": str(tmp_path / "cache")})
    card = {**to_dict(exp.nodes[0]), **SHIPPED, **card_overrides}
    return {"card": card, "experiment": to_dict(exp), "cache_dir": str(tmp_path / "cache"),
            "idle_timeout": idle}


def _zombie(pid) -> bool:
    """Killed but not yet reaped (an orphan waits for whatever adopted it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def _wait_dead(pid, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if _zombie(pid):
            return True
        try:  # reap if it is our child
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.1)
    return False


@pytest.fixture
def workers():
    pids = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


_CONNECT = """
import json, sys
from ftis_flwr.node.host.handle import connect_or_spawn
h = connect_or_spawn(sys.argv[1], json.loads(sys.argv[2]))
print(h.pid)
"""


def test_concurrent_clients_share_one_worker(tmp_path, workers):
    d = worker_dir(tmp_path / "cache", "run1", "a")
    spec = json.dumps(_spec(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", _CONNECT, str(d), spec], stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    pids = {int(p.communicate(timeout=60)[0].strip()) for p in procs}
    workers.extend(pids)
    assert len(pids) == 1, f"more than one worker started: {pids}"
    assert (d / "starts.log").read_text().count("\n") == 1
    assert oct((d / "address.json").stat().st_mode & 0o777) == "0o600"
    handle = WorkerHandle.read(d)
    assert handle.call("ping")["pid"] == handle.pid
    assert handle.call("stop")["pid"] == handle.pid
    assert _wait_dead(handle.pid)
    assert not (d / "address.json").exists()


def test_wrong_authkey_is_refused_and_worker_survives(tmp_path, workers):
    d = worker_dir(tmp_path / "cache", "run2", "a")
    handle = connect_or_spawn(d, _spec(tmp_path))
    workers.append(handle.pid)
    from multiprocessing import AuthenticationError

    with pytest.raises((AuthenticationError, EOFError, ConnectionError)):
        Client(handle.socket, family="AF_UNIX", authkey=b"not the key")
    assert handle.call("ping")["pid"] == handle.pid


def test_idle_timeout_stops_worker_and_next_call_respawns(tmp_path, workers):
    d = worker_dir(tmp_path / "cache", "run3", "a")
    first = connect_or_spawn(d, _spec(tmp_path, idle=1.0))
    workers.append(first.pid)
    assert _wait_dead(first.pid)
    second = connect_or_spawn(d, _spec(tmp_path, idle=60.0))
    workers.append(second.pid)
    assert second.pid != first.pid
    assert (d / "starts.log").read_text().count("\n") == 2


def test_node_that_cannot_be_built_reports_why(tmp_path, workers):
    d = worker_dir(tmp_path / "cache", "run4", "a")
    spec = _spec(tmp_path, source=str(tmp_path / "no-such-model-dir"))
    handle = connect_or_spawn(d, spec)
    workers.append(handle.pid)
    with pytest.raises(WorkerError, match="could not be built"):
        handle.call("step", {"round": 0, "num_rounds": 1, "prompt_indices": [], "group_size": 2,
                             "evaluate": False, "foreign_payloads": {}})
    assert handle.call("ping")["ready"] is False  # alive, still answering

    # the cause goes away (the model appears): the next request builds the node, no restart
    import shutil

    from ftis_flwr.config.schema import ModelCard
    from ftis_flwr.node.tiny.models import warm_start
    from ftis_flwr.tasks import ArithmeticTask

    shipped = warm_start(ModelCard(name="a", tiny_size="small", warmstart_target=0.6, seed=0),
                         ArithmeticTask(), tmp_path / "cache")
    shutil.copytree(shipped, tmp_path / "no-such-model-dir")
    out = handle.call("step", {"round": 0, "num_rounds": 1, "prompt_indices": [], "group_size": 2,
                               "evaluate": False, "foreign_payloads": {}})
    assert out["node"] == "a" and handle.call("ping")["ready"] is True


def _until(handle, states, timeout=120.0):
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        status = handle.call("build", timeout=30)
        seen.append(status)
        if status["state"] in states:
            return status, seen
        time.sleep(0.2)
    raise AssertionError(f"no state in {states} within {timeout} s: {seen[-3:]}")


def test_build_starts_the_node_ahead_of_the_first_round_and_says_how_far_it_is(tmp_path, workers):
    """``build`` answers at once while the node builds in the background; the first round then
    finds it built; a second ``build`` builds nothing again."""
    d = worker_dir(tmp_path / "cache", "run-build", "a")
    handle = connect_or_spawn(d, _spec(tmp_path))
    workers.append(handle.pid)
    first = handle.call("build", timeout=30)
    assert first["state"] in ("building", "ready"), first
    status, seen = _until(handle, ("ready", "failed"))
    assert status["state"] == "ready" and status["error"] == "", seen[-3:]
    assert status["seconds"] > 0 and status["progress"], status  # the worker's last line: what it did
    assert handle.call("ping")["ready"] is True
    out = handle.call("step", {"round": 0, "num_rounds": 1, "prompt_indices": [], "group_size": 2,
                               "evaluate": False, "foreign_payloads": {}})
    assert out["node"] == "a"
    assert handle.call("build", timeout=30) == status  # built once: the same answer, nothing rebuilt
    log = (d / "worker.log").read_text()
    assert log.count("node a ready") == 1, log[-2000:]


def test_a_build_that_fails_says_why_and_the_first_round_tries_again(tmp_path, workers):
    d = worker_dir(tmp_path / "cache", "run-build-fail", "a")
    handle = connect_or_spawn(d, _spec(tmp_path, source=str(tmp_path / "no-such-model-dir")))
    workers.append(handle.pid)
    status, _ = _until(handle, ("failed", "ready"))
    assert status["state"] == "failed" and "no-such-model-dir" in status["error"], status
    with pytest.raises(WorkerError, match="could not be built"):
        handle.call("step", {"round": 0, "num_rounds": 1, "prompt_indices": [], "group_size": 2,
                             "evaluate": False, "foreign_payloads": {}})


def test_a_silent_connection_does_not_stall_the_worker(tmp_path, workers):
    """A peer that connects and says nothing gets its own thread and is closed after the
    handshake timeout; requests meanwhile are answered (a ping bounded by that timeout)."""
    import socket

    from ftis_flwr.node.host.handle import HANDSHAKE_TIMEOUT

    handle = connect_or_spawn(worker_dir(tmp_path / "cache", "run", "a"), _spec(tmp_path))
    workers.append(handle.pid)
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.connect(handle.socket)
    silent.settimeout(10 * HANDSHAKE_TIMEOUT)
    try:
        assert handle.call("ping", timeout=HANDSHAKE_TIMEOUT)["pid"] == handle.pid
        while silent.recv(4096):  # the worker's challenge, then EOF when it gives up on us
            pass
    finally:
        silent.close()
    assert handle.call("ping", timeout=HANDSHAKE_TIMEOUT)["pid"] == handle.pid


def test_the_socket_lives_in_a_private_folder(tmp_path, workers):
    import stat

    handle = connect_or_spawn(worker_dir(tmp_path / "cache", "run", "a"), _spec(tmp_path))
    workers.append(handle.pid)
    folder = os.path.dirname(handle.socket)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(handle.socket).st_mode) == 0o600
    handle.call("stop")
    assert _wait_dead(handle.pid) and not os.path.exists(folder)


def test_a_live_worker_asked_for_a_round_again_replays_it_from_the_state_before(tmp_path, workers):
    """A resumed server may ask a live worker for a round it already ran: the worker rewinds to
    the state saved before that round, so no round is ever applied twice to one node."""
    exp = load_experiment(overrides={"cache_dir": str(tmp_path / "cache"), "rollout.max_new_tokens": 6,
                                     "rollout.group_size": 4, "rounds.num_rounds": 3})
    card = dict(to_dict(exp.nodes[0]), **SHIPPED)
    spec = {"card": card, "experiment": to_dict(exp), "cache_dir": str(tmp_path / "cache"), "idle_timeout": 600}
    handle = connect_or_spawn(worker_dir(tmp_path / "cache", "run7", "a"), spec)
    workers.append(handle.pid)

    def step(rnd):
        return handle.call("step", {"round": rnd, "num_rounds": 3, "prompt_indices": [2 * rnd, 2 * rnd + 1],
                                    "group_size": 4, "evaluate": False, "foreign_payloads": {}},
                           timeout=300)["metrics"]

    step(0)
    first = step(1)
    again = step(1)
    assert first["updates"] == again["updates"] == 1
    assert "resumed_from_round" not in first and again["resumed_from_round"] == 0
    assert again["loss"] == first["loss"]  # the same update from the same state
    assert step(2)["updates"] == 2


def test_a_busy_worker_answers_pings_and_a_hung_one_is_replaced(tmp_path, workers):
    """While a request runs, a ping still proves the worker alive (it takes no lock); a request
    that outlives its timeout raises WorkerTimeout, and the caller kills the worker, whose
    successor starts afresh (and would resume from the node's saved state)."""
    import threading

    from ftis_flwr.node.host.handle import WorkerTimeout

    exp = load_experiment(overrides={"cache_dir": str(tmp_path / "cache"), "rollout.max_new_tokens": 6})
    card = dict(to_dict(exp.nodes[0]), **SHIPPED)
    spec = {"card": card, "experiment": to_dict(exp), "cache_dir": str(tmp_path / "cache"), "idle_timeout": 600}
    d = worker_dir(tmp_path / "cache", "run8", "a")
    handle = connect_or_spawn(d, spec)
    workers.append(handle.pid)
    payload = {"round": 0, "num_rounds": 2, "prompt_indices": [0], "group_size": 2, "evaluate": False,
               "foreign_payloads": {}}
    answers = []
    # the first request builds the node (seconds): far longer than 0.2 s
    pinger = threading.Timer(0.05, lambda: answers.append(handle.call("ping", timeout=5)))
    pinger.start()
    with pytest.raises(WorkerTimeout, match="sent no reply to 'step' within"):
        handle.call("step", payload, timeout=0.2)
    pinger.join()
    assert answers and answers[0]["pid"] == handle.pid
    handle.kill("test: no reply in time")
    assert _wait_dead(handle.pid)
    successor = connect_or_spawn(d, spec)
    workers.append(successor.pid)
    assert successor.pid != handle.pid and not successor.ready
    assert successor.call("step", payload, timeout=120)["metrics"]["round"] == 0


_TREE = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(child.pid, flush=True)
time.sleep(float(sys.argv[1]))
"""


def _tree(leader_lives: float, *args: str) -> tuple[subprocess.Popen, int]:
    """A session leader (its cmdline names ftis_flwr.node.host.worker, as a real worker's does) with one
    child in its process group, as a vLLM engine core or a reward judge is."""
    proc = subprocess.Popen([sys.executable, "-c", _TREE, str(leader_lives), *args],
                            stdout=subprocess.PIPE, start_new_session=True)
    return proc, int(proc.stdout.readline())


def test_killing_a_worker_kills_its_group_even_after_the_leader_died():
    """kill_worker_group takes the worker's children with it (a vLLM EngineCore was left holding
    GBs when only the pid was killed), also when the worker itself is already gone; a live pid
    that is not a worker (a reused pid) is left alone."""
    from ftis_flwr.node.host.processes import kill_worker_group

    leader, child = _tree(120, "ftis_flwr.node.host.worker")
    kill_worker_group(leader.pid)
    assert leader.wait(timeout=15) == -signal.SIGKILL
    assert _wait_dead(child)

    leader, child = _tree(0, "ftis_flwr.node.host.worker")  # the leader exits at once, its child stays
    leader.wait(timeout=15)
    assert not _wait_dead(child, timeout=0.5)
    kill_worker_group(leader.pid)
    assert _wait_dead(child)

    stranger, child = _tree(120, "not-a-worker")
    try:
        kill_worker_group(stranger.pid)
        assert stranger.poll() is None and not _wait_dead(child, timeout=0.5)
    finally:
        os.killpg(stranger.pid, signal.SIGKILL)
        stranger.wait(timeout=15)


def test_an_exiting_worker_kills_what_is_left_in_its_group():
    """The worker leaves with os._exit (no destructor runs), so its cleanup kills the processes
    left in its own group; a process that does not lead its group kills nothing."""
    code = ("import subprocess, sys, time; from ftis_flwr.node.host.processes import _kill_own_group_but_me; "
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
            "print(c.pid, flush=True); time.sleep(0.5); print(_kill_own_group_but_me(), flush=True)")
    for leads in (True, False):
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                start_new_session=leads)
        child, killed = int(proc.stdout.readline()), int(proc.stdout.readline())
        proc.wait(timeout=15)
        try:
            assert killed == (1 if leads else 0)
            assert _wait_dead(child, timeout=15 if leads else 0.5) == leads
        finally:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_only_the_workers_of_runs_started_since_are_stopped(tmp_path):
    """A simulation sharing a cache with other runs stops only its own run's workers: by name
    (kill_workers_of_run), a concurrent run that started later survives; by snapshot
    (kill_workers_of_new_runs, when the name is not known) an older run survives. The sweep and
    the tests once killed every worker under the cache; then, by snapshot, a later concurrent
    run's (a sweep and a benchmark sharing the cache lost runs to each other)."""
    from ftis_flwr.node.host.processes import kill_workers_of_new_runs, kill_workers_of_run, worker_runs

    cache = tmp_path / "cache"
    procs = {}
    for run in ("older-run", "this-run", "later-run"):
        proc, child = _tree(120, "ftis_flwr.node.host.worker")
        procs[run] = (proc, child)
        d = worker_dir(cache, run, "a")
        d.mkdir(parents=True)
        if run == "older-run":
            before = worker_runs(cache)
        (d / "address.json").write_text(json.dumps({"pid": proc.pid}))
    try:
        assert before == {"older-run"}
        assert kill_workers_of_run(cache, "this-run") == 1
        assert procs["this-run"][0].wait(timeout=15) == -signal.SIGKILL and _wait_dead(procs["this-run"][1])
        assert procs["older-run"][0].poll() is None and procs["later-run"][0].poll() is None
        assert kill_workers_of_new_runs(cache, before) == 2  # this-run's address is still there
        assert procs["later-run"][0].wait(timeout=15) == -signal.SIGKILL and _wait_dead(procs["later-run"][1])
        assert procs["older-run"][0].poll() is None
    finally:
        for proc, _ in procs.values():
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=15)

def test_a_crashed_worker_not_yet_reaped_still_has_its_group_killed():
    """The ClientApp that started a worker is its parent and does not reap it, so a crashed worker
    stays a zombie, with an empty command line; its orphans (a vLLM engine core) must still go."""
    from ftis_flwr.node.host.processes import _pid_alive, kill_worker_group

    code = ("import subprocess, sys, time; "
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
            "print(c.pid, flush=True); time.sleep(120)")
    leader = subprocess.Popen([sys.executable, "-c", code, "ftis_flwr.node.host.worker"], stdout=subprocess.PIPE,
                              start_new_session=True)
    child = int(leader.stdout.readline())
    os.kill(leader.pid, signal.SIGKILL)  # the crash; not reaped: a zombie
    deadline = time.monotonic() + 15
    while not _zombie(leader.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert _zombie(leader.pid) and not _pid_alive(leader.pid)
        kill_worker_group(leader.pid)
        assert _wait_dead(child)
    finally:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
        leader.wait(timeout=15)


def test_a_worker_exits_when_no_message_comes_in_the_time_the_server_promised(tmp_path, workers):
    """#24: a run that ends without a STOP reaching the node (its ServerApp killed, ``flwr stop``, a
    failure) leaves nothing running. Each round message says within how many seconds the next one
    comes while the run goes on (``next_within``); a worker that hears nothing by then exits,
    keeping its saved state, long before its idle timeout (an hour here). Why here and not in a
    Flower simulation: there Ray kills the workers with its actors when the simulation ends (its
    subreaper: measured, they were gone 5 s after the ServerApp raised), so such a test could not
    fail; a deployed SuperNode has no such reaper."""
    exp = load_experiment(overrides={"cache_dir": str(tmp_path / "cache"), "rollout.max_new_tokens": 6,
                                     "rollout.group_size": 4, "rounds.num_rounds": 3})
    card = dict(to_dict(exp.nodes[0]), **SHIPPED)
    spec = {"card": card, "experiment": to_dict(exp), "cache_dir": str(tmp_path / "cache"), "idle_timeout": 3600}
    d = worker_dir(tmp_path / "cache", "run8", "a")
    handle = connect_or_spawn(d, spec)
    workers.append(handle.pid)
    t0 = time.monotonic()
    handle.call("step", {"round": 0, "num_rounds": 3, "prompt_indices": [0, 1], "group_size": 4,
                         "evaluate": False, "foreign_payloads": {}, "next_within": 8.0}, timeout=300)
    assert _wait_dead(handle.pid, timeout=120), "the worker outlived the server's promise by 100 s"
    waited = time.monotonic() - t0
    assert waited >= 7.5, f"it exited {waited:.0f} s after the round started, before the promised 8 s"
    assert "the run has ended" in (d / "worker.log").read_text()
    assert any((d / "state").iterdir())  # the saved state stays for a resume

