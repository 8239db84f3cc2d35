"""A reduced chaos run (benchmarks/chaos.py): a local deployment of two SuperNodes under faults.

Six synchronous rounds with a worker SIGKILLed, the ServerApp stopped (``flwr stop``) and resumed,
and one SuperNode away for two rounds, all at seeded rounds. The run must complete; each round is
logged once; each node's update counter never repeats and is explained by its logged and failed
rounds; and every fault is followed by the faulted node logging a round again. Its first rounds
are also the plain deployment check: each message runs in a fresh ClientApp process, and the
node's worker is found again every time, never reloaded.
"""

from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent

PAIR = """
task: {name: arithmetic}
rounds: {num_rounds: 6, prompts_per_node: 4, eval_every: 0, eval_size: 16, round_timeout: 300}
rollout: {group_size: 4, max_new_tokens: 6}
nodes:
  - {name: full, tiny_size: small, warmstart_target: 0.6, seed: 0}
  - {name: lora, tiny_size: small, warmstart_target: 0.6, seed: 0, lora: true,
     lora_config: {r: 8, alpha: 16}}
"""


def test_a_deployment_under_faults_completes_and_logs_every_round_once(tmp_path):
    from benchmarks import chaos

    study = tmp_path / "pair.yaml"
    study.write_text(PAIR)
    res = chaos.main(["--study", str(study), "--rounds", "6", "--kill-every", "3", "--seed", "0",
                      "--workdir", str(tmp_path / "chaos"), "--timeout", "900", "--set"])
    logs = f"logs in {res['workdir']}/logs"
    kinds = sorted(f["fault"] for f in res["injected"])
    assert kinds == ["server_stopped", "supernode_away", "worker_killed"], (res["injected"], logs)
    assert res["returncode"] == 0, logs
    check = res["check"]
    assert check["rounds_once"] and check["failures_bounded"], logs
    for name, node in check["nodes"].items():
        assert node["strictly_increasing"] and node["counter_explained"], (name, node, logs)
    for fault in res["injected"]:
        assert fault["recovery_seconds"] is not None, (fault, logs)
    assert set(res["final_accuracy"]) == {"full", "lora"}, logs
    # before the first fault (round 2), as in any deployment: each message ran in a fresh ClientApp
    # process, and each node's worker was found again, never restarted; every group crossed over
    from ftis_flwr.server.reporting.summary import load_metrics

    run_dir = Path(res["run_dir"])
    rows = load_metrics(run_dir)
    assert [r["round"] for r in rows] == list(range(7)), logs
    for r in rows[:3]:
        assert set(r["nodes"]) == {"full", "lora"}, (r["nodes"], logs)
        assert all(m["worker_starts"] == 1 for m in r["nodes"].values()), (r["nodes"], logs)
    assert all(m["samples_foreign"] == 16 for m in rows[1]["nodes"].values()), logs
    assert (run_dir / "checkpoints" / "lora" / "adapter_config.json").is_file(), logs
