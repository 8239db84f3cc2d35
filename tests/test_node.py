"""A Node without Flower: rounds of train + generate on real tiny models, modes and rejections."""

import dataclasses

import numpy as np
import pytest
import torch

from ftis_flwr.experiment import load_experiment
from ftis_flwr.maths.advantages import g_for_round
from ftis_flwr.maths.loss import LossInputs, compute_loss
from ftis_flwr.node.node import Node, Received, StepRequest

YAML = """
rounds: {num_rounds: 3, prompts_per_node: 4, eval_size: 8}
rollout: {group_size: 4, max_new_tokens: 6}
train: {lr: 1e-3, micro_batch_size: 8}
nodes:
  - {name: a, tiny_size: small, warmstart_steps: 60, seed: 1}
  - {name: b, tiny_size: small, warmstart_steps: 60, seed: 2}
"""


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("node-cache")


def _nodes(cache, **overrides):
    exp = load_experiment(yaml_text=YAML, overrides={"cache_dir": str(cache), **overrides})
    return exp, Node(exp.nodes[0], exp, cache_dir=cache), Node(exp.nodes[1], exp, cache_dir=cache)


def _params(node):
    return [p.detach().clone() for p in node.params]


def test_round_zero_generates_groups_of_own_log_probs(cache):
    exp, a, _ = _nodes(cache)
    res = a.step(StepRequest(0, 3, [0, 1, 2], 4, evaluate=True))
    assert [g.prompt_id for g in res.groups] == [a.task.train_problem(i).id for i in (0, 1, 2)]
    for g in res.groups:
        assert g.size == 4 and g.node == "a" and g.tokenizer_fp == a.fingerprint
        for c, lp in zip(g.completions, g.logprobs):
            assert len(c) == len(lp) and np.all(lp <= 0)
    assert "eval/test/accuracy" in res.metrics and "eval/ood/accuracy" in res.metrics
    assert "samples" not in res.metrics  # nothing to train on in round 0


def test_vertical_round_trains_on_own_and_foreign(cache):
    _, a, b = _nodes(cache)
    a.step(StepRequest(0, 3, [0, 1], 4, False))
    gb = b.step(StepRequest(0, 3, [2, 3], 4, False)).groups
    # one of b's groups right and wrong in turn, so the update has a signal whatever was sampled
    gold = a.task.train_problem(2).gold
    gb[0] = _crafted(a, 2, [gold, "x", gold, "y"], "b")
    before = _params(a)
    m = a.step(StepRequest(1, 3, [4, 5], 4, False, foreign=[Received("b", gb, [2, 3])])).metrics
    assert m["samples_own"] == 8 and m["samples_foreign"] == 8 and m["b/samples"] == 8
    assert m["kl_mean_own"] < 1e-4  # own samples are exactly on-policy
    assert m["samples_effective"] >= 2  # the right answers at least (the filter only takes A <= 0)
    assert any(not torch.equal(p, q) for p, q in zip(before, a.params)), "the update left a unchanged"
    assert len(a.pending) == 2 and a.updates == 1


def test_rewards_are_recomputed_not_trusted(cache):
    _, a, b = _nodes(cache)
    a.step(StepRequest(0, 3, [], 4, False))
    gb = b.step(StepRequest(0, 3, [0, 1, 2, 3], 4, False)).groups
    honest = [a._rewards(g) for g in gb]
    inflated = [dataclasses.replace(g, rewards=np.ones_like(g.rewards)) for g in gb]
    assert [a._rewards(g).tolist() for g in inflated] == [r.tolist() for r in honest]
    res = a.step(StepRequest(1, 3, [], 4, False, foreign=[Received("b", inflated, [0, 1, 2, 3])]))
    m = res.metrics
    assert m["train_reward_foreign"] == pytest.approx(float(np.mean(np.concatenate(honest))))
    lies = int(sum((r != 1).sum() for r in honest))  # samples whose claimed reward 1 was false
    assert lies > 0 and m["b/rewards_corrected"] == lies
    assert any(r.startswith(f"b: {lies} sample(s) came with rewards that differ") for r in res.rejections)


def test_group_with_foreign_prompt_tokens_is_rejected_and_counted(cache):
    _, a, b = _nodes(cache)
    gb = b.step(StepRequest(0, 3, [0, 1], 4, False)).groups
    bad = dataclasses.replace(gb[0], prompt_tokens=gb[1].prompt_tokens)
    unknown = dataclasses.replace(gb[1], prompt_id="test:0")  # an evaluation problem
    res = a.step(StepRequest(1, 3, [], 4, False, foreign=[Received("b", [bad, unknown], [0, 1])]))
    assert res.metrics["b/groups_rejected"] == 2 and res.metrics["b/samples_rejected"] == 8
    assert "samples" not in res.metrics  # nothing usable, nothing trained, nothing silently dropped
    assert len(res.rejections) == 2
    assert "prompt tokens differ" in res.rejections[0] and "not assigned to b" in res.rejections[1]


