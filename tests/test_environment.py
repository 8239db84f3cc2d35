"""Bring your own environment (issue #57): TRL's ``environment_factory`` contract, loaded by import
path (``ftis_flwr/tasks/environment.py``) with tools described by their docstrings
(``ftis_flwr/tasks/tool_schema.py``).

What is checked: a TRL-style class loads by module and by file path, its public methods but
``reset``/``get_reward`` are its tools, each with the schema ``transformers``' own
``get_json_schema`` gives (what TRL renders); ``reset(**row)`` gets every column and its string
comes back, the same for the same seed; sync and async tools and ``get_reward`` run; a tool that
raises, is unknown, gets wrong arguments or sleeps past the timeout becomes an error observation
(TRL's ``{'error': ...}`` text) and is counted, and an instance whose tool timed out takes no more
calls and is not pooled again; a class that breaks the contract is refused at load with its name
and what is missing; ``reset``/``get_reward`` that break it raise EnvironmentFault with the reason.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from transformers.utils import get_json_schema

from ftis_flwr.tasks.environment import EnvironmentContractError, EnvironmentFault, load_environment
from ftis_flwr.tasks.tool_schema import ToolSchemaError, parse_docstring, tool_schema

TOY = Path(__file__).resolve().parent / "toy_environments.py"


def test_a_trl_class_loads_with_its_tools_and_their_schemas():
    for path in ("toy_environments:SeededEnv", f"{TOY}:SeededEnv"):
        spec = load_environment(path)
        assert spec.name == "SeededEnv" and spec.has_reward
        assert sorted(spec.tools) == ["boom", "guess", "nap"]  # reset and get_reward are not tools
        probe = spec._pool[0]
        for name, schema in spec.tools.items():
            assert schema == get_json_schema(getattr(probe, name)), name  # what TRL's template renders
    guess = spec.tools["guess"]["function"]
    assert guess["parameters"]["required"] == ["value"]
    assert guess["parameters"]["properties"]["mode"] == {
        "type": "string", "enum": ["exact", "near"], "description": "How a guess is judged: exactly, or within ten."}
    assert spec.source() == TOY


def test_reset_gets_the_row_and_is_reproducible_by_seed():
    spec = load_environment("toy_environments:SeededEnv")
    a, b = spec.acquire(), spec.acquire()
    first = a.reset({"question": "q", "answer": "1"}, seed=7)
    assert first.startswith(" secret ") and b.reset({"question": "q"}, seed=7) == first
    assert a.reset({}, seed=8) != first
    calc = load_environment("toy_environments:CalcEnv").acquire()
    assert calc.reset({"answer": 46, "question": "12+34="}, seed=0) is None
    assert calc.instance.answer == "46"


def test_tools_run_and_failures_become_counted_error_observations():
    spec = load_environment("toy_environments:SeededEnv", tool_timeout=0.3)
    env = spec.acquire()
    env.reset({}, seed=1)
    secret = env.instance.secret
    ok = env.call("guess", {"value": secret})  # an async tool
    assert (ok.content, ok.error, ok.timed_out) == ("yes", "", False)
    assert env.call("guess", {"value": secret + 1}).content == "no"
    boom = env.call("boom", {})
    assert boom.content == "{'error': 'kaboom'}" and boom.error == "kaboom"  # TRL's error observation
    unknown = env.call("reset", {})
    assert unknown.error.startswith("Tool reset not found. Tools: boom, guess, nap")
    wrong = env.call("guess", {"answer": 3})
    assert "unexpected keyword argument 'answer'" in wrong.error
    assert env.call("guess", ["not", "named"]).error.startswith("arguments must be an object")
    assert env.reward() == 2.0  # async get_reward: two guesses ran
    t0 = time.perf_counter()
    slow = env.call("nap", {"seconds": 2.0})
    assert slow.timed_out and slow.content == "{'error': 'timed out after 0.3 s'}"
    assert time.perf_counter() - t0 < 1.5
    after = env.call("guess", {"value": 1})
    assert after.error.startswith("not run: tool nap timed out") and env.instance.guesses == [secret, secret + 1]
    spec._pool.clear()
    spec.release(env)
    assert spec._pool == []  # its nap may still be running: never reused


def test_sync_get_reward_reads_the_state():
    spec = load_environment("toy_environments:CalcEnv")
    env = spec.acquire()
    env.reset({"answer": "46"}, seed=0)
    assert env.call("calc", {"expression": "12+34"}).content == "46"
    assert env.reward() == 0.0
    env.call("submit", {"answer": 46})
    assert env.reward() == 1.0
    spec.release(env)
    assert spec.acquire().instance is env.instance  # pooled: construct once, reset often


@pytest.mark.parametrize("name,message", [
    ("NoReset", r"NoReset has no callable reset\(\*\*row\)"),
    ("Undocumented", r"tool Undocumented.look has no docstring"),
    ("Unannotated", r"tool Unannotated.look: argument 'where' has no type hint"),
    ("Undescribed", r"tool Undescribed.look: argument 'how' is not described in the docstring's 'Args:'"),
    ("Missing", r"has no 'Missing'; it defines: .*CalcEnv"),
])
def test_a_class_that_breaks_the_contract_is_refused_by_name(name, message):
    with pytest.raises(EnvironmentContractError, match=message):
        load_environment(f"toy_environments:{name}")


def test_reset_and_reward_that_break_the_contract_stop_with_the_reason():
    env = load_environment("toy_environments:BadReset").acquire()
    with pytest.raises(EnvironmentFault, match=r"BadReset.reset\(\*\*row\) returned 42 \(int\); TRL's contract"):
        env.reset({}, seed=0)
    strict = load_environment("toy_environments:StrictReset").acquire()
    assert strict.reset({"answer": "1"}, seed=0) is None
    with pytest.raises(EnvironmentFault, match=r"StrictReset.reset\(\*\*row\) raised TypeError: .*'question'.*"
                                               r"\(reset receives every column of the row: accept \*\*kwargs\)"):
        strict.reset({"answer": "1", "question": "q"}, seed=0)
    calc = load_environment("toy_environments:CalcEnv").acquire()
    calc.instance.get_reward = lambda: float("nan")
    with pytest.raises(EnvironmentFault, match=r"CalcEnv.get_reward\(\) returned nan, not a finite number"):
        calc.reward()


def test_docstring_parser_and_refusals():
    description, args, returns = parse_docstring("""Do it.

    Longer text.

    Args:
        a (int): first,
            continued.
        b: second.

    Returns:
        Something.
    """)
    assert (description, args, returns) == ("Do it.\n\nLonger text.", {"a": "first, continued.", "b": "second."},
                                            "Something.")

    def star(*values: int) -> int:
        """Sum.

        Args:
            values: Numbers.
        """
        return sum(values)

    with pytest.raises(ToolSchemaError, match=r"tool star: \*values / \*\*values cannot be described"):
        tool_schema(star)

    def odd(x: complex) -> str:
        """Odd.

        Args:
            x: A number.
        """
        return str(x)

    with pytest.raises(ToolSchemaError, match=r"argument 'x': type <class 'complex'> cannot be described"):
        tool_schema(odd)
