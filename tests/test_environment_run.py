"""A real Node with ``task.environment`` (issue #57, algorithm §13): its groups are episodes of the
calculator environment (``toy_environments.CalcEnv``) with sampled masks and the environment's
rewards, one update trains on them, the ``env/*`` metrics are in its round's metrics (and in the
metrics catalogue), a peer's episodes are replayed through this node's environment and trained on
with its own rewards, one whose tool result was altered is refused on replay, an environment that
does not declare itself deterministic is not replayed at all, and an environment fault stops the
round with its reason.

The node's tiny model is first taught the scripted episode of each row (``12+34=`` ->
``#calc(12+34)`` [``=46``] ``#submit(46)`` [``=ok``] ``done``) for a few steps, so that at
temperature 1 some of its episodes call the tools and submit the right answer and some do not.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import episode_node, teach

from ftis_flwr.node.env_rollout import METRICS
from ftis_flwr.node.node import Received, StepRequest
from ftis_flwr.server.reporting.metric_names import find
from ftis_flwr.tasks.environment import EnvironmentFault, load_environment

pytestmark = pytest.mark.slow  # a real tiny node taught and run: 15-20 s

TOYS = Path(__file__).resolve().parent / "toy_environments.py"
ROWS = ((12, 34), (20, 21))


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    node = episode_node(tmp_path_factory.mktemp("env-run"), f"{TOYS}:CalcEnv", ROWS, max_turns=4)
    teach(node, [(f"{a}+{b}=", [(f"#calc({a}+{b})", str(a + b)), (f"#submit({a + b})", "ok"), ("done", None)])
                 for a, b in ROWS])
    return node


@pytest.fixture(scope="module")
def first(node):
    """The taught node's first round: its evaluation and its first episode groups."""
    return node.step(StepRequest(0, 2, [0, 1], 8, True))


def test_a_node_trains_on_its_episodes_and_replays_a_peers(node, first):
    res = first
    groups = res.groups
    # evaluation: one greedy episode per problem, scored by the environment (the taught script submits right)
    assert res.metrics["eval/test/accuracy"] == 1.0 and res.metrics["eval/test/full_credit"] == 1.0
    assert [g.prompt_id for g in groups] == ["train:0", "train:1"]
    for g in groups:
        assert g.size == 8 and g.sampled_masks is not None
        for c, lp, m in zip(g.completions, g.logprobs, g.sampled_masks):
            assert len(c) == len(lp) == len(m) and m[0] == 1 and m[-1] == 1
            assert (lp[m == 0] == 0.0).all() and (lp[m == 1] <= 0).all()
        assert set(g.rewards.tolist()) <= {0.0, 1.0}
    assert any((m == 0).any() for g in groups for m in g.sampled_masks), "no episode appended a tool turn"
    rewards = np.concatenate([g.rewards for g in groups])
    assert 0 < rewards.mean() < 1, "the update needs episodes that succeed and fail"
    m = res.metrics
    assert m["env/episodes"] == 16 and m["env/tool_calls"] > 0 and 1 <= m["env/turns_mean"] <= 4
    assert m["env/tool_errors"] >= 0 and m["reward_mean"] == pytest.approx(float(rewards.mean()))
    longest = max(len(c) for g in groups for c in g.completions)
    assert longest > node.cfg.rollout.max_new_tokens  # an episode is longer than one turn's cap

    # the same episodes as b's: one group as sent, claiming every episode succeeded; the other with
    # one tool result altered (the hostile peer of issue #57)
    tampered = next(i for i, g in enumerate(groups) if any((m == 0).any() for m in g.sampled_masks))
    honest = 1 - tampered
    peer = [dataclasses.replace(g, node="b", rewards=np.ones(g.size, np.float32)) for g in groups]
    j = next(k for k, m in enumerate(groups[tampered].sampled_masks) if (m == 0).any())
    forged = groups[tampered].completions[j].copy()
    at = int(np.flatnonzero(groups[tampered].sampled_masks[j] == 0)[0])  # the tool turn's first token: "="
    forged[at + 1] = node.tokenizer.convert_tokens_to_ids("9" if node.tokenizer.decode([forged[at + 1]]) != "9"
                                                          else "8")
    completions = list(peer[tampered].completions)
    completions[j] = forged
    peer[tampered] = dataclasses.replace(peer[tampered], completions=completions)
    before = [p.detach().clone() for p in node.params]
    res = node.step(StepRequest(1, 2, [], 8, False, foreign=[Received("b", peer, [0, 1])]))
    m = res.metrics
    assert any(not torch.equal(p, q) for p, q in zip(before, node.params)), "the update left the node unchanged"
    assert m["samples_own"] == 16 and m["samples_foreign"] == 8
    assert m["train_reward_own"] == pytest.approx(float(rewards.mean()))  # the environment's rewards, kept
    # b's honest group replayed here: trained on with this node's rewards, not the 1.0 it claimed
    assert m["b/env_replayed"] == 8 and m["train_reward_foreign"] == pytest.approx(float(groups[honest].rewards.mean()))
    assert m.get("b/rewards_corrected", 0) == float((groups[honest].rewards != 1.0).sum())
    # the altered observation: the whole group refused on replay, with where it parted
    assert m["b/env_replay_refused"] == 8 and m["b/groups_rejected"] == 1 and m["b/samples_rejected"] == 8
    assert any(r.startswith("b: 1 group(s), 8 sample(s) rejected: env_replay_refused: episode "
                            f"{j}: the tool turn after turn 1 is not this node's tokens") for r in res.rejections)
    for key in [*METRICS, "b/env_replayed", "b/env_replay_refused", "b/episodes_no_replay"]:
        assert find(key, "node") is not None, key


