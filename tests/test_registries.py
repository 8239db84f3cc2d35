"""One registry per kind (losses, tasks, engines, selection rules), all in the shape of
``register_loss``: a lookup whose error lists the valid names, a second, different registration
under a name refused, and the torch-free name tuples of ``config.choices`` equal to what is
registered, so a name registered without its choice (or a choice without its code) fails here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent

NAMES = """
import json
from ftis_flwr.maths.loss import LOSS_REGISTRY
from ftis_flwr.node.engines import ENGINE_REGISTRY
from ftis_flwr.server.budget import SELECT_RULE_REGISTRY
from ftis_flwr.tasks.registry import TASK_PREFIX_REGISTRY, TASK_REGISTRY
print(json.dumps({"losses": list(LOSS_REGISTRY), "engines": list(ENGINE_REGISTRY),
                  "rules": list(SELECT_RULE_REGISTRY), "tasks": list(TASK_REGISTRY),
                  "prefixes": list(TASK_PREFIX_REGISTRY)}))
"""


def test_the_choices_name_exactly_what_is_registered():
    """Read in a fresh interpreter: what the package registers on import, not what a test added."""
    from ftis_flwr.config import choices

    proc = subprocess.run([sys.executable, "-c", NAMES], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(got["losses"]) == set(choices.BUILTIN_LOSSES)
    assert set(got["engines"]) == set(choices.ENGINES)
    assert set(got["rules"]) | {choices.NO_SELECTION} == set(choices.SELECT_RULES)
    assert choices.NO_SELECTION not in got["rules"]  # "all" is no rule: no budget, nothing chosen
    assert set(got["tasks"]) == set(choices.TASK_NAMES)
    assert set(got["prefixes"]) == set(choices.TASK_PREFIXES)


# ------------------------------------------------------------------------------ engines


@pytest.fixture
def engines():
    from ftis_flwr.node.engines import ENGINE_REGISTRY

    before = dict(ENGINE_REGISTRY)
    yield ENGINE_REGISTRY
    ENGINE_REGISTRY.clear()
    ENGINE_REGISTRY.update(before)


def test_an_engine_is_a_registration_and_a_second_different_one_is_refused(engines):
    from ftis_flwr.node.engines import get_engine_factory, make_engine, register_engine

    class Echo:  # an engine that says what it was built with
        def __init__(self, *built):
            self.built = built

        def sample(self, prompts, n, **kw):
            return []

        def greedy(self, prompts, **kw):
            return []

    def echo(model, tokenizer, *, card=None, share_prompts=True, **options):
        return Echo("echo", model, tokenizer, card, share_prompts, options)

    assert register_engine("test-echo")(echo) is echo
    register_engine("test-echo")(echo)  # the same factory again (a module imported twice): fine
    assert make_engine("test-echo", "m", "t", vocab_size=5).built == ("echo", "m", "t", None, True, {"vocab_size": 5})
    with pytest.raises(ValueError, match="engine 'test-echo' is already registered"):
        register_engine("test-echo")(lambda *a, **k: None)
    with pytest.raises(ValueError, match=r"unknown engine 'jax'; expected one of hf, vllm, test-echo"):
        get_engine_factory("jax")


def test_an_engine_of_ones_own_by_import_path(tmp_path):
    from ftis_flwr.node.engines import get_engine_factory

    (tmp_path / "my_engine.py").write_text("def build(model, tokenizer, **kw):\n    return 'mine'\n")
    assert get_engine_factory(f"{tmp_path / 'my_engine.py'}:build")("m", "t") == "mine"
    with pytest.raises(ValueError, match="has no 'nope'"):
        get_engine_factory(f"{tmp_path / 'my_engine.py'}:nope")


def test_an_engine_of_ones_own_passes_the_check_and_a_node_samples_with_it(tmp_path):
    """``nodes.N.engine='<file.py>:<factory>'``: the check imports it (a name that is neither built
    in nor a path is refused by key), and a real tiny node builds its engine from it and samples."""
    from ftis_flwr.config.schema import ConfigError
    from ftis_flwr.experiment import load_experiment
    from ftis_flwr.node.node import Node

    (tmp_path / "my_engine.py").write_text(
        "from ftis_flwr.node.engines import HFEngine\n\n\n"
        "def tagged(model, tokenizer, *, card=None, share_prompts=True, **options):\n"
        "    engine = HFEngine(model, tokenizer, share_prompts=share_prompts, **options)\n"
        "    engine.built_for = card.name\n"
        "    return engine\n")
    yaml = """
rounds: {num_rounds: 1, prompts_per_node: 1}
rollout: {group_size: 2, max_new_tokens: 4}
nodes:
  - {name: a, tiny_size: small, warmstart_steps: 1, warmstart_target: 0, seed: 1}
  - {name: b, tiny_size: small, warmstart_steps: 1, warmstart_target: 0, seed: 1}
