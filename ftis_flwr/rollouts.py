"""The wire codec of groups to Flower records (SPEC §1, DESIGN: Data on wire).

Only tokens, per-token generator log-probs and small metadata cross the network. Two formats,
chosen by the sender's ``wire.format``; a receiver reads both (a federation can switch format
one node at a time, and a resumed run may forward groups saved in the older one):

- ``compact`` (format 2, default): one uint8 array ``wire`` holding a byte container
  (:mod:`ftis_flwr.wire_compact`: bit-packed ids, packed lengths, one string table, optional
  zlib) and an empty ``ConfigRecord``.
- ``arrays`` (format 1): flat arrays plus offsets in an ``ArrayRecord``, per-group strings in
  a ``ConfigRecord`` (below).

Both decode to the same fields, and one set of checks runs on them: the receiver validates
*everything* before building a single ``Group``, so a malformed or hostile payload is rejected
loudly (``PayloadError``) and never half-decoded.

Layout of format version 1, n groups, c completions in total:

- arrays: ``prompt_ids`` (flat token ids of all prompts), ``prompt_offsets`` int64 [n+1],
  ``completion_ids`` (flat), ``completion_offsets`` int64 [c+1], ``group_offsets`` int64 [n+1]
  (completion index ranges per group), ``logprobs`` (flat, same length as ``completion_ids``),
  ``rewards`` float32 [c] (logging only: receivers recompute rewards from text).
- meta: ``format_version``, ``token_dtype`` (uint8 / uint16 / int32, the smallest that holds the
  vocabulary), ``logprob_dtype`` (fp32 / fp16 / bf16; bf16 travels as the uint16 upper half of
  the fp32 bit pattern, rounded to nearest even), and per-group lists of str ``prompt_id``,
  ``node``, ``model_id``, ``tokenizer_fp``.

The rules a group must meet are :class:`ftis_flwr.groups.Group`'s; this module only encodes
and decodes (and is the one place that imports Flower's records).
"""

from __future__ import annotations


from io import BytesIO

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord

from ftis_flwr import wire_compact
from ftis_flwr.config import WireConfig
from ftis_flwr.groups import Group, PayloadError, _first_bad_logprob
from ftis_flwr.wire_compact import Fields, check_token_cap as _check_token_cap
from ftis_flwr.wire_compact import decode_logprobs as _decode_logprobs
from ftis_flwr.wire_compact import encode_logprobs as _encode_logprobs

FORMAT_VERSION = 1
FORMATS = ("compact", "arrays")
WIRE_KEY = "wire"
"""The compact format's one ArrayRecord key."""
LOGPROB_DTYPES = wire_compact.LP_CODECS
TOKEN_DTYPES = ("uint8", "uint16", "int32")

_ARRAY_KEYS = (
    "prompt_ids",
    "prompt_offsets",
    "completion_ids",
    "completion_offsets",
    "group_offsets",
    "logprobs",
    "rewards",
)
_GROUP_STR_KEYS = ("prompt_id", "node", "model_id", "tokenizer_fp")
_LOGPROB_WIRE_DTYPE = {"fp32": np.float32, "fp16": np.float16, "bf16": np.uint16}


def token_dtype_for(vocab_size: int) -> str:
    """The smallest wire dtype that holds ids in [0, vocab_size)."""
    if not isinstance(vocab_size, int) or vocab_size <= 0:
        raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
    if vocab_size <= 2**8:
        return "uint8"
    if vocab_size <= 2**16:
        return "uint16"
    if vocab_size <= 2**31 - 1:
        return "int32"
    raise ValueError(f"vocab_size {vocab_size} does not fit int32 token ids")


def _offsets(lengths: list[int]) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def _flat(parts: list[np.ndarray], dtype) -> np.ndarray:
    return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype=dtype)


