"""The wire codec of groups to Flower records (algorithm §1; docs/performance.md#wire-cost).

Only tokens, per-token generator log-probs and small metadata cross the network. Two formats,
chosen by the sender's ``wire.format``; a receiver reads both (a federation can switch format
one node at a time, and a resumed run may forward groups saved in the older one):

- ``compact`` (format 2, default): one uint8 array ``wire`` holding a byte container
  (:mod:`ftis_flwr.wire.compact`: bit-packed ids, packed lengths, one string table, optional
  zlib) and an empty ``ConfigRecord``.
- ``arrays`` (format 1): flat arrays plus offsets in an ``ArrayRecord``, per-group strings in
  a ``ConfigRecord`` (:mod:`ftis_flwr.wire.arrays`).

Both decode to the same fields, and one set of checks runs on them: the receiver validates
*everything* before building a single ``Group``, so a malformed or hostile payload is rejected
loudly (``PayloadError``) and never half-decoded.

The rules a group must meet are :class:`ftis_flwr.wire.groups.Group`'s; this module only encodes
and decodes (with :mod:`ftis_flwr.wire.arrays`, the one place that imports Flower's records).
"""

from __future__ import annotations

from io import BytesIO

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord

from ftis_flwr.config.choices import WIRE_FORMATS, CrossTokenizerMode, WireFormat
from ftis_flwr.config.schema import WireConfig
from ftis_flwr.wire import arrays as wire_arrays
from ftis_flwr.wire import compact as wire_compact
from ftis_flwr.wire.arrays import (  # noqa: F401 (re-exported: format 1's names)
    FORMAT_VERSION,
    NPY_HEADER_MAX,
    TOKEN_DTYPES,
    declared_length,
    token_dtype_for,
)
from ftis_flwr.wire.compact import Fields
from ftis_flwr.wire.compact import flat as _flat
from ftis_flwr.wire.compact import offsets as _offsets
from ftis_flwr.wire.groups import Group, PayloadError, _first_bad_logprob, mask_fault, span_ends, text_fault
from ftis_flwr.wire.tool_turns import tools_fault

FORMATS = WIRE_FORMATS
WIRE_KEY = "wire"
"""The compact format's one ArrayRecord key."""
LOGPROB_DTYPES = wire_compact.LP_CODECS


def encode_groups(
    groups: list[Group], *, logprob_dtype: str = WireConfig.logprob_dtype, vocab_size: int,
    format: str = WireConfig.format, compress: str = WireConfig.compress,
) -> tuple[ArrayRecord, ConfigRecord]:
    """Validate and pack groups into (ArrayRecord, ConfigRecord); PayloadError on a bad group.
    Defaults are WireConfig's."""
    if logprob_dtype not in LOGPROB_DTYPES:
        raise ValueError(f"logprob_dtype must be one of {LOGPROB_DTYPES}, got {logprob_dtype!r}")
    if format not in FORMATS:
        raise ValueError(f"wire.format must be one of {FORMATS}, got {format!r}")
    tok_dtype = token_dtype_for(vocab_size)
    for i, g in enumerate(groups):
        try:
            g.validate(vocab_size)
        except PayloadError as e:
            raise PayloadError(f"group {i}: {e}") from None
    with_text = {g.texts is not None for g in groups}
    if len(with_text) > 1:
        raise PayloadError("some groups carry their texts and some do not: a payload carries all or none")
    text = None
    if with_text == {True}:
        text = (np.frombuffer(b"".join(t for g in groups for t in g.texts), np.uint8),
                _flat([np.asarray(b) for g in groups for b in g.byte_lengths], np.int64))
    with_tools = {g.tool_format is not None for g in groups}
    if len(with_tools) > 1:
        raise PayloadError("some groups carry their tool format and layout and some do not: a payload carries all "
                           "or none")
    tools = with_tools == {True}
    sampled = None  # episodes: one flat mask, all ones for the payload's single-turn groups
    if any(g.sampled_masks is not None for g in groups):
        sampled = _flat([np.asarray(m, np.uint8) for g in groups
                         for m in (g.sampled_masks or [np.ones(len(c), np.uint8) for c in g.completions])], np.uint8)
    completions = [c for g in groups for c in g.completions]
    flat_lp = _flat([np.asarray(lp, np.float32) for g in groups for lp in g.logprobs], np.float32)
    if format == WireFormat.COMPACT:
        fields = Fields(
            strings={key: [getattr(g, key) for g in groups] for key in wire_compact.str_keys(tools)},
            prompt_ids=_flat([g.prompt_tokens for g in groups], np.int64),
            prompt_offsets=_offsets([len(g.prompt_tokens) for g in groups]),
            completion_ids=_flat(completions, np.int64),
            completion_offsets=_offsets([len(c) for c in completions]),
            group_offsets=_offsets([g.size for g in groups]),
            logprobs=flat_lp,
            rewards=_flat([np.asarray(g.rewards) for g in groups], np.float32),
            text=None if text is None else text[0], byte_lengths=None if text is None else text[1],
            sampled=sampled,
        )
        blob = wire_compact.pack(fields, id_bits=wire_compact.bits_for(vocab_size - 1),
                                 codec=logprob_dtype, compress=compress, check_range=True)
        return ArrayRecord({WIRE_KEY: Array.from_numpy_ndarray(np.frombuffer(blob, np.uint8))}), \
            ConfigRecord()
    return wire_arrays.encode(groups, completions, flat_lp, logprob_dtype, tok_dtype, text, sampled, tools)


