"""An OpenEnv environment as a task's environment (issue #57, :mod:`ftis_flwr.tasks.openenv_source`):
a real ``openenv-core`` class loads by import path with its action as one tool, ``reset`` gets the
row's columns it names and a seed from the loop, a step returns the observation's text, the
observations' rewards sum to the episode's, ``done`` ends the tools, a class whose action cannot be
found is refused by name; and a real tiny node samples episodes through it and replays a peer's."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from conftest import episode_node, teach

from ftis_flwr.tasks.environment import EnvironmentContractError, load_environment

DOCS_ENV = Path(__file__).resolve().parents[1] / "docs" / "own-environment" / "openenv_calc.py"
CALC = f"{DOCS_ENV}:CalcEnvironment"
DOCS_MCP = DOCS_ENV.with_name("openenv_mcp_calc.py")
MCP_CALC = f"{DOCS_MCP}:CalcMCPEnvironment"


def test_an_openenv_class_loads_as_one_tool_named_after_its_action():
    spec = load_environment(CALC)
    assert (spec.name, sorted(spec.tools), spec.has_reward, spec.deterministic) == \
        ("CalcEnvironment", ["calc"], True, True)
    calc = spec.tools["calc"]["function"]
    assert calc["description"] == "Evaluate a sum or difference of integers."
    assert calc["parameters"] == {"type": "object", "required": ["expression"], "properties": {
        "expression": {"type": "string", "description": "Integers joined by + or -, e.g. 12+34."}}}
    assert spec.source() == DOCS_ENV  # the environment's code joins the task fingerprint
    counter = load_environment("toy_openenv:Counter")  # the action found from the generic base
    move = counter.tools["move"]["function"]["parameters"]
    assert move["required"] == ["steps"] and move["properties"]["steps"]["type"] == "integer"
    assert counter.deterministic is False  # not declared: peers will not replay it


def test_reset_gets_the_columns_it_names_and_a_seed_from_the_loop():
    spec = load_environment("toy_openenv:Counter")
    a, b = spec.acquire(), spec.acquire()
    first = a.reset({"target": 5, "question": "q"}, seed=7)  # "question" is not a reset argument: left out
    assert first.endswith("\ntarget: 5") and first.startswith("position: ")
    assert b.reset({"target": 5, "question": "q"}, seed=7) == first
    assert {a.reset({"target": 5}, seed=s) for s in range(8)} != {first}  # the seed moves the start
    calc = load_environment(CALC).acquire()
    assert calc.reset({"answer": 46, "prompt": "12+34=", "seed": 3}, seed=0) is None  # **kwargs: every column
    # but a column named seed: the loop's seed is the one reset gets
    assert calc.instance._env.answer == "46"


def test_steps_give_the_observation_rewards_add_up_and_done_ends_the_tools():
    calc = load_environment(CALC).acquire()
    calc.reset({"answer": "46"}, seed=0)
    wrong = calc.call("calc", {"expression": "12+30"})
    assert (wrong.content, wrong.error) == ("42", "")
    assert calc.call("calc", {"expression": "12+34"}).content == "46"
    assert calc.reward() == 1.0  # 0 + 1
    after = calc.call("calc", {"expression": "1+1"})
    assert "the episode is over" in after.error and after.content.startswith("{'error'")
    counter = load_environment("toy_openenv:Counter").acquire()
    counter.reset({"target": 200}, seed=1)
    assert counter.reward() is None  # no observation carried a reward: the task's reward functions score it
    bad = counter.call("move", {"steps": "far"})  # pydantic refuses it: an error observation, counted
    assert bad.error and "steps" in bad.error
    start = counter.instance._env.position
    assert counter.call("move", {"steps": 3}).content == f"position: {start + 3}\ntarget: 200"
    counter.call("move", {"steps": -1})
    assert counter.reward() == -(200 - start - 3) - (200 - start - 2)


def test_an_openenv_class_without_an_action_is_refused_by_name():
    with pytest.raises(EnvironmentContractError, match=r"toy_openenv:Silent.*Silent: its action class is not "
                                                       r"declared; annotate step\(self, action: MyAction"):
        load_environment("toy_openenv:Silent")
    with pytest.raises(EnvironmentContractError, match=r"Bare: its action Action has no field a model could fill"):
        load_environment("toy_openenv:Bare")


def test_an_mcp_environment_gives_each_of_its_tools_with_the_schema_its_server_declares():
    """An MCPEnvironment: each tool its ListToolsAction lists is a tool, its parameters the JSON
    schema the MCP server declares (an argument without a description is fine there), called
    through CallToolAction; what a tool raises and arguments MCP refuses are error observations;
    the observations' rewards (here reset's) sum to the episode's."""
    spec = load_environment("toy_mcp:Shelf")
    assert (spec.name, sorted(spec.tools), spec.deterministic) == ("Shelf", ["look", "shout"], False)
    look, shout = spec.tools["look"]["function"], spec.tools["shout"]["function"]
    assert look["description"] == "The book on a shelf slot."
    assert look["parameters"]["properties"] == {"slot": {"type": "string", "description": "a slot's letter"}}
    assert shout["parameters"]["required"] == ["text"]
    assert shout["parameters"]["properties"]["times"] == {"default": 1, "type": "integer"}
    shelf = spec.acquire()
    assert shelf.reset({"prompt": "?"}, seed=0) is None
    assert shelf.call("look", {"slot": "b"}).content == "Emma"
    assert shelf.call("shout", {"text": "hi", "times": 2}).content == "HIHI"
    loud = shelf.call("shout", {"text": "hi", "times": 5})
    assert "too loud" in loud.error and loud.content.startswith("{'error'")
    assert "slot" in shelf.call("look", {"shelf": "b"}).error  # MCP refuses the arguments: counted, read
    assert "Tool read not found" in shelf.call("read", {}).content
    assert shelf.reward() == 0.5
    calc = load_environment(MCP_CALC)
    assert (sorted(calc.tools), calc.deterministic) == (["calc"], True)
    env = calc.acquire()
    env.reset({"answer": "46"}, seed=0)
    assert env.call("calc", {"expression": "12+34"}).content == "46"
    assert env.reward() is None  # no observation carried one: the task's reward functions score the answer


