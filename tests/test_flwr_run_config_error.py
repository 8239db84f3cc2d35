"""A bad `flwr run --run-config` fails the run with one short message, no traceback (real flwr run);
`ftis-flwr run` refuses it before starting anything. (That it exits 1 when a run it started fails
is tests/test_run_failure_flwr.py's.)"""

import json
import subprocess
import sys

import pytest
from conftest import flower_bin
from test_flwr_run import REPO, ftis_flwr_run, superlink  # noqa: F401  (the SuperLink fixture this test owns)

pytestmark = pytest.mark.slow


def test_config_errors_fail_the_run_with_one_short_message(tmp_path, superlink):  # noqa: F811
    bindir = flower_bin()
    cmd = [str(bindir / "flwr"), "run", ".", "--stream",
           "--federation-config", "num-supernodes=2 client-resources-num-cpus=1",
           "--run-config", f"loss.method='ppo' rollout.group-size=8.5 overrides='nodes.0.lr=-1' "
                           f"cache-dir='{tmp_path / 'cache'}' run-dir='{tmp_path / 'runs'}'"]
    proc = subprocess.run(cmd, cwd=REPO, env=superlink, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert "invalid configuration (3 errors)" in out, out[-4000:]
    for fragment in ("rollout.group_size=8.5 is not an integer", "loss.method='ppo'",
                     "nodes[small].lr=-1.0 must be > 0", "invalid configuration (listed above)"):
        assert fragment in out, out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    assert not (tmp_path / "runs").exists()
    # Flower 1.42's `flwr run --stream` exits 0 whatever the run's outcome (it never reads the run's
    # status); the failure is recorded on the SuperLink, where scripts can read it.
    ls = subprocess.run([str(bindir / "flwr"), "ls", "--format", "json"], cwd=REPO, env=superlink,
                        capture_output=True, text=True, timeout=60)
    runs = json.loads(ls.stdout[ls.stdout.index("{"):])["runs"]
    assert [r["status"] for r in runs] == ["finished:failed"], ls.stdout
    assert "loss.method='ppo'" in runs[0]["status-details"]


def _runs(superlink) -> list[dict]:  # noqa: F811
    ls = subprocess.run([str(flower_bin() / "flwr"), "ls", "--format", "json"], cwd=REPO, env=superlink,
                        capture_output=True, text=True, timeout=60)
    return json.loads(ls.stdout[ls.stdout.index("{"):])["runs"]


def test_ftis_flwr_run_refuses_a_bad_configuration_before_starting_a_run(tmp_path, superlink):  # noqa: F811
    cmd = [sys.executable, "-m", "ftis_flwr.cli", "run", ".", "--stream",
           "--run-config", "loss.method='ppo' loss.trunc=3 rollout.group-size=8.5"]
    proc = subprocess.run(cmd, cwd=REPO, env=superlink, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "unknown key 'loss.trunc'; did you mean loss.trunc-c" in proc.stderr
    assert _runs(superlink) == []  # nothing reached the SuperLink
