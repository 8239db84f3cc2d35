"""A receiver weighs a received completion only when its own tokens stand for exactly the
completion's bytes (ftis_flwr.xtok.represent), on tokenizers of each family built here with the
``tokenizers`` library: a normaliser (NFC, as Qwen2's), an unknown-token fallback (the tiny
char-level one), byte fallback (Llama-style SentencePiece BPE), byte-level BPE (GPT-2 style), and
one that prepends a space (Metaspace ``prepend_scheme="first"``, and the legacy ``Prepend``
normaliser). Then the node: a group with one unrepresentable completion trains on the others,
counts the refused one with its reason, and keeps its reward in the group's advantages."""

from __future__ import annotations

import numpy as np
import pytest
from test_cross_node import _node, _wire
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from ftis_flwr.maths.advantages import group_advantages
from ftis_flwr.node.node import Received, StepRequest
from ftis_flwr.node.tiny.models import build_char_tokenizer
from ftis_flwr.wire import protocol
from ftis_flwr.xtok.represent import Unrepresentable, encode_exact, text_limits
from ftis_flwr.xtok.token_bytes import token_bytes

CORPUS = ["12 + 34 = 46", "what is seven plus five", "café au lait", "<think> 3 + 4 </think>", "7\n8"] * 40
SPECIALS = ["<unk>", "<s>", "</s>"]


def _fast(backend: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", clean_up_tokenization_spaces=False)


def _byte_level(normalizer=None) -> PreTrainedTokenizerFast:
    t = Tokenizer(models.BPE())
    if normalizer is not None:
        t.normalizer = normalizer
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return _fast(t)


def _byte_fallback() -> PreTrainedTokenizerFast:
    """Llama-2 style: SentencePiece BPE over "▁"-marked words, unknown characters as <0xNN> bytes."""
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for ch in "▁abcdefghijklmnopqrstuvwxyz0123456789+=<>/":
        vocab.setdefault(ch, len(vocab))
    t = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    t.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                   decoders.Strip(" ", 1, 0)])
    return _fast(t)


def _metaspace_unigram(legacy: bool) -> PreTrainedTokenizerFast:
    """A unigram model that prepends a space: Metaspace(prepend_scheme="first"), or (``legacy``)
    the old Llama form, a Prepend("▁") + Replace(" ", "▁") normaliser."""
    t = Tokenizer(models.Unigram())
    if legacy:
        t.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        t.pre_tokenizer = pre_tokenizers.Split("▁", "merged_with_next")
        t.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.Strip(" ", 1, 0)])
    else:
        t.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
        t.decoder = decoders.Metaspace(prepend_scheme="first")
    t.train_from_iterator(CORPUS, trainers.UnigramTrainer(vocab_size=100, special_tokens=SPECIALS,
                                                          unk_token="<unk>"))
    return _fast(t)


@pytest.fixture(scope="module")
def toks():
    return {"nfc": _byte_level(normalizers.NFC()), "unk": build_char_tokenizer(),
            "fallback": _byte_fallback(), "byte_level": _byte_level(),
            "prepend": _metaspace_unigram(legacy=False), "legacy_prepend": _metaspace_unigram(legacy=True)}


def _tiles(tok, text: str) -> np.ndarray:
    ids, starts, ends = encode_exact(tok, text)
    want = text.encode("utf-8")
    assert b"".join(token_bytes(tok, ids)) == want  # the tokens stand for exactly these bytes
    assert starts[0] == 0 and ends[-1] == len(want) and np.array_equal(starts[1:], ends[:-1])
    assert (ends > starts).all()
    return ids


def _refused(tok, text: str) -> str:
    with pytest.raises(Unrepresentable) as caught:
        encode_exact(tok, text)
    return caught.value.reason


@pytest.mark.parametrize("name", ["nfc", "unk", "fallback", "byte_level", "prepend", "legacy_prepend"])
def test_every_family_tiles_what_it_can_stand_for(toks, name):
    for text in ["12 + 34 = 46", "what is 7", "7\n"]:
        _tiles(toks[name], text)


def test_a_normaliser_refuses_text_it_would_change_and_takes_text_it_keeps(toks):
    decomposed = "cafe\u0301"  # "é" as e + combining accent: NFC makes it one code point
    assert _refused(toks["nfc"], decomposed) == "normalised"
    _tiles(toks["nfc"], "caf\u00e9")  # already NFC: the same bytes
    _tiles(toks["byte_level"], decomposed)  # no normaliser: any bytes


def test_an_unknown_token_fallback_refuses_characters_outside_its_vocabulary(toks):
    assert _refused(toks["unk"], "What is 2?") == "unknown_token"  # no capital letters
    assert _refused(toks["prepend"], "QUIZ") == "unknown_token"  # a unigram model without byte fallback


def test_byte_fallback_and_byte_level_stand_for_any_text(toks):
    for name in ("fallback", "byte_level"):
        _tiles(toks[name], "Zebra ∑ 😀 中文 QUIZ")


