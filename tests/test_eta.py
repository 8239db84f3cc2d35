"""The time-left estimate on the progress line (ftis_flwr/server/reporting/eta.py), on hand-written rounds."""
from __future__ import annotations

import math

import pytest

from ftis_flwr.config.schema import RoundConfig
from ftis_flwr.server.reporting.eta import format_left, seconds_left
from ftis_flwr.server.reporting.reporter import RunReporter


def _row(rnd, wall, *evals):
    """One logged round: its wall time and each node's evaluation seconds (none: no evaluation)."""
    nodes = {f"n{i}": ({"seconds_eval": e} if e is not None else {}) for i, e in enumerate(evals or (None,))}
    return {"round": rnd, "nodes": nodes, "server": {"round_seconds": wall}}


EVERY_2_OF_4 = RoundConfig(num_rounds=4, eval_every=2).evaluates


def test_the_rule_of_which_rounds_evaluate():
    assert [k for k in range(11) if RoundConfig(num_rounds=10, eval_every=4).evaluates(k)] == [0, 4, 8, 10]
    assert [k for k in range(6) if RoundConfig(num_rounds=5, eval_every=0).evaluates(k)] == [0, 5]


def test_no_estimate_before_a_training_round_was_timed():
    assert seconds_left([], 4, EVERY_2_OF_4) is None
    assert seconds_left([_row(0, 100.0, 60.0, 40.0)], 4, EVERY_2_OF_4) is None  # builds + evaluates only
    assert seconds_left([_row(0, 100.0, 60.0), _row(1, None)], 4, EVERY_2_OF_4) is None


def test_training_and_evaluation_are_counted_apart():
    # round 0: the slower node evaluated for 60 s; round 1 trained in 50 s. Left: rounds 2, 3, 4,
    # each 50 s of training, and 2 and 4 evaluate (60 s each)
    rows = [_row(0, 100.0, 60.0, 40.0), _row(1, 50.0)]
    assert seconds_left(rows, 4, EVERY_2_OF_4) == pytest.approx(3 * 50 + 2 * 60)
    # round 2 evaluated for 70 s in its 120 s: 50 s of it trained; the newest evaluation counts
    rows.append(_row(2, 120.0, 70.0, 30.0))
    assert seconds_left(rows, 4, EVERY_2_OF_4) == pytest.approx(2 * 50 + 70)
    assert seconds_left(rows + [_row(3, 50.0), _row(4, 110.0, 60.0)], 4, EVERY_2_OF_4) == 0.0


def test_one_slow_round_does_not_swing_it_and_non_finite_times_are_skipped():
    rows = [_row(0, 100.0, 10.0), _row(1, 50.0), _row(2, 400.0), _row(3, math.nan), _row(4, 54.0)]
    # median of 50, 400, 54 is 54; rounds 5..10 left, 10 evaluates
    assert seconds_left(rows, 10, RoundConfig(num_rounds=10, eval_every=0).evaluates) == pytest.approx(6 * 54 + 10)


def test_format():
    assert format_left(40.4) == "~40 s left"
    assert format_left(600) == "~10 min left"
    assert format_left(3900) == "~1 h 05 min left"
    assert format_left(-3) == "~0 s left"


def test_the_progress_line_ends_with_the_time_left(tmp_path):
    cfg = RoundConfig(num_rounds=3, eval_every=0)
    with RunReporter(tmp_path / "run", config={"preset": "unit"}, node_names=["a"], num_rounds=3,
                     tensorboard=False, evaluates=cfg.evaluates) as rep:
        first = rep.log_round(0, {"a": {"seconds_eval": 30.0}}, {"round_seconds": 45.0})
        second = rep.log_round(1, {"a": {"reward_mean": 0.5}}, {"round_seconds": 60.0})
        rep.log_round(2, {"a": {}}, {"round_seconds": 62.0})
        last = rep.log_round(3, {"a": {"seconds_eval": 30.0}}, {"round_seconds": 92.0})
    assert first == "round 0/3 | a: ok | 45.0 s"  # nothing trained yet: no estimate
    assert second == "round 1/3 | a: reward 0.50 | 60.0 s | ~2 min left"  # 60 + 60 + 30 s
    assert "left" not in last
