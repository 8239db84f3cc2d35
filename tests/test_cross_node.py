"""A Node on the cross-tokenizer (text) path, without Flower: senders put texts on the wire, a
receiver aligns them with its own tokens and trains at chunk level (algorithm §4).

The anchor: between identical char-level tokenizers, ``exchange.cross_tokenizer=always`` (every
foreign sample through its text) trains exactly as the token path does (same parameters after
the step, same metrics); with ``loss.cross_tokenizer_ratio=word`` it does so when every word of
the texts is one token."""

import numpy as np
import pytest
import torch
from test_node import YAML  # the same two tiny nodes

from ftis_flwr.experiment import load_experiment
from ftis_flwr.node.node import Node, Received, StepRequest
from ftis_flwr.server.roster import FederationError
from ftis_flwr.server.strategy import FTISStrategy
from ftis_flwr.wire.rollouts import decode_groups, encode_groups


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("xnode-cache")


def _node(cache, name="a", **overrides):
    exp = load_experiment(yaml_text=YAML, overrides={"cache_dir": str(cache), **overrides})
    return Node(next(c for c in exp.nodes if c.name == name), exp, cache_dir=cache)


def _wire(groups, receiver):
    """Groups through the compact wire and back, as the receiver's worker decodes them."""
    arrays, meta = encode_groups(groups, vocab_size=receiver.vocab_size)
    return decode_groups(arrays, meta, expected_fp=receiver.fingerprint, vocab_size=receiver.vocab_size,
                         wire=receiver.cfg.wire, cross_tokenizer=receiver.cfg.exchange.cross_tokenizer)


def test_senders_put_texts_that_tile_their_tokens_on_the_wire(cache):
    b = _node(cache, "b")
    res = b.step(StepRequest(0, 3, [0, 1, 2], 4, False, send_text=True))
    assert res.metrics["groups_unsent_no_text"] == 0 and len(res.groups) == 3
    for g in res.groups:
        for ids, text, lengths in zip(g.completions, g.texts, g.byte_lengths):
            assert len(lengths) == len(ids) and int(lengths.sum()) == len(text)
            ended = int(ids[-1]) in b.stop_ids
            assert (lengths[-1] == 0) == ended  # the end of the turn covers no text
            assert text.decode() == b.tokenizer.decode(ids, skip_special_tokens=True)
    plain = _node(cache, "b").step(StepRequest(0, 3, [0, 1, 2], 4, False)).groups
    assert all(g.texts is None for g in plain)  # no text unless the server asks for it
    arrays, _ = encode_groups(res.groups, vocab_size=b.vocab_size)
    arrays0, _ = encode_groups(plain, vocab_size=b.vocab_size)
    assert len(arrays["wire"].data) > len(arrays0["wire"].data)


def test_always_trains_exactly_as_the_token_path_between_equal_tokenizers(cache):
    sender = _node(cache, "b")
    gb = sender.step(StepRequest(0, 3, [2, 3], 4, False, send_text=True)).groups
    after, metrics = {}, {}
    for mode in ("auto", "always"):
        a = _node(cache, "a", **{"exchange.cross_tokenizer": mode})
        a.step(StepRequest(0, 3, [0, 1], 4, False))
        foreign = [Received("b", _wire(gb, a), [2, 3])]
        metrics[mode] = a.step(StepRequest(1, 3, [], 4, False, foreign=foreign)).metrics
        after[mode] = [p.detach().clone() for p in a.params]
    m, ref = metrics["always"], metrics["auto"]
    assert m["b/xtok_chunks_per_token"] == 1.0 and m["b/xtok_multi_token_share"] == 0.0
    assert "b/xtok_tokens" not in ref  # auto between equal tokenizers: the token path
    for p, q in zip(after["auto"], after["always"]):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-7)
    shared = [k for k in ref if k in m and not k.startswith("seconds") and "seconds" not in k]
    assert {k: m[k] for k in shared} == pytest.approx({k: ref[k] for k in shared}, rel=1e-6, abs=1e-7)


