"""Rewards: the strict format, math-verify equivalences (in-process and in the judge subprocess),
time bounds on hostile answers, thread safety. Examples are made up, not copied from data sets."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from ftis_flwr.tasks import rewards
from ftis_flwr.tasks.rewards import (
    SYSTEM_PROMPT,
    RewardJudgeError,
    arithmetic_reward,
    gsm8k_gold,
    math_equal,
    math_reward,
    parse_strict_answer,
)


def fmt(answer: str, think: str = "some reasoning") -> str:
    return f"<think>{think}</think><answer>{answer}</answer>"


def test_system_prompt_names_the_format():
    for tag in ("<think>", "</think>", "<answer>", "</answer>"):
        assert tag in SYSTEM_PROMPT


@pytest.mark.parametrize(
    "completion,answer",
    [
        (fmt("72"), "72"),
        (fmt("  72 \n"), "72"),
        ("  \n<think>a</think>\n\n<answer>\\boxed{5}</answer>  \n", "\\boxed{5}"),
        ("<think></think><answer>x = 3</answer>", "x = 3"),
        ("<think>2 < 3 and 5 > 4</think> <answer>1/2</answer>", "1/2"),
    ],
)
def test_strict_format_accepts(completion, answer):
    assert parse_strict_answer(completion) == answer


@pytest.mark.parametrize(
    "completion",
    [
        "72",
        "<think>r</think>72",  # no answer tags
        "<answer>72</answer>",  # no think
        "<think>r<answer>72</answer>",  # no </think>
        "<think>r</think><answer>72",  # no </answer>
        "<think>r</think><answer>7</answer><answer>72</answer>",  # two answers
        "<think>r</think><think>s</think><answer>72</answer>",  # two thinks
        fmt("72") + " so the answer is 72",  # text after </answer>
        fmt("72") + "<|endoftext|>",  # special-token text counts as text
        "Sure! " + fmt("72"),  # text before <think>
        "<think>r</think> therefore <answer>72</answer>",  # text between the blocks
        "<answer>72</answer><think>r</think>",  # think after answer
        "<think>r<answer>72</answer></think>",  # answer nested in think
        "</think><think>r<answer>72</answer>",  # misordered think tags
        "<think>r</think></answer>72<answer>",  # misordered answer tags
        fmt("   "),  # empty answer
        "",
    ],
)
def test_strict_format_rejects(completion):
    assert parse_strict_answer(completion) is None
    assert math_reward(completion, "72", format_credit=0.5) == 0.0


EQUIVALENT = [
    ("1/2", "0.5"),
    ("0.5", "1/2"),
    ("$1,000", "1000"),
    ("1,000", "1000"),
    ("\\$1,000", "1000"),
    ("\\frac{1}{2}", "0.5"),
    ("0.5", "\\frac{1}{2}"),
    ("72.0", "72"),
    ("72", "72"),
    ("\\boxed{72}", "72"),
    ("$\\boxed{72}$", "72"),
    ("-5", "-5"),
    ("14/3", "\\frac{14}{3}"),
    ("18.9", "\\$18.90"),
    ("$18$", "18"),
]
DIFFERENT = [("73", "72"), ("-5", "5"), ("0.49", "1/2"), ("\\boxed{71}", "72"), ("1,001", "1000")]


@pytest.fixture(params=["in-process", "judge"])
def path(request, monkeypatch):
    """Run each equivalence both in-process and through the judge subprocess."""
    if request.param == "judge":
        monkeypatch.setattr(rewards, "_is_fast", lambda text: False)
    return request.param


@pytest.mark.parametrize("answer,gold", EQUIVALENT)
def test_equivalent_answers_score_one(answer, gold, path):
    assert math_reward(fmt(answer), gold) == 1.0


@pytest.mark.parametrize("answer,gold", DIFFERENT)
def test_different_answers_score_zero(answer, gold, path):
    assert math_reward(fmt(answer), gold) == 0.0
    assert math_reward(fmt(answer), gold, format_credit=0.1) == 0.1


@pytest.mark.parametrize(
    "answer,gold,expected",
    [
        ("\\sqrt 2", "\\sqrt{2}", 1.0),
        ("(1, 2)", "(1,2)", 1.0),
        ("\\frac{\\sqrt 3}{2}", "\\frac{\\sqrt{3}}{2}", 1.0),
        ("The answer is 18 dollars", "18", 1.0),
        ("\\sqrt 3", "\\sqrt{2}", 0.0),
        ("(2, 1)", "(1,2)", 0.0),
    ],
)
def test_math_style_answers(answer, gold, expected):
    assert math_reward(fmt(answer), gold) == expected


def test_overlong_answer_is_not_parsed():
    long = "72 " + "x" * rewards.MAX_ANSWER_CHARS
    assert math_reward(fmt(long), "72") == 0.0
    assert math_reward(fmt(long), "72", format_credit=0.25) == 0.25


def test_empty_gold_is_a_caller_bug():
    with pytest.raises(ValueError, match="gold answer must be a non-empty str"):
        math_reward(fmt("1"), " ")


def test_hostile_answers_are_time_bounded():
    nested = "\\sin(" * 100 + "x" + ")" * 100  # ~28 s to parse unbounded
    tower = "9^{9^{9^{9}}}"  # never finishes verifying unbounded
    # judge's own signal timeout (1 s per math-verify call) ends these
    assert math_reward(fmt(tower), "72", timeout_s=4) == 0.0
    assert math_reward(fmt(nested), "72", timeout_s=4) == 0.0
    # hard deadline below the judge's signal timeout: the judge is killed, then restarted
    before = rewards._JUDGE.timeouts
    assert math_reward(fmt(nested), "72", timeout_s=0.5) == 0.0
    assert rewards._JUDGE.timeouts == before + 1
    assert math_reward(fmt("\\sqrt 2"), "\\sqrt{2}") == 1.0


def test_math_reward_from_worker_threads():
    cases = [(fmt(a), g, 1.0) for a, g in EQUIVALENT] + [(fmt(a), g, 0.0) for a, g in DIFFERENT]
    cases += [(fmt("\\sqrt 2"), "\\sqrt{2}", 1.0), (fmt("(2, 1)"), "(1,2)", 0.0), ("72", "72", 0.0)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        got = list(pool.map(lambda c: math_reward(c[0], c[1]), cases * 2))
    assert got == [c[2] for c in cases * 2]
    out = {}
    t = threading.Thread(target=lambda: out.update(r=math_reward(fmt("1,000"), "1000")))
    t.start()
    t.join()
    assert out == {"r": 1.0}


def test_judge_that_cannot_start_is_loud(monkeypatch):
    monkeypatch.setattr(rewards.sys, "executable", "/bin/false")
    judge = rewards._Judge()
    with pytest.raises(RewardJudgeError, match="failed to start"):
        judge.ask("\\sqrt 2", "\\sqrt{2}", 5.0)
    judge.close()


def test_math_equal_direct():
    assert math_equal("0.5", "1/2") is True
    assert math_equal("", "1/2") is False


def test_gsm8k_gold():
    text = "She buys 3 boxes of 250 pencils, so 3 * 250 = 750.\nAdding 500 gives 1,250.\n#### 1,250"
    assert gsm8k_gold(text) == "1250"
    assert gsm8k_gold("first #### 3\nthen\n####  -7 ") == "-7"
    assert gsm8k_gold("####12") == "12"
    with pytest.raises(ValueError, match="no '####' marker"):
        gsm8k_gold("The answer is 12.")
    with pytest.raises(ValueError, match="nothing after '####'"):
        gsm8k_gold("work #### \n")
    assert math_reward(fmt("$1,250"), gsm8k_gold(text)) == 1.0


def test_arithmetic_reward():
    assert arithmetic_reward(" 42\n", "42") == 1.0
    assert arithmetic_reward("42", " 42 ") == 1.0
    assert arithmetic_reward("042", "42") == 0.0
    assert arithmetic_reward("4 2", "42") == 0.0
    assert arithmetic_reward("-3", "3") == 0.0
    with pytest.raises(ValueError, match="empty"):
        arithmetic_reward("1", "  ")
