"""A bad `flwr run --run-config` fails the run with one short message, no traceback (real flwr run)."""

import json
import subprocess

import pytest
from conftest import flower_bin
from test_flwr_run import REPO, superlink  # noqa: F401  (the SuperLink fixture this test owns)

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