def _group_at(group_offsets: np.ndarray, completion: int) -> int:
    return int(np.searchsorted(group_offsets, completion, side="right") - 1)


def decode_groups(
    arrays: ArrayRecord,
    meta: ConfigRecord,
    *,
    expected_fp: str,
    vocab_size: int,
    wire: WireConfig,
    cross_tokenizer: str = "off",
) -> list[Group]:
    """Validate a received payload completely, then build its groups; PayloadError on any fault.

    ``cross_tokenizer`` (``exchange.cross_tokenizer``): "off" refuses groups of another
    tokenizer; otherwise they are accepted when they carry their texts (their ids are then the
    sender's, checked only to be >= 0: the receiver trains on the text)."""
    f = _read_fields(arrays, meta, wire)
    same = _check_fingerprints(f, expected_fp, cross_tokenizer)
    check_fields(f, wire, vocab_size=vocab_size if same else None)
    return _build(f)


def read_payload(arrays: ArrayRecord, meta: ConfigRecord, wire: WireConfig) -> Fields:
    """Read a payload (either format) and check everything that needs no tokenizer: the caps,
    every offset, positive lengths, ids >= 0, log-probs finite and <= 0, rewards finite. The
    server reads every reply with this before it stores, cuts or forwards it, so what it uses
    (sizes, offsets, claimed rewards) meets the receivers' own rules; PayloadError otherwise."""
    f = _read_fields(arrays, meta, wire)
    check_fields(f, wire)
    return f


def _read_fields(arrays: ArrayRecord, meta: ConfigRecord, wire: WireConfig) -> Fields:
    if not isinstance(arrays, ArrayRecord) or not isinstance(meta, ConfigRecord):
        raise PayloadError(f"a payload is an ArrayRecord and a ConfigRecord, got "
                           f"{type(arrays).__name__} and {type(meta).__name__}")
    if WIRE_KEY in arrays.keys():
        return wire_compact.unpack(_compact_bytes(arrays, meta, wire), wire)
    return wire_arrays.read(arrays, meta, wire)


def _check_fingerprints(f: Fields, expected_fp: str, cross_tokenizer: str = "off") -> bool:
    """True when every group is of the receiver's tokenizer; PayloadError for a group of another
    one unless ``cross_tokenizer`` allows it and the payload carries the texts."""
    same = True
    for g, fp in enumerate(f.strings["tokenizer_fp"]):
        if fp == expected_fp:
            continue
        same = False
        where = (f"group {g} (prompt_id {f.strings['prompt_id'][g]!r}): tokenizer fingerprint {fp!r} "
                 f"differs from this node's {expected_fp!r}")
        if cross_tokenizer == CrossTokenizerMode.OFF:
            raise PayloadError(f"{where} (exchange.cross_tokenizer=off refuses another tokenizer; 'auto' "
                               "trains on it through the completion text)")
        if f.text is None:
            raise PayloadError(f"{where}, and the payload carries no completion text to align")
    return same