def test_provenance_comes_from_the_stamp_not_the_label(cache):
    _, a, b = _nodes(cache)
    gb = b.step(StepRequest(0, 3, [0, 1], 4, False)).groups
    as_own = [dataclasses.replace(g, node="a") for g in gb]  # b passes its groups off as a's own
    res = a.step(StepRequest(1, 3, [], 4, False, foreign=[Received("b", as_own, [0, 1]),
                                                         Received("a", gb, [0, 1])]))
    m = res.metrics
    assert m["b/groups_rejected"] == 2 and m["b/samples_rejected"] == 8
    assert m["a/groups_rejected"] == 2 and m["a/samples_rejected"] == 8
    assert "samples" not in m
    assert any("labelled as made by 'a', but the server received it from 'b'" in r for r in res.rejections)
    assert any("this node's own name" in r for r in res.rejections)


def test_alone_ignores_foreign_groups_and_says_so(cache):
    _, a, b = _nodes(cache, **{"advantage.mode": "alone"})
    a.step(StepRequest(0, 3, [0], 4, False))
    gb = b.step(StepRequest(0, 3, [1], 4, False)).groups
    m = a.step(StepRequest(1, 3, [], 4, False, foreign=[Received("b", gb, [1])])).metrics
    assert m["samples_foreign"] == 0 and m["foreign_ignored_alone"] == 4


def _crafted(node, index, answers, name):
    """A group whose completions are the given answer strings (rewards follow from the text)."""
    from ftis_flwr.wire.groups import Group

    problem = node.task.train_problem(index)
    comps = [np.asarray(node.tokenizer(t, add_special_tokens=False)["input_ids"] + [node.tokenizer.eos_token_id])
             for t in answers]
    return Group(prompt_id=problem.id, prompt_tokens=node._prompt_tokens(problem), completions=comps,
                 logprobs=[np.full(len(c), -0.5, dtype=np.float32) for c in comps],
                 rewards=np.zeros(len(comps), dtype=np.float32), node=name,
                 model_id=f"{name}:crafted", tokenizer_fp=node.fingerprint)


def test_horizontal_pools_the_same_prompt_across_nodes(cache):
    _, a, b = _nodes(cache, **{"advantage.mode": "horizontal"})
    ga = a.step(StepRequest(0, 3, [0, 1], 2, False)).groups
    gb = b.step(StepRequest(0, 3, [0, 1], 2, False)).groups
    assert [g.prompt_id for g in ga] == [g.prompt_id for g in gb]  # same prompts, G/m each
    # prompt 0: a right twice, b wrong twice -> only the pooled group has reward variance
    gold0 = a.task.train_problem(0).gold
    a.pending = [_crafted(a, 0, [gold0, gold0], "a"), _crafted(a, 1, ["x", "y"], "a")]
    foreign = [_crafted(a, 0, ["x", "y"], "b"), _crafted(a, 1, ["x", "y"], "b")]
    m = a.step(StepRequest(1, 3, [], 2, False, foreign=[Received("b", foreign, [0, 1])])).metrics
    assert m["samples"] == 8
    assert m["frac_zero_std_groups"] == pytest.approx(0.5)  # unpooled it would be 1.0
    assert m["positive_advantage"] == 2 and m["negative_advantage"] == 2


def test_vertical_does_not_pool_across_nodes(cache):
    _, a, _ = _nodes(cache)
    gold0 = a.task.train_problem(0).gold
    a.pending = [_crafted(a, 0, [gold0, gold0], "a")]
    foreign = [Received("b", [_crafted(a, 0, ["x", "y"], "b")], [0])]
    m = a.step(StepRequest(1, 3, [], 4, False, foreign=foreign)).metrics
    assert m["frac_zero_std_groups"] == 1.0 and m["zero_advantage"] == 4


def test_the_filter_drops_a_far_off_policy_foreign_group(cache):
    """A sampler that claimed its tokens had log-prob -200: KL ~ 200 > g, so the wrong answers go."""
    _, a, _ = _nodes(cache)
    gold = a.task.train_problem(0).gold
    far = _crafted(a, 0, [gold, "x", "y", "z"], "b")
    far.logprobs = [np.full(len(c), -200.0, dtype=np.float32) for c in far.completions]
    m = a.step(StepRequest(1, 3, [], 4, False, foreign=[Received("b", [far], [0])])).metrics
    assert m["negative_advantage"] == 3 and m["kl_mean_foreign"] > a.cfg.loss.kl_threshold
    assert m["filtered_kl"] == 3 and m["filtered"] == 3 and m["b/filtered_kl"] == 3
    assert m["samples_effective"] == 1  # only the right answer still pushes the update


