"""Temporary folders named after their owner's pid: a process killed with SIGKILL cannot remove
its own (the vLLM engine's weights, 1 GB or more; a node worker's socket folder), so the next one
deletes them. Runs without vLLM: the sweep on real folders and processes, and real node workers."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ftis_flwr.config.schema import to_dict
from ftis_flwr.experiment import load_experiment
from ftis_flwr.node.host.tempdirs import VLLM_PREFIX, WORKER_PREFIX, make_owned_tempdir, remove_stale_tempdirs


def test_only_folders_of_processes_that_are_gone_are_deleted(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: its pid no longer runs
    dead = tmp_path / f"{VLLM_PREFIX}{gone.pid}-abc"
    (dead / "weights").mkdir(parents=True)
    (dead / "weights" / "model.safetensors").write_bytes(b"0" * 1024)
    alive = tmp_path / f"{VLLM_PREFIX}{os.getpid()}-def"
    alive.mkdir()
    unnamed = tmp_path / f"{VLLM_PREFIX}xyz"  # no pid in the name: not ours to judge
    unnamed.mkdir()
    a_file = tmp_path / f"{VLLM_PREFIX}{gone.pid}-file"
    a_file.write_text("not a folder")
    other_kind = tmp_path / f"{WORKER_PREFIX}{gone.pid}-ghi"  # another prefix: another sweep's
    other_kind.mkdir()

    assert remove_stale_tempdirs(VLLM_PREFIX, tmp_path) == [dead]
    assert not dead.exists()
    assert alive.is_dir() and unnamed.is_dir() and a_file.is_file() and other_kind.is_dir()
    assert remove_stale_tempdirs(VLLM_PREFIX, tmp_path) == []


def test_a_new_folder_is_private_and_named_after_this_process(monkeypatch):
    root = Path(tempfile.mkdtemp(prefix="ftis-t-"))
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    try:
        made = make_owned_tempdir(VLLM_PREFIX)
        assert made.parent == root and made.name.startswith(f"{VLLM_PREFIX}{os.getpid()}-")
        assert made.stat().st_mode & 0o777 == 0o700
    finally:
        shutil.rmtree(root)


def _start_worker(directory: Path, tmp: Path) -> tuple[subprocess.Popen, Path]:
    """A real node worker; returns it and its socket folder once it listens (it builds its node
    only on the first request, so this costs no model)."""
    cache = directory.parent / "cache"
    exp = load_experiment(overrides={"cache_dir": str(cache)})
    directory.mkdir(parents=True)
    (directory / "spec.json").write_text(json.dumps({
        "card": to_dict(exp.nodes[0]), "experiment": to_dict(exp), "cache_dir": str(cache),
        "idle_timeout": 120.0}))
    proc = subprocess.Popen([sys.executable, "-m", "ftis_flwr.node.host.worker", "--dir", str(directory)],
                            env={**os.environ, "TMPDIR": str(tmp)}, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (directory / "address.json").exists():
        assert proc.poll() is None, "the worker exited before it listened"
        assert time.monotonic() < deadline, "the worker did not listen within 120 s"
        time.sleep(0.2)
    return proc, Path(json.loads((directory / "address.json").read_text())["socket"]).parent


def test_a_killed_workers_socket_folder_is_deleted_by_the_next_worker(tmp_path):
    """SIGKILL skips the worker's cleanup, so its folder stays; the next worker (of any run) to
    start deletes it, and leaves a live worker's folder alone."""
    tmp = Path(tempfile.mkdtemp(prefix="ftis-t-"))  # short: a socket path is capped at 108 bytes
    procs = []
    try:
        killed, killed_folder = _start_worker(tmp_path / "a", tmp)
        procs.append(killed)
        live, live_folder = _start_worker(tmp_path / "b", tmp)
        procs.append(live)
        assert killed_folder.name.startswith(f"{WORKER_PREFIX}{killed.pid}-")
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait(timeout=15)
        assert killed_folder.is_dir()  # nothing ran to remove it

        later, later_folder = _start_worker(tmp_path / "c", tmp)
        procs.append(later)
        assert not killed_folder.exists()
        assert live_folder.is_dir() and later_folder.is_dir()
    finally:
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=15)
        shutil.rmtree(tmp, ignore_errors=True)
