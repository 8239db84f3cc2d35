"""benchmarks/round_times.py: the per-round table of a run from its metrics.jsonl (hand-written records)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import round_times  # noqa: E402


def _write(run: Path, records: list[dict]) -> None:
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_table_marks_phases_not_run_and_nodes_that_did_not_reply(tmp_path, capsys):
    run = tmp_path / "run"
    _write(run, [
        {"round": 0, "elapsed": 100.0, "server": {"round_seconds": 99.94},
         "nodes": {"a": {"seconds_train": 3e-7, "seconds_generate": 20.0, "seconds_eval": 60.04},
                   "b": {"seconds_train": 4e-7, "seconds_generate": 25.0, "seconds_eval": 70.0}}},
        {"round": 1, "elapsed": 150.0, "server": {"round_seconds": 50.0},
         "nodes": {"a": {"seconds_train": 30.0, "seconds_generate": 15.0}}},
    ])
    assert round_times.main([str(run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| round | round s | a: train / generate / eval s | b: train / generate / eval s |"
    assert lines[2] == "| 0 | 99.9 | - / 20.0 / 60.0 | - / 25.0 / 70.0 |"
    assert lines[3] == "| 1 | 50.0 | 30.0 / 15.0 / - | no reply |"
    assert "2 rounds logged, 150 s" in lines[-1]


def test_a_directory_without_metrics_is_said_not_raised(tmp_path, capsys):
    assert round_times.main([str(tmp_path)]) == 2
    assert "give a run's directory" in capsys.readouterr().err