def _compact_bytes(arrays: ArrayRecord, meta: ConfigRecord, wire: WireConfig) -> memoryview:
    """The container inside the ``wire`` array: its npy header parsed by hand (np.load would
    allocate whatever shape the header declares), checked against the payload cap first."""
    extra = sorted(set(arrays.keys()) - {WIRE_KEY})
    if extra:
        raise PayloadError(f"compact payload: arrays have unexpected keys {extra}")
    if len(meta):
        raise PayloadError(f"compact payload: meta must be empty, has keys {sorted(meta.keys())}")
    arr = arrays[WIRE_KEY]
    if arr.stype != "numpy.ndarray" or arr.dtype != "uint8" or len(arr.shape) != 1:
        raise PayloadError(f"compact payload: array 'wire' must be a 1-D uint8 numpy array, got "
                           f"{len(arr.shape)}-D {arr.dtype} ({arr.stype})")
    if len(arr.data) > wire.max_payload_bytes + NPY_HEADER_MAX:
        raise PayloadError(f"compact payload: {len(arr.data)} bytes exceed wire.max_payload_bytes="
                           f"{wire.max_payload_bytes}")
    bio = BytesIO(arr.data)
    try:
        version = np.lib.format.read_magic(bio)
        read = {(1, 0): np.lib.format.read_array_header_1_0,
                (2, 0): np.lib.format.read_array_header_2_0}[version]
        shape, _, dtype = read(bio, max_header_size=NPY_HEADER_MAX)
    except Exception as e:  # any malformed npy header, whatever numpy raises
        raise PayloadError(f"compact payload: array 'wire' has no valid npy header ({e})") from None
    size = len(arr.data) - bio.tell()
    if dtype != np.uint8 or shape != (size,):
        raise PayloadError(f"compact payload: array 'wire' declares {shape} {dtype}, "
                           f"its data holds ({size},) uint8")
    return memoryview(arr.data)[bio.tell():]


def check_fields(f: Fields, wire: WireConfig, *, vocab_size: int | None = None) -> None:
    """The checks both formats share (what and where): offsets, caps, ids (in [0, vocab_size)
    when it is given, else >= 0), log-probs, rewards; PayloadError naming the first fault."""
    strs = f.strings
    n = len(strs["prompt_id"])

    def name(g: int) -> str:
        return f"group {g} (prompt_id {strs['prompt_id'][g]!r})"

    g_off, c_off, p_off = f.group_offsets, f.completion_offsets, f.prompt_offsets
    _check_offsets(p_off, n, len(f.prompt_ids), "prompt_offsets", "prompt", name)
    _check_offsets(g_off, n, None, "group_offsets", "group", name)
    n_comp = int(g_off[-1])

    def name_completion(c: int) -> str:
        g = _group_at(g_off, c)
        return f"{name(g)}: completion {c - g_off[g]}"

    _check_offsets(
        c_off, n_comp, len(f.completion_ids), "completion_offsets", "completion",
        name_completion,
    )
    if len(f.rewards) != n_comp:
        raise PayloadError(f"rewards length {len(f.rewards)} != {n_comp} completions")
    if len(f.logprobs) != len(f.completion_ids):
        raise PayloadError(f"logprobs length {len(f.logprobs)} != completion_ids length "
                           f"{len(f.completion_ids)}")
    sizes = np.diff(g_off)
    if n and sizes.max() > wire.max_completions_per_group:
        g = int(np.argmax(sizes))
        raise PayloadError(
            f"{name(g)}: {sizes[g]} completions exceed wire.max_completions_per_group="
            f"{wire.max_completions_per_group}"
        )
    lengths = np.diff(c_off)
    if n_comp and lengths.max() > wire.max_tokens_per_completion:
        c = int(np.argmax(lengths))
        g = _group_at(g_off, c)
        raise PayloadError(
            f"{name(g)}: completion {c - g_off[g]} has {lengths[c]} tokens, over "
            f"wire.max_tokens_per_completion={wire.max_tokens_per_completion}"
        )

    def where_token(pos: int) -> str:
        c = int(np.searchsorted(c_off, pos, side="right") - 1)
        g = _group_at(g_off, c)
        return f"{name(g)}: completion {c - g_off[g]} token {pos - c_off[c]}"

    def where_prompt(pos: int) -> str:
        g = int(np.searchsorted(p_off, pos, side="right") - 1)
        return f"{name(g)}: prompt token {pos - p_off[g]}"

    top = 2**31 if vocab_size is None else vocab_size
    for ids, where in ((f.prompt_ids, where_prompt), (f.completion_ids, where_token)):
        bad = (ids < 0) | (ids >= top)
        if bad.any():
            pos = int(np.argmax(bad))
            raise PayloadError(f"{where(pos)}: token id {ids[pos]} outside [0, {top})")
    bad = _first_bad_logprob(f.logprobs)
    if bad is not None:
        raise PayloadError(f"{where_token(bad[0])}: {bad[1]}")
    if not np.all(np.isfinite(f.rewards)):
        c = int(np.argmax(~np.isfinite(f.rewards)))
        raise PayloadError(f"{name(_group_at(g_off, c))}: non-finite reward")
    if f.sampled is not None:
        _check_sampled(f, n_comp, name_completion)
    if (f.text is None) != (f.byte_lengths is None):
        raise PayloadError("a payload carries texts and byte lengths together or neither")
    if "tool_format" in strs:
        if f.text is None:
            raise PayloadError("a payload carries tool formats and layouts only with its episodes' texts")
        for g in range(n):
            why = tools_fault(strs["tool_format"][g], strs["tool_layout"][g])
            if why:
                raise PayloadError(f"{name(g)}: {why}")
    if f.text is not None:
        if len(f.byte_lengths) != len(f.completion_ids):
            raise PayloadError(f"{len(f.byte_lengths)} byte lengths for {len(f.completion_ids)} completion tokens")
        if len(f.byte_lengths) and (f.byte_lengths.min() < 0 or f.byte_lengths.sum() != len(f.text)):
            raise PayloadError(f"byte lengths (min {f.byte_lengths.min()}) add up to {f.byte_lengths.sum()}, "
                               f"the texts hold {len(f.text)} bytes")
        at = _offsets(f.byte_lengths)
        text = f.text.tobytes()
        for c in range(n_comp):
            lo, hi = int(c_off[c]), int(c_off[c + 1])
            ends = None if f.sampled is None else span_ends(f.sampled[lo:hi])
            why = text_fault(text[at[lo]:at[hi]], f.byte_lengths[lo:hi], hi - lo, ends)
            if why:
                raise PayloadError(f"{name_completion(c)}: {why}")


