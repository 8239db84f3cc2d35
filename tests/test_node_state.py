"""A node's saved training state: a restored node is the node that was saved, full and LoRA."""

import json

import numpy as np
import pytest
import torch

from ftis_flwr.experiment import load_experiment
from ftis_flwr.node.node import Node, Received, StepRequest
from ftis_flwr.node.state import KEEP, StateError, load_state, save_state, saved_rounds

YAML = """
rounds: {num_rounds: 4, prompts_per_node: 3, eval_size: 8}
rollout: {group_size: 4, max_new_tokens: 6}
train: {lr: 1e-3, micro_batch_size: 8}
nodes:
  - {name: a, tiny_size: small, warmstart_steps: 60, seed: 1}
  - {name: b, tiny_size: small, warmstart_steps: 60, seed: 1, lora: true, lora_config: {r: 4, alpha: 8}}
"""


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("state-cache")


def _node(cache, i):
    exp = load_experiment(yaml_text=YAML, overrides={"cache_dir": str(cache)})
    return Node(exp.nodes[i], exp, cache_dir=cache)


def _two_rounds(node):
    node.step(StepRequest(0, 4, [0, 1, 2], 4, False))
    node.step(StepRequest(1, 4, [3, 4, 5], 4, False))


@pytest.mark.parametrize("index", [0, 1], ids=["full", "lora"])
def test_a_restored_node_continues_exactly_where_the_saved_one_was(cache, tmp_path, index):
    node = _node(cache, index)
    _two_rounds(node)
    assert node.updates == 1 and node.round == 1
    info = save_state(node, tmp_path, node.round)
    assert info.nbytes > 0 and saved_rounds(tmp_path) == [1]

    fresh = _node(cache, index)
    base = [p.detach().clone() for p in fresh.params]
    assert load_state(fresh, tmp_path) == 1
    assert fresh.updates == 1 and fresh.round == 1
    assert all(torch.equal(p, q) for p, q in zip(node.params, fresh.params))
    assert any(not torch.equal(p, q) for p, q in zip(base, fresh.params)), "state did not change weights"
    exp_a, exp_b = node.optimizer.state_dict()["state"], fresh.optimizer.state_dict()["state"]
    assert exp_a.keys() == exp_b.keys() and exp_a
    for k in exp_a:
        assert all(torch.equal(exp_a[k][n], exp_b[k][n]) for n in exp_a[k])
    assert [g.prompt_id for g in fresh.pending] == [g.prompt_id for g in node.pending]
    for g, h in zip(node.pending, fresh.pending):
        assert all(np.array_equal(x, y) for x, y in zip(g.logprobs, h.logprobs))
        assert all(np.array_equal(x, y) for x, y in zip(g.completions, h.completions))
    # the next round is the same whether the node lived on or was restored
    m1 = node.step(StepRequest(2, 4, [6, 7, 8], 4, False)).metrics
    m2 = fresh.step(StepRequest(2, 4, [6, 7, 8], 4, False)).metrics
    for key in ("loss", "grad_norm", "reward_mean", "updates"):
        assert m1[key] == m2[key], key
    assert all(torch.equal(p, q) for p, q in zip(node.params, fresh.params))


def test_only_the_newest_rounds_are_kept_and_a_partial_save_is_never_read(cache, tmp_path):
    node = _node(cache, 0)
    node.step(StepRequest(0, 4, [0], 4, False))
    for r in range(KEEP + 2):
        save_state(node, tmp_path, r)
    assert saved_rounds(tmp_path) == list(range(2, KEEP + 2))
    (tmp_path / ".tmp-123").mkdir()  # what a crash mid-save leaves: ignored
    assert saved_rounds(tmp_path) == list(range(2, KEEP + 2))
    assert load_state(node, tmp_path, at_most=2) == 2
    assert load_state(node, tmp_path, at_most=1) is None


def test_a_state_saved_by_another_card_is_refused(cache, tmp_path):
    node = _node(cache, 0)
    node.step(StepRequest(0, 4, [0], 4, False))
    info = save_state(node, tmp_path, 0)
    meta = json.loads((info.path / "state.json").read_text())
    meta["identity"]["model_id"] = "someone-else"
    (info.path / "state.json").write_text(json.dumps(meta))
    with pytest.raises(StateError, match="belongs to"):
        load_state(_node(cache, 0), tmp_path)


def test_foreign_groups_survive_nothing_they_are_not_state(cache, tmp_path):
    """Only own pending groups are state: foreign ones arrive again with the next round's message."""
    a, b = _node(cache, 0), _node(cache, 1)
    a.step(StepRequest(0, 4, [0], 4, False))
    gb = b.step(StepRequest(0, 4, [1], 4, False)).groups
    a.step(StepRequest(1, 4, [2], 4, False, foreign=[Received("b", gb, [1])]))
    save_state(a, tmp_path, 1)
    restored = _node(cache, 0)
    load_state(restored, tmp_path)
    assert {g.node for g in restored.pending} == {"a"}


def test_an_episodes_sampled_masks_are_saved_and_reach_the_loss(cache, tmp_path):
    """An own group of episodes (``Group.sampled_masks``, algorithm §13) keeps its masks through a
    save and a restore, and the node's batch takes them: the loss counts the sampled tokens only
    (the three tool tokens between two model turns are context), and the update runs on it."""
    node = _node(cache, 0)
    node.step(StepRequest(0, 4, [0], 4, False))
    g = node.pending[0]
    tool, ones = np.array([20, 21, 22], np.int64), [np.ones(len(c), np.uint8) for c in g.completions]
    g.sampled_masks = [np.concatenate([m, np.zeros(3, np.uint8), m]) for m in ones]
    g.completions = [np.concatenate([c, tool, c]) for c in g.completions]
    g.logprobs = [np.concatenate([lp, np.zeros(3, np.float32), lp]) for lp in g.logprobs]
    g.validate(node.vocab_size)
    save_state(node, tmp_path, 0)
    fresh = _node(cache, 0)
    load_state(fresh, tmp_path)
    assert [m.tolist() for m in fresh.pending[0].sampled_masks] == [m.tolist() for m in g.sampled_masks]
    samples = fresh._samples(fresh.pending, [np.array([1.0, 0.0, 0.0, 1.0], np.float32)])
    assert [s.sampled.tolist() for s in samples] == [m.tolist() for m in g.sampled_masks]
    inputs = fresh._loss_inputs(samples)
    assert int(inputs.mask.sum()) == sum(int(m.sum()) for m in g.sampled_masks)
    assert np.isfinite(fresh.train(fresh.pending, 1, 4)["loss"])
