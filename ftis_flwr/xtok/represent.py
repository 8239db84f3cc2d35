"""Whether a receiver's own tokens stand for exactly a received completion's bytes (cross-tokenizer
F-TIS, the receiver's side).

Why: an importance weight compares two probabilities of *one* text. A receiver's tokenizer may
turn the text into tokens for another text: an unknown-token fallback (``<unk>`` for a letter
outside its vocabulary), a normaliser (NFC, lower-casing), a space it prepends, a special-token
string in the text read as a control token. Offsets alone do not show it (``<unk>`` has a span
too). So every received completion is encoded as a *continuation* (no prepended space, special
tokens split into plain text: a peer's text is data, never markup), the bytes of the resulting
tokens are rebuilt from the receiver's vocabulary (:func:`ftis_flwr.xtok.token_bytes.token_bytes`,
the reader the sender uses for its byte lengths) and compared with the completion's bytes; the
tokens must tile them, each covering at least one byte. A completion that fails is refused with
one of :data:`REASONS`, counted per source; the group's other completions are judged one by one.
"""

from __future__ import annotations

import json
import weakref

import numpy as np

from ftis_flwr.xtok.token_bytes import TokenBytesError, token_bytes

REASONS = {
    "unknown_token": "the receiver's tokenizer has no token for some of its characters (unknown-token fallback)",
    "normalised": "the receiver's tokenizer normalises the text (its tokens stand for other bytes)",
    "prepended_space": "the receiver's tokenizer prepends a space it cannot be told to leave out",
    "special_token": "a special token of the receiver's stood for part of the text",
    "bytes_differ": "the receiver's tokens stand for other bytes than the text",
    "empty_token": "a receiver token stands for no bytes",
    "unreadable": "the bytes of a receiver token cannot be read from its vocabulary",
    "unaligned": "the sender's byte lengths and the receiver's tokens could not be aligned",
    "too_long": "in the receiver's tokens it is longer than wire.max_tokens_per_completion",
}
"""Why a completion's text is not represented by the receiver's tokens: slug -> meaning. The slugs
name the metrics (``<source>/text_refused_<slug>``) and the summary's rows."""

PROBES = {
    "unknown_token": "Zebra QUIZ: ~ {x} ∑ ☃",
    "normalised": "cafe\u0301 Ａ ﬁ",
    "prepended_space": "word",
}
"""Texts that show each limit of a tokenizer at the start of a run (:func:`text_limits`)."""


class Unrepresentable(ValueError):
    """The receiver's tokens cannot stand for a text's bytes; ``reason`` is a key of :data:`REASONS`."""

    def __init__(self, reason: str, detail: str = ""):
        self.reason = reason
        super().__init__(REASONS[reason] + (f": {detail}" if detail else ""))


_CONTINUATION: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _no_prepend(node) -> None:
    """Turn off, in place, every rule of a tokenizer.json part that prepends a space."""
    if isinstance(node, list):
        for x in node:
            _no_prepend(x)
        return
    if not isinstance(node, dict):
        return
    if node.get("type") == "Metaspace":
        node["prepend_scheme"] = "never"
        node.pop("add_prefix_space", None)
    if node.get("type") == "ByteLevel":
        node["add_prefix_space"] = False
    for key in ("pretokenizers", "normalizers"):
        if isinstance(node.get(key), list):
            node[key] = [x for x in node[key] if not (isinstance(x, dict) and x.get("type") == "Prepend")]
            _no_prepend(node[key])


def continuation_encoder(tokenizer):
    """(encoder, unknown ids): the receiver's backend tokenizer as a continuation encoder, built
    once per tokenizer (no space prepended, no BOS/EOS added, special-token strings split into
    plain tokens), and the ids its model falls back to for text it has no token for."""
    enc = _CONTINUATION.get(tokenizer)
    if enc is None:
        from tokenizers import Tokenizer

        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise TokenBytesError(f"{type(tokenizer).__name__} is not a fast tokenizer")
        spec = json.loads(backend.to_str())
        if spec.get("normalizer") and spec["normalizer"].get("type") == "Prepend":
            spec["normalizer"] = None
        for part in ("normalizer", "pre_tokenizer"):
            _no_prepend(spec.get(part))
        enc = Tokenizer.from_str(json.dumps(spec))
        enc.encode_special_tokens = True
        enc.no_truncation()
        enc.no_padding()
        enc_unk = _unknown_ids(spec, enc) | {getattr(tokenizer, "unk_token_id", None)} - {None}
        _CONTINUATION[tokenizer] = enc = (enc, enc_unk)
    return enc


def _unknown_ids(spec: dict, enc) -> set[int]:
    """The id(s) the backend model falls back to for text it has no token for."""
    model = spec.get("model") or {}
    if isinstance(model.get("unk_id"), int):  # Unigram
        return {model["unk_id"]}
    token = model.get("unk_token")
    found = enc.token_to_id(token) if isinstance(token, str) else None
    return set() if found is None else {int(found)}


def _reason(tokenizer, text: str, ids: np.ndarray, pieces: list[bytes]) -> Unrepresentable:
    enc, unknown = continuation_encoder(tokenizer)
    hits = int(np.isin(ids, list(unknown)).sum()) if unknown else 0
    if hits:
        return Unrepresentable("unknown_token", f"{hits} unknown-token fallback(s)")
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    if any(int(i) in special for i in ids):
        return Unrepresentable("special_token")
    norm = enc.normalizer  # a metaspace Replace(" ", "▁") changes nothing
    if norm is not None and norm.normalize_str(text).replace("▁", " ") != text.replace("▁", " "):
        return Unrepresentable("normalised")
    joined = b"".join(pieces)
    if joined == b" " + text.encode("utf-8"):
        return Unrepresentable("prepended_space")
    if not all(pieces) and joined == text.encode("utf-8"):
        return Unrepresentable("empty_token", f"token {int(ids[[not p for p in pieces].index(True)])}")
    return Unrepresentable("bytes_differ", f"{len(joined)} bytes for a {len(text.encode('utf-8'))}-byte text")


def encode_exact(tokenizer, text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The receiver's tokens of ``text`` and their UTF-8 byte spans [start, end), which tile the
    text's bytes exactly; :class:`Unrepresentable` (with its reason) when they cannot."""
    enc, unknown = continuation_encoder(tokenizer)
    ids = np.asarray(enc.encode(text, add_special_tokens=False).ids, np.int64)
    try:
        pieces = token_bytes(tokenizer, ids)
    except TokenBytesError as exc:
        raise Unrepresentable("unreadable", str(exc)) from None
    if b"".join(pieces) != text.encode("utf-8") or not all(pieces) or (unknown and np.isin(ids, list(unknown)).any()):
        raise _reason(tokenizer, text, ids, pieces)
    ends = np.cumsum([len(p) for p in pieces]).astype(np.int64)
    return ids, ends - np.asarray([len(p) for p in pieces], np.int64), ends


def text_limits(tokenizer) -> dict[str, str]:
    """What this tokenizer will refuse as a receiver: reason -> an example text it refuses, for
    each of :data:`PROBES` (empty: it stands for any text)."""
    out = {}
    for probe in PROBES.values():
        try:
            encode_exact(tokenizer, probe)
        except Unrepresentable as exc:
            out.setdefault(exc.reason, probe)
    return out


def describe_limits(limits: dict[str, str]) -> str:
    """One line for the server's log: each limit's meaning and the example it refused."""
    return "; ".join(f"{REASONS[r]} (e.g. {text!r})" for r, text in limits.items())