@pytest.mark.parametrize("reward", ["shown_the_answer", "read_the_answer_from_a_tool"])
def test_a_reward_function_reads_each_episode_on_the_sampler_and_on_replay(tmp_path, reward):
    """TRL's reward arguments for environments, on an environment without ``get_reward``
    (``Ledger``): ``environments``, each episode's instance (``shown_the_answer`` reads what it
    showed), and the conversational ``completions`` and ``prompts``, each episode's messages
    (``read_the_answer_from_a_tool`` reads the tool messages; it raises on plain text). The episodes
    end with "done", which the exact-match reward would score 0, so rewards above 0 are the
    episodes'; a peer's replay scores them on its own instances, to the same values."""
    from ftis_flwr.tasks.reward_probe import environment_scorer

    ledger = episode_node(tmp_path, f"{TOYS}:Ledger", ROWS, max_turns=3, reward=f"{TOYS}:{reward}")
    teach(ledger, [(f"{a}+{b}=", [(f"#calc({a}+{b})", str(a + b)), ("done", None)]) for a, b in ROWS])
    res = ledger.step(StepRequest(0, 2, [0, 1], 8, False))
    rewards = np.concatenate([g.rewards for g in res.groups])
    assert set(rewards.tolist()) <= {0.0, 1.0} and 0 < rewards.mean() < 1, rewards
    peer = [dataclasses.replace(g, node="b", rewards=1 - g.rewards) for g in res.groups]
    m = ledger.step(StepRequest(1, 2, [], 8, False, foreign=[Received("b", peer, [0, 1])])).metrics
    assert m["b/env_replayed"] == 16 and m["train_reward_foreign"] == pytest.approx(float(rewards.mean()))
    # the check's reward probe ends episodes without a tool call: nothing shown, nothing paid
    probe = environment_scorer(ledger.cfg, ledger.task)
    problems = [ledger.task.train_problem(i) for i in (0, 1)]
    assert probe([str(a + b) for a, b in ROWS], problems) == [0.0, 0.0]


def test_a_single_turn_episode_without_its_mask_is_still_replayed(node):
    """The wire drops a mask of all ones: such a group is an episode all the same, replayed (not
    scored as a single completion); cut to 5 tokens with room left to sample, it is refused as cut."""
    groups = node.step(StepRequest(1, 2, [0], 8, False)).groups
    cut = dataclasses.replace(groups[0], node="b", sampled_masks=None, rewards=np.ones(8, np.float32),
                              completions=[c[:5] for c in groups[0].completions],
                              logprobs=[lp[:5] for lp in groups[0].logprobs])
    res = node.step(StepRequest(2, 2, [], 8, False, foreign=[Received("b", [cut], [0])]))
    assert res.metrics["b/env_replay_refused"] == 8 and not res.metrics.get("samples_foreign")
    assert any("turn 1 is not closed by an end-of-turn token, yet it stops with tokens left to sample" in r
               for r in res.rejections), res.rejections


