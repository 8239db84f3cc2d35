"""``task.environment`` and the episode keys (issue #57): what ``ftis-flwr check`` refuses, each
by its key, before any model loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ftis_flwr.config.choices import TOOL_FORMATS
from ftis_flwr.config.schema import ConfigError
from ftis_flwr.experiment import load_experiment

TOYS = Path(__file__).parent / "toy_environments.py"


@pytest.fixture()
def rows(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n"
                            for a, b in ((12, 34), (20, 21))))
    return {"task.name": "dataset", "task.dataset": "json", "task.data_files.train": str(path)}


def _errors(overrides) -> str:
    with pytest.raises(ConfigError) as caught:
        load_experiment(overrides=overrides)
    return str(caught.value)


def test_an_environment_that_loads_passes_and_sets_the_episode_budget(rows):
    exp = load_experiment(overrides={**rows, "task.environment": f"{TOYS}:CalcEnv", "task.max_turns": 3,
                                     "rollout.max_new_tokens": 10})
    assert exp.task.environment.endswith(":CalcEnv") and exp.episode_budget() == 30
    exp = load_experiment(overrides={**rows, "task.environment": f"{TOYS}:CalcEnv", "task.episode_tokens": 50})
    assert exp.episode_budget() == 50


def test_a_broken_environment_is_refused_by_its_key_with_the_loaders_message(rows):
    msg = _errors({**rows, "task.environment": f"{TOYS}:NoReset"})
    assert f"task.environment='{TOYS}:NoReset': environment" in msg and "has no callable reset" in msg
    msg = _errors({**rows, "task.environment": f"{TOYS}:Undocumented"})
    assert "task.environment=" in msg and "look" in msg
    msg = _errors({**rows, "task.environment": "no_such_module_here:Env"})
    assert "task.environment='no_such_module_here:Env'" in msg


def test_environment_needs_dataset_rows_and_episode_keys_need_an_environment(rows):
    msg = _errors({"task.environment": f"{TOYS}:CalcEnv"})
    assert "needs a task with rows (task.name 'dataset' or 'arithmetic-chain'" in msg
    msg = _errors({**rows, "task.max_turns": 2, "task.tool_format": "tiny"})
    assert "task.max_turns=2 is read only with task.environment set" in msg
    assert "task.tool_format='tiny' is read only with task.environment set" in msg
    msg = _errors({**rows, "task.environment": f"{TOYS}:CalcEnv", "task.tool_format": "json",
                   "task.max_turns": 0, "advantage.mode": "horizontal"})
    assert "task.tool_format='json'" in msg and "task.max_turns=0 must be >= 1" in msg
    assert "needs advantage.mode 'vertical' or 'alone'" in msg
    msg = _errors({**rows, "task.environment": f"{TOYS}:CalcEnv", "task.episode_tokens": 10**6})
    assert "exceeds wire.max_tokens_per_completion" in msg


def test_the_tool_format_choices_are_the_episode_loops():
    from ftis_flwr.tasks.tool_calls import TOOL_FORMATS as READERS

    assert set(TOOL_FORMATS) == {"", *READERS}


def test_the_environments_code_is_part_of_the_task_every_node_must_agree_on(rows, tmp_path):
    from ftis_flwr.tasks import make_task
    from ftis_flwr.tasks.fingerprint import task_parts

    calc = TOYS.parents[1] / "docs" / "own-environment" / "calc_env.py"  # the class toy_environments re-exports
    moved = tmp_path / "elsewhere" / "calc_env.py"
    moved.parent.mkdir()
    moved.write_text(calc.read_text())
    exp = load_experiment(overrides={**rows, "task.environment": f"{calc}:CalcEnv"})
    parts = task_parts(exp.task, make_task(exp.task))
    assert "environment CalcEnv" in parts  # its code, by content
    there = load_experiment(overrides={**rows, "task.environment": f"{moved}:CalcEnv"})
    assert task_parts(there.task, make_task(there.task)) == parts  # the same file elsewhere: the same task
    assert "1.0 if" in calc.read_text()
    moved.write_text(calc.read_text().replace("1.0 if", "2.0 if"))
    changed = task_parts(there.task, make_task(there.task))
    assert changed["environment CalcEnv"] != parts["environment CalcEnv"]


def test_an_environment_fault_stops_the_run_in_one_line():
    from ftis_flwr.server.run_failure import environment_stop

    why = "node worker failed 'step': EnvironmentFault: BadReset.reset(**row) returned 42 (int)"
    line = environment_stop(2, {"a": f"code 2: {why}", "b": f"code 2: {why}", "c": "code 2: other"})
    assert line.startswith("round 2: the environment failed on nodes a and b: BadReset.reset(**row) returned 42")
    assert "\n" not in line and line.count("returned 42") == 1
    assert environment_stop(2, {"c": "code 2: RewardError: reward 'f' raised"}) == ""


def test_memory_plans_size_sequences_by_the_episode_budget(rows):
    import dataclasses

    from ftis_flwr.config.plan import estimate
    from ftis_flwr.config.schema import ModelCard

    card = ModelCard(name="q", source="Qwen/Qwen2.5-0.5B")
    one = load_experiment(overrides={**rows, "rollout.max_new_tokens": 64})
    episodes = dataclasses.replace(one, task=dataclasses.replace(one.task, environment=f"{TOYS}:CalcEnv", max_turns=4))
    assert episodes.completion_tokens() == 256 and one.completion_tokens() == 64
    assert estimate(card, episodes).kv_cache > estimate(card, one).kv_cache


def test_the_environment_page_shows_the_shipped_class_and_its_command_checks(capsys):
    """docs/your-own-environment.md: its Python block is docs/own-environment/calc_env.py's class,
    verbatim, and its command, run as written from the repository's root, says the configuration
    is valid (the class loads as a node loads it, every tool's schema read)."""
    import shlex

    from conftest import REPO_ROOT, doc_block, run_doc_check

    page = "docs/your-own-environment.md"
    code = (REPO_ROOT / "docs" / "own-environment" / "calc_env.py").read_text()
    assert doc_block("Your own environment (multi-turn, with tools)", "python", page).strip() == \
        code[code.index("class CalcEnv:"):].strip()
    command = shlex.split(doc_block("Your own environment (multi-turn, with tools)", "bash", page))
    assert run_doc_check(command) == 0
    assert "configuration valid: 2 nodes (small, large)" in capsys.readouterr().out


def test_check_runs_reset_on_the_first_row_and_writes_a_call_in_each_nodes_format(rows):
    """``reset(**row)`` gets every column of the first train row before round 0 (TRL's
    contract); the tiny char tokenizer cannot write a ``hermes`` call (it has no braces)."""
    msg = _errors({**rows, "task.environment": f"{TOYS}:StrictReset"})
    assert "on the first train row (train:0, columns prompt, answer)" in msg and "accept **kwargs" in msg
    msg = _errors({**rows, "task.environment": f"{TOYS}:CalcEnv", "task.tool_format": "hermes"})
    assert "its tokenizer cannot write a tool call in the hermes format" in msg and "no '{', '}'" in msg
    load_experiment(overrides={**rows, "task.environment": f"{TOYS}:CalcEnv", "task.tool_format": "tiny"})


def test_a_class_peers_cannot_replay_is_named_in_a_warning_only_where_peers_share():
    """Without ``deterministic = True`` every node refuses its peers' episodes: check says so."""
    from ftis_flwr.tasks.environment_checks import episode_notes

    train = str(Path(__file__).parents[1] / "docs" / "own-task" / "train.jsonl")
    exp = load_experiment(overrides={"task.name": "dataset", "task.dataset": "json", "task.data_files.train": train,
                                     "task.environment": f"{TOYS}:UndeclaredCalcEnv"})
    assert "UndeclaredCalcEnv does not declare deterministic = True" in " ".join(episode_notes(exp))
    exp.advantage.mode = "alone"
    assert episode_notes(exp) == []
    exp.advantage.mode, exp.task.environment = "vertical", f"{TOYS}:CalcEnv"
    assert episode_notes(exp) == []


def test_check_refuses_an_episode_prompt_that_fills_a_nodes_positions(rows):
    """The tiny models have 64 positions: reset's text of 80 characters leaves no room to answer."""
    msg = _errors({**rows, "task.environment": f"{TOYS}:LongReset"})
    assert "the episode prompt of the first train row (train:0)" in msg and "more than the model's 64" in msg


def test_templates_and_call_formats_that_part_peers_are_warned_and_only_those(monkeypatch):
    """Peers of two tokenizers share episodes across chat templates (a tool turn is checked against
    its sender's layout); peers of one tokenizer with two templates, or whose models write tool calls
    in two formats, refuse each other's: check warns for those, naming the nodes, and only those."""
    from ftis_flwr.node.tiny.bpe import build_bpe_tokenizer
    from ftis_flwr.node.tiny.chars import build_char_tokenizer
    from ftis_flwr.tasks import node_models as nm
    from ftis_flwr.tasks.environment_checks import episode_notes

    exp = load_experiment("cpu-xtok-calc")
    assert episode_notes(exp) == []  # two tokenizers, no template
    chat = "{% for m in messages %}<{{ m.role }}>{{ m['content'] }}<eos>{% endfor %}"

    def notes(*pairs, tool_format="tiny"):
        models = [nm.NodeModel([name], "tiny", 64, tiny=kind, _tokenizer=tok) for name, kind, tok in pairs]
        monkeypatch.setattr(nm, "node_models", lambda exp: (models, []))
        return episode_notes(load_experiment("cpu-xtok-calc", overrides={"task.tool_format": tool_format}))

    templated_bpe = build_bpe_tokenizer()
    templated_bpe.chat_template = chat
    assert notes(("small", "char", build_char_tokenizer()), ("bpe", "bpe", templated_bpe)) == []
    templated_char = build_char_tokenizer()
    templated_char.chat_template = chat
    (note,) = notes(("small", "char", build_char_tokenizer()), ("other", "char", templated_char))
    assert "nodes of one tokenizer write tool turns with different chat templates (nodes[small]; nodes[other])" in note
    assert "env_replay_refused" in note
    hermes_bpe = build_bpe_tokenizer()
    hermes_bpe.chat_template = "<tool_call>" + chat  # a template that writes <tool_call>: the hermes format
    (note,) = notes(("small", "char", build_char_tokenizer()), ("bpe", "bpe", hermes_bpe), tool_format="")
    assert "write tool calls in different formats (tiny: nodes[small]; hermes: nodes[bpe])" in note


def test_nodes_of_two_tokenizers_with_one_ratio_per_completion_are_warned():
    """Replay across tokenizers aligns each model turn by chunk or word; ``sequence`` has one ratio
    per completion, so such peers would refuse each other's episodes: check says so, and only then."""
    from ftis_flwr.tasks.environment_checks import episode_notes

    (note,) = episode_notes(load_experiment("cpu-xtok-calc", overrides={"loss.cross_tokenizer_ratio": "sequence"}))
    assert "different tokenizers and loss.cross-tokenizer-ratio='sequence'" in note and "use 'chunk'" in note
    assert episode_notes(load_experiment("cpu-pair-calc", overrides={"loss.cross_tokenizer_ratio": "sequence"})) == []
    assert episode_notes(load_experiment("cpu-xtok-calc", overrides={"loss.cross_tokenizer_ratio": "sequence",
                                                                     "exchange.cross_tokenizer": "off"})) == []


def test_the_check_loads_the_environment_once(monkeypatch, capsys):
    """``ftis-flwr check`` on an environment: the contract check, the reset on the first row and
    the reward probe share one load (each used to import and build it again)."""
    from conftest import REPO_ROOT

    import ftis_flwr.tasks.environment as environment
    from ftis_flwr.cli import main

    monkeypatch.chdir(REPO_ROOT)
    loads = []
    real = environment.load_environment
    monkeypatch.setattr(environment, "load_environment", lambda *a, **k: loads.append(a) or real(*a, **k))
    assert main(["check", ".", "--run-config", "task.name='dataset' task.dataset='json' "
                 "task.data-files.train='docs/own-task/train.jsonl' task.data-files.test='docs/own-task/test.jsonl' "
                 "task.environment='docs/own-environment/calc_env.py:CalcEnv' task.max-turns=3"]) == 0
    assert "configuration valid" in capsys.readouterr().out
    assert len(loads) == 1, loads
