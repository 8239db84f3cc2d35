"""The shipped environment (issue #57): the ``arithmetic-chain`` task, the calculator written to TRL's
contract, the tiny models' tool warm start and the preset that puts them together (``cpu-pair-calc``).
Whether the pair learns on it is tests/test_environment_learning.py."""

import json
from pathlib import Path

import pytest

from ftis_flwr.config.schema import ConfigError
from ftis_flwr.experiment import load_experiment
from ftis_flwr.node.models import load_policy
from ftis_flwr.node.tiny import assets as tiny_assets
from ftis_flwr.node.tiny import models as tiny
from ftis_flwr.node.tiny import tools as tiny_tools
from ftis_flwr.node.tiny.models import build_char_tokenizer, find_shipped
from ftis_flwr.node.turns import tool_turn_ids
from ftis_flwr.tasks import make_task
from ftis_flwr.tasks.arithmetic_chain import SIZES, ArithmeticChainTask
from ftis_flwr.tasks.calculator import Calculator
from ftis_flwr.tasks.environment import ToolResult, load_environment

ENV = "ftis_flwr.tasks.calculator:Calculator"


def test_the_chain_task_has_disjoint_splits_of_three_term_rows_with_their_columns():
    task = ArithmeticChainTask(seed=1234)
    splits = {s: task.problems(s) for s in ("train", "test", "warmstart")}
    assert {s: len(p) for s, p in splits.items()} == SIZES
    questions = [{p.question for p in ps} for ps in splits.values()]
    assert sum(map(len, questions)) == len(set().union(*questions)), "a problem is in two splits"
    for p in splits["train"][:200]:
        a, rest = p.question.rstrip("=").split("+")
        b, c = rest.split("-")
        assert len(a) == len(b) == len(c) == 2 and p.gold == str(int(a) + int(b) - int(c)) and int(p.gold) >= 0
        assert dict(p.columns) == {"question": p.question, "answer": p.gold}
    first = splits["test"][0]
    assert task.reward(f" {first.gold} ", first) == 1.0 and task.reward(first.gold + "0", first) == 0.0
    assert [p.question for p in ArithmeticChainTask(seed=1234).problems("test")] == [p.question for p in splits["test"]]
    assert [p.question for p in ArithmeticChainTask(seed=7).problems("test")] != [p.question for p in splits["test"]]
    assert task.eval_splits == ("test",) and "warmstart" in task.splits


def test_the_calculator_keeps_trls_contract_and_evaluates_chains():
    spec = load_environment(ENV)
    assert set(spec.tools) == {"calc"}
    assert spec.tools["calc"]["function"]["parameters"]["required"] == ["expression"]
    calc = Calculator()
    assert calc.reset(question="12+34-56=", answer="-10") is None
    assert calc.calc("12+34-56") == "-10" and calc.calc(" 7 - 8 + 100 ") == "99" and calc.calls == 2
    for bad in ("12*3", "12+", "", "1+2)"):
        with pytest.raises(ValueError, match="cannot read"):
            calc.calc(bad)
    assert Calculator.deterministic is True


def test_the_tool_warm_start_labels_only_what_the_model_writes_as_the_episode_loop_tokenizes_it():
    tok = build_char_tokenizer()
    eos = tok.eos_token_id
    rows = tiny_tools.tool_examples(tok, eos, share=0.5, seed=0, task_seed=1234)
    problems = ArithmeticChainTask(seed=1234).problems("warmstart")
    assert len(rows) == len(problems)
    calls = 0
    for (ids, labels), p in zip(rows, problems):
        assert len(ids) == len(labels) <= tiny.TINY_MAX_POSITIONS
        written = tok.decode([t for t, lb in zip(ids, labels) if lb != -100])
        context = tok.decode([t for t, lb in zip(ids, labels) if lb == -100])
        if "#calc" in written:
            calls += 1
            expr = p.question.rstrip("=")
            assert written == f"#calc({expr})<eos>{p.gold}<eos>"
            assert context == p.question + f"={p.gold}\n"  # the prompt and the tool turn: never labelled
            tool = tool_turn_ids(tok, [ToolResult("calc", p.gold)], [eos])
            start = len(ids) - len(tok(p.gold, add_special_tokens=False)["input_ids"]) - 1 - len(tool)
            assert ids[start:start + len(tool)] == tool
        else:
            assert written == f"{p.gold}<eos>" and context == p.question
    assert calls == round(0.5 * len(problems))
    assert sum("#calc" in tok.decode(i) for i, _ in tiny_tools.tool_examples(tok, eos, 0.25, 0, 1234)) == \
        round(0.25 * len(problems))


@pytest.mark.parametrize("preset", ["cpu-pair-calc", "cpu-xtok-calc"])
def test_the_preset_validates_and_its_tool_warm_starts_are_shipped(preset, tmp_path, monkeypatch):
    exp = load_experiment(preset)
    assert exp.task.name == "arithmetic-chain" and exp.task.environment == ENV
    assert all(c.warmstart_tools == 0.5 for c in exp.nodes) and preset in tiny_assets.SHIPPED_PRESETS
    task = make_task(exp.task)
    for card in exp.nodes:
        name = tiny_tools.warm_started(card, task, tmp_path, build=False).name
        assert "-calc50-" in name
        shipped = find_shipped(name)
        assert shipped is not None, f"not shipped: python -m ftis_flwr.node.tiny.assets --ship --presets {preset}"
        assert shipped[1]["report"]["key"]["share"] == 0.5

    def boom(*a, **k):
        raise AssertionError("trained a model that is shipped")

    monkeypatch.setattr(tiny, "train_tiny", boom)
    monkeypatch.setattr(tiny_tools, "train_tools", boom)
    policy = load_policy(exp.nodes[-1], task=task, cache_dir=tmp_path)
    assert json.loads((Path(policy.base) / tiny.MARKER).read_text())["shipped"].endswith(".safetensors")
    assert "-calc50:" in policy.model_id
    tok = policy.tokenizer  # the tokenizer the stage trained with: the tool turn keeps its newline
    assert tok.decode(tok("=41\n", add_special_tokens=False)["input_ids"]) == "=41\n"


def test_an_environment_needs_a_task_with_rows():
    with pytest.raises(ConfigError, match="needs a task with rows"):
        load_experiment("cpu-pair", overrides={"task.environment": ENV})
    with pytest.raises(ConfigError, match="warmstart_tools"):
        load_experiment("cpu-pair-calc", overrides={"nodes.small.warmstart_tools": 1.5})
