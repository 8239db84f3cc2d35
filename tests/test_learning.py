"""A learning claim that can fail: the default federation (the shipped small + large tiny models,
the cpu-pair recipe) trained with vertical F-TIS in a real Flower simulation gets better at
held-out problems.

Distribution measured before the thresholds were set (this machine, 12 run seeds
``rounds.seed`` 0..11, the same recipe driven in-process; 10 rounds, 500 test problems):
small +10.4 .. +13.4 points (mean +11.9), large +4.4 .. +7.6 (mean +6.4), the pair's mean
+8.0 .. +10.5. Different CPUs change the trajectory the way a different run seed does; the
thresholds (every node >= +2, mean >= +4) sit about 2.4 points below the worst node seen and
half the worst mean. With the earlier recipe (lr 3e-4) the same measurement gave -7.8 .. +11.8
per node over 12 models, which is why this test used to flip between machines.
"""

import pytest
from conftest import simulate

from ftis_flwr.experiment import load_experiment
from ftis_flwr.server.reporting.summary import load_metrics

pytestmark = pytest.mark.slow


def test_default_federation_improves_held_out_accuracy(tmp_path):
    exp = load_experiment("cpu-pair", overrides={
        "rounds.num_rounds": 10, "rounds.eval_every": 0, "rounds.eval_size": 500,
        "cache_dir": str(tmp_path / "cache"), "run_dir": str(tmp_path / "runs")})
    rounds = load_metrics(simulate(exp))
    first = {n: m["eval/test/accuracy"] for n, m in rounds[0]["nodes"].items()}
    last = {n: m["eval/test/accuracy"] for n, m in rounds[-1]["nodes"].items()}
    assert set(first) == set(last) == {"small", "large"}
    gains = {n: last[n] - first[n] for n in first}
    assert all(g >= 0.02 for g in gains.values()), f"a node gained < 2 points: {first} -> {last}"
    assert sum(gains.values()) / len(gains) >= 0.04, f"mean gain < 4 points: {first} -> {last}"
