"""Per-source health over a run (ftis_flwr.server.reporting.source_health), from metrics rows as the
reporter logs them: the filtered share, ESS and quantiles per (source, receiver), and the
summary's first lines naming a peer whose samples were almost all filtered."""

from __future__ import annotations

import pytest

from ftis_flwr.server.reporting.reporter import RunReporter
from ftis_flwr.server.reporting.source_health import source_health, warnings_first


def _row(r: int, filtered_b: float) -> dict:
    return {"round": r, "nodes": {
        "a": {"b/samples": 10.0, "b/filtered": filtered_b, "b/ess": 0.5 + 0.1 * r, "b/w_p50": 1.0,
              "b/w_p90": 1.5, "b/w_p99": 2.0, "b/abs_log_ratio_p50": 0.0, "b/abs_log_ratio_p90": 0.4,
              "b/abs_log_ratio_p99": 3.0, "a/samples": 10.0, "a/filtered": 0.0},
        "b": {"a/samples": 10.0, "a/filtered": 1.0, "a/ess": float("nan")}}}


def test_health_per_pair_over_the_run_and_the_almost_all_filtered_warning():
    rows = [_row(1, 9.0), _row(2, 10.0)]
    health = {(h["source"], h["receiver"]): h for h in source_health(rows)}
    assert set(health) == {("b", "a"), ("a", "b")}  # a node's own samples are not a peer
    ba = health[("b", "a")]
    assert ba["rounds"] == 2 and ba["samples"] == 20 and ba["filtered_share"] == pytest.approx(0.95)
    assert ba["ess"] == pytest.approx(0.65) and ba["abs_log_ratio_p99"] == 3.0
    assert health[("a", "b")]["ess"] is None  # NaN rounds are not averaged in
    (line,) = warnings_first(rows)
    assert line.startswith("a's filter dropped almost all of b's samples: 19 of 20 (95%)")
    assert warnings_first([_row(1, 8.0), _row(2, 9.0)]) == []  # 85%: not almost all


def test_the_summary_says_it_first_and_shows_the_table(tmp_path):
    with RunReporter(tmp_path / "run", config={"preset": "x"}, node_names=["a", "b"], tensorboard=False) as rep:
        for r in (1, 2):
            rep.log_round(r, _row(r, 10.0)["nodes"], {})
        summary = rep.finish()
    text = (tmp_path / "run" / "summary.md").read_text()
    assert summary.warnings and "a's filter dropped almost all of b's samples" in summary.warnings[0]
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert lines[2].startswith("**Warning:** a's filter dropped almost all")  # right after the title lines
    assert "| b | a | 20 | 100% | 0.65 | 1.00 / 1.50 / 2.00 | 0.00 / 0.40 / 3.00 |" in text
