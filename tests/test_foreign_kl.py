"""simulations/foreign_kl.py: what each node's filter and truncation saw, from a run's metrics.jsonl
(hand-written records)."""

import json
from pathlib import Path

from simulations import foreign_kl


def _write(run: Path, records: list[dict]) -> None:
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_received_samples_only_over_training_rounds(tmp_path, capsys):
    """Round 0 (no training) and the node's own samples (weights about 1, ESS 1) are left out; a round in
    which a node received nothing counts for nothing; a node that never received shows "-"."""
    run = tmp_path / "run-1"
    _write(run, [
        {"round": 0, "nodes": {"a": {"samples_foreign": 8, "kl_median_foreign": 9e9, "filtered": 8}}},
        {"round": 1, "nodes": {
            "a": {"samples_foreign": 16, "filtered": 4, "kl_median_foreign": 2300.0,
                  "a/w_max": 9.0, "a/frac_tokens_truncated": 0.5, "b/w_max": 2.0,
                  "b/frac_tokens_truncated": 0.027, "a/ess": 1.0, "b/ess": 0.5,
                  "b/xtok_word_merged_share": 0.1},
            "c": {"samples_foreign": 0}}},
        {"round": 2, "nodes": {
            "a": {"samples_foreign": 16, "filtered": 16, "kl_median_foreign": 170000.0,
                  "b/w_max": 1.5, "b/frac_tokens_truncated": 0.01, "b/ess": 0.3,
                  "b/xtok_word_merged_share": 0.3}}},
        {"round": 3, "nodes": {"a": {"samples_foreign": 0, "filtered": 0}}},
    ])
    assert foreign_kl.main([str(run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "| run-1 | a | 2.3e+03..1.7e+05 | 62% | 2.7% | 2 | 0.40 | 20.0% |"
    assert lines[3] == "| run-1 | c | - | - | - | - | - | - |"
    assert len(lines) == 4


def test_a_folder_without_metrics_is_named(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert foreign_kl.main([str(tmp_path / "empty"), str(tmp_path / "absent")]) == 2
    err = capsys.readouterr().err
    assert "no metrics.jsonl in:" in err and "empty" in err and "absent" in err


def test_by_config_folds_the_seeds_of_one_configuration(tmp_path, capsys):
    """--by-config: one row per configuration (run name without its seed) and node, each cell the
    range over that configuration's runs; a figure equal in every run is written once."""
    def node(kl, filtered, ess):
        return {"samples_foreign": 10, "filtered": filtered, "kl_median_foreign": kl,
                "b/w_max": 2.0, "b/frac_tokens_truncated": 0.01, "b/ess": ess}
    _write(tmp_path / "xf__f-tis__seed-0", [{"round": 1, "nodes": {"a": node(10.0, 1, 0.9)}}])
    _write(tmp_path / "xf__f-tis__seed-1", [{"round": 1, "nodes": {"a": node(300.0, 5, 0.6)}}])
    _write(tmp_path / "xf-seq__f-tis__seed-0", [{"round": 1, "nodes": {"a": node(0.5, 0, 1.0)}}])
    runs = [str(tmp_path / n) for n in ("xf__f-tis__seed-0", "xf__f-tis__seed-1", "xf-seq__f-tis__seed-0")]
    assert foreign_kl.main(["--by-config", *runs]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| configuration | runs | node | median KL")
    assert lines[1].count("---") == 9
    assert lines[2] == "| xf__f-tis | 2 | a | 10..300 | 10%..50% | 1.0% | 2 | 0.60..0.90 | - |"
    assert lines[3] == "| xf-seq__f-tis | 1 | a | 0.5..0.5 | 0% | 1.0% | 2 | 1.00 | - |"
    assert len(lines) == 4
