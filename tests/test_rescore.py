"""simulations/rescore.py: the answer kinds it counts, and the result files it rewrites (#24).

Its model path is the node's own (``HFEngine.greedy`` on the run's settings); re-scoring the
cross-family study's checkpoints with math-verify gave back every accuracy the runs reported."""

import json
from pathlib import Path

from simulations import rescore


def test_answers_are_told_apart_by_what_stands_in_the_answer_tag():
    assert rescore.kind("<think> 5 plus 14 is 19. </think><answer> 19 </answer>") == "number"
    assert rescore.kind(" <think>43+29</think><answer>43+29</answer>") == "expression"
    assert rescore.kind("<think>x</think><answer>(9 - 5) * 1</answer>") == "expression"
    assert rescore.kind("<think>x</think><answer>nineteen</answer>") == "other"
    assert rescore.kind("19") == "none"
    assert rescore.kind("<think>x</think><answer>19</answer> and more") == "none"


def _result(key: str, run_dir: Path) -> dict:
    acc = {"test": [[0, 0.2], [20, 1.0]], "ood": [[0, 0.02], [20, 1.0]]}
    return {"key": key, "summary": {"run_dir": str(run_dir), "nodes": {
        "a": {"accuracy": json.loads(json.dumps(acc))}, "b": {"accuracy": json.loads(json.dumps(acc))}}}}


def test_result_files_get_the_rescored_first_and_last_evaluations_and_nothing_else(tmp_path):
    sweep = tmp_path / "sweep"
    (sweep / "results").mkdir(parents=True)
    for key in ("k1", "k2"):
        (sweep / "results" / f"{key}.json").write_text(json.dumps(_result(key, tmp_path / key)))
    split = lambda x: {"test": {"number": x}, "ood": {"number": x / 2}}  # noqa: E731
    done = {"start": {"a": split(0.1), "b": split(0.3)}, "k1": {"a": split(0.5), "b": split(0.0)},
            "k2": {"a": split(0.7)}}  # k2's node b is not re-scored yet: its file is not written
    out = tmp_path / "number"
    assert rescore.write_results(sweep, done, out) == 1
    assert not (out / "results" / "k2.json").exists()
    nodes = json.loads((out / "results" / "k1.json").read_text())["summary"]["nodes"]
    assert nodes["a"]["accuracy"] == {"test": [[0, 0.1], [20, 0.5]], "ood": [[0, 0.05], [20, 0.25]]}
    assert nodes["b"]["accuracy"] == {"test": [[0, 0.3], [20, 0.0]], "ood": [[0, 0.15], [20, 0.0]]}
    original = json.loads((sweep / "results" / "k1.json").read_text())
    assert original["summary"]["nodes"]["a"]["accuracy"]["test"][-1] == [20, 1.0]  # the sweep's own files stay


def test_a_sweep_without_checkpoints_is_named_not_a_traceback(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    (sweep / "results").mkdir(parents=True)
    (sweep / "results" / "k1.json").write_text(json.dumps(_result("k1", tmp_path / "gone")))
    assert rescore.main([str(sweep), "--out", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err
    assert "has no checkpoints/" in err and "no finished run with checkpoints" in err
