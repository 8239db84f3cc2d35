"""A learning claim that can fail: two tiny nodes trained with F-TIS in a real Flower simulation
get better at held-out problems. (Scaled-down default: same recipe, fewer rounds.)"""

import pytest
from conftest import simulate

from ftis_flwr.config import load_experiment
from ftis_flwr.reporting import load_metrics

pytestmark = pytest.mark.slow

FEDERATION = """
rollout: {group_size: 8, max_new_tokens: 6, batch_size: 512}
train: {lr: 3e-4, warmup_rounds: 5, micro_batch_size: 256}
rounds: {num_rounds: 12, prompts_per_node: 64, eval_every: 0, eval_size: 500}
nodes:
  - {name: a, tiny_size: small, warmstart_target: 0.6, seed: 0}
  - {name: b, tiny_size: small, warmstart_target: 0.6, seed: 1}
"""


def test_ftis_federation_improves_held_out_accuracy(tmp_path):
    exp = load_experiment("cpu-pair", yaml_text=FEDERATION,
                          overrides={"cache_dir": str(tmp_path / "cache"), "run_dir": str(tmp_path / "runs")})
    rounds = load_metrics(simulate(exp))
    first = {n: m["eval/test/accuracy"] for n, m in rounds[0]["nodes"].items()}
    last = {n: m["eval/test/accuracy"] for n, m in rounds[-1]["nodes"].items()}
    gain = sum(last[n] - first[n] for n in first) / len(first)
    assert gain >= 0.03, f"mean held-out accuracy went from {first} to {last}"
    assert all(last[n] > first[n] for n in first), f"a node got worse: {first} -> {last}"
