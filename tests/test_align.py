"""The cross-tokenizer aligner (ftis_flwr.xtok.align) on synthetic spans and on real fast tokenizers:
the character-level one of the tiny models, a byte-level BPE and a SentencePiece-style (Metaspace)
unigram model, both trained here on arithmetic-like text with the ``tokenizers`` library."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from ftis_flwr.node.tiny.models import as_tiny_tokenizer, build_char_tokenizer
from ftis_flwr.wire.groups import Group
from ftis_flwr.xtok.align import (
    ALIGN_PROBE,
    AlignError,
    align,
    char_class,
    encode_with_spans,
    merge_to_words,
    receiver_cuts,
    sender_cuts,
    word_boundaries,
)
from ftis_flwr.xtok.represent import Unrepresentable
from ftis_flwr.xtok.token_bytes import TokenBytesError, token_bytes
from ftis_flwr.xtok.translate import to_own_tokens

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


# ----------------------------------------------------------------- word boundaries (ratio "word")


@pytest.mark.parametrize("text,want", [
    ("12+30=42", [0, 2, 3, 5, 6, 8]),  # digit runs and the signs between them
    ("a  b\t\nc", [0, 1, 3, 4, 6, 7]),  # whitespace runs, mixed kinds in one run
    ("x, y.", [0, 1, 2, 3, 4, 5]),  # punctuation after a letter and before a space
    ("</answer>", [0, 2, 8, 9]),  # a run of punctuation is one word
    ("a1b2", [0, 1, 2, 3, 4]),  # letter / digit changes
    ("héllo 中文🙂!", [0, 6, 7, 13, 18]),  # 2-, 3- and 4-byte characters: letters, an emoji (a symbol)
    ("e\u0301t", [0, 4]),  # a combining mark belongs to its letter
    ("\u0663\u00bd7", [0, 5]),  # Arabic-Indic three, a vulgar fraction, 7: all numbers
    ("", [0]), ("a", [0, 1]), ("  ", [0, 2]),
])
def test_word_boundaries_are_where_the_character_class_changes(text, want):
    assert word_boundaries(text.encode()).tolist() == want


def test_word_boundaries_on_random_text_split_runs_of_one_class_and_never_a_character():
    for text in texts(seed=11, n=200) + [ALIGN_PROBE]:
        raw = text.encode()
        b = word_boundaries(raw)
        assert b[0] == 0 and b[-1] == len(raw) and (np.diff(b) > 0).all()
        assert all(p == len(raw) or raw[p] & 0xC0 != 0x80 for p in b), text  # never a continuation byte
        words = [raw[i:j].decode() for i, j in zip(b[:-1], b[1:])]
        assert "".join(words) == text
        assert all(len({char_class(ch) for ch in w}) == 1 for w in words), words  # one class a word
        assert all(char_class(u[-1]) != char_class(v[0]) for u, v in zip(words, words[1:])), words  # maximal
    with pytest.raises(AlignError, match="not UTF-8"):
        word_boundaries("é".encode()[:1])


def chunk_bytes(chunks, lengths, starts, ends):
    """Per chunk: the (first, end) bytes its sender tokens and its receiver tokens cover."""
    bounds = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    first = np.searchsorted(chunks.sender, np.arange(chunks.n))
    last = np.searchsorted(chunks.sender, np.arange(chunks.n), side="right") - 1
    send = [(int(bounds[i]), int(bounds[j + 1])) for i, j in zip(first, last)]
    recv = [(int(starts[chunks.receiver == k].min()), int(ends[chunks.receiver == k].max())) for k in range(chunks.n)]
    return send, recv


def test_merging_to_words_joins_the_chunks_that_end_mid_word():
    # "12+30=42" in one-character tokens on both sides: the digit runs become one chunk each
    lengths, starts = np.ones(8, np.int64), np.arange(8)
    c = align(lengths, starts, starts + 1, 8)
    assert c.n == 8
    w = merge_to_words(c, lengths, word_boundaries(b"12+30=42"))
    assert w.n == 5 and w.sender.tolist() == w.receiver.tolist() == [0, 0, 1, 2, 2, 3, 4, 4]
    lp = np.array([-1.0, -2.0, -0.5, -1.0, -1.0, -0.25, -3.0, -1.0])
    assert w.sums(lp).tolist() == w.sums(lp, "sender").tolist() == [-3.0, -0.5, -2.0, -0.25, -4.0]
    # a chunk that already ends at word boundaries only is left alone; no boundary inside a word
    assert merge_to_words(c, lengths, np.arange(9)).sender.tolist() == list(range(8))
    one = merge_to_words(c, lengths, np.array([0, 8]))
    assert one.n == 1 and set(one.receiver.tolist()) == {0}
    empty = align(np.zeros(0, np.int64), np.zeros(0), np.zeros(0), 0)
    assert merge_to_words(empty, np.zeros(0, np.int64), word_boundaries(b"")).n == 0
    with pytest.raises(AlignError, match="3 sender byte lengths for 8 sender tokens"):
        merge_to_words(c, lengths[:3], word_boundaries(b"12+30=42"))


@pytest.mark.parametrize("sender,receiver", [("char", "bpe"), ("bpe", "char"), ("bpe", "unigram"),
                                             ("unigram", "char"), ("char", "char"), ("bpe", "bpe")])
def test_word_chunks_cover_the_same_bytes_and_cut_only_at_common_word_boundaries(tokenizers, sender, receiver):
    """Merged to words, each chunk covers the same bytes on both sides, and its boundaries are
    exactly the common token boundaries that are word boundaries: none is missed (maximal)."""
    merged = 0
    for text in texts(seed=5 + sum(map(ord, sender + receiver))) + [ALIGN_PROBE]:
        raw = text.encode()
        try:
            lengths = clean_lengths(tokenizers[sender], text)
            ids, starts, ends = encode_with_spans(tokenizers[receiver], text)
        except Unrepresentable:
            continue
        if not raw:
            continue
        c = align(lengths, starts, ends, len(raw))
        words = word_boundaries(raw)
        w = merge_to_words(c, lengths, words)
        check_partition(w, len(lengths), len(ids))
        send, recv = chunk_bytes(w, lengths, starts, ends)
        assert send == recv, text  # the same bytes on both sides
        assert send[0][0] == 0 and send[-1][1] == len(raw) and all(a[1] == b[0] for a, b in zip(send, send[1:]))
        cuts = [e for _, e in send[:-1]]
        common = np.intersect1d(sender_cuts(lengths, len(raw)), receiver_cuts(starts, ends, len(raw)))
        assert cuts == np.intersect1d(common, words).tolist(), text  # common word boundaries, all of them
        merged += c.n - w.n
    assert merged > 0  # not vacuous: some chunk ended mid-word


WORD_TEXTS = ["12 + 30 = 42", "héllo  wörld, 中文!", "  spaces   and\ttabs\n\nnew lines", "<answer> 7 </answer>",
              "e\u0301t 3.5"]


def word_level_tokenizer(corpus) -> PreTrainedTokenizerFast:
    """A tokenizer whose tokens are whole words (:func:`word_boundaries`' runs of one class)."""
    split = pre_tokenizers.Split(Regex(r"\s+|[\p{L}\p{M}]+|\p{N}+|[^\s\p{L}\p{M}\p{N}]+"), behavior="isolated")
    words = sorted({w for t in corpus for w, _ in split.pre_tokenize_str(t)})
    vocab = {tok: i for i, tok in enumerate(["<pad>", "<eos>", "<unk>"] + words)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer, backend.decoder = split, decoders.Fuse()
    return as_tiny_tokenizer(backend)


def _text_group(tokenizer, corpus) -> Group:
    """A group of ``corpus`` texts in ``tokenizer``'s tokens as a sender puts them on the wire,
    each ended by an end-of-turn token (byte length 0), with distinct log-probs."""
    comps, lps, lengths = [], [], []
    for i, text in enumerate(corpus):
        cut = clean_lengths(tokenizer, text)
        comps.append(np.append(tokenizer(text, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id))
        lps.append(-np.linspace(0.1, 2.0, len(cut) + 1).astype(np.float32) * (i + 1) / len(corpus))
        lengths.append(np.append(cut, 0).astype(np.int64))
    return Group(prompt_id="p", prompt_tokens=np.array([3]), completions=comps, logprobs=lps,
                 rewards=np.zeros(len(corpus), np.float32), node="s", model_id="s", tokenizer_fp="fp",
                 texts=[t.encode() for t in corpus], byte_lengths=lengths)


def test_word_chunks_are_the_tokens_when_every_token_is_a_word():
    """The reduction: between identical tokenizers whose tokens are whole words, "word" gives one
    chunk a token, as "chunk" and the token path do; with one character a token it merges digit
    and letter runs instead (so the first check can fail)."""
    word = word_level_tokenizer(WORD_TEXTS)
    for text in WORD_TEXTS:
        raw = text.encode()
        lengths = clean_lengths(word, text)
        _, starts, ends = encode_with_spans(word, text)
        assert set(np.cumsum(lengths).tolist()) <= set(word_boundaries(raw).tolist())  # tokens are words
        c = align(lengths, starts, ends, len(raw))
        w = merge_to_words(c, lengths, word_boundaries(raw))
        assert w.n == c.n == len(lengths) and w.sender.tolist() == w.receiver.tolist() == list(range(len(lengths)))
    for tok, same in ((word, True), (build_char_tokenizer(), False)):
        corpus = WORD_TEXTS if same else ["12 + 30 = 42", "<answer> 7 </answer>", "new lines"]
        g = _text_group(tok, corpus)
        (chunk, s_chunk), (words, s_word) = (to_own_tokens(g, tok, np.array([3]), tok.eos_token_id, max_tokens=64,
                                                           ratio=r) for r in ("chunk", "word"))
        assert all(not r for r in chunk.refused + words.refused)
        for a, b, n in zip(chunk.chunks, words.chunks, map(len, g.completions)):
            assert a.tolist() == list(range(n))  # "chunk" between identical tokenizers: one token a chunk
            assert (a.tolist() == b.tolist()) is same
        for a, b in zip(chunk.logprobs, words.logprobs):
            assert np.array_equal(a, b) is same
        assert s_chunk.unmerged_chunks == s_chunk.chunks and (s_word.unmerged_chunks == s_word.chunks) is same
        assert [x.tolist() for x in chunk.completions] == [x.tolist() for x in words.completions]
    with pytest.raises(ValueError, match="not one of chunk, word, sequence"):
        to_own_tokens(g, tok, np.array([3]), tok.eos_token_id, max_tokens=64, ratio="words")


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
        if (name != "unigram" and len(want)
                and tokenizers["char"].unk_token_id not in tokenizers["char"](text)["input_ids"]):
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
