"""Bring your own task: a user's JSONL rows through ``datasets`` (``task.name=dataset``), reward
functions in TRL's form by import path, several with weights, factories by import path, and the
errors a check gives for each kind of bad input (each naming its key)."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from ftis_flwr.config.schema import ConfigError, TaskConfig
from ftis_flwr.experiment import load_experiment
from ftis_flwr.tasks import make_task
from ftis_flwr.tasks.base import Problem, Task
from ftis_flwr.tasks.reward_funcs import RewardError

# TRL's documentation, "Using a custom reward function", example 3 ("Reward completions based on a
# reference"), as written there: it must drop in unchanged.
TRL_REWARD = '''
import re

def reward_func(completions, ground_truth, **kwargs):
    # Regular expression to capture content inside \\\\boxed{}
    matches = [re.search(r"\\\\boxed\\{(.*?)\\}", completion) for completion in completions]
    contents = [match.group(1) if match else "" for match in matches]
    # Reward 1 if the content is the same as the ground truth, 0 otherwise
    return [1.0 if c == gt else 0.0 for c, gt in zip(contents, ground_truth)]
'''


@pytest.fixture()
def files(tmp_path):
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b), "ground_truth": str(a + b), "level": a % 3}
            for a, b in [(12, 30), (45, 11), (20, 20), (33, 17)]]
    for split, part in (("train", rows[:3]), ("test", rows[3:])):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    (tmp_path / "trl_reward.py").write_text(TRL_REWARD)
    (tmp_path / "rewards.py").write_text(textwrap.dedent('''
        calls = []
        def by_level(completions, level, **kwargs):
            calls.append(len(completions))
            return [None if lv == 0 else float(lv) for lv in level]
        def wrong_length(completions, **kwargs):
            return [1.0]
        def nan(completions, **kwargs):
            return [float("nan")] * len(completions)
        def boom(completions, **kwargs):
            raise RuntimeError("judge is down")
        def needs_column(completions, difficulty, **kwargs):
            return [0.0] * len(completions)
        def factory(cfg):
            from ftis_flwr.tasks.arithmetic import ArithmeticTask
            return ArithmeticTask(seed=cfg.seed)
        def not_a_task(cfg):
            return 42
    '''))
    return tmp_path


def _cfg(files, **kw) -> TaskConfig:
    base = dict(name="dataset", dataset="json", data_files={"train": str(files / "train.jsonl"),
                                                            "test": str(files / "test.jsonl")})
    return TaskConfig(**{**base, **kw})


def test_rows_become_problems_with_every_column_and_the_eval_splits_by_name(files):
    task = make_task(_cfg(files))
    assert task.splits == ("train", "test") and task.eval_splits == ("test",)
    p = task.problem("train:1")
    assert (p.id, p.question, p.gold) == ("train:1", "45+11=", "56")
    assert p.columns == {"prompt": "45+11=", "answer": "56", "ground_truth": "56", "level": 0}
    assert task.prompt_text(p, tokenizer=None) == "45+11="  # plain text: no chat template asked
    assert task.rewards(["56", " 56 ", "55"], [p] * 3) == [1.0, 1.0, 0.0]  # default: exact
    templated = make_task(_cfg(files, prompt_template="Q: {prompt} (level {level})"))
    assert templated.problem("test:0").question == "Q: 33+17= (level 0)"


def test_a_reward_from_trls_documentation_drops_in_unchanged(files):
    task = make_task(_cfg(files, reward=f"{files / 'trl_reward.py'}:reward_func"))
    p = task.problem("train:0")
    assert task.rewards(["so \\boxed{42}", "42", "\\boxed{41}"], [p] * 3) == [1.0, 0.0, 0.0]


def test_several_rewards_are_summed_with_weights_and_none_is_counted(files):
    task = make_task(_cfg(files, rewards=["exact", f"{files / 'rewards.py'}:by_level"], reward_weights=[2.0, 0.5]))
    problems = [task.problem(f"train:{i}") for i in range(3)]  # levels 0, 0, 2
    got = task.rewards(["42", "x", "40"], problems)
    assert got == [2.0, 0.0, 2.0 + 0.5 * 2.0]
    assert task.reward_set.nones == 2


@pytest.mark.parametrize("fn,match", [("wrong_length", "returned 1 values for 2 completions"),
                                      ("nan", "not finite"), ("boom", "raised RuntimeError: judge is down")])
def test_a_reward_that_misbehaves_fails_loudly_naming_itself(files, fn, match):
    task = make_task(_cfg(files, reward=f"{files / 'rewards.py'}:{fn}"))
    with pytest.raises(RewardError, match=match):
        task.rewards(["a", "b"], [task.problem("train:0")] * 2)


def test_a_task_factory_by_import_path(files):
    task = make_task(TaskConfig(name=f"{files / 'rewards.py'}:factory", seed=7))
    assert isinstance(task, Task) and task.name == "arithmetic" and task.seed == 7


def _errors(overrides) -> str:
    with pytest.raises(ConfigError) as caught:
        load_experiment(overrides=overrides)
    return str(caught.value)


def test_check_names_each_bad_input_by_its_key(files):
    flat = {"task.name": "dataset", "task.dataset": "json", "task.data_files.train": str(files / "train.jsonl")}
    assert "task.data_files.test='" in _errors({**flat, "task.data_files.test": str(files / "nope.jsonl")})
    msg = _errors({**flat, "task.prompt_field": "question"})
    assert "task.prompt_field" in msg and "its columns: prompt, answer, ground_truth, level" in msg
    msg = _errors({**flat, "task.reward": f"{files / 'rewards.py'}:needs_column"})
    assert "task.reward=" in msg and "'difficulty'" in msg and "columns: prompt" in msg
    msg = _errors({**flat, "task.reward": f"{files / 'rewards.py'}:missing"})
    assert "has no 'missing'" in msg and "by_level" in msg
    assert "cannot import module 'no_such_mod'" in _errors({**flat, "task.reward": "no_such_mod:f"})
    assert "not a ftis_flwr.tasks.base.Task" in _errors({"task.name": f"{files / 'rewards.py'}:not_a_task"})
    assert "is not one of arithmetic" in _errors({"task.name": "nope"})
    (files / "empty.jsonl").write_text("")
    assert "task.data_files.test=" in _errors({**flat, "task.data_files.test": str(files / "empty.jsonl")})
    (files / "bad.jsonl").write_text("{not json\n")
    assert "task.data_files.test=" in _errors({**flat, "task.data_files.test": str(files / "bad.jsonl")})


def test_problems_keep_comparing_as_before():
    assert Problem("a", "q", "g") == Problem("a", "q", "g", columns={"x": 1})


def test_nodes_that_compute_rewards_from_another_task_stop_the_run_naming_what_differs(files):
    from ftis_flwr.server.roster import FederationError
    from ftis_flwr.server.task_agreement import TaskAgreement
    from ftis_flwr.tasks.fingerprint import task_parts

    cfg = _cfg(files, reward=f"{files / 'trl_reward.py'}:reward_func")
    same = task_parts(cfg, make_task(cfg))
    moved = files / "elsewhere"
    moved.mkdir()
    for f in ("train.jsonl", "test.jsonl", "trl_reward.py"):
        (moved / f).write_bytes((files / f).read_bytes())
    there = _cfg(moved, reward=f"{moved / 'trl_reward.py'}:reward_func")
    assert task_parts(there, make_task(there)) == same  # the same files at another path agree
    agree = TaskAgreement()
    agree.note("a", same)
    agree.note("b", task_parts(there, make_task(there)))
    agree.check()
    (moved / "trl_reward.py").write_text(TRL_REWARD.replace("1.0 if", "2.0 if"))
    other = task_parts(there, make_task(there))
    assert other != same and fingerprint_differs(same, other) == ["reward reward_func"]
    agree.note("b", other)
    with pytest.raises(FederationError, match=r"reward reward_func \(a: \w+, b: \w+\)"):
        agree.check()


def fingerprint_differs(a: dict, b: dict) -> list[str]:
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def test_every_node_scores_own_and_received_samples_with_the_users_reward(files, tmp_path):
    """Two tiny nodes on the user's rows: each calls the user's TRL-form reward on its own new
    groups and on the groups it receives (the claimed rewards are never used), and evaluates the
    user's test split under its name."""
    from test_node import YAML

    from ftis_flwr.node.node import Node, Received, StepRequest

    log = tmp_path / "calls.log"
    (files / "logged.py").write_text(textwrap.dedent(f'''
        import os
        def reward(completions, answer, **kwargs):
            with open({str(log)!r}, "a") as fh:
                fh.write(f"{{os.getpid()}} {{len(completions)}}\\n")
            return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]
    '''))
    overrides = {"cache_dir": str(tmp_path / "cache"), "task.name": "dataset", "task.dataset": "json",
                 "task.data_files.train": str(files / "train.jsonl"), "task.data_files.test": str(files / "test.jsonl"),
                 "task.reward": f"{files / 'logged.py'}:reward"}
    exp = load_experiment(yaml_text=YAML, overrides=overrides)
    a, b = (Node(card, exp, cache_dir=tmp_path / "cache") for card in exp.nodes)
    ra = a.step(StepRequest(0, 3, [0, 1], 4, True))
    rb = b.step(StepRequest(0, 3, [2], 4, False))
    assert "eval/test/accuracy" in ra.metrics and len(ra.groups) == 2
    assert [r["prompt"] for r in ra.samples] == [g.prompt_id for g in ra.groups]  # report.samples_per_node=2
    assert ra.samples[0]["reward"] == float(ra.groups[0].rewards[0]) and rb.samples == []  # b: no eval
    pid = os.getpid()
    assert log.read_text().splitlines() == [f"{pid} 4", f"{pid} 4", f"{pid} 1", f"{pid} 4"]  # a: 2 groups, its
    # evaluation of the one test row; b: its group
    for g in rb.groups:
        g.rewards = g.rewards + 1.0  # a peer's claimed rewards: never trusted
    res = a.step(StepRequest(1, 3, [], 4, False, foreign=[Received("b", rb.groups, [2])]))
    assert res.metrics["b/rewards_corrected"] == 4  # rescored with the user's reward
    assert len(log.read_text().splitlines()) == 4 + 3  # a's 2 own groups and b's group, scored again