def test_an_episode_from_another_prompt_or_past_the_turn_limit_is_refused_on_replay(node, first):
    """The prompt sent must be this node's rendering of the row after reset, and no episode may
    have more model turns than task.max_turns."""
    g = next(g for g in first.groups if any((m == 0).any() for m in g.sampled_masks))  # one with a tool turn
    moved = dataclasses.replace(g, node="b", prompt_tokens=g.prompt_tokens[1:])
    res = node.step(StepRequest(2, 2, [], 8, False, foreign=[Received("b", [moved], [0, 1])]))
    assert res.metrics["b/env_replay_refused"] == 8
    assert any("its prompt is not this node's rendering of the row after reset" in r for r in res.rejections)
    limit, budget = node.cfg.task.max_turns, node.cfg.task.episode_tokens
    node.cfg.task.max_turns, node.cfg.task.episode_tokens = 1, 256  # the budget left as it was
    try:
        res = node.step(StepRequest(3, 4, [], 8, False, foreign=[Received("b", [dataclasses.replace(g, node="b")],
                                                                          [0, 1])]))
    finally:
        node.cfg.task.max_turns, node.cfg.task.episode_tokens = limit, budget
    assert any("model turns, more than task.max_turns=1" in r for r in res.rejections), res.rejections


def test_a_mask_that_lies_or_a_missing_turn_is_refused_on_replay(node, first):
    """The hostile peer's other forgeries (issue #57): a mask that calls a tool result's first token
    sampled (so the loss would train on the environment's text), and an episode cut after its first
    turn, which called a tool (the loop stops after a call only at the turn limit or the budget)."""
    g = next(g for g in first.groups if any((m == 0).any() for m in g.sampled_masks))
    j = next(k for k, m in enumerate(g.sampled_masks) if (m == 0).any())
    masks = [m.copy() for m in g.sampled_masks]
    masks[j][int(np.flatnonzero(masks[j] == 0)[0])] = 1
    lying = dataclasses.replace(g, node="b", sampled_masks=masks)
    at = int(np.flatnonzero(g.sampled_masks[j] == 0)[0])  # the first model turn ends just before
    cut = [c.copy() for c in g.completions]
    cut[j] = cut[j][:at]
    lps = [lp.copy() for lp in g.logprobs]
    lps[j] = lps[j][:at]
    short = [m.copy() for m in g.sampled_masks]
    short[j] = short[j][:at]
    missing = dataclasses.replace(g, node="c", completions=cut, logprobs=lps, sampled_masks=short)
    res = node.step(StepRequest(5, 6, [], 8, False, foreign=[Received("b", [lying], [0, 1]),
                                                             Received("c", [missing], [0, 1])]))
    m = res.metrics
    assert m["b/env_replay_refused"] == 8 and m["c/env_replay_refused"] == 8 and not m.get("samples_foreign")
    assert any(r.startswith("b: 1 group(s), 8 sample(s) rejected: env_replay_refused") for r in res.rejections)
    assert any(r.startswith("c: ") and "ends on turn 1, which called a tool, with turns and tokens left" in r
               for r in res.rejections), res.rejections


def test_an_environment_that_does_not_declare_itself_deterministic_is_not_replayed(node):
    """TRL's class as it is (no ``deterministic = True``): a peer's episodes are refused and counted."""
    groups = node.step(StepRequest(1, 2, [0, 1], 8, False)).groups
    spec = node.env.spec
    node.env.spec = load_environment("toy_environments:UndeclaredCalcEnv")
    try:
        peer = [dataclasses.replace(g, node="b") for g in groups]
        res = node.step(StepRequest(2, 2, [], 8, False, foreign=[Received("b", peer, [0, 1])]))
    finally:
        node.env.spec = spec
    m = res.metrics
    assert m["b/episodes_no_replay"] == 16 and m["b/groups_rejected"] == 2 and not m.get("samples_foreign")
    assert any("does not declare itself deterministic" in r for r in res.rejections)


def test_a_saved_state_keeps_the_pending_episodes_masks(node, first, tmp_path):
    """A resumed node trains on the episodes it made before it stopped, their tool turns still
    masked out of the loss (node/state.py saves each sampled mask)."""
    from ftis_flwr.node.state import load_state, save_state

    node.pending = list(first.groups)  # the first round's: episodes with tool turns
    before = [(g.prompt_id, [m.copy() for m in g.sampled_masks]) for g in node.pending]
    assert any((m == 0).any() for _, masks in before for m in masks)
    save_state(node, tmp_path, node.round)
    node.pending = []
    assert load_state(node, tmp_path) == node.round
    after = [(g.prompt_id, g.sampled_masks) for g in node.pending]
    assert [p for p, _ in after] == [p for p, _ in before]
    for (_, a), (_, b) in zip(before, after):
        assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_an_environment_fault_stops_the_round_with_its_reason(node):
    spec = node.env.spec
    node.env.spec = load_environment("toy_environments:BadReset")
    try:
        with pytest.raises(EnvironmentFault, match=r"BadReset.reset\(\*\*row\) returned 42"):
            node.step(StepRequest(2, 2, [0], 8, False))
    finally:
        node.env.spec = spec
