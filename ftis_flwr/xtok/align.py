"""Aligning two tokenizations of one completion text into chunks (cross-tokenizer F-TIS, algorithm §4).

Why: a receiver whose tokenizer differs from the sender's cannot score the sender's token ids. It
scores the completion's *text* with its own tokens instead, and compares the two sides where both
have a token boundary at the same byte: a chunk is a run of sender tokens and a run of receiver
tokens that cover exactly the same bytes, the smallest such runs. By the chain rule a chunk's
log-prob is the sum of its tokens' log-probs on either side, so the importance weight is taken per
chunk. Between identical tokenizations every chunk is one token, and the token path is recovered.

The walk is the byte-offset alignment of TRL's GOLD trainer, for any pair of fast tokenizers: the
sender's side comes as token byte lengths (they tile the text), the receiver's as the bytes its
own tokens stand for, which must tile the text too (:mod:`ftis_flwr.xtok.represent`: a completion
its tokens cannot stand for is refused, never weighed). A receiver span that crosses a byte
position leaves no boundary there, so such tokens always share a chunk. Pure numpy, no model:
tested on synthetic and real tokenizers (tests/test_align.py).

``loss.cross_tokenizer_ratio=word`` merges the chunks further, until every chunk boundary is also a
*word boundary* (:func:`word_boundaries`), so that no chunk on either side ends mid-word (ALM,
arXiv 2503.20083: a likelihood that ends inside a word carries the tokenizer's bias):
:func:`merge_to_words`.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ftis_flwr.config.choices import CROSS_TOKENIZER_MODES, CROSS_TOKENIZER_RATIOS  # noqa: F401 (implemented here)
from ftis_flwr.xtok.represent import Unrepresentable, encode_exact
from ftis_flwr.xtok.token_bytes import TokenBytesError, token_bytes


class AlignError(ValueError):
    """Two tokenizations that cannot be aligned (spans that do not tile the text, a tokenizer
    without offsets); the message says which."""


@dataclass(frozen=True)
class Chunks:
    """The chunks of one completion: each side's tokens mapped to chunk indices 0..n-1 in order."""

    sender: np.ndarray
    """[n_sender_tokens] int64: the chunk of each sender token (non-decreasing, every chunk hit)."""
    receiver: np.ndarray
    """[n_receiver_tokens] int64: the chunk of each receiver token (same rules)."""
    n: int
    """Number of chunks (0 only for an empty completion)."""

    def sums(self, values: np.ndarray, side: str = "receiver") -> np.ndarray:
        """Per-chunk sums of per-token ``values`` of one side (the chain rule for log-probs)."""
        index = self.sender if side == "sender" else self.receiver
        return np.bincount(index, weights=np.asarray(values, np.float64), minlength=self.n)


def sender_cuts(byte_lengths: np.ndarray, total: int) -> np.ndarray:
    """The inner token boundaries (byte positions) of the sender, checked to tile ``total`` bytes."""
    lengths = np.asarray(byte_lengths)
    if lengths.ndim != 1 or not np.issubdtype(lengths.dtype, np.integer):
        raise AlignError(f"sender byte lengths must be a 1-D integer array, got {lengths.dtype} "
                         f"{lengths.shape}")
    if len(lengths) and lengths.min() <= 0:
        raise AlignError(f"sender token {int(np.argmax(lengths <= 0))} has byte length "
                         f"{int(lengths.min())}: every token covers at least one byte")
    if int(lengths.sum()) != total:
        raise AlignError(f"sender token byte lengths add up to {int(lengths.sum())}, the text has {total} bytes")
    return np.cumsum(lengths)[:-1].astype(np.int64)


def receiver_cuts(starts: np.ndarray, ends: np.ndarray, total: int) -> np.ndarray:
    """Byte positions inside (0, total) where the receiver's tokens have a clean boundary: some
    token ends there, some token starts there, and no token's span crosses it."""
    starts, ends = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
    if len(starts) != len(ends) or (len(starts) and (starts.min() < 0 or ends.max() > total
                                                      or (ends < starts).any())):
        raise AlignError(f"receiver spans do not lie within the {total}-byte text")
    inner = np.intersect1d(ends, starts)
    inner = inner[(inner > 0) & (inner < total)]
    if not len(inner):
        return inner
    crossing = np.zeros(total + 1, np.int64)  # +1 over (start, end): positions strictly inside a span
    np.add.at(crossing, starts + 1, 1)
    np.add.at(crossing, ends, -1)
    inside = np.cumsum(crossing) > 0
    return inner[~inside[inner]]


def align(sender_lengths: np.ndarray, receiver_starts: np.ndarray, receiver_ends: np.ndarray,
          total: int) -> Chunks:
    """Chunks of a completion of ``total`` bytes: sender tokens of ``sender_lengths`` bytes each,
    receiver tokens spanning [start, end) bytes (zero-width ones join the chunk they sit in)."""
    s_cuts = sender_cuts(sender_lengths, total)
    r_starts = np.asarray(receiver_starts, np.int64)
    r_cuts = receiver_cuts(r_starts, receiver_ends, total)
    common = np.intersect1d(s_cuts, r_cuts)
    n_recv = len(r_starts)
    if total == 0:
        if n_recv:
            raise AlignError(f"an empty text has {n_recv} receiver token(s)")
        return Chunks(np.zeros(len(np.asarray(sender_lengths)), np.int64), np.zeros(0, np.int64), 0)
    if n_recv == 0:
        raise AlignError(f"a {total}-byte text has no receiver tokens")
    s_starts = np.concatenate([[0], s_cuts])
    sender = np.searchsorted(common, s_starts, side="right").astype(np.int64)
    receiver = np.searchsorted(common, r_starts, side="right").astype(np.int64)
    return Chunks(sender, receiver, len(common) + 1)