def test_sample_rows_in_a_reply_are_read_safely():
    from ftis_flwr.server.replies import MAX_SAMPLES, read_samples

    rows = [{"prompt": "train:1", "completion": "42", "reward": 1.0}]
    assert read_samples(json.dumps(rows)) == rows
    assert read_samples("") == [] and read_samples("{not json") == [] and read_samples('{"a": 1}') == []
    assert read_samples(json.dumps([{"prompt": "p", "completion": "x" * 5000, "reward": "high"}])) == []
    many = read_samples(json.dumps(rows * 40))
    assert len(many) == MAX_SAMPLES
    assert len(read_samples(json.dumps([{**rows[0], "completion": "x" * 5000}]))[0]["completion"]) == 2000


# ------------------------------------------------ the first hour's traps (#56): each stopped by check

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS_RUN = ("task.dataset='json' task.data-files.train='docs/own-task/train.jsonl' "
            "task.data-files.test='docs/own-task/test.jsonl' task.reward='docs/own-task/reward.py:reward'")


def _check(capsys, run_config: str) -> tuple[int, str]:
    from ftis_flwr.cli import main

    code = main(["check", REPO, "--run-config", run_config, "--no-reward-probe"])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_the_docs_own_task_command_without_task_name_is_refused_naming_the_task_that_reads_it(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    code, out = _check(capsys, DOCS_RUN)
    assert code == 2, out
    assert ("task.dataset='json', task.data_files.train='docs/own-task/train.jsonl', task.data_files.test="
            "'docs/own-task/test.jsonl': read only by task.name='dataset'; task.name='arithmetic' does not read "
            "them, so the run would train 'arithmetic' and ignore them: set task.name='dataset'") in out
    code, out = _check(capsys, "task.name='dataset' " + DOCS_RUN)
    assert code == 0 and "configuration valid" in out


def test_keys_of_other_tasks_are_named_and_a_presets_own_are_not_the_users(files):
    flat = {"task.name": "dataset", "task.dataset": "json", "task.data_files.train": str(files / "train.jsonl")}
    msg = _errors({"task.train_path": str(files / "train.jsonl"), "task.shots": 1, "task.size": 9})
    assert "task.train_path='" in msg and "read only by task.name='gsm8k' or 'math500'" in msg
    assert "task.shots=1: read only by task.name='basic-math' or " in msg
    assert "task.size=9: read only by task.name='reasoning-gym:<generator>'" in msg and "(3 errors)" in msg
    exp = load_experiment("cpu-smollm2", flat)  # the preset's shots: 1 is basic-math's, not the user's
    assert exp.task.shots == 1 and exp.task.name == "dataset"
    with pytest.raises(ConfigError, match=r"task.shots=2: read only by task.name='basic-math'"):
        load_experiment("cpu-smollm2", {**flat, "task.shots": 2})


def _user_files(tmp_path, questions: list[str]) -> str:
    rows = [{"question": q, "product": "84"} for q in questions]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "reward.py").write_text("def reward(completions, product, **kw):\n"
                                        "    return [float(c.strip() == p) for c, p in zip(completions, product)]\n")
    return (f"task.name='dataset' task.dataset='json' task.data-files.train='{tmp_path}/train.jsonl' "
            f"task.prompt-field='question' task.reward='{tmp_path}/reward.py:reward'")


