"""simulations/repeat_check.py: a rerun repeats when every node drew the same samples and ended with
the same accuracies; float noise elsewhere is reported, not judged. Synthetic metrics rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulations.repeat_check import main

REPO = Path(__file__).resolve().parent.parent



def _run(folder: Path, rewards: list[float], losses: list[float], test_acc: tuple[float, float] = (0.1, 0.2),
         grad: float = 2.0) -> Path:
    folder.mkdir(parents=True)
    rows = []
    for k, (reward, loss) in enumerate(zip(rewards, losses, strict=True)):
        node = {"reward_mean": reward, "tokens": 100.0 + k, "loss": loss, "grad_norm": grad + k,
                "seconds_train": 1.0 + 0.1 * k * len(str(folder))}
        if k in (0, len(rewards) - 1):
            node["eval/test/accuracy"] = test_acc[0 if k == 0 else 1]
        rows.append({"round": k, "elapsed": 3.0 * k, "nodes": {"a": node}})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_same_samples_and_accuracies_repeat_though_losses_and_timings_differ(tmp_path, capsys):
    first = _run(tmp_path / "first", [0.1, 0.2, 0.3], [1e-7, -2e-7, 3e-8])
    rerun = _run(tmp_path / "rerun-on-another-cpu", [0.1, 0.2, 0.3], [-4e-7, 1e-7, 5e-8], grad=2.00001)
    main([str(first), str(rerun)])
    out = capsys.readouterr().out
    assert "a: the same samples in every round" in out
    assert "round 0: 10.00 / 10.00, round 2: 20.00 / 20.00" in out
    assert "grad_norm 5.0e-06" in out  # 1e-5 / 2.00001 at round 0, the largest
    assert "loss" not in out and "seconds" not in out  # rounding noise and timings left out
    assert out.rstrip().endswith("the runs repeat: same samples and same accuracies")


def test_runs_that_part_name_the_first_round_and_metric(tmp_path, capsys):
    first = _run(tmp_path / "first", [0.1, 0.2, 0.3], [0.0, 0.0, 0.0])
    rerun = _run(tmp_path / "rerun", [0.1, 0.25, 0.3], [0.0, 0.0, 0.0], test_acc=(0.1, 0.3))
    main([str(first), str(rerun)])
    out = capsys.readouterr().out
    assert "a: the samples part at round 1 (reward_mean: 0.2 / 0.25)" in out
    assert "round 2: 20.00 / 30.00" in out
    assert out.rstrip().endswith("the runs do not repeat")


def test_equal_samples_but_other_accuracy_do_not_repeat(tmp_path, capsys):
    first = _run(tmp_path / "first", [0.1, 0.2], [0.0, 0.0])
    rerun = _run(tmp_path / "rerun", [0.1, 0.2], [0.0, 0.0], test_acc=(0.1, 0.25))
    main([str(first), str(rerun)])
    assert capsys.readouterr().out.rstrip().endswith("the runs do not repeat")


def test_bad_input_is_said_in_one_line(tmp_path):
    first = _run(tmp_path / "first", [0.1, 0.2, 0.3], [0.0, 0.0, 0.0])
    shorter = _run(tmp_path / "shorter", [0.1, 0.2], [0.0, 0.0])
    with pytest.raises(SystemExit, match=r"different rounds: \[0, 1, 2\] / \[0, 1\]"):
        main([str(first), str(shorter)])
    with pytest.raises(SystemExit, match="no metrics.jsonl"):
        main([str(first), str(tmp_path / "missing")])
