"""``ftis-flwr answers`` (:mod:`ftis_flwr.node.answers`) on synthetic answers: what it counts as full
credit, copied and distinct.

Its model path (greedy, on a run's own settings) is checked against a real run's reported
accuracies in tests/test_e2e_simulation.py."""

from ftis_flwr.node import answers
from ftis_flwr.tasks.base import Problem

Q = "Spell this word backward (example: sun -> nus): monstrator"


def _tagged(answer: str) -> str:
    return f"<think> I read the task. </think><answer> {answer} </answer>"


def test_an_answer_is_copied_when_it_stands_word_for_word_in_the_prompt():
    assert answers.copied(_tagged("monstrator"), Q)  # the word itself, forward
    assert answers.copied(_tagged("NUS"), Q)  # the example's answer, case aside
    assert not answers.copied(_tagged("rotartsnom"), Q)  # the answer worked out
    assert not answers.copied(_tagged("mon"), Q)  # part of a word is not a word of the question
    assert not answers.copied("monstrator", Q)  # no strict format: no answer to compare
    assert answers.copied(_tagged("43+29"), "What is 43+29?")  # the question's expression
    demo = f"Spell this word backward: elutor\n{_tagged('rotule')}\n{Q}"
    assert answers.copied(_tagged("rotule"), demo)  # a worked example's answer


def test_a_split_is_described_by_its_scores_copies_and_distinct_answers():
    problems = [Problem(id=f"test:{i}", question=f"Spell this word backward: {w}", gold=w[::-1])
                for i, w in enumerate(("stone", "river", "cloud", "apple"))]
    texts = [_tagged("enots"), _tagged("river"), _tagged("rotule"), " " + _tagged("rotule") + "\n"]
    d = answers.describe(problems, texts, [1.0, 0.2, 0.0, 0.0])  # no prompts: the questions
    assert d["copied"] == 1
    prompts = [f"Spell this word backward: elutor\n{_tagged('rotule')}\n{p.question}" for p in problems]
    assert answers.describe(problems, texts, [1.0, 0.2, 0.0, 0.0], prompts)["copied"] == 3
    assert d["problems"] == 4 and d["accuracy"] == 0.3
    assert d["full_credit"] == 1 and d["copied"] == 1
    assert d["distinct"] == 3  # the two "rotule" answers differ only in surrounding space
    assert d["most_common"][0] == (_tagged("rotule"), 2)
    assert [a["gold"] for a in d["answers"]] == ["enots", "revir", "duolc", "elppa"]
    lines = answers.report([], "gemma", "test", d, show=1, start=True)
    assert lines[0] == "gemma, test (its starting model, 4 problems, greedy): accuracy 30.00%"
    assert "full credit (score 1): 1 of 4; answer copied from the prompt: 1; distinct answers: 3" in lines[1]
    assert len(lines) == 3 and "score 1.00" in lines[2]


def test_on_a_task_whose_reward_reads_case_only_the_word_as_written_is_a_copy():
    """On ``uppercase`` the right answer is the question's word in capitals: counted case aside,
    every right answer would be a copy. The task says its reward reads case, and the report's
    count follows it."""
    import pytest

    pytest.importorskip("reasoning_gym")
    from ftis_flwr.config.schema import TaskConfig
    from ftis_flwr.tasks import make_task
    from ftis_flwr.tasks.uppercase import QUESTION

    task = make_task(TaskConfig(name="uppercase", shots=1))
    assert task.answer_case_matters and not make_task(TaskConfig(name="basic-math")).answer_case_matters
    problems = task.problems("test")[:3]
    prefix, suffix = QUESTION.split("{word}")
    words = [p.question[len(prefix):-len(suffix)] for p in problems]
    texts = [_tagged(words[0].upper()), _tagged(words[1]), _tagged("?")]  # right, the word as written, neither
    scores = list(task.rewards(texts, problems))
    assert scores == [1.0, 0.0, 0.0]
    assert answers.describe(problems, texts, scores)["copied"] == 2  # case aside: the right one too
    d = answers.describe(problems, texts, scores, ignore_case=not task.answer_case_matters)
    assert d["copied"] == 1 and d["full_credit"] == 1
