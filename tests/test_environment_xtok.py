"""Episodes across tokenizers (issue #57, algorithm §4 and §13): a peer of another tokenizer replays
an episode from its text, rebuilt in its own tokens (ftis_flwr/node/replay_text.py), and trains on the
sender's sampled turns only, aligned byte for byte; an altered tool observation is refused.

The pair: cpu-xtok-calc's (shipped): cpu-pair-calc's small model (character tokenizer) sends; a small
model on the byte-level BPE tokenizer receives; both tool-warm-started, so both call the calculator.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from ftis_flwr.experiment import load_experiment
from ftis_flwr.node.node import Node, Received, StepRequest
from ftis_flwr.wire.groups import span_ends
from ftis_flwr.wire.rollouts import decode_groups, encode_groups

YAML = """
task: {name: arithmetic-chain, environment: "ftis_flwr.tasks.calculator:Calculator", max_turns: 3}
rollout: {group_size: 8, temperature: 1.0, max_new_tokens: 16}
train: {lr: 2e-4, micro_batch_size: 64}
rounds: {num_rounds: 2, prompts_per_node: 4, eval_size: 16}
exchange: {cross_tokenizer: auto}
nodes:
  - {name: small, tiny_size: small, warmstart_target: 0.6, warmstart_tools: 0.5, seed: 0}
  - {name: bpe, tiny_size: small, tiny_tokenizer: bpe, warmstart_target: 0.6, warmstart_tools: 0.5, seed: 2}
