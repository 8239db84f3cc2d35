"""End to end: three tiny nodes in a real Flower simulation, each receiving at most one node's worth
of the other two's groups per round (exchange.max_foreign_groups), chosen by reward variance."""

import pytest
from conftest import simulate

from ftis_flwr.experiment import load_experiment
from ftis_flwr.server.reporting.summary import load_metrics

pytestmark = pytest.mark.slow

BUDGET_FEDERATION = """
rounds: {num_rounds: 2, prompts_per_node: 4, eval_every: 0, eval_size: 16, round_timeout: 300}
rollout: {group_size: 4, max_new_tokens: 6, batch_size: 64}
train: {lr: 1e-3, micro_batch_size: 32}
exchange: {max_foreign_groups: 4, select: reward_variance}
# three cards on the offline default's shipped small model: nothing warm-starts
nodes:
  - {name: a, tiny_size: small, warmstart_target: 0.6, seed: 0}
  - {name: b, tiny_size: small, warmstart_target: 0.6, seed: 0}
  - {name: c, tiny_size: small, warmstart_target: 0.6, seed: 0}
"""


def test_three_nodes_each_train_on_a_budget_of_foreign_groups(tmp_path):
    exp = load_experiment(yaml_text=BUDGET_FEDERATION,
                          overrides={"cache_dir": str(tmp_path / "cache"), "run_dir": str(tmp_path / "runs")})
    rounds = load_metrics(simulate(exp, num_supernodes=3))
    assert [r["round"] for r in rounds] == [0, 1, 2]
    for r in rounds:
        assert set(r["nodes"]) == {"a", "b", "c"}
        for name, m in r["nodes"].items():
            assert 0.0 <= m["idle_fraction"] <= 1.0 and m["compute_seconds"] > 0
            if r["round"] == 0:
                assert m["foreign_groups_received"] == 0
                continue
            # 8 groups on offer (4 from each other node), 4 forwarded, all of them used
            assert m["foreign_groups_received"] == 4, (r["round"], name, m)
            assert m["samples_foreign"] == 16 and m["samples_own"] == 16
            assert not [k for k in m if k.endswith("_rejected")], m
            assert m["foreign_bytes_received"] > 0
