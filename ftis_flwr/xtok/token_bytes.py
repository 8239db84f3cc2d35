"""The UTF-8 bytes each of a node's own tokens stands for (cross-tokenizer F-TIS, the sender's side).

Why: a receiver with another tokenizer aligns the sender's tokens with its own by byte positions
(:mod:`ftis_flwr.xtok.align`), so the sender must say how many bytes of the completion text each token
it *generated* covers. Decoding and re-encoding would not do: text can re-tokenize differently than
it was sampled, and a token may hold part of a multi-byte character. So each token's bytes are
read from the tokenizer's own vocabulary, by the rules of its decoder (``tokenizer.json``):
byte-level BPE (GPT-2's byte-to-unicode table: SmolLM2, Llama 3, Qwen), SentencePiece-style
metaspace (``▁`` is a space) with byte fallback (``<0x0A>``), and plain pieces (the char-level
tokenizer). Special tokens stand for no text (an end of turn travels as a flag).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache

import numpy as np

from ftis_flwr.wire.groups import span_ends

BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class TokenBytesError(ValueError):
    """A tokenizer whose tokens' bytes cannot be read; the message names what is missing."""


@lru_cache(maxsize=1)
def _byte_level_table() -> dict[str, int]:
    """GPT-2's printable stand-in character of each byte, inverted (char -> byte)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, n = keep[:], 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars)}


def _decoder_kinds(tokenizer) -> set[str]:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise TokenBytesError(f"{type(tokenizer).__name__} is not a fast tokenizer: its tokens' bytes "
                              "cannot be read")
    decoder = backend.decoder  # its own JSON only (the whole tokenizer's can be megabytes)
    decoder = json.loads(decoder.__getstate__()) if decoder is not None else {}
    kinds, todo = set(), [decoder]
    while todo:
        d = todo.pop()
        kinds.add(str(d.get("type", "")))
        todo += d.get("decoders") or []
        if d.get("type") == "Replace" and (d.get("pattern") or {}).get("String") == "▁":
            kinds.add("Metaspace")
    return kinds


def token_bytes(tokenizer, ids, *, specials: str = "empty") -> list[bytes]:
    """The bytes of each token in ``ids``: b"" for special tokens, or their own text
    (``specials="content"``, e.g. ``<|im_start|>``: what a decode without skipping them shows)."""
    kinds = _decoder_kinds(tokenizer)
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    pieces = tokenizer.convert_ids_to_tokens([int(i) for i in ids])
    table = _byte_level_table() if "ByteLevel" in kinds else None
    out = []
    for i, piece in zip(ids, pieces):
        if piece is None:
            out.append(b"")
        elif int(i) in special:
            out.append(piece.encode("utf-8") if specials == "content" else b"")
        elif table is not None:
            try:
                out.append(bytes(table[ch] for ch in piece))
            except KeyError as exc:
                raise TokenBytesError(f"token {int(i)} ({piece!r}) has a character outside the byte-level "
                                      f"table: {exc}") from None
        elif "ByteFallback" in kinds and BYTE_PIECE.fullmatch(piece):
            out.append(bytes([int(BYTE_PIECE.fullmatch(piece).group(1), 16)]))
        elif "Metaspace" in kinds:
            out.append(piece.replace("▁", " ").encode("utf-8"))
        else:
            out.append(piece.encode("utf-8"))
    return out


def completion_text(tokenizer, ids, stop_ids, sampled=None) -> tuple[bytes, np.ndarray]:
    """(text, byte lengths) a sender puts on the wire for one generated completion
    (``Group.texts`` / ``Group.byte_lengths``): a final token in ``stop_ids`` is the end of the
    turn and covers 0 bytes; a special token inside the completion stands for its own text.
    ``sampled``: an episode's sampled mask (``Group.sampled_masks``): the end-of-turn token that
    closes each sampled span covers 0 bytes, and the tool turns' tokens their own text.
    TokenBytesError when some other token covers no byte (it could not be aligned)."""
    ids = [int(i) for i in ids]
    stops = {int(i) for i in stop_ids}
    ends = ([len(ids) - 1] if ids else []) if sampled is None else np.flatnonzero(span_ends(sampled)).tolist()
    closing = {k for k in ends if ids[k] in stops}  # a span cut by its cap has no end-of-turn token
    pieces = token_bytes(tokenizer, ids, specials="content")
    pieces = [b"" if k in closing else p for k, p in enumerate(pieces)]
    empty = [k for k, p in enumerate(pieces) if not p and k not in closing]
    if empty:
        raise TokenBytesError(f"token {ids[empty[0]]} at position {empty[0]} stands for no text")
    return b"".join(pieces), np.asarray([len(p) for p in pieces], np.int64)