"""


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("env-xtok")
    exp = load_experiment(yaml_text=YAML, overrides={"cache_dir": str(tmp / "cache")})
    return [Node(card, exp, cache_dir=tmp / "cache") for card in exp.nodes]


@pytest.fixture(scope="module")
def sent(pair):
    """The character model's first round, with its episodes' texts (what a BPE peer receives)."""
    small, _ = pair
    res = small.step(StepRequest(0, 2, [0, 1, 2, 3], 8, False, send_text=True))
    assert len(res.groups) == 4 and all(g.texts is not None for g in res.groups)
    return res.groups


def test_an_episodes_text_covers_its_model_and_tool_turns_and_crosses_the_wire(pair, sent):
    small, bpe = pair
    g = next(g for g in sent if any((m == 0).any() for m in g.sampled_masks))
    i = next(k for k, m in enumerate(g.sampled_masks) if (m == 0).any())
    text, lengths, mask = bytes(g.texts[i]), g.byte_lengths[i], g.sampled_masks[i]
    assert text == small.tokenizer.decode(g.completions[i], skip_special_tokens=True).encode()
    assert (lengths[span_ends(mask)] <= 1).all() and (lengths[~span_ends(mask)] >= 1).all()
    assert text.startswith(b"#calc(") and b"\n" in text  # a call, then the tool's turn "=<value>\n"
    arrays, meta = encode_groups(sent, vocab_size=small.vocab_size)
    back = decode_groups(arrays, meta, vocab_size=small.vocab_size, expected_fp=bpe.fingerprint, wire=bpe.cfg.wire,
                         cross_tokenizer="auto")
    assert [bytes(t) for t in back[0].texts] == [bytes(t) for t in sent[0].texts]
    assert all(np.array_equal(a, b) for a, b in zip(back[0].sampled_masks, sent[0].sampled_masks))


def test_a_peer_of_another_tokenizer_replays_and_trains_on_the_sampled_turns(pair, sent):
    _, bpe = pair
    own = bpe.step(StepRequest(0, 2, [4, 5, 6, 7], 8, False))  # its own episodes, with tool turns, train beside
    assert any((m == 0).any() for g in own.groups for m in g.sampled_masks)
    before = [p.detach().clone() for p in bpe.params]
    res = bpe.step(StepRequest(1, 2, [], 8, False, foreign=[Received("small", sent, [0, 1, 2, 3])]))
    m = res.metrics
    assert m["small/env_replayed"] == 32 and "small/env_replay_refused" not in m, res.rejections
    assert m["samples_foreign"] == 32 and m["samples_own"] == 32 and m["small/text_samples"] == 32
    assert any(not torch.equal(p, q) for p, q in zip(before, bpe.params)), "the update left the node unchanged"
    # the rewards are the receiver's: the task's, over each episode's final answer in its own replay
    assert m["train_reward_foreign"] == pytest.approx(float(np.mean([g.rewards for g in sent])))


def test_the_rebuilt_episode_is_the_receivers_tokens_with_the_senders_turns_aligned(pair, sent):
    from ftis_flwr.node.replay_text import replay_text_group

    _, bpe = pair
    g = next(g for g in sent if any((m == 0).any() for m in g.sampled_masks))
    own = replay_text_group(bpe, g, bpe.task.problem(g.prompt_id))
    for i, (ids, mask, chunks, gen) in enumerate(zip(own.completions, own.sampled_masks, own.chunks, own.logprobs)):
        sampled = mask == 1
        assert bpe.tokenizer.decode(ids, skip_special_tokens=True) == bytes(g.texts[i]).decode()
        counts = np.diff(chunks[sampled])
        assert chunks[sampled][0] == 0 and set(counts.tolist()) <= {0, 1}  # chunks 0, 1, ... over the sampled tokens
        assert (gen[~sampled] == 0).all()
        # per chunk, the sender's log-probs summed: the totals over the sampled turns agree
        sender = g.logprobs[i][g.sampled_masks[i] == 1].sum()
        assert gen[sampled].sum() == pytest.approx(float(sender), abs=1e-4)
    assert np.array_equal(own.replayed_rewards, g.rewards)  # the same task reward, replayed here


def test_an_altered_tool_observation_is_refused_across_tokenizers(pair, sent):
    _, bpe = pair
    gi = next(k for k, g in enumerate(sent) if any((m == 0).any() for m in g.sampled_masks))
    g = sent[gi]
    j = next(k for k, m in enumerate(g.sampled_masks) if (m == 0).any())
    text = bytearray(g.texts[j])
    at = text.index(b"\n=") + 2 if b"\n=" in text else text.index(b"=") + 1  # the first digit the tool returned
    text[at] = ord("9") if text[at] != ord("9") else ord("8")
    texts = list(g.texts)
    texts[j] = bytes(text)
    forged = dataclasses.replace(g, texts=texts)
    res = bpe.step(StepRequest(2, 2, [], 8, False, foreign=[Received("small", [forged], [0, 1, 2, 3])]))
    assert res.metrics["small/env_replay_refused"] == 8
    assert any(f"episode {j}: the tool turn after turn 1 is not this node's text" in r for r in res.rejections), \
        res.rejections



def test_the_other_way_the_character_model_replays_the_bpe_models_episodes(pair):
    """Both directions keep each other's episodes (cpu-xtok-calc: the BPE model's text, in the
    character model's tokens); what a Flower run of the preset shows is on docs/your-own-environment.md."""
    small, bpe = pair
    sent = bpe.step(StepRequest(3, 4, [8, 9, 10, 11], 8, False, send_text=True)).groups
    assert sent and all(g.texts is not None for g in sent)
    res = small.step(StepRequest(1, 4, [], 8, False, foreign=[Received("bpe", sent, [8, 9, 10, 11])]))
    m = res.metrics
    kept = m.get("bpe/env_replayed", 0)
    assert kept + m.get("bpe/env_replay_refused", 0) == 8 * len(sent) and kept >= 8 * (len(sent) - 1), res.rejections
    assert m["samples_foreign"] == kept


CHAT = ("{% if tools %}tools:{% for t in tools %} {{ t.function.name }}{% endfor %};{% endif %}"
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}<eos>\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}")
"""A chat template with tool turns of its own (``<tool>46<eos>`` and the next assistant header),
unlike the character sender's plain ``=46`` lines."""


