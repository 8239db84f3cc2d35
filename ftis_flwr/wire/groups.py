"""Groups of completions: G samples of one prompt by one generator, with its token log-probs.

The data model of the method, free of any transport (the node and the maths import it without
Flower; ``ftis_flwr.wire.rollouts`` puts groups on the wire). Rules a group must meet (sender and
receiver alike): a prompt has >= 1 token; a group has >= 1 completion; every completion has >= 1
token (a model always emits at least one token, EOS or a token cut by the length cap, so an empty
completion can only be a fault); log-probs are finite and <= ``LOGPROB_TOLERANCE`` (1e-4:
log-softmax rounding may give tiny positive values, anything larger is not a log-probability);
ids lie in [0, vocab_size); rewards are finite.

Episodes (algorithm §13: multi-turn, with tools) are groups whose completions interleave tokens the
model sampled with tokens it did not (the template's role markers, the tools' results): their
``sampled_masks`` say which (:func:`mask_fault` gives the rules).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np

from ftis_flwr.wire.tool_turns import tools_fault

LOGPROB_TOLERANCE = 1e-4


class PayloadError(ValueError):
    """A group or payload breaks the wire rules; the message names the group and the fault."""


@dataclass
class Group:
    """G completions of one prompt by one generator, with the generator's token log-probs."""

    prompt_id: str
    prompt_tokens: np.ndarray
    completions: list[np.ndarray]
    logprobs: list[np.ndarray]
    rewards: np.ndarray
    node: str
    model_id: str
    tokenizer_fp: str
    texts: list[bytes] | None = None
    """Cross-tokenizer path (algorithm §4), for receivers with another tokenizer: each completion's
    text as UTF-8 bytes, what its tokens stand for (a final end-of-turn token stands for none)."""
    byte_lengths: list[np.ndarray] | None = None
    """With ``texts``: per completion, the bytes of its text each token covers, in order: >= 1,
    except a final end-of-turn token's 0 (so a last length of 0 says the completion ended its
    turn; a truncated one has none). They add up to the text's length."""
    chunks: list[np.ndarray] | None = None
    """Receiver side only, never on the wire: after alignment (:mod:`ftis_flwr.xtok.align`) the group
    is in the receiver's tokens and each completion's tokens carry their chunk index 0, 1, ...;
    its ``logprobs`` then hold the sender's log-prob of each chunk on the chunk's last token."""
    refused: list[str] | None = None
    """Receiver side only, after alignment: per completion, "" when its tokens stand for exactly
    the text's bytes, else why not (a key of :data:`ftis_flwr.xtok.represent.REASONS`). A refused
    completion has no tokens and is never trained on; its reward still counts in its group's
    advantages."""
    sampled_masks: list[np.ndarray] | None = None
    """Episodes (algorithm §13): per completion, 1 on each token the model sampled and 0 on the
    context between its turns (template markers, tool results), whose log-prob is exactly 0.0 and
    which never enter the loss (:func:`mask_fault`). None: a single turn, every token sampled."""
    source_texts: list[str] | None = None
    """Receiver side only, after alignment: the completions' texts as the sender sent them; the
    receiver scores its rewards on these (a refused completion has no tokens to decode)."""
    tool_format: str | None = None
    """Episodes with ``texts``: the sender's tool-call format
    (:data:`ftis_flwr.tasks.tool_calls.TOOL_FORMATS`); a receiver of another tokenizer reads the
    calls in it, and refuses episodes written in a format other than its own."""
    tool_layout: str | None = None
    """With ``tool_format``: the sender's tool-turn layout
    (:class:`~ftis_flwr.wire.tool_turns.ToolTurnLayout`, as its wire string, or ``"null"``), which a
    receiver of another template checks the sent tool turns against."""
    replayed_rewards: np.ndarray | None = None
    """Receiver side only, episodes: the rewards this node computed by replaying them through its
    own environment (:mod:`ftis_flwr.node.replay`), which it trains on instead of the sender's."""

    @property
    def size(self) -> int:
        """Number of completions in the group."""
        return len(self.completions)

    @property
    def num_tokens(self) -> int:
        """Completion tokens in the group (the prompt is not counted)."""
        return int(sum(len(c) for c in self.completions))

    def validate(self, vocab_size: int | None = None) -> None:
        """Raise PayloadError unless the group meets the wire rules (module docstring)."""
        where = f"group {self.prompt_id!r}"
        for name in ("prompt_id", "node", "model_id", "tokenizer_fp"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise PayloadError(f"{where}: {name} must be a non-empty str, got {value!r}")
        _check_ids(self.prompt_tokens, vocab_size, f"{where}: prompt_tokens")
        if not isinstance(self.completions, list) or not isinstance(self.logprobs, list):
            raise PayloadError(f"{where}: completions and logprobs must be lists of arrays")
        if not self.completions:
            raise PayloadError(f"{where}: a group needs at least one completion")
        if len(self.logprobs) != len(self.completions):
            raise PayloadError(
                f"{where}: {len(self.completions)} completions but {len(self.logprobs)} "
                "log-prob arrays"
            )
        for i, (ids, lps) in enumerate(zip(self.completions, self.logprobs)):
            _check_ids(ids, vocab_size, f"{where}: completion {i}")
            lps = np.asarray(lps)
            if lps.ndim != 1 or lps.dtype.kind != "f":
                raise PayloadError(f"{where}: completion {i}: log-probs must be a 1-D float array")
            if len(lps) != len(ids):
                raise PayloadError(
                    f"{where}: completion {i}: {len(ids)} tokens but {len(lps)} log-probs"
                )
            bad = _first_bad_logprob(lps.astype(np.float32))
            if bad is not None:
                raise PayloadError(f"{where}: completion {i} token {bad[0]}: {bad[1]}")
        rewards = np.asarray(self.rewards)
        if rewards.shape != (len(self.completions),) or rewards.dtype.kind not in "fiub":
            raise PayloadError(
                f"{where}: rewards must be a numeric array of shape ({len(self.completions)},),"
                f" got shape {rewards.shape}"
            )
        if not np.all(np.isfinite(rewards)):
            raise PayloadError(f"{where}: rewards contain non-finite values")
        if self.sampled_masks is not None:
            if not isinstance(self.sampled_masks, list) or len(self.sampled_masks) != len(self.completions):
                raise PayloadError(f"{where}: sampled_masks must be a list of one array per completion "
                                   f"({len(self.completions)})")
            for i, (mask, lps) in enumerate(zip(self.sampled_masks, self.logprobs)):
                why = mask_fault(np.asarray(mask), np.asarray(lps))
                if why:
                    raise PayloadError(f"{where}: completion {i}: {why}")
        if (self.texts is None) != (self.byte_lengths is None):
            raise PayloadError(f"{where}: texts and byte_lengths come together or not at all")
        if self.texts is not None:
            if len(self.texts) != len(self.completions) or len(self.byte_lengths) != len(self.completions):
                raise PayloadError(f"{where}: {len(self.completions)} completions but {len(self.texts)} "
                                   f"texts and {len(self.byte_lengths)} byte-length arrays")
            masks = self.sampled_masks or [None] * len(self.completions)
            for i, (ids, text, lengths, mask) in enumerate(zip(self.completions, self.texts, self.byte_lengths, masks)):
                why = text_fault(text, np.asarray(lengths), len(ids), None if mask is None else span_ends(mask))
                if why:
                    raise PayloadError(f"{where}: completion {i}: {why}")
        if (self.tool_format is None) != (self.tool_layout is None):
            raise PayloadError(f"{where}: tool_format and tool_layout come together or not at all")
        if self.tool_format is not None:
            if self.texts is None:
                raise PayloadError(f"{where}: tool_format and tool_layout come only with the episodes' texts")
            why = tools_fault(self.tool_format, self.tool_layout)
            if why:
                raise PayloadError(f"{where}: {why}")


def span_ends(mask: np.ndarray) -> np.ndarray:
    """Per token of an episode: whether it is the last token of a sampled span (a model turn), the
    only tokens of an episode's text that may cover no bytes (the turn's end-of-turn token)."""
    mask = np.asarray(mask).astype(bool)
    nxt = np.append(mask[1:], False)
    return mask & ~nxt


def mask_fault(mask: np.ndarray, logprobs: np.ndarray) -> str:
    """Why one episode's sampled mask breaks the wire rules, or "" when it meets them: one 0/1
    entry per token; the first and the last token are the model's (an episode starts with the
    model's turn and ends with one: context after the last turn conditions nothing); the log-prob
    of every token the model did not sample is exactly 0.0 (a mask that lies about a sampled token
    would hide its log-prob from the loss; one that lies about a context token shows a number the
    sender did not sample)."""
    if mask.ndim != 1 or mask.dtype.kind not in "biu" or len(mask) != len(logprobs):
        return f"sampled mask must be a 1-D 0/1 array of {len(logprobs)} entries (one per token)"
    if len(mask) and ((mask != 0) & (mask != 1)).any():
        return f"sampled mask holds {int(mask[(mask != 0) & (mask != 1)][0])} (only 0 and 1)"
    if not len(mask) or not mask[0] or not mask[-1]:
        return "its first and last tokens must be sampled (an episode starts and ends with the model's turn)"
    context = np.asarray(logprobs)[mask == 0]
    if (context != 0).any():
        pos = int(np.flatnonzero((mask == 0) & (np.asarray(logprobs) != 0))[0])
        return (f"token {pos} is not sampled but has log-prob {float(logprobs[pos])} (context tokens "
                "carry exactly 0.0)")
    return ""


def text_fault(text: bytes, lengths: np.ndarray, n_tokens: int, turn_ends: np.ndarray | None = None) -> str:
    """Why one completion's text and byte lengths break the wire rules (``Group.byte_lengths``),
    or "" when they meet them. Only an end-of-turn token covers no bytes: the last token, or in an
    episode the last token of each sampled span (``turn_ends``, :func:`span_ends`)."""
    if not isinstance(text, (bytes, bytearray)):
        return f"text must be bytes, got {type(text).__name__}"
    if lengths.ndim != 1 or lengths.dtype.kind not in "iu" or len(lengths) != n_tokens:
        return f"byte lengths must be a 1-D integer array of {n_tokens} (one per token)"
    may_be_empty = np.zeros(n_tokens, bool)
    may_be_empty[-1:] = True
    if turn_ends is not None and len(turn_ends) == n_tokens:
        may_be_empty |= np.asarray(turn_ends, bool)
    if (lengths < 0).any():
        return f"token {int(np.argmax(lengths < 0))} covers {int(lengths.min())} bytes"
    empty = (lengths == 0) & ~may_be_empty
    if empty.any():
        return (f"token {int(np.argmax(empty))} covers 0 bytes (only a model turn's end-of-turn token "
                "covers none)")
    if int(lengths.sum()) != len(text):
        return f"byte lengths add up to {int(lengths.sum())}, the text has {len(text)} bytes"
    try:
        bytes(text).decode("utf-8")
    except UnicodeDecodeError as e:
        return f"text is not valid UTF-8 ({e.reason} at byte {e.start})"
    return ""


def _check_ids(ids: np.ndarray, vocab_size: int | None, where: str) -> None:
    ids = np.asarray(ids)
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise PayloadError(f"{where}: token ids must be a 1-D integer array")
    if len(ids) == 0:
        raise PayloadError(f"{where}: has no tokens (at least one is required)")
    if ids.min() < 0 or (vocab_size is not None and ids.max() >= vocab_size):
        raise PayloadError(
            f"{where}: token id out of range [0, {vocab_size}): min {ids.min()}, max {ids.max()}"
        )


def _first_bad_logprob(lps: np.ndarray) -> tuple[int, str] | None:
    """(position, fault) of the first non-finite or positive log-prob, else None."""
    bad = ~np.isfinite(lps) | (lps > LOGPROB_TOLERANCE)
    if not bad.any():
        return None
    pos = int(np.argmax(bad))
    value = float(lps[pos])
    kind = "non-finite" if not np.isfinite(value) else f"positive (> {LOGPROB_TOLERANCE})"
    return pos, f"log-prob {value} is {kind}"


def tokenizer_fingerprint(tokenizer) -> str:
    """Short hex hash of the vocabulary and special tokens: equal iff ids mean the same text.

    Covers token->id (sorted, added tokens included) and the bos/eos/pad/unk ids and strings,
    because a receiver scores and trains on received ids with its own tokenizer.
    """
    vocab = sorted((str(tok), int(idx)) for tok, idx in tokenizer.get_vocab().items())
    special = {
        f"{name}{suffix}": getattr(tokenizer, f"{name}{suffix}", None)
        for name in ("bos", "eos", "pad", "unk")
        for suffix in ("_token", "_token_id")
    }
    blob = json.dumps({"vocab": vocab, "special": special}, ensure_ascii=True, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def groups_by_node(groups: list[Group]) -> dict[str, list[Group]]:
    """Groups keyed by generator node, order kept (for redistribution and per-source stats)."""
    out: dict[str, list[Group]] = {}
    for g in groups:
        out.setdefault(g.node, []).append(g)
    return out