def _text_group(node, index, answers, name, seed):
    """A group of ``node``'s char-level tokens whose completions are ``answers``, each ended by the
    end-of-turn token, with texts and byte lengths as a sender sends them, and log-probs near 0 (so
    no weight reaches C and every weight counts)."""
    from ftis_flwr.wire.groups import Group

    problem, rng = node.task.train_problem(index), np.random.default_rng(seed)
    comps = [np.asarray(node.tokenizer(t, add_special_tokens=False)["input_ids"] + [node.stop_ids[0]]) for t in answers]
    return Group(prompt_id=problem.id, prompt_tokens=node._prompt_tokens(problem), completions=comps,
                 logprobs=[(-0.02 - 0.3 * rng.random(len(c))).astype(np.float32) for c in comps],
                 rewards=np.zeros(len(comps), np.float32), node=name, model_id=f"{name}:crafted",
                 tokenizer_fp=node.fingerprint, texts=[t.encode() for t in answers],
                 byte_lengths=[np.append(np.ones(len(c) - 1, np.int64), 0) for c in comps])


@pytest.mark.parametrize("words_of_one_token", [True, False])
def test_word_ratio_trains_as_the_token_path_when_every_word_is_one_token(cache, words_of_one_token):
    """``loss.cross_tokenizer_ratio=word`` between identical char-level tokenizers: on answers whose
    every word is one character it is the token path (same parameters to 1e-7); on multi-digit
    answers it merges each digit run into one chunk, and the update differs."""
    sender = _node(cache, "b")
    if words_of_one_token:  # golds "9" and "1" (problems 1 and 5); "3+4", "a b": one character a word
        indices, answers = [1, 5], [["9", "x", "9", "3+4"], ["1", "a b", "1", "7"]]
    else:  # golds "65" and "32" (problems 0 and 2)
        indices, answers = [0, 2], [["65", "x", "65", "12"], ["32", "ab", "32", "7+45"]]
    assert [sender.task.train_problem(i).gold for i in indices] == [a[0] for a in answers]
    gb = [_text_group(sender, i, a, "b", seed=i) for i, a in zip(indices, answers)]
    after, metrics = {}, {}
    for mode in ("auto", "always"):
        a = _node(cache, "a", **{"exchange.cross_tokenizer": mode, "loss.cross_tokenizer_ratio": "word"})
        a.step(StepRequest(0, 3, [3, 4], 4, False))
        metrics[mode] = a.step(StepRequest(1, 3, [], 4, False, foreign=[Received("b", _wire(gb, a), indices)])).metrics
        after[mode] = [p.detach().clone() for p in a.params]
    m, ref = metrics["always"], metrics["auto"]
    assert m["b/samples"] == 8 and "b/xtok_tokens" not in ref and "b/xtok_word_merged_share" not in ref
    diff = max(float((p - q).abs().max()) for p, q in zip(after["auto"], after["always"]))
    if words_of_one_token:
        assert m["b/xtok_word_merged_share"] == 0.0 and m["b/xtok_chunks_per_token"] == 1.0
        assert diff <= 1e-7
        shared = [k for k in ref if k in m and "seconds" not in k]
        assert {k: m[k] for k in shared} == pytest.approx({k: ref[k] for k in shared}, rel=1e-6, abs=1e-7)
    else:  # 17 one-character chunks and 8 end-of-turn ones; 10 words and the 8
        assert m["b/xtok_word_merged_share"] == pytest.approx(1 - 18 / 25)
        assert diff > 1e-5


def test_a_group_without_texts_is_refused_on_the_text_path_and_counted(cache):
    sender = _node(cache, "b")
    gb = sender.step(StepRequest(0, 3, [2, 3], 4, False)).groups  # no texts asked for
    a = _node(cache, "a", **{"exchange.cross_tokenizer": "always"})
    a.step(StepRequest(0, 3, [0], 4, False))
    res = a.step(StepRequest(1, 3, [], 4, False, foreign=[Received("b", _wire(gb, a), [2, 3])]))
    assert res.metrics["b/groups_rejected"] == 2 and res.metrics["b/samples_rejected"] == 8
    assert any("carries no completion texts" in r for r in res.rejections)


