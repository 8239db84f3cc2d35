"""Wire format 2 ("compact"): one byte container per payload (issue #9).

Why: format 1 ships seven npy arrays plus per-group string lists, so on short completions the
headers and the strings cost more than the tokens (13.5 B/token in the offline default's runs).
Here everything is one little-endian byte string: a fixed 44-byte header, then byte-aligned
sections whose sizes all follow from the header, so a receiver checks the declared counts against
its caps and the exact container length *before* it unpacks (or decompresses) anything.

Header (``<4sBBBB9I``): magic ``FTWC``, version 2, flags (bits 0-1 log-prob codec: 0 fp32,
1 fp16, 2 bf16; bit 2 body zlib-compressed), ``id_bits`` (bits per token id), 0; then groups,
completions, completion tokens, prompt tokens, strings, string bytes, reward palette size
(0 = raw fp32 rewards), body bytes (uncompressed), and one word of four bit widths (prompt
length, group size, completion length, string length).

Body sections, in order, each padded to a whole byte (padding bits must be 0): string lengths;
UTF-8 string table (each distinct string once); per group 4 indices into it (prompt_id, node,
model_id, tokenizer_fp); prompt lengths; group sizes; completion lengths; prompt ids; completion
ids (all bit-packed, most significant bit first); log-probs (4 or 2 bytes each); rewards (fp32
each, or a palette of distinct fp32 values plus bit-packed indices: lossless, and 0/1 rewards
cost a bit each). With the zlib flag (set by a sender only where the stream is smaller) the body after the
header is one zlib stream, which is
inflated to at most the declared body size (itself capped) and must end exactly there.

Text (flag bit 3, cross-tokenizer F-TIS: for receivers with another tokenizer): an 8-byte
extension after the header (``<2I``: text bytes, bits per byte length), and two more body
sections after the rewards: each completion token's byte length (bit-packed; a final
end-of-turn token's is 0) and the completions' UTF-8 texts, concatenated (each completion's
share is the sum of its tokens' lengths).

Sampled masks (flag bit 4, episodes: algorithm §13): a 4-byte extension after the header and the
text extension (``<I``: how many tokens the model sampled), one more body section at the end (a
bit per completion token, 1 = sampled), and the log-prob section holds the sampled tokens' only:
the context between turns (tool results, template markers) has log-prob 0 by definition, so it
costs its ids and a bit per token.

Tool turns (flag bit 5, episodes with texts): each group has 6 string indices instead of 4, the
last two its sender's tool-call format and tool-turn layout (:mod:`ftis_flwr.wire.tool_turns`).

This module is pure bytes <-> :class:`Fields`; the semantic checks (offsets, vocabulary, log-prob
signs, caps per group) are format-independent and live in :mod:`ftis_flwr.wire.rollouts`.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import numpy as np

from ftis_flwr.config.choices import COMPRESSORS, Compressor  # noqa: F401 (implemented here)
from ftis_flwr.config.schema import WireConfig
from ftis_flwr.wire.bits import (  # noqa: F401 (re-exported: the container's numbers)
    _LP_WIRE,
    LP_CODECS,
    bf16_bits,
    bf16_to_fp32,
    bits_for,
    decode_logprobs,
    encode_logprobs,
    pack_bits,
    packed_len,
    unpack_bits,
)
from ftis_flwr.wire.groups import PayloadError

MAGIC = b"FTWC"
VERSION = 2
HEADER = struct.Struct("<4sBBBB9I")
STR_KEYS = ("prompt_id", "node", "model_id", "tokenizer_fp")
TOOL_KEYS = ("tool_format", "tool_layout")
"""Episodes with texts (flag ``_TOOLS``): two more strings per group, the sender's tool-call format
and tool-turn layout (:mod:`ftis_flwr.wire.tool_turns`)."""
_ZLIB = 4
_TEXT = 8
_MASK = 16
_TOOLS = 32
MASK_EXT = struct.Struct("<I")
"""The sampled-mask extension after the header (and the text extension): sampled tokens."""
EXT = struct.Struct("<2I")
"""The text extension after the header: text bytes, bits per token byte length."""
_MAX_WIDTH = 32
_MAX_ID_BITS = 31  # int32 ids, as format 1


@dataclass
class Fields:
    """A payload's content, structurally read but not yet checked (both formats decode to this).

    Token ids and offsets are int64, log-probs float32 (decoded from their wire codec), rewards
    float32; ``strings[key]`` has one str per group for each of :data:`STR_KEYS` (and of
    :data:`TOOL_KEYS` when the payload's episodes carry them).
    """

    strings: dict[str, list[str]]
    prompt_ids: np.ndarray
    prompt_offsets: np.ndarray
    completion_ids: np.ndarray
    completion_offsets: np.ndarray
    group_offsets: np.ndarray
    logprobs: np.ndarray
    rewards: np.ndarray
    text: np.ndarray | None = None
    """uint8: the completions' texts, concatenated (cross-tokenizer payloads only)."""
    byte_lengths: np.ndarray | None = None
    """int64, one per completion token: the bytes of the text it covers (with ``text``)."""
    sampled: np.ndarray | None = None
    """uint8, one per completion token: 1 where the model sampled it, 0 on an episode's context
    (``logprobs`` there are 0); None: every token was sampled (single-turn groups)."""


# ---- container -----------------------------------------------------------------------------------


def _widths_word(widths: tuple[int, int, int, int]) -> int:
    return widths[0] | widths[1] << 8 | widths[2] << 16 | widths[3] << 24


def _section_sizes(h: dict) -> list[tuple[str, int]]:
    """(section, bytes) of the body in order, computed from the header alone."""
    n, c, t, p, s = h["groups"], h["completions"], h["tokens"], h["prompt_tokens"], h["strings"]
    wp, wg, wc, ws = h["widths"]
    k = h["palette"]
    return [
        ("string lengths", packed_len(s, ws)),
        ("string table", h["string_bytes"]),
        ("string indices", packed_len(len(str_keys(h["tools"])) * n, bits_for(max(s - 1, 0)))),
        ("prompt lengths", packed_len(n, wp)),
        ("group sizes", packed_len(n, wg)),
        ("completion lengths", packed_len(c, wc)),
        ("prompt ids", packed_len(p, h["id_bits"])),
        ("completion ids", packed_len(t, h["id_bits"])),
        ("log-probs", (h["sampled"] if h["mask"] else t) * _LP_WIRE[h["codec"]].itemsize),
        ("rewards", 4 * k + packed_len(c, bits_for(max(k - 1, 0))) if k else 4 * c),
    ] + ([("byte lengths", packed_len(t, h["length_bits"])), ("text", h["text_bytes"])]
         if h["text"] else []) + ([("sampled mask", packed_len(t, 1))] if h["mask"] else [])


def str_keys(tools: bool) -> tuple[str, ...]:
    """The strings each group carries: :data:`STR_KEYS`, and :data:`TOOL_KEYS` with ``tools``."""
    return STR_KEYS + TOOL_KEYS if tools else STR_KEYS


def pack(fields: Fields, *, id_bits: int, codec: str = "fp32", compress: str = "none",
         level: int = 6, check_range: bool = False) -> bytes:
    """Fields -> container bytes. No semantic checks: callers validate groups first (a forger may
    call this directly, which is why the receiver checks everything); ``check_range``: refuse
    log-probs the 16-bit codec cannot hold. ``compress="zlib"`` sets the flag only when the
    stream is smaller than the body."""
    if codec not in LP_CODECS:
        raise ValueError(f"logprob_dtype must be one of {LP_CODECS}, got {codec!r}")
    if compress not in COMPRESSORS:
        raise ValueError(f"wire.compress must be one of {COMPRESSORS}, got {compress!r}")
    n = len(fields.group_offsets) - 1
    tools = all(key in fields.strings for key in TOOL_KEYS)
    keys = str_keys(tools)
    table: dict[str, int] = {}
    for g in range(n):
        for key in keys:
            table.setdefault(fields.strings[key][g], len(table))
    encoded = [s.encode("utf-8") for s in table]
    str_lens = np.array([len(b) for b in encoded], np.int64)
    indices = np.array([table[fields.strings[key][g]] for g in range(n) for key in keys], np.int64)
    plen = np.diff(fields.prompt_offsets)
    gsize = np.diff(fields.group_offsets)
    clen = np.diff(fields.completion_offsets)
    widths = tuple(bits_for(int(a.max()) if len(a) else 0) for a in (plen, gsize, clen, str_lens))
    rewards = np.asarray(fields.rewards, np.float32)
    palette, idx = np.unique(rewards.view(np.uint32), return_inverse=True)
    k = len(palette)
    palette_cost = 4 * k + packed_len(len(rewards), bits_for(max(k - 1, 0)))
    use_palette = 0 < k and palette_cost < 4 * len(rewards)
    if use_palette:
        reward_bytes = palette.astype("<u4").tobytes() + pack_bits(idx, bits_for(max(k - 1, 0)))
    else:
        reward_bytes = rewards.astype("<f4").tobytes()
    flat_lp = np.asarray(fields.logprobs, np.float32)
    sampled = None if fields.sampled is None else np.asarray(fields.sampled).astype(bool)
    if sampled is not None:  # context tokens' log-probs are 0 by definition: not sent
        flat_lp = flat_lp[sampled]
    lp = encode_logprobs(flat_lp, codec, check=check_range)
    lp = lp.astype(_LP_WIRE[codec])
    body = b"".join([
        pack_bits(str_lens, widths[3]),
        b"".join(encoded),
        pack_bits(indices, bits_for(max(len(table) - 1, 0))),
        pack_bits(plen, widths[0]),
        pack_bits(gsize, widths[1]),
        pack_bits(clen, widths[2]),
        pack_bits(fields.prompt_ids, id_bits),
        pack_bits(fields.completion_ids, id_bits),
        lp.tobytes(),
        reward_bytes,
    ])
    ext = b""
    if fields.text is not None:
        lengths = np.asarray(fields.byte_lengths, np.int64)
        length_bits = bits_for(int(lengths.max()) if len(lengths) else 0)
        text = np.asarray(fields.text, np.uint8).tobytes()
        ext = EXT.pack(len(text), length_bits)
        body += pack_bits(lengths, length_bits) + text
    if sampled is not None:
        ext += MASK_EXT.pack(int(sampled.sum()))
        body += pack_bits(sampled.astype(np.int64), 1)
    packed = zlib.compress(body, level) if compress == Compressor.ZLIB else body
    if len(packed) >= len(body):  # zlib only where it pays: tiny or random bodies go as they are
        packed = body
    flags = (LP_CODECS.index(codec) | (_ZLIB if packed is not body else 0)
             | (_TEXT if fields.text is not None else 0) | (_MASK if sampled is not None else 0)
             | (_TOOLS if tools else 0))
    header = HEADER.pack(MAGIC, VERSION, flags, id_bits, 0, n, len(clen),
                         len(fields.completion_ids), len(fields.prompt_ids), len(table),
                         int(str_lens.sum()), k if use_palette else 0, len(body),
                         _widths_word(widths))
    return header + ext + packed


def read_header(buf: bytes | memoryview) -> dict:
    """The header's fields (nothing else read); PayloadError if it is short or not format 2."""
    if len(buf) < HEADER.size:
        raise PayloadError(f"compact payload: {len(buf)} bytes, shorter than its "
                           f"{HEADER.size}-byte header")
    (magic, version, flags, id_bits, zero, n, c, t, p, s, sb, k, body,
     widths) = HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise PayloadError(f"compact payload: magic {magic!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise PayloadError(f"compact payload: version {version}, this receiver reads {VERSION}")
    if flags & ~(_ZLIB | _TEXT | _MASK | _TOOLS | 3) or (flags & 3) >= len(LP_CODECS) or zero:
        raise PayloadError(f"compact payload: unknown flags {flags:#04x} / reserved byte {zero}")
    w = tuple((widths >> sh) & 0xFF for sh in (0, 8, 16, 24))
    if id_bits > _MAX_ID_BITS or max(w) > _MAX_WIDTH:
        raise PayloadError(f"compact payload: bit widths {id_bits} (ids) / {w} exceed "
                           f"{_MAX_ID_BITS} / {_MAX_WIDTH}")
    text_bytes, length_bits, sampled, at = 0, 0, 0, HEADER.size
    for flag, ext, what in ((_TEXT, EXT, "text"), (_MASK, MASK_EXT, "sampled-mask")):
        if flags & flag and len(buf) < at + ext.size:
            raise PayloadError(f"compact payload: {len(buf)} bytes, shorter than its header and "
                               f"{ext.size}-byte {what} extension")
    if flags & _TEXT:
        text_bytes, length_bits = EXT.unpack_from(buf, at)
        at += EXT.size
        if length_bits > _MAX_WIDTH:
            raise PayloadError(f"compact payload: {length_bits} bits per byte length exceed {_MAX_WIDTH}")
    if flags & _MASK:
        (sampled,) = MASK_EXT.unpack_from(buf, at)
        at += MASK_EXT.size
        if sampled > t:
            raise PayloadError(f"compact payload: {sampled} sampled tokens of {t}")
    return {"codec": LP_CODECS[flags & 3], "zlib": bool(flags & _ZLIB), "id_bits": id_bits,
            "groups": n, "completions": c, "tokens": t, "prompt_tokens": p, "strings": s,
            "string_bytes": sb, "palette": k, "body_bytes": body, "widths": w,
            "text": bool(flags & _TEXT), "text_bytes": text_bytes, "length_bits": length_bits,
            "mask": bool(flags & _MASK), "sampled": sampled, "tools": bool(flags & _TOOLS), "header_bytes": at}


def check_token_cap(tokens: int, wire: WireConfig) -> None:
    if tokens > wire.max_tokens_per_payload:
        raise PayloadError(f"{tokens} completion tokens exceed wire.max_tokens_per_payload="
                           f"{wire.max_tokens_per_payload}")


def check_caps(h: dict, container_bytes: int, wire: WireConfig) -> None:
    """Declared counts and sizes against the receiver's caps: before anything is allocated."""
    if container_bytes > wire.max_payload_bytes or h["body_bytes"] > wire.max_payload_bytes:
        raise PayloadError(f"compact payload: {max(container_bytes, h['body_bytes'])} bytes "
                           f"exceed wire.max_payload_bytes={wire.max_payload_bytes}")
    if h["groups"] > wire.max_groups:
        raise PayloadError(f"{h['groups']} groups exceed wire.max_groups={wire.max_groups}")
    check_token_cap(h["tokens"], wire)
    if h["completions"] > h["groups"] * wire.max_completions_per_group:
        raise PayloadError(f"compact payload: {h['completions']} completions in {h['groups']} "
                           f"groups exceed wire.max_completions_per_group="
                           f"{wire.max_completions_per_group} per group")
    per = len(str_keys(h["tools"]))
    if h["strings"] > per * h["groups"]:
        raise PayloadError(f"compact payload: {h['strings']} strings for {h['groups']} groups "
                           f"(at most {per} per group)")
    if h["palette"] > h["completions"]:
        raise PayloadError(f"compact payload: reward palette of {h['palette']} values for "
                           f"{h['completions']} completions")


def unpack(buf: bytes | memoryview, wire: WireConfig) -> Fields:
    """Container bytes -> Fields, checking structure only; PayloadError naming the fault."""
    buf = memoryview(buf)
    h = read_header(buf)
    check_caps(h, len(buf), wire)
    sizes = _section_sizes(h)
    expected = sum(size for _, size in sizes)
    if h["body_bytes"] != expected:
        raise PayloadError(f"compact payload: header declares a {h['body_bytes']}-byte body, its "
                           f"counts need {expected}")
    rest = buf[h["header_bytes"] :]
    if h["zlib"]:
        body = _inflate(rest, expected)
    elif len(rest) != expected:
        kind = "truncated" if len(rest) < expected else "trailing bytes"
        raise PayloadError(f"compact payload: body is {len(rest)} bytes, the header's counts need "
                           f"{expected} ({kind})")
    else:
        body = rest
    sec, at = {}, 0
    for name, size in sizes:
        sec[name] = body[at : at + size]
        at += size
    wp, wg, wc, ws = h["widths"]
    n, c, t, p = h["groups"], h["completions"], h["tokens"], h["prompt_tokens"]
    str_lens = unpack_bits(sec["string lengths"], h["strings"], ws, "string lengths")
    if int(str_lens.sum()) != h["string_bytes"]:
        raise PayloadError(f"compact payload: string lengths sum to {int(str_lens.sum())}, the "
                           f"table holds {h['string_bytes']} bytes")
    table_bytes, strings, at = bytes(sec["string table"]), [], 0
    for i, size in enumerate(str_lens.tolist()):
        if size == 0:
            raise PayloadError(f"compact payload: string {i} is empty")
        try:
            strings.append(table_bytes[at : at + size].decode("utf-8"))
        except UnicodeDecodeError as e:
            raise PayloadError(f"compact payload: string {i} is not UTF-8 ({e.reason})") from None
        at += size
    keys = str_keys(h["tools"])
    idx = unpack_bits(sec["string indices"], len(keys) * n, bits_for(max(h["strings"] - 1, 0)),
                      "string indices")
    if n and idx.max() >= h["strings"]:
        g = int(np.argmax(idx >= h["strings"])) // len(keys)
        raise PayloadError(f"compact payload: group {g} names string {int(idx.max())}, the table "
                           f"has {h['strings']}")
    per_group = idx.reshape(n, len(keys))
    fields_str = {key: [strings[i] for i in per_group[:, j].tolist()]
                  for j, key in enumerate(keys)}
    plen = unpack_bits(sec["prompt lengths"], n, wp, "prompt lengths")
    gsize = unpack_bits(sec["group sizes"], n, wg, "group sizes")
    clen = unpack_bits(sec["completion lengths"], c, wc, "completion lengths")
    prompt_ids = unpack_bits(sec["prompt ids"], p, h["id_bits"], "prompt ids")
    completion_ids = unpack_bits(sec["completion ids"], t, h["id_bits"], "completion ids")
    lp_wire = np.frombuffer(sec["log-probs"], _LP_WIRE[h["codec"]])
    logprobs = decode_logprobs(lp_wire.astype(lp_wire.dtype.newbyteorder("=")), h["codec"])
    sampled = None
    if h["mask"]:
        sampled = unpack_bits(sec["sampled mask"], t, 1, "sampled mask").astype(np.uint8)
        if int(sampled.sum()) != h["sampled"]:
            raise PayloadError(f"compact payload: the sampled mask marks {int(sampled.sum())} tokens, the "
                               f"header declares {h['sampled']}")
        full = np.zeros(t, np.float32)
        full[sampled.astype(bool)] = logprobs
        logprobs = full
    k = h["palette"]
    if k:
        palette = np.frombuffer(sec["rewards"][: 4 * k], "<u4").astype(np.uint32)
        ridx = unpack_bits(sec["rewards"][4 * k :], c, bits_for(k - 1), "rewards")
        if c and ridx.max() >= k:
            raise PayloadError(f"compact payload: completion {int(np.argmax(ridx >= k))} names "
                               f"reward {int(ridx.max())}, the palette has {k}")
        rewards = palette[ridx].view(np.float32)
    else:
        rewards = np.frombuffer(sec["rewards"], "<f4").astype(np.float32)
    text = byte_lengths = None
    if h["text"]:
        byte_lengths = unpack_bits(sec["byte lengths"], t, h["length_bits"], "byte lengths")
        text = np.frombuffer(sec["text"], np.uint8)
    return Fields(strings=fields_str, prompt_ids=prompt_ids, prompt_offsets=offsets(plen),
                  completion_ids=completion_ids, completion_offsets=offsets(clen),
                  group_offsets=offsets(gsize), logprobs=logprobs, rewards=rewards,
                  text=text, byte_lengths=byte_lengths, sampled=sampled)


def offsets(lengths) -> np.ndarray:
    """[0, l0, l0+l1, ...] as int64."""
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def flat(parts: list[np.ndarray], dtype) -> np.ndarray:
    return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype=dtype)


def _inflate(data: memoryview, expected: int) -> bytes:
    """zlib body of exactly ``expected`` bytes (already capped), never inflating past it."""
    d = zlib.decompressobj()
    try:
        body = d.decompress(data, expected)
        if len(body) == expected and not d.eof:  # a stream that would inflate further
            body += d.decompress(d.unconsumed_tail, 1)
    except zlib.error as e:
        raise PayloadError(f"compact payload: zlib body is corrupt ({e})") from None
    if len(body) != expected or not d.eof:
        raise PayloadError(f"compact payload: zlib body inflates to {len(body)}"
                           f"{'+' if len(body) >= expected else ''} bytes (not a complete stream "
                           f"of the declared {expected})")
    if d.unused_data or d.unconsumed_tail:
        raise PayloadError(f"compact payload: {len(d.unused_data) + len(d.unconsumed_tail)} "
                           "trailing bytes after the zlib body")
    return body