@lru_cache(maxsize=4096)
def char_class(ch: str) -> int:
    """A character's class for :func:`word_boundaries`: 0 whitespace (``str.isspace``), 1 letter or
    mark (Unicode L*, M*), 2 digit (any Unicode number, N*), 3 anything else (punctuation, symbols)."""
    if ch.isspace():
        return 0
    major = unicodedata.category(ch)[0]
    return 1 if major in "LM" else 2 if major == "N" else 3


_ASCII_CLASS = np.array([char_class(chr(i)) for i in range(128)], np.int8)


def word_boundaries(text: bytes) -> np.ndarray:
    """The word boundaries of a UTF-8 text, in bytes: 0, ``len(text)``, and every position between
    two characters of different :func:`char_class`. A word is thus a maximal run of one class:
    whitespace, letters (with their marks), digits, or other characters (punctuation, symbols), as
    GPT-2's and Llama-3's pre-tokenizer regexes cut a text (they also cut inside some runs, and keep
    a space with the next word; Metaspace cuts at whitespace only). Sorted int64, never inside a
    multi-byte character; AlignError for bytes that are not UTF-8."""
    raw = bytes(text)
    try:
        s = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise AlignError(f"the text is not UTF-8: {exc}") from None
    if not s:
        return np.zeros(1, np.int64)
    cps = np.frombuffer(s.encode("utf-32-le"), np.uint32)
    cls = np.where(cps < 128, _ASCII_CLASS[np.minimum(cps, 127)], -1).astype(np.int8)
    for i in np.flatnonzero(cls < 0):
        cls[i] = char_class(s[i])
    width = 1 + (cps >= 0x80).astype(np.int64) + (cps >= 0x800) + (cps >= 0x10000)  # UTF-8 bytes per char
    starts = np.concatenate([[0], np.cumsum(width)])
    change = np.flatnonzero(cls[1:] != cls[:-1]) + 1  # characters whose class differs from the one before
    return np.concatenate([[0], starts[change], [len(raw)]]).astype(np.int64)


def merge_to_words(chunks: Chunks, sender_lengths: np.ndarray, boundaries: np.ndarray) -> Chunks:
    """``chunks`` (of :func:`align`, sender tokens of ``sender_lengths`` bytes) merged so that every
    chunk boundary is a byte position in ``boundaries`` too (:func:`word_boundaries`): each chunk
    that does not end at one joins the next. The finest such chunks: every common token boundary
    that is a word boundary stays one."""
    lengths = np.asarray(sender_lengths, np.int64)
    if len(lengths) != len(chunks.sender):
        raise AlignError(f"{len(lengths)} sender byte lengths for {len(chunks.sender)} sender tokens")
    if chunks.n == 0:
        return chunks
    last = np.searchsorted(chunks.sender, np.arange(chunks.n), side="right") - 1  # each chunk's last sender token
    keep = np.isin(np.cumsum(lengths)[last], np.asarray(boundaries, np.int64))
    keep[-1] = True  # the text's end
    index = np.concatenate([[0], np.cumsum(keep[:-1])]).astype(np.int64)  # old chunk -> merged chunk
    return Chunks(index[chunks.sender], index[chunks.receiver], int(index[-1]) + 1)


ALIGN_PROBE = "Hello, world: 12 + 30 = 42.\n  é€ 😀 中文 <think> x"
"""A text with what alignment must survive (multi-byte characters, whitespace runs, digits)."""


def alignment_fault(tokenizer) -> str:
    """Why ``tokenizer`` cannot take part in cross-tokenizer F-TIS (no offsets, tokens whose bytes
    cannot be read), or "" when it can: checked on :data:`ALIGN_PROBE` both as a receiver (tokens
    that tile the text's bytes) and as a sender (token bytes that rebuild what it encodes). Texts it
    cannot stand for are not a fault but a limit (:func:`ftis_flwr.xtok.represent.text_limits`)."""
    try:
        encode_with_spans(tokenizer, ALIGN_PROBE)
    except Unrepresentable as exc:
        if exc.reason == "unreadable":
            return str(exc)
    except (AlignError, TokenBytesError) as exc:
        return str(exc)
    except Exception as exc:  # a tokenizer's own failure is a fault of that tokenizer, named
        return f"{type(exc).__name__}: {exc}"
    try:
        token_bytes(tokenizer, tokenizer(ALIGN_PROBE, add_special_tokens=False)["input_ids"])
    except TokenBytesError as exc:
        return str(exc)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return ""


def encode_with_spans(tokenizer, text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The receiver's own tokens of a completion text and their UTF-8 byte spans, which tile the
    text's bytes exactly (:func:`ftis_flwr.xtok.represent.encode_exact`: encoded as a continuation,
    nothing in the text read as a special token); AlignError for a tokenizer that is not fast,
    :class:`~ftis_flwr.xtok.represent.Unrepresentable` when its tokens cannot stand for the text."""
    if not getattr(tokenizer, "is_fast", False):
        raise AlignError(f"{type(tokenizer).__name__} is not a fast tokenizer: it gives no offsets, so "
                         "its completions cannot be aligned with another tokenizer's")
    return encode_exact(tokenizer, text)