def test_prompts_the_tiny_models_cannot_read_are_refused_naming_the_row_the_nodes_and_the_limit(tmp_path, capsys):
    """The issue's natural prompt: capitals (not in the char vocabulary) and 73 characters (64 positions)."""
    natural = "What is the product of twelve and seven? Answer with the number, please!!"
    assert len(natural) == 73
    code, out = _check(capsys, _user_files(tmp_path, ["what is 12 times 7?", natural]))
    assert code == 2, out
    head = "nodes[small], nodes[large] (tiny models, char tokenizer, 64 positions): the prompt of row 2 of " \
        "task.data_files.train"
    assert (f"{head} is 73 tokens as the node renders it, and an answer needs one more: 74 positions, more than "
            "the model's 64; 1 of the 2 rows checked (the longest: 73 tokens): shorten the prompts to at most 63 "
            "tokens (one per character), or use a real model's preset, e.g. preset='cpu-smollm2'") in out
    assert (f"{head} has characters the tokenizer cannot represent: 'W', 'A' (its tokens stand for '<unk>hat is "
            "the product") in out
    assert "1 of the 2 rows checked: the char tokenizer has digits, lowercase a-z, space, newline and" in out
    code, out = _check(capsys, _user_files(tmp_path, ["what is 12 times 7?", "what is seven times twelve?"]))
    assert code == 0, out  # lowercase and short: what the tiny models read