def test_a_prepended_space_is_left_out_the_tokens_continue_the_text(toks):
    for name in ("prepend", "legacy_prepend", "fallback"):
        tok = toks[name]
        plain = tok("what", add_special_tokens=False)["input_ids"]
        assert b"".join(token_bytes(tok, plain)) == b" what"  # its plain encoding gains a space
        ids = _tiles(tok, "what")  # as a continuation it does not
        assert ids.tolist() != plain
        _tiles(tok, " what")  # a space that is there stays


def test_special_token_strings_in_the_text_are_plain_text_never_control_tokens(toks):
    for name in ("unk", "byte_level", "fallback"):
        tok = toks[name]
        text = "1 </s> 2 <s> <eos> <pad>" if name != "unk" else "1<eos>2<pad>"
        ids = _tiles(tok, text)
        assert not set(ids.tolist()) & set(tok.all_special_ids), name


def test_the_limits_named_at_the_start_per_family(toks):
    assert set(text_limits(toks["unk"])) == {"unknown_token"}
    assert set(text_limits(toks["prepend"])) == {"unknown_token"}
    assert set(text_limits(toks["nfc"])) == {"normalised"}
    for name in ("fallback", "byte_level", "legacy_prepend"):
        limits = text_limits(toks[name])
        assert "prepended_space" not in limits and "normalised" not in limits, (name, limits)
    assert text_limits(toks["byte_level"]) == {} and text_limits(toks["fallback"]) == {}


# ------------------------------------------------------------------------------------- the node
def test_a_group_trains_on_what_the_receiver_can_stand_for_and_counts_the_rest(cache):
    """b's group of 4 arrives at the char-level a through its text; one completion is made to hold
    a capital letter (same byte length, so the wire accepts it): a refuses that one alone, counts
    it with its reason, trains on the other 3, and keeps its reward in the group's advantages."""
    sender = _node(cache, "b")
    gb = sender.step(StepRequest(0, 3, [2], 4, False, send_text=True)).groups
    text = gb[0].texts[1]
    gb[0].texts[1] = b"A" + bytes(text)[1:] if len(text) else text
    assert len(text) > 0
    a = _node(cache, "a", **{"exchange.cross_tokenizer": "always"})
    a.step(StepRequest(0, 3, [0], 4, False))
    metrics, reasons = {}, []
    got = a._usable([Received("b", _wire(gb, a), [2])], metrics, reasons)
    assert [g.refused for g in got] == [["", "unknown_token", "", ""]]
    assert metrics["b/text_samples"] == 4 and metrics["b/text_refused"] == 1
    assert metrics["b/text_refused_unknown_token"] == 1
    assert len(reasons) == 1 and protocol.REFUSED_NOTE in reasons[0] and "unknown_token" in reasons[0]
    assert len(got[0].completions[1]) == 0  # no tokens: nothing of it can reach the gradient
    rewards = [a._rewards(g) for g in got]
    assert rewards[0][1] == a.task.reward(gb[0].texts[1].decode(), a.task.problem(gb[0].prompt_id))
    samples = a._samples(got, rewards)
    assert len(samples) == 3
    full = group_advantages(rewards[0][None], scale=a.cfg.advantage.scale_rewards, eps=a.cfg.advantage.eps)
    assert [s[3] for s in samples] == pytest.approx([full[0, 0], full[0, 2], full[0, 3]])  # all 4 rewards count
    res = a.step(StepRequest(1, 3, [], 4, False, foreign=[Received("b", _wire(gb, a), [2])]))
    assert res.metrics["b/text_refused"] == 1 and res.metrics["samples_foreign"] == 3
    assert any(protocol.REFUSED_NOTE in r for r in res.rejections)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("represent-cache")


def test_the_summary_warns_first_when_a_peer_was_mostly_unrepresentable():
    from ftis_flwr.server.reporting.incidents import incidents
    from ftis_flwr.server.reporting.source_health import warnings_first

    rows = [{"round": r, "nodes": {"small": {"bpe/text_samples": 10.0, "bpe/text_refused": 8.0,
                                             "bpe/text_refused_unknown_token": 8.0},
                                   "bpe": {"small/text_samples": 10.0}}} for r in (1, 2)]
    lines = warnings_first(rows)
    assert len(lines) == 1 and lines[0].startswith("small could not represent most of bpe's samples")
    assert "16 of 20 (80%: unknown_token 80%)" in lines[0]
    rows[1]["nodes"]["small"].update({"bpe/text_samples": 70.0, "bpe/text_refused": 0.0})
    assert warnings_first(rows) == []  # 8 of 80: not most
    events = [{"event": "text_refused:unknown_token", "round": 1, "node": "small", "source": "bpe", "samples": 8.0}]
    row = incidents(events)[0]
    assert (row["event"], row["who"], row["by"], row["samples"]) == ("text_refused:unknown_token", "bpe", "small", 8.0)