def _check_sampled(f: Fields, n_comp: int, name_completion) -> None:
    """The episodes' sampled masks (:func:`ftis_flwr.wire.groups.mask_fault`), found vectorised and
    named per completion."""
    c_off = f.completion_offsets
    if len(f.sampled) != len(f.completion_ids):
        raise PayloadError(f"{len(f.sampled)} sampled-mask entries for {len(f.completion_ids)} completion tokens")
    mask = np.asarray(f.sampled)
    bad = (mask > 1) | ((mask == 0) & (f.logprobs != 0))
    ends = np.zeros(len(mask), bool)
    if n_comp:
        ends[c_off[:-1]] = ends[c_off[1:] - 1] = True
    bad |= ends & (mask == 0)
    if bad.any():
        c = int(np.searchsorted(c_off, int(np.argmax(bad)), side="right") - 1)
        lo, hi = int(c_off[c]), int(c_off[c + 1])
        raise PayloadError(f"{name_completion(c)}: {mask_fault(mask[lo:hi], f.logprobs[lo:hi])}")


def _build(f: Fields) -> list[Group]:
    """Groups from checked fields."""
    strs, g_off, c_off, p_off = f.strings, f.group_offsets, f.completion_offsets, f.prompt_offsets
    groups = []
    for g in range(len(strs["prompt_id"])):
        cs = range(int(g_off[g]), int(g_off[g + 1]))
        groups.append(
            Group(
                prompt_id=strs["prompt_id"][g],
                prompt_tokens=f.prompt_ids[p_off[g] : p_off[g + 1]].astype(np.int64),
                completions=[f.completion_ids[c_off[c] : c_off[c + 1]].copy() for c in cs],
                logprobs=[f.logprobs[c_off[c] : c_off[c + 1]].copy() for c in cs],
                rewards=f.rewards[g_off[g] : g_off[g + 1]].astype(np.float32),
                node=strs["node"][g],
                model_id=strs["model_id"][g],
                tokenizer_fp=strs["tokenizer_fp"][g],
            )
        )
    if f.text is not None:
        at, text = _offsets(f.byte_lengths), f.text.tobytes()
        for g, group in enumerate(groups):
            cs = range(int(g_off[g]), int(g_off[g + 1]))
            group.texts = [text[at[c_off[c]]:at[c_off[c + 1]]] for c in cs]
            group.byte_lengths = [f.byte_lengths[c_off[c]:c_off[c + 1]].copy() for c in cs]
    if "tool_format" in strs:
        for g, group in enumerate(groups):
            group.tool_format, group.tool_layout = strs["tool_format"][g], strs["tool_layout"][g]
    if f.sampled is not None:  # a group whose every token was sampled is a single turn: None
        for g, group in enumerate(groups):
            masks = [f.sampled[c_off[c]:c_off[c + 1]].astype(np.uint8) for c in range(int(g_off[g]), int(g_off[g + 1]))]
            group.sampled_masks = None if all(m.all() for m in masks) else masks
    return groups


