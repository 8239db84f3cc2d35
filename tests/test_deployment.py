"""Deployment: a real SuperLink and two SuperNodes that name their model cards with --node-config.

Each message starts a fresh ClientApp process here (Flower's deployment runtime), so this is the
test that a node's worker is reused across processes, not reloaded per round.
"""

import os
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import flower_bin, free_port, kill_workers, wait_listening

from ftis_flwr.reporting import load_metrics

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
BIN = flower_bin()

FEDERATION = """
rounds: {num_rounds: 1, prompts_per_node: 4, eval_size: 16}
rollout: {group_size: 4, max_new_tokens: 6}
nodes:
  - {name: full, tiny_size: small, warmstart_target: 0.6, seed: 0}
  - {name: lora, tiny_size: small, warmstart_target: 0.6, seed: 0, lora: true,
     lora_config: {r: 8, alpha: 16}}
"""


def _start(cmd, env, log):
    return subprocess.Popen(cmd, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _stop(proc):
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def test_superlink_and_two_supernodes(tmp_path):
    port = free_port()
    home = tmp_path / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "dep"\n\n[superlink.dep]\naddress = "127.0.0.1:{port}"\ninsecure = true\n')
    env = dict(os.environ, FLWR_HOME=str(home))
    (tmp_path / "tiny.yaml").write_text(FEDERATION)
    cache, runs = tmp_path / "cache", tmp_path / "runs"
    procs = [_start([str(BIN / "flower-superlink"), "--insecure", "--isolation", "subprocess",
                     "--host", "127.0.0.1", "--port", str(port), "--disable-runtime-dependency-installation"],
                    env, tmp_path / "superlink.log")]
    try:
        wait_listening(port, procs[0])
        for card in ("full", "lora"):
            procs.append(_start([str(BIN / "flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{port}",
                                 "--port", str(free_port()), "--node-config", f'card="{card}"'],
                                env, tmp_path / f"supernode-{card}.log"))
        run = subprocess.run(
            [str(BIN / "flwr"), "run", ".", "dep", "--stream", "--run-config",
             f"config-file='{tmp_path / 'tiny.yaml'}' cache-dir='{cache}' run-dir='{runs}'"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    finally:
        kill_workers(cache)
        for proc in reversed(procs):
            _stop(proc)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    (run_dir,) = list(runs.glob("*"))
    rounds = load_metrics(run_dir)
    assert [r["round"] for r in rounds] == [0, 1]  # two messages per node: two ClientApp processes
    for r in rounds:
        assert set(r["nodes"]) == {"full", "lora"}
        assert all(m["worker_starts"] == 1 for m in r["nodes"].values()), r["nodes"]
    assert all(m["samples_foreign"] == 16 for m in rounds[1]["nodes"].values())
    assert (run_dir / "checkpoints" / "lora" / "adapter_config.json").is_file()