def test_sequence_ratio_is_one_ratio_of_means_per_completion(cache):
    sender = _node(cache, "b")
    gb = sender.step(StepRequest(0, 3, [2, 3], 4, False, send_text=True)).groups
    a = _node(cache, "a", **{"exchange.cross_tokenizer": "always", "loss.cross_tokenizer_ratio": "sequence"})
    a.step(StepRequest(0, 3, [0], 4, False))
    received = _wire(gb, a)  # the sender's log-probs as the wire carries them (fp16)
    got = a._usable([Received("b", received, [2, 3])], {}, [])
    samples = a._samples(got, [a._rewards(g) for g in got])
    inputs = a._loss_inputs(samples)
    lp, gen, mask = inputs.logprobs.detach(), inputs.gen_logprobs, inputs.mask
    for i, (_, comp, _sender_lp, *_rest) in enumerate(samples):
        n = len(comp)
        assert torch.all(inputs.chunks[i, :n] == 0)  # one chunk per completion
        want = lp[i, :n].mean() - float(np.mean(received[i // 4].logprobs[i % 4]))
        assert float((lp[i, :n] - gen[i, :n]).sum()) == pytest.approx(float(want), abs=1e-4)
        assert mask[i, :n].all()


def test_the_server_asks_for_texts_only_while_a_peer_needs_them():
    exp = load_experiment(yaml_text=YAML)
    s = FTISStrategy(exp)
    assert s.peers.send_text("a") and s.peers.send_text("b")  # nothing known yet (round 0)
    s.peers.fingerprints.update(a="f1")
    assert s.peers.send_text("a") and s.peers.send_text("b")  # b's tokenizer still unknown
    s.peers.fingerprints.update(b="f1")
    assert not s.peers.send_text("a") and not s.peers.send_text("b")  # equal tokenizers: the token path
    s.peers.fingerprints.update(b="f2")
    assert s.peers.send_text("a") and s.peers.send_text("b")
    s.peers.check()  # auto: different tokenizers are fine
    for mode, want in (("always", True), ("off", False)):
        exp_mode = load_experiment(yaml_text=YAML, overrides={"exchange.cross_tokenizer": mode})
        assert FTISStrategy(exp_mode).peers.send_text("a") is want
    alone = load_experiment(yaml_text=YAML, overrides={"advantage.mode": "alone"})
    assert not FTISStrategy(alone).peers.send_text("a")


def test_off_names_both_cards_and_their_tokenizers():
    s = FTISStrategy(load_experiment(yaml_text=YAML, overrides={"exchange.cross_tokenizer": "off"}))
    s.peers.fingerprints.update(a="f1", b="f1")
    s.peers.check()
    s.peers.fingerprints.update(b="f2")
    with pytest.raises(FederationError, match=r"a \(tokenizer f1\); b \(tokenizer f2\).*'auto'"):
        s.peers.check()


def test_a_card_whose_tokenizer_cannot_be_aligned_stops_a_mixed_run_before_round_one():
    from transformers import ByT5Tokenizer  # a real Python-backend tokenizer: no offsets

    from ftis_flwr.xtok.align import alignment_fault

    assert "ByT5Tokenizer is not a fast tokenizer" in alignment_fault(ByT5Tokenizer())
    s = FTISStrategy(load_experiment(yaml_text=YAML))
    s.peers.fingerprints.update(a="f1", b="f1")
    s.peers.align_faults.update(a="", b=alignment_fault(ByT5Tokenizer()))
    s.peers.check()  # one tokenizer: nothing to align
    s.peers.fingerprints.update(b="f2")
    with pytest.raises(FederationError, match=r"card 'b'.s tokenizer cannot be aligned.*not a fast tokenizer"):
        s.peers.check()