def payload_size(arrays: ArrayRecord, meta: ConfigRecord) -> tuple[int, int]:
    """(groups, completions) a payload claims, read without decoding, to count a rejected one.

    Compact: the container header's counts. Format 1: groups from the meta ``prompt_id`` list,
    else the declared ``group_offsets`` length; completions: the declared ``completion_offsets``
    length. 0 for what cannot be read.
    """
    h = _compact_header(arrays)
    if h is not None:
        return h["groups"], h["completions"]
    ids = meta.get("prompt_id") if isinstance(meta, ConfigRecord) else None
    groups = len(ids) if isinstance(ids, list) else max(declared_length(arrays, "group_offsets") - 1, 0)
    return groups, max(declared_length(arrays, "completion_offsets") - 1, 0)


def _compact_header(arrays: ArrayRecord) -> dict | None:
    """A compact payload's header fields (nothing else read), None if there is none to read."""
    if WIRE_KEY not in arrays.keys():
        return None
    try:
        return wire_compact.read_header(
            _compact_bytes(ArrayRecord({WIRE_KEY: arrays[WIRE_KEY]}), ConfigRecord(),
                           WireConfig(max_payload_bytes=2**62)))
    except PayloadError:
        return None


def _check_offsets(
    off: np.ndarray, count: int, total: int | None, key: str, unit: str, name
) -> None:
    """Offsets must be count+1 long, start at 0, strictly increase (no empty unit), end at total."""
    if len(off) != count + 1:
        raise PayloadError(f"{key} has {len(off)} entries, expected {count + 1}")
    if off[0] != 0:
        raise PayloadError(f"{key} starts at {off[0]}, expected 0")
    steps = np.diff(off)
    if count and steps.min() <= 0:
        i = int(np.argmax(steps <= 0))
        raise PayloadError(
            f"{name(i)}: {key} not strictly increasing at {i} ({off[i]} -> {off[i + 1]}):"
            f" every {unit} needs at least one element"
        )
    if total is not None and off[-1] != total:
        raise PayloadError(f"{key} ends at {off[-1]} but the data holds {total}")


def payload_bytes(arrays: ArrayRecord, meta: ConfigRecord) -> int:
    """Bytes of the payload as Flower carries it, protobuf framing excluded.

    Counted: each Array's serialized ``.data`` buffer (npy: ~128-byte header + raw data; the
    compact format's one container is such a buffer) and its key; each ConfigRecord key and value
    (str as UTF-8, bytes as is, int/float 8, bool 1).
    """
    total = sum(len(k.encode()) + len(v.data) for k, v in arrays.items())
    for key, value in meta.items():
        total += len(key.encode())
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, bool):
                total += 1
            elif isinstance(item, (int, float)):
                total += 8
            elif isinstance(item, str):
                total += len(item.encode("utf-8"))
            else:
                total += len(item)
    return total


def completion_tokens(arrays: ArrayRecord) -> int:
    """Completion tokens a payload carries, read from the compact header or the format 1 record's
    shape (nothing decoded)."""
    h = _compact_header(arrays)
    if h is not None:
        return h["tokens"]
    return int(np.prod(arrays["completion_ids"].shape)) if "completion_ids" in arrays else 0


def bytes_per_completion_token(arrays: ArrayRecord, meta: ConfigRecord) -> float:
    """payload_bytes / completion tokens carried; nan when the payload carries no tokens."""
    tokens = completion_tokens(arrays)
    return payload_bytes(arrays, meta) / tokens if tokens else float("nan")