@pytest.fixture(scope="module")
def templated(pair, tmp_path_factory):
    """A BPE receiver whose tokenizer carries a chat template (as a real model family's does): its
    prompts and tool turns are the template's, its tool-call format stays ``tiny``."""
    import copy

    from ftis_flwr.node.turns import tool_turn_layout

    _, bpe = pair
    node = Node(bpe.card, bpe.cfg, cache_dir=tmp_path_factory.getbasetemp() / "env-xtok0" / "cache")
    node.tokenizer = copy.deepcopy(node.tokenizer)
    node.tokenizer.chat_template = CHAT
    node.env.layout = tool_turn_layout(node.tokenizer, node.stop_ids).wire()
    assert node.env.format.name == "tiny" and node.env.layout != bpe.env.layout
    return node


def test_a_peer_of_another_chat_template_checks_tool_turns_against_the_senders_layout(templated, sent):
    """The sender writes tool turns as ``=46`` lines, the receiver's template as ``<tool>46<eos>``:
    the receiver checks each sent tool turn against the sender's layout of its own replayed results,
    continues the episode with its own template's tool turn, and trains on the sender's turns."""
    from ftis_flwr.node.replay_text import replay_text_group

    assert {(g.tool_format, g.tool_layout) for g in sent} == {("tiny", '["=", "\\n=", "\\n"]')}
    g = next(g for g in sent if any((m == 0).any() for m in g.sampled_masks))
    own = replay_text_group(templated, g, templated.task.problem(g.prompt_id))
    i = next(k for k, m in enumerate(g.sampled_masks) if (m == 0).any())
    ids, mask = own.completions[i], own.sampled_masks[i]
    context = templated.tokenizer.decode(ids[mask == 0].tolist(), skip_special_tokens=False)
    assert context.startswith("\n<tool>") and "<assistant>" in context and "=" not in context
    sampled_bytes = np.repeat(g.sampled_masks[i], g.byte_lengths[i]) == 1
    said = np.frombuffer(bytes(g.texts[i]), np.uint8)[sampled_bytes].tobytes()  # the sender's turns' bytes
    assert templated.tokenizer.decode(ids[mask == 1].tolist(), skip_special_tokens=True).encode() == said
    assert np.array_equal(own.replayed_rewards, g.rewards)
    before = [p.detach().clone() for p in templated.params]
    res = templated.step(StepRequest(0, 2, [], 8, False, foreign=[Received("small", sent, [0, 1, 2, 3])]))
    assert res.metrics["small/env_replayed"] == 32 and "small/env_replay_refused" not in res.metrics, res.rejections
    assert any(not torch.equal(p, q) for p, q in zip(before, templated.params))


@pytest.mark.parametrize("edit, reason", [
    ("observation", "the tool turn after turn 1 is not the sender's layout of what its replayed calls returned"),
    ("layout", "the tool turn after turn 1 is not the sender's layout"),
    ("format", "its model writes tool calls in the 'hermes' format and this node's in 'tiny'"),
    ("no layout", "the tool turn after turn 1 is not this node's text"),
])
def test_a_peer_of_another_template_refuses_what_its_layout_does_not_account_for(templated, sent, edit, reason):
    """An altered observation, a layout that is not what the sender wrote, calls in another format,
    or no layout at all (a template that writes tool names): the group is refused, with the reason."""
    g = next(g for g in sent if any((m == 0).any() for m in g.sampled_masks))
    j = next(k for k, m in enumerate(g.sampled_masks) if (m == 0).any())
    if edit == "observation":
        text = bytearray(g.texts[j])
        at = text.index(b"=") + 1  # the first character the tool returned
        text[at] = ord("9") if text[at] != ord("9") else ord("8")
        forged = dataclasses.replace(g, texts=[bytes(text) if k == j else t for k, t in enumerate(g.texts)])
    else:
        forged = dataclasses.replace(g, **{"layout": {"tool_layout": '["=", "\\n=", "\\n\\n"]'},
                                          "format": {"tool_format": "hermes"},
                                          "no layout": {"tool_layout": "null"}}[edit])
    res = templated.step(StepRequest(1, 2, [], 8, False, foreign=[Received("small", [forged], [0, 1, 2, 3])]))
    assert res.metrics["small/env_replay_refused"] == 8
    assert any(reason in r for r in res.rejections), res.rejections
