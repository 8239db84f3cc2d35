"""The cross-tokenizer aligner (ftis_flwr.xtok.align) on synthetic spans and on real fast tokenizers:
the character-level one of the tiny models, a byte-level BPE and a SentencePiece-style (Metaspace)
unigram model, both trained here on arithmetic-like text with the ``tokenizers`` library."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from ftis_flwr.node.tiny import build_char_tokenizer
from ftis_flwr.xtok.align import AlignError, align, encode_with_spans, receiver_cuts
from ftis_flwr.xtok.represent import Unrepresentable
from ftis_flwr.xtok.token_bytes import TokenBytesError, token_bytes

CORPUS = ["12 + 34 = 46", "100 - 7 = 93", "héllo wörld 中文 🙂", "  spaces   and\ttabs\n\nnew lines",
          "<think> 3 + 4 is 7 </think> <answer> 7 </answer>"] * 50
ALPHABET = list("0123456789+-= ") + ["  ", "\n", "\t", "é", "中", "🙂", "abc", "<answer>", "x"]


def _fast(backend: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>",
                                   clean_up_tokenization_spaces=False)


@pytest.fixture(scope="module")
def tokenizers():
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    uni = Tokenizer(models.Unigram())
    uni.pre_tokenizer = pre_tokenizers.Metaspace()
    uni.decoder = decoders.Metaspace()
    uni.train_from_iterator(CORPUS, trainers.UnigramTrainer(vocab_size=120, special_tokens=["<unk>", "<s>"],
                                                            unk_token="<unk>"))
    return {"char": build_char_tokenizer(), "bpe": _fast(bpe), "unigram": _fast(uni)}


def texts(seed: int, n: int = 40) -> list[str]:
    rng = np.random.default_rng(seed)
    return ["".join(rng.choice(ALPHABET, int(rng.integers(0, 25)))) for _ in range(n)] + ["", " ", "🙂", "a"]


def clean_lengths(tokenizer, text: str) -> np.ndarray:
    """A sender's token byte lengths that tile the text: the tokenizer's own tokens, with those that
    share a byte (a split multi-byte character) merged, as the wire requires."""
    _, starts, ends = encode_with_spans(tokenizer, text)
    total = len(text.encode())
    cuts = receiver_cuts(starts, ends, total)
    return np.diff(np.concatenate([[0], cuts, [total]])).astype(np.int64) if total else np.zeros(0, np.int64)


def check_partition(chunks, n_send: int, n_recv: int) -> None:
    for ids, n in ((chunks.sender, n_send), (chunks.receiver, n_recv)):
        assert len(ids) == n
        if n:
            assert ids[0] == 0 and ids[-1] == chunks.n - 1
            assert set(np.diff(ids).tolist()) <= {0, 1}  # in order, no chunk skipped


def test_identical_tokenizations_give_one_token_per_chunk():
    lengths = np.array([1, 3, 2, 1])
    starts, ends = np.array([0, 1, 4, 6]), np.array([1, 4, 6, 7])
    c = align(lengths, starts, ends, 7)
    assert c.n == 4 and c.sender.tolist() == c.receiver.tolist() == [0, 1, 2, 3]
    assert c.sums(np.array([-1.0, -2.0, -3.0, -4.0])).tolist() == [-1.0, -2.0, -3.0, -4.0]


def test_chunks_are_the_smallest_runs_that_cover_the_same_bytes():
    # 6 bytes; sender cuts at 2 and 4, receiver cuts at 1, 3 and 5: no common inner boundary
    sender, r_starts, r_ends = np.array([2, 2, 2]), np.array([0, 1, 3, 5]), np.array([1, 3, 5, 6])
    c = align(sender, r_starts, r_ends, 6)
    assert c.n == 1 and c.sender.tolist() == [0, 0, 0] and c.receiver.tolist() == [0, 0, 0, 0]
    sender = np.array([1, 2, 3])  # cuts 1, 3 ; receiver cuts 1, 3, 5
    c = align(sender, r_starts, r_ends, 6)
    assert c.n == 3 and c.sender.tolist() == [0, 1, 2] and c.receiver.tolist() == [0, 1, 2, 2]
    lp_recv = np.array([-0.5, -1.0, -0.25, -0.25])
    assert c.sums(lp_recv).tolist() == [-0.5, -1.0, -0.5]
    assert c.sums(np.array([-1.0, -1.0, -1.0]), "sender").tolist() == [-1.0, -1.0, -1.0]


def test_receiver_tokens_sharing_a_character_never_get_a_boundary_inside_it():
    # "é" is 2 bytes; a byte-level tokenizer may emit two tokens that both report the char's span
    starts, ends = np.array([0, 1, 1, 3]), np.array([1, 3, 3, 4])
    assert receiver_cuts(starts, ends, 4).tolist() == [1, 3]
    c = align(np.array([1, 1, 1, 1]), starts, ends, 4)  # a sender with a cut at 2, inside the char
    assert c.n == 3 and c.sender.tolist() == [0, 1, 1, 2] and c.receiver.tolist() == [0, 1, 1, 2]


@pytest.mark.parametrize("lengths,total,match", [
    (np.array([2, 2]), 5, "add up to 4, the text has 5 bytes"),
    (np.array([3, 0, 2]), 5, "token 1 has byte length 0"),
    (np.array([2.0, 3.0]), 5, "1-D integer array"),
])
def test_sender_lengths_that_do_not_tile_the_text_are_refused(lengths, total, match):
    with pytest.raises(AlignError, match=match):
        align(lengths, np.array([0]), np.array([total]), total)


def test_receiver_spans_outside_the_text_and_empty_texts():
    with pytest.raises(AlignError, match="do not lie within"):
        align(np.array([3]), np.array([0]), np.array([4]), 3)
    empty = align(np.zeros(0, np.int64), np.zeros(0), np.zeros(0), 0)
    assert empty.n == 0 and len(empty.receiver) == 0
    with pytest.raises(AlignError, match="no receiver tokens"):
        align(np.array([3]), np.zeros(0), np.zeros(0), 3)


def test_a_tokenizer_without_offsets_is_named():
    class Slow:
        is_fast = False

    with pytest.raises(AlignError, match="Slow is not a fast tokenizer"):
        encode_with_spans(Slow(), "1 + 1")


@pytest.mark.parametrize("sender,receiver", [("char", "bpe"), ("bpe", "char"), ("bpe", "unigram"),
                                             ("unigram", "char"), ("char", "char"), ("bpe", "bpe")])
def test_real_tokenizers_align_on_random_text(tokenizers, sender, receiver):
    """On random text with multi-byte characters, whitespace runs and digits: both sides split
    into the same number of chunks, in order; each chunk covers the same bytes on both sides; no
    finer common boundary is missed; and a tokenizer aligned with itself gives one token a chunk."""
    aligned = 0
    for text in texts(seed=sum(map(ord, sender + receiver))):
        total = len(text.encode())
        try:
            lengths = clean_lengths(tokenizers[sender], text)
        except Unrepresentable:  # a text the sender could not have generated (char: no "é")
            continue
        try:
            ids, starts, ends = encode_with_spans(tokenizers[receiver], text)
        except Unrepresentable as exc:  # char lacks "é", the unigram model "x" (not in its corpus)
            assert receiver in ("char", "unigram") and exc.reason == "unknown_token", (text, exc)
            assert tokenizers[receiver].unk_token_id in tokenizers[receiver](text)["input_ids"]
            continue
        aligned += 1
        assert not set(ids.tolist()) & {tokenizers[receiver].bos_token_id}  # no BOS in a completion
        c = align(lengths, starts, ends, total)
        check_partition(c, len(lengths), len(ids))
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        s_first = np.searchsorted(c.sender, np.arange(c.n))  # first sender token of each chunk
        chunk_start = bounds[s_first]
        for k in range(c.n):  # the receiver's tokens of chunk k start no earlier than the chunk
            assert starts[c.receiver == k].min() >= chunk_start[k]
        inner = set(bounds[1:-1].tolist()) - set(chunk_start.tolist())
        assert not inner & set(receiver_cuts(starts, ends, total).tolist()), text  # maximal
        if sender == receiver:  # every chunk is one (clean) token: the token path
            assert c.n == len(lengths)
            if sender == "char":
                assert c.n == len(ids)
    assert aligned >= 5  # not vacuous: some random texts are representable on both sides


# ----------------------------------------------------------------- the sender's bytes per token


@pytest.mark.parametrize("name", ["char", "bpe", "unigram"])
def test_each_generated_tokens_bytes_rebuild_the_text_and_align(tokenizers, name):
    """A sender's own tokens (as a sampler would emit them: here its encoding of random text) give
    bytes that join to exactly the text (a metaspace tokenizer's prepended space aside), so their
    lengths tile it and align with any receiver's tokens, the char-level one's included."""
    tok = tokenizers[name]
    for text in texts(seed=7):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        if tok.unk_token_id in ids:  # a text the sender could not have generated (char: no "é")
            continue
        pieces = token_bytes(tok, ids)
        joined = b"".join(pieces)
        want = text.encode()
        # Metaspace with prepend_scheme="always": a text that does not start with a space gains one
        ok = joined == want or (name == "unigram" and joined == b" " + want)
        assert ok, (name, text, tok.convert_ids_to_tokens(ids))
        lengths = np.array([len(p) for p in pieces], np.int64)
        if name != "unigram" and len(want) and tokenizers["char"].unk_token_id not in tokenizers["char"](text)["input_ids"]:
            r_ids, starts, ends = encode_with_spans(tokenizers["char"], text)
            chunks = align(lengths[lengths > 0], starts, ends, len(want))
            check_partition(chunks, int((lengths > 0).sum()), len(r_ids))


def test_special_tokens_stand_for_no_bytes_and_a_slow_tokenizer_is_named(tokenizers):
    tok = tokenizers["bpe"]
    assert token_bytes(tok, [tok.bos_token_id, tok("1", add_special_tokens=False)["input_ids"][0]]) == [b"", b"1"]

    class Slow:
        pass

    with pytest.raises(TokenBytesError, match="Slow is not a fast tokenizer"):
        token_bytes(Slow(), [1])