def test_an_mcp_tools_errors_are_counted_observations_not_log_tracebacks():
    """FastMCP logs each tool that raised with its traceback, and each refused call: in a run of
    thousands of episodes that floods the node's log with what ``env/tool_errors`` already counts.
    Those two kinds of line are left out; the error observations are unchanged."""
    import logging

    class Lines(logging.Handler):
        def __init__(self):
            super().__init__()
            self.messages = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    lines = Lines()
    shelf = load_environment("toy_mcp:Shelf").acquire()  # FastMCP sets its logger's handlers as it starts
    shelf.reset({"prompt": "?"}, seed=0)
    logging.getLogger("fastmcp").addHandler(lines)  # beside FastMCP's own (its logger does not propagate)
    try:
        assert "too loud" in shelf.call("shout", {"text": "hi", "times": 5}).error
        assert "slot" in shelf.call("look", {"shelf": "b"}).error
    finally:
        logging.getLogger("fastmcp").removeHandler(lines)
    assert not [m for m in lines.messages if "calling tool" in m or "Invalid arguments" in m], lines.messages


@pytest.mark.parametrize("cls, why", [("Empty", "its MCP server lists no tool"),
                                      ("Scorer", "its MCP tool 'get_reward' cannot be a tool here")])
def test_an_mcp_environment_whose_tools_cannot_be_tools_is_refused_by_name(cls, why):
    with pytest.raises(EnvironmentContractError, match=f"toy_mcp:{cls}.*{cls}: {why}"):
        load_environment(f"toy_mcp:{cls}")


ROWS = ((12, 34), (20, 21))


@pytest.fixture(scope="module", params=["action", "mcp"])
def node(tmp_path_factory, request):
    """A tiny node on the OpenEnv calculator, first taught each row's script (``12+34=`` ->
    ``#calc(12+34)`` [``46``] ``done``), so that at temperature 1 some episodes call the tool with
    the row's sum and some do not. The MCP calculator carries no reward (the task's exact-match
    reward scores the final answer), so its scripts end with an answer instead of ``done``: the
    tool's value in the first row's, a wrong one in the second's, so that the rewards differ."""
    env = CALC if request.param == "action" else MCP_CALC
    node = episode_node(tmp_path_factory.mktemp(request.param), env, ROWS, max_turns=3)
    ends = ["done"] * 2 if request.param == "action" else [str(sum(ROWS[0])), str(sum(ROWS[1]) + 1)]
    teach(node, [(f"{a}+{b}=", [(f"#calc({a}+{b})", str(a + b)), (end, None)]) for (a, b), end in zip(ROWS, ends)])
    return node


@pytest.mark.slow
def test_a_node_samples_openenv_episodes_and_replays_a_peers(node):
    from ftis_flwr.node.node import Received, StepRequest

    res = node.step(StepRequest(0, 2, [0, 1], 8, False))
    groups = res.groups
    assert res.metrics["env/episodes"] == 16 and res.metrics["env/tool_calls"] > 0
    rewards = np.concatenate([g.rewards for g in groups])
    assert set(rewards.tolist()) <= {0.0, 1.0} and 0 < rewards.mean() < 1, rewards  # observations' sum, or the task's
    assert any((m == 0).any() for g in groups for m in g.sampled_masks), "no episode appended a tool turn"
    peer = [dataclasses.replace(g, node="b", rewards=np.ones(g.size, np.float32)) for g in groups]
    res = node.step(StepRequest(1, 2, [], 8, False, foreign=[Received("b", peer, [0, 1])]))
    m = res.metrics
    # replayed through this node's own OpenEnv instances: its rewards, not the 1.0 claimed
    assert m["b/env_replayed"] == 16 and m["samples_foreign"] == 16
    assert m["train_reward_foreign"] == pytest.approx(float(rewards.mean()))


@pytest.mark.parametrize("section, source, first_line", [
    ("An OpenEnv environment", DOCS_ENV, "class CalcAction(Action):"),
    ("An MCP environment", DOCS_MCP, "class CalcMCPEnvironment(MCPEnvironment):")])
def test_the_environment_page_shows_the_openenv_classes_and_their_commands_check(capsys, section, source,
                                                                                 first_line):
    """docs/your-own-environment.md, "An OpenEnv environment" and "An MCP environment": each Python
    block is its file's classes, verbatim, and each command, run as written from the repository's
    root, says the configuration is valid."""
    import shlex

    from conftest import doc_block, run_doc_check

    page = "docs/your-own-environment.md"
    code = source.read_text()
    assert doc_block(section, "python", page).strip() == code[code.index(first_line):].strip()
    command = shlex.split(doc_block(section, "bash", page))
    assert f"{source.name}:" in command[-1] and run_doc_check(command) == 0
    assert "configuration valid: 2 nodes (small, large)" in capsys.readouterr().out
