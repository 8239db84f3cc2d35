"""Greedy answers that collapsed to one for most problems, and accuracies that are partial credit
only (ftis_flwr.server.reporting.answer_health), from metrics rows as the reporter logs them, and the
summary lines that name them first."""

from __future__ import annotations

from ftis_flwr.server.reporting.answer_health import collapsed_answers, partial_credit_only
from ftis_flwr.server.reporting.reporter import RunReporter


def _row(r: int, gemma: float, smollm2: float = 0.9) -> dict:
    return {"round": r, "nodes": {
        "gemma": {"eval/test/accuracy": 0.0546, "eval/test/distinct": gemma, "eval/ood/distinct": 0.9},
        "smollm2": {"eval/test/accuracy": 0.14, "eval/test/distinct": smollm2}}}


def test_a_fall_to_one_answer_for_most_problems_is_named_per_node_and_split():
    rows = [_row(0, 110 / 128), {"round": 5, "nodes": {"gemma": {"reward_mean": 0.1}}}, _row(20, 1 / 128)]
    (line,) = collapsed_answers(rows)
    assert line.startswith("gemma's greedy answers on test collapsed: 0.8% of them are distinct at round 20 "
                           "(85.9% at round 0)")


def test_few_answers_from_the_start_or_one_evaluation_are_not_a_collapse():
    assert collapsed_answers([_row(0, 0.05), _row(20, 0.04)]) == []  # a yes/no task: few from the start
    assert collapsed_answers([_row(0, 0.9), _row(20, 0.2)]) == []  # fewer, but not few
    assert collapsed_answers([_row(20, 1 / 128)]) == []  # one evaluation: nothing to fall from
    assert collapsed_answers([_row(0, 0.9), _row(20, float("nan"))]) == []


def test_the_summary_says_it_first(tmp_path):
    with RunReporter(tmp_path / "run", config={"preset": "x"}, node_names=["gemma", "smollm2"],
                     tensorboard=False) as rep:
        for r, share in ((0, 0.86), (20, 1 / 128)):
            rep.log_round(r, _row(r, share)["nodes"], {})
        summary = rep.finish()
    assert len(summary.warnings) == 1 and summary.warnings[0].startswith("gemma's greedy answers on test collapsed")
    lines = [ln for ln in (tmp_path / "run" / "summary.md").read_text().splitlines() if ln.strip()]
    assert lines[2].startswith("**Warning:** gemma's greedy answers on test collapsed")


def test_an_accuracy_without_one_full_credit_answer_is_named_partial_credit_only():
    def row(r, acc, full):
        return {"round": r, "nodes": {"smollm2": {"eval/test/accuracy": acc, "eval/test/full_credit": full},
                                      "gemma": {"eval/test/accuracy": 0.2, "eval/test/full_credit": 0.1}}}

    (line,) = partial_credit_only([row(0, 0.063, 0.0), row(20, 0.1257, 0.0)])
    assert line.startswith("smollm2's accuracy on test (12.6% at round 20) is partial credit only")
    assert partial_credit_only([row(0, 0.063, 0.0), row(20, 0.1257, 0.01)]) == []  # one answer right
    assert partial_credit_only([row(20, 0.0, 0.0)]) == []  # nothing scored: nothing to mistake
    assert partial_credit_only([{"round": 20, "nodes": {"a": {"eval/test/accuracy": 0.3}}}]) == []  # not logged