def _own_and_foreign(a, b):
    """a's own groups (pending, sampled) and b's, one of them right and wrong in turn."""
    a.step(StepRequest(0, 3, [0, 1], 4, False))
    gb = b.step(StepRequest(0, 3, [2, 3], 4, False)).groups
    gold = a.task.train_problem(2).gold
    gb[0] = _crafted(a, 2, [gold, "x", gold, "y"], "b")
    return list(a.pending) + gb


def test_several_updates_take_the_ratio_against_the_round_start(cache):
    """updates_per_round=2: the first step has ratio 1 (tis never clips there); the second takes
    its ratio against the first step's log-probs, so a large step makes the clip bind."""
    _, a, b = _nodes(cache, **{"train.updates_per_round": 2, "train.lr": 3e-2, "loss.method": "tis"})
    m = a.train(_own_and_foreign(a, b), 1, 3)
    assert m["clip_frac"] == 0.0  # pi_theta == pi_old on the first step
    assert m["clip_frac_last"] > 0.0, m
    assert m["kl_mean_own"] < 1e-4 and m["own_logprob_gap_max"] < 1e-5  # first-step metrics
    assert m["updates"] == 1 and "loss_last" in m and "grad_norm_last" in m


def test_one_update_per_round_is_the_plain_micro_batched_step(cache):
    """updates_per_round=1 (the default) is unchanged: no pi_old is passed, and the node's step is
    bit-for-bit a plain loop of compute_loss + backward over micro-batches. Its metrics are those
    of one compute_loss over the whole batch (computed once, from the micro-batches' stats)."""
    exp, a, b = _nodes(cache, **{"train.micro_batch_size": 5})
    ref = Node(exp.nodes[0], exp, cache_dir=cache)
    groups = _own_and_foreign(a, b)
    m = a.train(groups, 1, 3)
    assert "clip_frac_last" not in m and "loss_last" not in m

    samples = ref._samples(groups, [ref._rewards(g) for g in groups])
    cfg = dataclasses.replace(exp.loss, kl_threshold=g_for_round(ref.card.g, exp.loss.kl_threshold, 1, 3))
    ref.model.train()
    ref.optimizer.zero_grad(set_to_none=True)
    denominator, parts = 0.0, []
    for start in range(0, len(samples), 5):  # several micro-batches of different widths
        inputs = ref._loss_inputs(samples[start:start + 5])
        out = compute_loss(inputs, cfg)
        out.loss_sum.backward()
        denominator += out.denominator
        parts.append(dataclasses.replace(inputs, logprobs=inputs.logprobs.detach()))
    for p in ref.params:
        p.grad.div_(denominator)
    torch.nn.utils.clip_grad_norm_(ref.params, exp.train.grad_clip)
    ref.optimizer.step()
    assert all(torch.equal(p, q) for p, q in zip(a.params, ref.params))
    whole = compute_loss(_concat(parts), cfg).metrics
    assert len(parts) > 1 and m["samples"] == len(samples) == 16
    assert {k: m[k] for k in whole} == pytest.approx(whole, rel=1e-6, abs=0)
    rest = {k: v for k, v in whole.items() if k != "loss"}  # loss: float32 sums in another order
    assert {k: m[k] for k in rest} == pytest.approx(rest, rel=1e-12, abs=0)


def _concat(parts):
    """One LossInputs of the micro-batches, right-padded to one width."""
    width = max(p.logprobs.shape[1] for p in parts)

    def pad(t, value=0):
        return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value)

    return LossInputs(torch.cat([pad(p.logprobs) for p in parts]),
                      torch.cat([pad(p.gen_logprobs) for p in parts]),
                      torch.cat([p.advantages for p in parts]),
                      torch.cat([pad(p.mask, False) for p in parts]),
                      torch.cat([p.foreign for p in parts]),
                      [s for p in parts for s in p.sources])


def test_an_engine_that_sleeps_is_released_before_the_update_and_synced_after(cache):
    """A vLLM engine on a GPU frees its memory for the learner's update (``release_memory``) and
    wakes with the new weights (``sync_weights``). vLLM's sleep mode is CUDA's: the node's real HF
    engine stands in, wrapped to record what the node calls and whether the weights had changed."""
    _, a, _ = _nodes(cache)
    calls = []

    class Sleeping:
        def __init__(self, engine):
            self.engine, self.before = engine, None

        def __getattr__(self, name):
            return getattr(self.engine, name)

        def release_memory(self):
            self.before = _params(a)
            calls.append("release")

        def sync_weights(self, model):
            moved = any(not torch.equal(p, q) for p, q in zip(self.before, a.params))
            calls.append(("sync", model is a.engine_model, moved))
            return 0.25

    a.engine = Sleeping(a.engine)
    own = a.step(StepRequest(0, 3, [0, 1], 4, False)).groups
    own[0] = _crafted(a, 0, [a.task.train_problem(0).gold, "x", "y", "z"], "a")
    a.pending = own
    m = a.step(StepRequest(1, 3, [2, 3], 4, False)).metrics
    assert calls == ["release", ("sync", True, True)]
    assert m["seconds_engine_sync"] == 0.25