def test_answers_a_gold_comparing_reward_needs_must_fit_the_completion_budget(files):
    rows = [{"prompt": "1+1=", "answer": "two"}, {"prompt": "2+2=", "answer": "the number four, in words"}]
    (files / "long.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    msg = _errors({"task.name": "dataset", "task.dataset": "json", "task.data_files.train": str(files / "long.jsonl"),
                   "rollout.max_new_tokens": 6})
    assert ("row 2 of task.data_files.train has the answer 'the number four, in words', 25 tokens, more than "
            "rollout.max_new_tokens=6; 1 of the 2 rows checked: raise rollout.max_new_tokens (now 6) to at least 25") \
        in msg


def test_the_answer_column_is_checked_whenever_it_is_set(files):
    flat = {"task.name": "dataset", "task.dataset": "json", "task.data_files.train": str(files / "train.jsonl")}
    msg = _errors({**flat, "task.answer_field": "solution", "task.reward": f"{files / 'rewards.py'}:by_level"})
    assert "task.answer_field='solution': task.data_files.train has no such column" in msg
    load_experiment(overrides={**flat, "task.answer_field": "ground_truth"})  # a column: fine
    msg = _errors({"task.reward": f"{files / 'rewards.py'}:needs_column"})  # arithmetic's rows: answer only
    assert "task.reward=" in msg and "it requires 'difficulty'" in msg


def test_a_file_builders_misspelling_fails_at_once_offline_with_did_you_mean(files, capsys, monkeypatch):
    import time

    from ftis_flwr.tasks import data_faults

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    data_faults.hub_reachable.cache_clear()
    try:
        start = time.perf_counter()
        code, out = _check(capsys, f"task.name='dataset' task.dataset='jsonl' task.data-files.train="
                                   f"'{files}/train.jsonl' task.data-files.test='{files}/test.jsonl'")
        took = time.perf_counter() - start
        assert code == 2 and out.count("task.dataset='jsonl' is not a builder that reads files (json, csv, parquet, "
                                       "text, arrow) nor a local folder, and the hub cannot be reached") == 1, out
        assert "did you mean 'json' (it reads .jsonl files)?" in out and took < 20  # was 26-48 s of retries
        assert data_faults.did_you_mean("csvv", ("json", "csv")) == "; did you mean 'csv'?"
        assert data_faults.did_you_mean("someone/data", ("json", "csv")) == ""
    finally:
        data_faults.hub_reachable.cache_clear()
    monkeypatch.setattr(data_faults, "hub_reachable", lambda: True)
    assert data_faults.hub_fault("jsonl", ("json",)) == ""  # the hub answers: datasets is asked


