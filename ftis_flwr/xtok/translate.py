"""A foreign group of another tokenizer, turned into the receiver's own tokens (algorithm §4, chunks).

Why apart from the node: this is the whole receiver side of cross-tokenizer F-TIS in one pure
function (no model, no optimiser): the receiver's prompt is its own rendering of the same
problem; each completion's text is encoded with the receiver's tokenizer and aligned with the
sender's tokens by byte positions (:mod:`ftis_flwr.xtok.align`); the sender's log-probs are summed per
chunk (the chain rule) and put on each chunk's last receiver token, which is all the loss needs
(:attr:`ftis_flwr.maths.loss.LossInputs.chunks`). A completion that ended its turn ends with the
receiver's own end-of-turn token, and the two end-of-turn tokens form the last chunk; a truncated
completion has none. ``loss.cross_tokenizer_ratio=word`` merges the chunks to word boundaries first
(:func:`ftis_flwr.xtok.align.merge_to_words`). A completion the receiver's tokens cannot stand for
byte for byte is refused on its own (:mod:`ftis_flwr.xtok.represent`). Run once per received
group, never per optimiser step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ftis_flwr.config.choices import CROSS_TOKENIZER_RATIOS, CrossTokenizerRatio
from ftis_flwr.wire.groups import Group
from ftis_flwr.xtok.align import AlignError, Chunks, align, encode_with_spans, merge_to_words, word_boundaries
from ftis_flwr.xtok.represent import Unrepresentable


@dataclass
class AlignStats:
    """What one source's alignment looked like (the node reports them per source)."""

    receiver_tokens: int = 0
    chunks: int = 0
    multi_tokens: int = 0
    """Receiver tokens in a chunk that is not one token on each side."""
    unmerged_chunks: int = 0
    """The chunks before the merge to word boundaries (``ratio="word"``; ``chunks`` otherwise)."""

    def add(self, other: AlignStats) -> None:
        self.receiver_tokens += other.receiver_tokens
        self.chunks += other.chunks
        self.multi_tokens += other.multi_tokens
        self.unmerged_chunks += other.unmerged_chunks


def chunk_gen(chunks: Chunks, sender_lp: np.ndarray) -> np.ndarray:
    """Per receiver token: the sender's log-prob of the token's chunk on the chunk's last token,
    0 elsewhere (so the chunk sums are the sender's)."""
    out = np.zeros(len(chunks.receiver), np.float32)
    last = np.searchsorted(chunks.receiver, np.arange(chunks.n), side="right") - 1
    out[last] = chunks.sums(sender_lp, "sender")
    return out


