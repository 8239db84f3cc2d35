"""End to end with ``task.environment`` (issue #57): a real Flower simulation of two tiny nodes whose
groups are episodes of the calculator environment (``toy_environments.CalcEnv``). Each node runs its
episodes, logs the ``env/*`` metrics every round and trains on its own; the peer's episode groups
cross the wire (sampled masks included, an all-ones mask dropped), are replayed through the
receiver's own environment and trained on with the rewards it computed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import simulate

from ftis_flwr.config.merge import load_experiment
from ftis_flwr.server.summary import load_metrics

pytestmark = pytest.mark.slow  # a Flower simulation: about a minute

TOYS = Path(__file__).resolve().parent / "toy_environments.py"


def test_two_nodes_run_episodes_and_train_on_each_others_after_replay(tmp_path):
    rows = tmp_path / "train.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n"
                            for a, b in ((12, 34), (20, 21), (31, 15), (40, 12))))
    yaml = f"""
rounds: {{num_rounds: 2, prompts_per_node: 2, round_timeout: 300}}
rollout: {{group_size: 4, max_new_tokens: 12, batch_size: 64}}
train: {{lr: 1e-3, micro_batch_size: 32}}
task: {{name: dataset, dataset: json, data_files: {{train: "{rows}"}}, environment: "{TOYS}:CalcEnv", max_turns: 3}}
nodes:
  - {{name: a, tiny_size: small, warmstart_steps: 0, seed: 1}}
  - {{name: b, tiny_size: small, warmstart_steps: 0, seed: 2}}
report: {{to: [none]}}
"""
    exp = load_experiment(yaml_text=yaml, overrides={"cache_dir": str(tmp_path / "cache"),
                                                     "run_dir": str(tmp_path / "runs")})
    records = load_metrics(simulate(exp))
    assert [r["round"] for r in records] == [0, 1, 2]
    for r in records:
        for name in ("a", "b"):
            m = r["nodes"][name]
            assert m["env/episodes"] == 8 and 1 <= m["env/turns_mean"] <= 3 and "env/tool_errors" in m
            if r["round"]:
                assert m["samples_own"] == 8
    last = records[-1]["nodes"]  # round 1's groups reached the peer in round 2 (round 0's asked for texts)
    for node, peer in (("a", "b"), ("b", "a")):
        m = last[node]
        assert m[f"{peer}/env_replayed"] == 8 and m["samples_foreign"] == 8, m
        assert not m.get(f"{peer}/env_replay_refused") and not m.get(f"{peer}/groups_rejected")