def test_a_malformed_line_is_named_by_file_and_1_based_line_with_the_parsers_message(files):
    rows = [json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) for i in range(50)]
    rows[41] = rows[41][:-1]  # line 42 loses its closing brace
    (files / "bad.jsonl").write_text("\n".join(rows) + "\n")
    msg = _errors({"task.name": "dataset", "task.dataset": "json", "task.data_files.train": str(files / "bad.jsonl")})
    assert (f"task.data_files.train='{files / 'bad.jsonl'}': line 42, column 35: Expecting ',' delimiter "
            "(the file does not parse as JSON Lines, one object per line)") in msg
    from ftis_flwr.tasks.data_faults import json_fault

    (files / "doc.json").write_text('[\n  {"prompt": "1+1=", "answer": "2"},\n  {"prompt": "2+2=" "answer": "4"}\n]\n')
    assert json_fault(files / "doc.json") == "line 3, column 21: Expecting ',' delimiter"
    (files / "list.jsonl").write_text('{"prompt": "1+1="}\n[1, 2]\n')
    assert json_fault(files / "list.jsonl") == "line 2: a row must be a JSON object {...}, got list"
    assert json_fault(files / "train.jsonl") == ""


def test_a_reward_that_needs_what_only_trl_passes_is_named_with_the_docs(files):
    (files / "trl_state.py").write_text("def reward(completions, trainer_state, **kwargs):\n"
                                        "    return [float(trainer_state.global_step > 10)] * len(completions)\n")
    msg = _errors({"task.name": "dataset", "task.dataset": "json", "task.data_files.train": str(files / "train.jsonl"),
                   "task.reward": f"{files / 'trl_state.py'}:reward"})
    assert ("it requires 'trainer_state', which the rows do not have (columns: prompt, answer, ground_truth, level) "
            "(trainer_state: TRL's GRPOTrainer passes it, this project does not: docs/your-own-task.md)") in msg


def test_a_reward_that_reads_the_environments_needs_an_environment(files):
    """TRL gives ``environments`` only with ``environment_factory``: here only with
    ``task.environment``, where the check takes such a reward."""
    (files / "env_reward.py").write_text("def reward(completions, environments, **kwargs):\n"
                                         "    return [float(len(e.shown) > 0) for e in environments]\n")
    keys = {"task.name": "dataset", "task.dataset": "json", "task.data_files.train": str(files / "train.jsonl"),
            "task.reward": f"{files / 'env_reward.py'}:reward"}
    msg = _errors(keys)
    assert ("it requires 'environments', which the rows do not have (columns: prompt, answer, ground_truth, level) "
            "(environments: given with task.environment, each episode's instance, as TRL gives it with "
            "environment_factory)") in msg
    toys = Path(__file__).resolve().parent / "toy_environments.py"
    load_experiment(overrides={**keys, "task.environment": f"{toys}:Ledger"})  # valid: nothing raised


def test_the_messages_docs_your_own_task_quotes_are_what_check_prints(capsys, monkeypatch):
    """Each `ftis-flwr check` command of "What the check refuses" and "The default models' limits"
    (those that need no file written first), run as written: its quoted lines are in what it prints,
    and a command quoted with no output is valid."""
    import re
    import shlex

    from ftis_flwr.tasks import data_faults

    monkeypatch.chdir(REPO)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    data_faults.hub_reachable.cache_clear()
    text = open(os.path.join(REPO, "docs", "your-own-task.md")).read()
    section = text[text.index("## What the check refuses"):text.index("## A procedural task")]
    blocks = re.findall(r"```bash\n(.*?)```\n(?:\n```\n(.*?)```)?", section, flags=re.DOTALL)
    ran = 0
    try:
        for command, quoted in blocks:
            if not command.startswith("ftis-flwr check . --run-config") or "\n" in command.strip():
                continue
            run_config = shlex.split(command)[-1]
            code, out = _check(capsys, run_config)
            lines = [line for line in quoted.splitlines() if line.strip()]
            assert code == (2 if lines else 0), (command, out)
            for line in lines:
                assert line in out, (line, out)
            ran += 1
    finally:
        data_faults.hub_reachable.cache_clear()
    assert ran == 4
