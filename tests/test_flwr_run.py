"""`flwr run .` with the real pyproject: the path users take, against a SuperLink this test owns."""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import flower_bin, free_port, kill_workers, wait_listening

from ftis_flwr.server.reporting.summary import load_events, load_metrics

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent

FEDERATION = """  # cpu-pair's cards, whose models ship with the package: nothing is warm-started
rounds: {num_rounds: 1, prompts_per_node: 4, eval_size: 16}
rollout: {group_size: 4, max_new_tokens: 6}
nodes:
  - {name: small, tiny_size: small, warmstart_target: 0.6, seed: 0}
  - {name: large, tiny_size: large, warmstart_target: 0.6, seed: 1}
"""


@pytest.fixture
def superlink(tmp_path):
    """A local simulation SuperLink on free ports, stopped by its pid afterwards."""
    http, control = free_port(), free_port()
    env = dict(os.environ, FLWR_HOME=str(tmp_path / "flwr-home"),
               FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(http), FLWR_LOCAL_CONTROL_API_PORT=str(control),
               FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1")
    bindir = flower_bin()
    proc = subprocess.Popen(
        [str(bindir / "flower-superlink"), "--insecure", "--simulation", "--isolation", "subprocess",
         "--control-api-address", f"127.0.0.1:{control}", "--host", "127.0.0.1", "--port", str(http),
         "--disable-runtime-dependency-installation", "--log-file", str(tmp_path / "superlink.log")],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        cwd=tmp_path)  # a relative run-dir resolves here, on the server, never in the repository
    try:
        wait_listening(http, proc)
        yield env
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the SuperLink and the simulation process it started
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def ftis_flwr_run(run_config: str, env: dict, cache: Path,
                  timeout: int = 600) -> tuple[str, subprocess.CompletedProcess]:
    """``ftis-flwr run . --stream`` on 2 simulated SuperNodes against the test's SuperLink; the
    node workers under ``cache`` are stopped afterwards."""
    cmd = [sys.executable, "-m", "ftis_flwr.cli", "run", ".", "--stream",
           "--federation-config", "num-supernodes=2 client-resources-num-cpus=1", "--run-config", run_config]
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    finally:
        kill_workers(cache)
    return proc.stdout + proc.stderr, proc


def test_flwr_run_with_the_real_pyproject(tmp_path, superlink):
    config = tmp_path / "tiny.yaml"
    config.write_text(FEDERATION)
    cache, runs = tmp_path / "cache", tmp_path / "runs"
    # through `ftis-flwr run` (ftis_flwr/cli/): checked locally, then `flwr run` with the same
    # arguments; its exit code is Flower's status of the run (finished:completed -> 0)
    out, proc = ftis_flwr_run(f"config_file='{config}' cache-dir='{cache}' run-dir='{runs}'", superlink, cache)
    assert proc.returncode == 0, out[-4000:]
    assert "ftis-flwr: configuration valid: 2 nodes (small, large), 1 rounds" in out
    assert "config-file=" in out and re.search(r"ftis-flwr: run \d+ finished:completed", out), out[-4000:]
    run_dirs = list(runs.glob("*"))
    assert len(run_dirs) == 1, out[-4000:]
    rounds = load_metrics(run_dirs[0])
    assert [r["round"] for r in rounds] == [0, 1]
    assert rounds[1]["nodes"]["small"]["samples_foreign"] == 16
    assert "round 1/1" in out
    # each node's model was built before round 0, and the stream said so (protocol.BUILD)
    for node in ("small", "large"):
        assert re.search(rf"node {node} ready: built in \d+ s", out), out[-4000:]
    assert out.index("ready: built in") < out.index("round 0/1"), out[-4000:]
    built = [e for e in load_events(run_dirs[0]) if e.get("event") == "node_built"]
    assert sorted(e["node"] for e in built) == ["large", "small"], built
    summary = json.loads((run_dirs[0] / "summary.json").read_text())
    assert set(summary["checkpoints"]) == {"small", "large"}