"""
    with pytest.raises(ConfigError, match=r"nodes\[a\].engine='jax' is not one of hf, vllm, nor an import path"):
        load_experiment(yaml_text=yaml, overrides={"nodes.a.engine": "jax"})
    exp = load_experiment(yaml_text=yaml, overrides={"nodes.a.engine": f"{tmp_path / 'my_engine.py'}:tagged",
                                                     "cache_dir": str(tmp_path / "cache")})
    node = Node(exp.nodes[0], exp, cache_dir=tmp_path / "cache")
    assert node.engine.built_for == "a"
    (group,) = node.generate([0], 2, 0)
    assert group.size == 2 and all(len(c) for c in group.completions)


# ---------------------------------------------------------------------- selection rules


@pytest.fixture
def rules():
    from ftis_flwr.server.budget import SELECT_RULE_REGISTRY

    before = dict(SELECT_RULE_REGISTRY)
    yield SELECT_RULE_REGISTRY
    SELECT_RULE_REGISTRY.clear()
    SELECT_RULE_REGISTRY.update(before)


def _payloads(sizes: dict[str, int]):
    """source -> (arrays, meta, indices) of ``n`` one-sample groups (prompt ids train:0..n-1)."""
    from ftis_flwr.wire.groups import Group
    from ftis_flwr.wire.rollouts import encode_groups

    out = {}
    for src, n in sizes.items():
        groups = [Group(prompt_id=f"train:{i}", prompt_tokens=np.arange(1, 4), completions=[np.full(2, 5)],
                        logprobs=[np.full(2, -0.5, np.float32)], rewards=np.zeros(1, np.float32), node=src,
                        model_id=f"m-{src}", tokenizer_fp="f" * 16) for i in range(n)]
        arrays, meta = encode_groups(groups, vocab_size=32)
        out[src] = (arrays, meta, list(range(n)))
    return out


def test_a_selection_rule_is_a_registered_scorer_the_budget_ranks_by(rules):
    from ftis_flwr.config.schema import ExchangeConfig
    from ftis_flwr.server.budget import ForeignBudget, get_select_rule, register_select_rule

    @register_select_rule("test-prefer-b")
    def prefer_b(source, read, kl):
        return [1.0 if source == "b" else 0.0] * read.n

    chosen = ForeignBudget(ExchangeConfig(max_foreign_groups=2, select="test-prefer-b")).select(
        "a", 1, _payloads({"b": 2, "c": 3}))
    assert list(chosen) == ["b"] and chosen["b"][2] == [0, 1]  # both of b's, as received
    with pytest.raises(ValueError, match="selection rule 'test-prefer-b' is already registered"):
        register_select_rule("test-prefer-b")(lambda s, r, k: [])
    with pytest.raises(ValueError, match=r"exchange.select='best' is not one of random, reward_variance, "
                                         r"low_kl, test-prefer-b \(or 'all' without a budget\)"):
        get_select_rule("best")


def test_a_rule_that_fails_on_a_source_leaves_only_that_source_out(rules):
    from ftis_flwr.config.schema import ExchangeConfig
    from ftis_flwr.server.budget import ForeignBudget, register_select_rule

    @register_select_rule("test-miscount")
    def miscount(source, read, kl):
        return [0.0] if source == "b" else [0.0] * read.n

    events = []
    budget = ForeignBudget(ExchangeConfig(max_foreign_groups=2, select="test-miscount"),
                           on_event=lambda kind, **f: events.append(f))
    assert list(budget.select("a", 1, _payloads({"b": 2, "c": 3}))) == ["c"]
    assert [e["source"] for e in events] == ["b"] and "scored 1 groups of 2" in events[0]["reason"]


# ------------------------------------------------------------------------------- tasks


def test_a_task_is_a_registration_and_a_second_different_one_is_refused():
    from ftis_flwr.config.schema import TaskConfig
    from ftis_flwr.tasks import ArithmeticTask
    from ftis_flwr.tasks.registry import TASK_REGISTRY, TaskError, make_task, register_task

    def factory(cfg):
        return ArithmeticTask(seed=cfg.seed)

    try:
        register_task("test-arith", factory)
        register_task("test-arith", factory)  # the same factory again: fine
        assert isinstance(make_task(TaskConfig(name="test-arith")), ArithmeticTask)
        with pytest.raises(TaskError, match="task 'test-arith' is already registered"):
            register_task("test-arith", lambda cfg: ArithmeticTask())
        with pytest.raises(TaskError, match=r"unknown task 'nope'; valid tasks: arithmetic, .*test-arith"):
            make_task(TaskConfig(name="nope"))
    finally:
        TASK_REGISTRY.pop("test-arith", None)


def test_a_task_must_provide_what_the_abstract_base_declares():
    from ftis_flwr.tasks.base import Problem, Task

    class NoReward(Task):
        def _load_split(self, split):
            return [Problem(id=f"{split}:0", question="1+1", gold="2")]

        def prompt_text(self, problem, tokenizer):
            return problem.question

    with pytest.raises(TypeError, match="abstract method.* reward"):
        NoReward()

    class Whole(NoReward):
        def reward(self, completion_text, problem):
            return float(completion_text.strip() == problem.gold)

    assert Whole().rewards(["2", "3"], [Whole().train_problem(0)] * 2) == [1.0, 0.0]
