"""The uppercase task (#39's candidate for a study of learning across tokenizer families): its
splits, its exact-match reward, and its errors, on reasoning-gym's real word lists."""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("reasoning_gym")

from ftis_flwr.config.schema import ConfigError, TaskConfig  # noqa: E402
from ftis_flwr.config.validation import experiment_errors  # noqa: E402
from ftis_flwr.experiment import load_experiment  # noqa: E402
from ftis_flwr.tasks import UppercaseTask, make_task  # noqa: E402
from ftis_flwr.tasks.checks import task_errors  # noqa: E402
from ftis_flwr.tasks.uppercase import DEMO_WORDS, DEMOS, OOD_LETTERS, QUESTION  # noqa: E402


def _word(problem) -> str:
    prefix, suffix = QUESTION.split("{word}")
    assert problem.question.startswith(prefix) and problem.question.endswith(suffix), problem.question
    return problem.question[len(prefix):-len(suffix)]


def test_splits_are_disjoint_words_and_ood_words_are_longer():
    task = make_task(TaskConfig(name="uppercase", shots=1, seed=3))
    assert isinstance(task, UppercaseTask) and task.eval_splits == ("test", "ood")
    words = {s: [_word(p) for p in task.problems(s)] for s in ("train", "test", "ood")}
    assert len(words["test"]) == 256 and len(words["ood"]) == 256 and len(words["train"]) > 1900
    for split, ws in words.items():
        assert len(set(ws)) == len(ws), split
        assert not set(ws) & set(DEMO_WORDS), split
        assert all(w.isalpha() and w.islower() for w in ws), split
        assert [p.gold for p in task.problems(split)] == [w.upper() for w in ws]
        assert [p.id for p in task.problems(split)] == [f"{split}:{i}" for i in range(len(ws))]
    assert not set(words["train"]) & set(words["test"])
    assert {len(w) for w in words["train"] + words["test"]} == {5}
    lo, hi = OOD_LETTERS
    assert all(lo <= len(w) <= hi for w in words["ood"])


def test_the_seed_draws_the_splits_and_the_same_seed_the_same_ones():
    def test_words(seed):
        return [p.question for p in make_task(TaskConfig(name="uppercase", seed=seed)).problems("test")]

    assert test_words(3) == test_words(3)
    assert test_words(3) != test_words(4)


def test_reward_is_the_word_in_capitals_exactly_in_the_strict_format():
    task = make_task(TaskConfig(name="uppercase", shots=1))
    problem = task.problems("test")[0]
    word = _word(problem)

    def says(answer: str) -> float:
        return task.reward(f"<think> {word} in capital letters is {answer}. </think><answer>{answer}</answer>", problem)

    assert says(word.upper()) == 1.0
    assert says(f" {word.upper()}. ") == 1.0
    for wrong in (word, word.capitalize(), word.upper()[:-1], word.upper() + "S", f"{word.upper()} {word.upper()}", ""):
        assert says(wrong) == 0.0, wrong  # the word copied as it stands, or nearly right: nothing
    assert task.reward(word.upper(), problem) == 0.0  # the format counts


def test_worked_examples_show_the_format_in_the_chat_prompt():
    from ftis_flwr.node.tiny.bpe import build_tiny_tokenizer

    tok = build_tiny_tokenizer("char")
    tok.chat_template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    one = make_task(TaskConfig(name="uppercase", shots=1))
    problem = one.problems("test")[0]
    text = one.prompt_text(problem, tok)
    assert DEMOS[0][0] in text and DEMOS[0][1] in text and DEMOS[1][0] not in text
    assert text.rstrip().endswith(problem.question)
    assert DEMOS[1][1] in make_task(TaskConfig(name="uppercase", shots=2)).prompt_text(problem, tok)
    with pytest.raises(ValueError, match="shots=3 must be in 0..2"):
        make_task(TaskConfig(name="uppercase", shots=3))


def test_without_reasoning_gym_the_check_names_the_pip_line(monkeypatch):
    from ftis_flwr.tasks import uppercase

    uppercase._word_lists.cache_clear()  # lists read by an earlier test in this process
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # what `import` sees when not installed
    monkeypatch.setitem(sys.modules, "reasoning_gym.data", None)
    errors = task_errors(TaskConfig(name="uppercase"))
    assert len(errors) == 1 and "uppercase" in errors[0] and 'pip install -e ".[tasks]"' in errors[0], errors


def test_the_preset_checks_and_tiny_models_are_refused():
    assert experiment_errors(load_experiment("cpu-xfamily-upper")) == []
    with pytest.raises(ConfigError, match="task.name='uppercase' needs real models"):
        load_experiment("cpu-pair", {"task.name": "uppercase"})


def test_nodes_with_other_word_lists_stop_the_run_naming_the_words(monkeypatch):
    """Another reasoning-gym release with other word lists would give a node other words for the
    same problem ids, and so other rewards: the task's parts carry the lists' digest, and the
    server's agreement check names that part."""
    from ftis_flwr.server.roster import FederationError
    from ftis_flwr.server.task_agreement import TaskAgreement
    from ftis_flwr.tasks import uppercase
    from ftis_flwr.tasks.fingerprint import task_parts

    cfg = TaskConfig(name="uppercase", shots=1)
    same = task_parts(cfg, make_task(cfg))
    assert task_parts(cfg, make_task(cfg)) == same and "data words" in same
    common, rare = uppercase._word_lists()
    monkeypatch.setattr(uppercase, "_word_lists", lambda: (common[1:], rare))
    other = task_parts(cfg, make_task(cfg))
    assert {k for k in same if same[k] != other[k]} == {"data words"}
    agree = TaskAgreement()
    agree.note("a", same)
    agree.note("b", other)
    with pytest.raises(FederationError, match=r"data words \(a: \w+, b: \w+\)"):
        agree.check()
