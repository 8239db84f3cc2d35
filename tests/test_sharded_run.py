"""The offline default with one node sharded over two ranks, through a real Flower simulation:
it trains and completes, a killed rank costs that node one round (then a rebuilt node resumes
from its saved state), and no rank outlives the run."""

import json
import os
import signal
import time

from conftest import simulate

from ftis_flwr.experiment import load_experiment


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped) is gone for our purpose
        return "State:\tZ" not in open(f"/proc/{pid}/status").read()
    except OSError:
        return False


def test_a_node_on_two_ranks_trains_survives_a_killed_rank_and_leaves_none(tmp_path):
    exp = load_experiment(preset="cpu-pair", overrides={
        "cache_dir": str(tmp_path / "cache"), "run_dir": str(tmp_path / "runs"), "rounds.num_rounds": 4,
        "rounds.prompts_per_node": 8, "rounds.eval_every": 4, "rounds.eval_size": 16, "rounds.state_every": 1,
        "nodes.large.ranks": 2})
    seen: dict[int, int] = {}

    def kill_a_rank(rnd, node_metrics):
        if rnd == 1:  # rank 1 of node large dies between rounds 1 and 2
            (found,) = (tmp_path / "cache" / "workers").glob("*/large/ranks.json")
            pid = json.loads(found.read_text())["ranks"]["1"]
            seen[rnd] = pid
            os.kill(pid, signal.SIGKILL)
        for f in (tmp_path / "cache" / "workers").glob("*/large/ranks.json"):
            seen.setdefault(100 + rnd, json.loads(f.read_text())["ranks"]["1"])

    run_dir = simulate(exp, after_round=kill_a_rank)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    large = {r["round"]: r["nodes"]["large"] for r in rows if "large" in r.get("nodes", {})}
    assert large[0]["ranks"] == 2 and 4 in large and 2 not in large, sorted(large)  # round 2 failed
    assert any("resumed_from_round" in r for r in large.values()), "the rebuilt node did not resume"
    assert large[4]["updates"] >= 2 and "eval/test/accuracy" in large[4]
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(str(run_dir / "checkpoints" / "large"))  # whole, plain
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in seen.values()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not [p for p in seen.values() if _alive(p)], "a rank outlived the run"
