"""simulations/foreign_kl.py: what each node's filter and truncation saw, from a run's metrics.jsonl
(hand-written records)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "simulations"))
import foreign_kl  # noqa: E402


def _write(run: Path, records: list[dict]) -> None:
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_received_samples_only_over_training_rounds(tmp_path, capsys):
    """Round 0 (no training) and the node's own samples (weights about 1) are left out; a round in
    which a node received nothing counts for nothing; a node that never received shows "-"."""
    run = tmp_path / "run-1"
    _write(run, [
        {"round": 0, "nodes": {"a": {"samples_foreign": 8, "kl_median_foreign": 9e9, "filtered": 8}}},
        {"round": 1, "nodes": {
            "a": {"samples_foreign": 16, "filtered": 4, "kl_median_foreign": 2300.0,
                  "a/w_max": 9.0, "a/frac_tokens_truncated": 0.5, "b/w_max": 2.0,
                  "b/frac_tokens_truncated": 0.027},
            "c": {"samples_foreign": 0}}},
        {"round": 2, "nodes": {
            "a": {"samples_foreign": 16, "filtered": 16, "kl_median_foreign": 170000.0,
                  "b/w_max": 1.5, "b/frac_tokens_truncated": 0.01}}},
        {"round": 3, "nodes": {"a": {"samples_foreign": 0, "filtered": 0}}},
    ])
    assert foreign_kl.main([str(run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "| run-1 | a | 2.3e+03..1.7e+05 | 62% | 2.7% | 2 |"
    assert lines[3] == "| run-1 | c | - | - | - | - |"
    assert len(lines) == 4


def test_a_folder_without_metrics_is_named(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert foreign_kl.main([str(tmp_path / "empty"), str(tmp_path / "absent")]) == 2
    err = capsys.readouterr().err
    assert "no metrics.jsonl in:" in err and "empty" in err and "absent" in err