def to_own_tokens(g: Group, tokenizer, prompt: np.ndarray, eot_id: int, *, max_tokens: int,
                  ratio: str = "chunk") -> tuple[Group, AlignStats]:
    """``g`` (with texts) in the receiver's tokens: prompt ``prompt``, each completion's text
    encoded by ``tokenizer`` plus ``eot_id`` where the sender ended its turn, with chunks.

    Each completion is judged on its own: one whose text this tokenizer's tokens cannot stand for
    byte for byte (:mod:`ftis_flwr.xtok.represent`), that cannot be aligned, or that exceeds
    ``max_tokens`` is refused (``Group.refused`` names why; no tokens) and never trained on; its
    reward still counts in the group's advantages, scored from ``Group.source_texts``.

    ``ratio="word"``: the chunks merged until every chunk boundary is a word boundary too
    (:func:`ftis_flwr.xtok.align.merge_to_words`); the loss is the chunk loss on those chunks.
    ``ratio="sequence"`` (the HACPO-style ablation): one chunk per completion, and every receiver
    token holds the sender's *mean* token log-prob (the node turns that into one per-completion
    ratio of means). AlignError when the group carries no texts.
    """
    if ratio not in CROSS_TOKENIZER_RATIOS:
        raise ValueError(f"ratio {ratio!r} is not one of {', '.join(CROSS_TOKENIZER_RATIOS)}")
    if g.texts is None or g.byte_lengths is None:
        raise AlignError("the group carries no completion texts")
    comps, lps, chunk_ids, refused, stats = [], [], [], [], AlignStats()
    texts = [bytes(t).decode("utf-8", errors="replace") for t in g.texts]
    for text, raw, lengths, gen in zip(texts, g.texts, g.byte_lengths, g.logprobs):
        try:
            ids, r_gen, r_chunks, one = _one_completion(text, bytes(raw), lengths, gen, tokenizer, eot_id,
                                                        max_tokens, words=ratio == CrossTokenizerRatio.WORD)
        except Unrepresentable as exc:
            refused.append(exc.reason)
        except AlignError:
            refused.append("unaligned")
        else:
            stats.add(one)
            if ratio == CrossTokenizerRatio.SEQUENCE:
                r_gen = np.full(len(ids), float(np.mean(gen)), np.float32)
                r_chunks = np.zeros(len(ids), np.int64)
            comps.append(ids.astype(np.int64))
            lps.append(r_gen)
            chunk_ids.append(r_chunks.astype(np.int64))
            refused.append("")
            continue
        comps.append(np.zeros(0, np.int64))
        lps.append(np.zeros(0, np.float32))
        chunk_ids.append(np.zeros(0, np.int64))
    out = Group(prompt_id=g.prompt_id, prompt_tokens=prompt, completions=comps, logprobs=lps,
                rewards=g.rewards, node=g.node, model_id=g.model_id, tokenizer_fp=g.tokenizer_fp,
                chunks=chunk_ids, refused=refused, source_texts=texts)
    return out, stats


def _one_completion(text: str, raw: bytes, lengths, gen, tokenizer, eot_id: int, max_tokens: int,
                    words: bool = False):
    """(receiver ids, per-token sender log-probs, chunk per token, stats) of one completion of
    ``raw`` bytes (``text`` decoded); ``words``: chunks merged to word boundaries."""
    lengths, gen = np.asarray(lengths, np.int64), np.asarray(gen, np.float32)
    eot = len(lengths) > 0 and lengths[-1] == 0
    s_len, s_gen = (lengths[:-1], gen[:-1]) if eot else (lengths, gen)
    ids, starts, ends = encode_with_spans(tokenizer, text)
    ch = align(s_len, starts, ends, len(raw))
    unmerged = ch.n + int(eot)
    if words:
        ch = merge_to_words(ch, s_len, word_boundaries(raw))
    r_gen, r_chunks = chunk_gen(ch, s_gen), ch.receiver
    if eot:
        ids = np.append(ids, eot_id)
        r_gen = np.append(r_gen, gen[-1]).astype(np.float32)
        r_chunks = np.append(r_chunks, ch.n)
    if len(ids) == 0 or len(ids) > max_tokens:
        raise Unrepresentable("too_long" if len(ids) else "empty_token",
                              f"{len(ids)} tokens, wire.max_tokens_per_completion={max_tokens}")
    r_counts = np.bincount(r_chunks)
    s_counts = np.bincount(ch.sender, minlength=max(ch.n, 1))
    s_counts = np.append(s_counts[:ch.n], [1] if eot else [])
    one_one = (r_counts == 1) & (s_counts == 1)
    return ids, r_gen, r_chunks, AlignStats(len(ids), len(r_counts), int(np.sum(r_counts[~one_one])), unmerged)


def sequence_gen(gen: torch.Tensor, old: torch.Tensor, chunks, comps) -> torch.Tensor:
    """``loss.cross_tokenizer_ratio=sequence``: a text-path sample is one chunk whose tokens
    hold the sender's mean token log-prob; choose per-token values whose chunk sum of
    ``old - gen`` is ``mean(old) - mean(sender)`` (one HACPO-style ratio of means)."""
    gen = gen.clone()
    old = old.detach().to(gen.device).float()
    for i, (c, comp) in enumerate(zip(chunks, comps)):
        if c is None:
            continue
        n = len(comp)
        d = old[i, :n].mean() - gen[i, :n].mean()
        gen[i, :n] = old[i, :n] - d / n
    return gen
