"""``ftis-flwr report`` and ``ftis-flwr compare`` on hand-written run folders (config.json and
metrics.jsonl records); both on a real run in tests/test_e2e_simulation.py."""

import json
from pathlib import Path

from ftis_flwr.cli import main


def _write(run: Path, records: list[dict], config: dict | None = None) -> Path:
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if config is not None:
        (run / "config.json").write_text(json.dumps(config))
    return run


def test_report_marks_phases_not_run_and_nodes_that_did_not_reply(tmp_path, capsys):
    run = _write(tmp_path / "run", [
        {"round": 0, "elapsed": 100.0, "server": {"round_seconds": 99.94},
         "nodes": {"a": {"seconds_train": 3e-7, "seconds_generate": 20.0, "seconds_eval": 60.04},
                   "b": {"seconds_train": 4e-7, "seconds_generate": 25.0, "seconds_eval": 70.0}}},
        {"round": 1, "elapsed": 150.0, "server": {"round_seconds": 50.0},
         "nodes": {"a": {"seconds_train": 30.0, "seconds_generate": 15.0}}},
    ])
    assert main(["report", str(run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{run}: 2 rounds logged, 150 s from the start to the last"
    assert lines[2] == "| round | round s | a: train / generate / eval s | b: train / generate / eval s |"
    assert lines[4] == "| 0 | 99.9 | - / 20.0 / 60.0 | - / 25.0 / 70.0 |"
    assert lines[5] == "| 1 | 50.0 | 30.0 / 15.0 / - | no reply |"
    assert "Each node's steps" not in "\n".join(lines)  # a synchronous run: no step breakdown


def test_report_breaks_an_async_runs_steps_down(tmp_path, capsys):
    step = {"round_seconds": 2.0, "compute_seconds": 1.2, "worker_seconds": 1.4, "clientapp_seconds": 1.5,
            "server_reply_seconds": 0.1, "server_send_seconds": 0.05, "idle_fraction": 0.2}
    run = _write(tmp_path / "run", [{"round": r, "elapsed": 2.0 * r, "nodes": {"a": dict(step)}} for r in range(4)])
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    # steps 1 and 2 (the first builds the node, the last generates nothing): worker 0.2, hop 0.1, Flower 0.35
    assert "| a | 2 | 2.000 | 1.200 | 0.200 | 0.100 | 0.150 (0.100 + 0.050) | 0.350 | 0.650 | 0.200 |" in out


def test_compare_lists_the_settings_that_differ_and_the_accuracies_of_both(tmp_path, capsys):
    def rows(last_acc):
        return [{"round": 0, "nodes": {"a": {"eval/test/accuracy": 0.5, "reward_mean": 0.1}}},
                {"round": 4, "nodes": {"a": {"eval/test/accuracy": last_acc, "reward_mean": 0.3}}}]
    cfg = {"loss": {"method": "f-tis"}, "run_dir": "x", "nodes": [{"name": "a", "seed": 0}]}
    a = _write(tmp_path / "a", rows(0.6), cfg)
    b = _write(tmp_path / "b", rows(0.75)[:1] + [{"round": 4, "nodes": {"a": {"reward_mean": 0.2},
                                                                        "c": {"eval/test/accuracy": 0.1}}}],
               {**cfg, "loss": {"method": "nois"}, "run_dir": "y", "nodes": [{"name": "a", "seed": 1}]})
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert 'loss.method: "f-tis" -> "nois"' in out and 'nodes.a.seed: 0 -> 1' in out
    assert "run_dir" not in out  # where a run wrote is not a setting
    assert "| a | test | 0.500 (r0) | 0.600 (r4) | 0.500 (r0) | 0.500 (r0) | -10.0 |" in out
    assert "| c | test | - | - | 0.100 (r4) | 0.100 (r4) | - |" in out  # a node one run lacks: marked
    assert "| a | 0.100 (r0) -> 0.300 (r4) | 0.100 (r0) -> 0.200 (r4) |" in out


def test_a_folder_without_a_run_is_said_not_raised(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "ftis-flwr report: " in capsys.readouterr().err
    assert main(["compare", str(tmp_path), str(tmp_path)]) == 2
    assert "no config.json: give a run's folder" in capsys.readouterr().err