def encode_groups(
    groups: list[Group], *, logprob_dtype: str = "fp32", vocab_size: int,
    format: str = "compact", compress: str = "none",
) -> tuple[ArrayRecord, ConfigRecord]:
    """Validate and pack groups into (ArrayRecord, ConfigRecord); PayloadError on a bad group."""
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
    completions = [c for g in groups for c in g.completions]
    flat_lp = _flat([np.asarray(lp, np.float32) for g in groups for lp in g.logprobs], np.float32)
    if format == "compact":
        fields = Fields(
            strings={key: [getattr(g, key) for g in groups] for key in _GROUP_STR_KEYS},
            prompt_ids=_flat([g.prompt_tokens for g in groups], np.int64),
            prompt_offsets=_offsets([len(g.prompt_tokens) for g in groups]),
            completion_ids=_flat(completions, np.int64),
            completion_offsets=_offsets([len(c) for c in completions]),
            group_offsets=_offsets([g.size for g in groups]),
            logprobs=flat_lp,
            rewards=_flat([np.asarray(g.rewards) for g in groups], np.float32),
        )
        blob = wire_compact.pack(fields, id_bits=wire_compact.bits_for(vocab_size - 1),
                                 codec=logprob_dtype, compress=compress)
        return ArrayRecord({WIRE_KEY: Array.from_numpy_ndarray(np.frombuffer(blob, np.uint8))}), \
            ConfigRecord()
    arrays = {
        "prompt_ids": _flat([g.prompt_tokens for g in groups], tok_dtype),
        "prompt_offsets": _offsets([len(g.prompt_tokens) for g in groups]),
        "completion_ids": _flat(completions, tok_dtype),
        "completion_offsets": _offsets([len(c) for c in completions]),
        "group_offsets": _offsets([g.size for g in groups]),
        "logprobs": _encode_logprobs(flat_lp, logprob_dtype),
        "rewards": _flat([np.asarray(g.rewards) for g in groups], np.float32),
    }
    record = ArrayRecord({k: Array.from_numpy_ndarray(v) for k, v in arrays.items()})
    meta: dict = {
        "format_version": FORMAT_VERSION,
        "token_dtype": tok_dtype,
        "logprob_dtype": logprob_dtype,
    }
    for key in _GROUP_STR_KEYS:
        meta[key] = [getattr(g, key) for g in groups]
    return record, ConfigRecord(meta)


def _group_at(group_offsets: np.ndarray, completion: int) -> int:
    return int(np.searchsorted(group_offsets, completion, side="right") - 1)


def decode_groups(
    arrays: ArrayRecord,
    meta: ConfigRecord,
    *,
    expected_fp: str,
    vocab_size: int,
    wire: WireConfig,
) -> list[Group]:
    """Validate a received payload completely, then build its groups; PayloadError on any fault."""
    if WIRE_KEY in arrays.keys():
        f = wire_compact.unpack(_compact_bytes(arrays, meta, wire), wire)
    else:
        f = _read_v1(arrays, meta, wire)
    return _check_and_build(f, expected_fp=expected_fp, vocab_size=vocab_size, wire=wire)


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
    if len(arr.data) > wire.max_payload_bytes + _NPY_HEADER_MAX:
        raise PayloadError(f"compact payload: {len(arr.data)} bytes exceed wire.max_payload_bytes="
                           f"{wire.max_payload_bytes}")
    bio = BytesIO(arr.data)
    try:
        version = np.lib.format.read_magic(bio)
        read = {(1, 0): np.lib.format.read_array_header_1_0,
                (2, 0): np.lib.format.read_array_header_2_0}[version]
        shape, _, dtype = read(bio, max_header_size=_NPY_HEADER_MAX)
    except Exception as e:  # any malformed npy header, whatever numpy raises
        raise PayloadError(f"compact payload: array 'wire' has no valid npy header ({e})") from None
    size = len(arr.data) - bio.tell()
    if dtype != np.uint8 or shape != (size,):
        raise PayloadError(f"compact payload: array 'wire' declares {shape} {dtype}, "
                           f"its data holds ({size},) uint8")
    return memoryview(arr.data)[bio.tell():]


_NPY_HEADER_MAX = 4096


def _read_v1(arrays: ArrayRecord, meta: ConfigRecord, wire: WireConfig) -> Fields:
    """Format 1 records -> Fields; meta and declared shapes checked before arrays are read."""
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise PayloadError(f"format_version is {version!r}, this receiver reads {FORMAT_VERSION} "
                           f"(arrays) or a compact {WIRE_KEY!r} container")
    lp_dtype, tok_dtype = meta.get("logprob_dtype"), meta.get("token_dtype")
    if lp_dtype not in LOGPROB_DTYPES:
        raise PayloadError(f"meta logprob_dtype {lp_dtype!r} is not one of {LOGPROB_DTYPES}")
    if tok_dtype not in TOKEN_DTYPES:
        raise PayloadError(f"meta token_dtype {tok_dtype!r} is not one of {TOKEN_DTYPES}")
    strs: dict[str, list[str]] = {}
    for key in _GROUP_STR_KEYS:
        value = meta.get(key)
        if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
            raise PayloadError(f"meta {key!r} is missing or not a list of non-empty str")
        strs[key] = value
    n = len(strs["prompt_id"])
    if any(len(v) != n for v in strs.values()):
        raise PayloadError(f"meta lists differ in length: { {k: len(v) for k, v in strs.items()} }")
    if n > wire.max_groups:
        raise PayloadError(f"{n} groups exceed wire.max_groups={wire.max_groups}")
    _check_token_cap(_declared_length(arrays, "completion_ids"), wire)  # before decoding anything
    nbytes = sum(len(v.data) for v in arrays.values())
    if nbytes > wire.max_payload_bytes + len(arrays) * _NPY_HEADER_MAX:
        raise PayloadError(f"{nbytes} array bytes exceed wire.max_payload_bytes="
                           f"{wire.max_payload_bytes}")
    a = _read_arrays(arrays, tok_dtype, lp_dtype)
    _check_token_cap(len(a["completion_ids"]), wire)  # the declared shape may have lied
    if len(a["logprobs"]) != len(a["completion_ids"]):
        raise PayloadError(
            f"logprobs length {len(a['logprobs'])} != completion_ids length "
            f"{len(a['completion_ids'])}"
        )
    return Fields(strings=strs, prompt_ids=a["prompt_ids"].astype(np.int64),
                  prompt_offsets=a["prompt_offsets"],
                  completion_ids=a["completion_ids"].astype(np.int64),
                  completion_offsets=a["completion_offsets"], group_offsets=a["group_offsets"],
                  logprobs=_decode_logprobs(a["logprobs"], lp_dtype), rewards=a["rewards"])


