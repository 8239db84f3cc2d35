"""The vLLM engine's temporary folder (1 GB or more: the model's weights) outlives a worker killed
with SIGKILL, which cannot run ``close()``; the next engine deletes it. Runs without vLLM: only the
folder sweep, on real folders and real processes."""

import os
import subprocess
import sys

from ftis_flwr.node.engines.workdirs import WORKDIR_PREFIX, remove_stale_workdirs


def test_only_folders_of_processes_that_are_gone_are_deleted(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: its pid no longer runs
    dead = tmp_path / f"{WORKDIR_PREFIX}{gone.pid}-abc"
    (dead / "weights").mkdir(parents=True)
    (dead / "weights" / "model.safetensors").write_bytes(b"0" * 1024)
    alive = tmp_path / f"{WORKDIR_PREFIX}{os.getpid()}-def"
    alive.mkdir()
    unnamed = tmp_path / f"{WORKDIR_PREFIX}xyz"  # no pid in the name: not ours to judge
    unnamed.mkdir()
    a_file = tmp_path / f"{WORKDIR_PREFIX}{gone.pid}-file"
    a_file.write_text("not a folder")

    assert remove_stale_workdirs(tmp_path) == [dead]
    assert not dead.exists()
    assert alive.is_dir() and unnamed.is_dir() and a_file.is_file()
    assert remove_stale_workdirs(tmp_path) == []