def _check_and_build(f: Fields, *, expected_fp: str, vocab_size: int,
                     wire: WireConfig) -> list[Group]:
    """The checks of both formats (what and where), then the groups."""
    strs = f.strings
    n = len(strs["prompt_id"])

    def name(g: int) -> str:
        return f"group {g} (prompt_id {strs['prompt_id'][g]!r})"

    for g, fp in enumerate(strs["tokenizer_fp"]):
        if fp != expected_fp:
            raise PayloadError(
                f"{name(g)}: tokenizer fingerprint {fp!r} differs from this node's {expected_fp!r}"
            )
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

    for ids, where in ((f.prompt_ids, where_prompt), (f.completion_ids, where_token)):
        bad = (ids < 0) | (ids >= vocab_size)
        if bad.any():
            pos = int(np.argmax(bad))
            raise PayloadError(f"{where(pos)}: token id {ids[pos]} outside [0, {vocab_size})")
    bad = _first_bad_logprob(f.logprobs)
    if bad is not None:
        raise PayloadError(f"{where_token(bad[0])}: {bad[1]}")
    if not np.all(np.isfinite(f.rewards)):
        c = int(np.argmax(~np.isfinite(f.rewards)))
        raise PayloadError(f"{name(_group_at(g_off, c))}: non-finite reward")

    groups = []
    for g in range(n):
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
    return groups


def _declared_length(arrays: ArrayRecord, key: str) -> int:
    """Elements the sender declares for ``key`` (its shape; nothing decoded); 0 if unreadable."""
    try:
        return int(np.prod([int(d) for d in arrays[key].shape]))
    except Exception:  # a missing key or odd shape is reported by _read_arrays
        return 0


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
    groups = len(ids) if isinstance(ids, list) else max(_declared_length(arrays, "group_offsets") - 1, 0)
    return groups, max(_declared_length(arrays, "completion_offsets") - 1, 0)


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


def _read_arrays(arrays: ArrayRecord, tok_dtype: str, lp_dtype: str) -> dict[str, np.ndarray]:
    keys = set(arrays.keys())
    missing = [k for k in _ARRAY_KEYS if k not in keys]
    if missing:
        raise PayloadError(f"arrays missing keys {missing}")
    extra = sorted(keys - set(_ARRAY_KEYS))
    if extra:
        raise PayloadError(f"arrays have unexpected keys {extra}")
    want = {
        "prompt_ids": np.dtype(tok_dtype),
        "completion_ids": np.dtype(tok_dtype),
        "prompt_offsets": np.dtype(np.int64),
        "completion_offsets": np.dtype(np.int64),
        "group_offsets": np.dtype(np.int64),
        "logprobs": np.dtype(_LOGPROB_WIRE_DTYPE[lp_dtype]),
        "rewards": np.dtype(np.float32),
    }
    out = {}
    for key, dtype in want.items():
        try:
            value = arrays[key].numpy()
        except Exception as e:  # a corrupt buffer must become a PayloadError, whatever numpy says
            raise PayloadError(f"array {key!r} cannot be read: {e}") from None
        if value.ndim != 1 or value.dtype != dtype:
            raise PayloadError(
                f"array {key!r} must be 1-D {dtype}, got {value.ndim}-D {value.dtype}"
            )
        out[key] = value
    return out


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
    compact format's one container is such a buffer) and its key; each ConfigRecord key and value (str as UTF-8, bytes as is, int/float 8, bool 1).
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


