"""Wire format 1 ("arrays"): seven npy arrays in an ``ArrayRecord`` + string lists in a ``ConfigRecord``.

Kept so that a receiver reads what older senders (and a resumed run's saved groups) carry, and as
the reference the compact format is measured against. Layout, n groups, c completions in total:

- arrays: ``prompt_ids`` (flat token ids of all prompts), ``prompt_offsets`` int64 [n+1],
  ``completion_ids`` (flat), ``completion_offsets`` int64 [c+1], ``group_offsets`` int64 [n+1]
  (completion index ranges per group), ``logprobs`` (flat, same length as ``completion_ids``),
  ``rewards`` float32 [c] (logging only: receivers recompute rewards from text).
- optional, together (cross-tokenizer payloads): ``text`` uint8 (the completions' UTF-8 texts,
  concatenated) and ``byte_lengths`` int32 (one per completion token, see ``Group.byte_lengths``).
- optional (episodes, algorithm §13): ``sampled`` uint8, one per completion token, 1 where the
  model sampled it (``Group.sampled_masks``); ``logprobs`` holds 0 on the others.
- meta: ``format_version``, ``token_dtype`` (uint8 / uint16 / int32, the smallest that holds the
  vocabulary), ``logprob_dtype`` (fp32 / fp16 / bf16; bf16 travels as the uint16 upper half of
  the fp32 bit pattern, rounded to nearest even), and per-group lists of str ``prompt_id``,
  ``node``, ``model_id``, ``tokenizer_fp``.

Reading checks the meta and the declared shapes against the caps before any array is read; the
checks both formats share are in :mod:`ftis_flwr.wire.rollouts`.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord

from ftis_flwr.config.schema import WireConfig
from ftis_flwr.wire.compact import LP_CODECS as LOGPROB_DTYPES
from ftis_flwr.wire.compact import TOOL_KEYS, Fields, check_token_cap, decode_logprobs, encode_logprobs, str_keys
from ftis_flwr.wire.compact import flat as _flat
from ftis_flwr.wire.compact import offsets as _offsets
from ftis_flwr.wire.groups import Group, PayloadError

FORMAT_VERSION = 1
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
_LOGPROB_WIRE_DTYPE = {"fp32": np.float32, "fp16": np.float16, "bf16": np.uint16}


NPY_HEADER_MAX = 4096
"""Bytes an npy header may take (numpy writes 128 for a 1-D array)."""


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


def encode(groups: list[Group], completions: list[np.ndarray], flat_lp: np.ndarray,
           logprob_dtype: str, tok_dtype: str, text: tuple[np.ndarray, np.ndarray] | None = None,
           sampled: np.ndarray | None = None, tools: bool = False) -> tuple[ArrayRecord, ConfigRecord]:
    """Checked groups -> format 1 records (the caller validated every group); ``text``: the
    flat (text, byte_lengths) of a cross-tokenizer payload; ``sampled``: the flat sampled mask of
    a payload with episodes; ``tools``: its groups carry their tool formats and layouts."""
    arrays = {
        "prompt_ids": _flat([g.prompt_tokens for g in groups], tok_dtype),
        "prompt_offsets": _offsets([len(g.prompt_tokens) for g in groups]),
        "completion_ids": _flat(completions, tok_dtype),
        "completion_offsets": _offsets([len(c) for c in completions]),
        "group_offsets": _offsets([g.size for g in groups]),
        "logprobs": encode_logprobs(flat_lp, logprob_dtype),
        "rewards": _flat([np.asarray(g.rewards) for g in groups], np.float32),
    }
    if text is not None:
        arrays["text"], arrays["byte_lengths"] = text[0].astype(np.uint8), text[1].astype(np.int32)
    if sampled is not None:
        arrays["sampled"] = np.asarray(sampled).astype(np.uint8)
    record = ArrayRecord({k: Array.from_numpy_ndarray(v) for k, v in arrays.items()})
    meta: dict = {
        "format_version": FORMAT_VERSION,
        "token_dtype": tok_dtype,
        "logprob_dtype": logprob_dtype,
    }
    for key in str_keys(tools):
        meta[key] = [getattr(g, key) for g in groups]
    return record, ConfigRecord(meta)


def read(arrays: ArrayRecord, meta: ConfigRecord, wire: WireConfig) -> Fields:
    """Format 1 records -> Fields; meta and declared shapes checked before arrays are read."""
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise PayloadError(f"format_version is {version!r}, this receiver reads {FORMAT_VERSION} "
                           f"(arrays) or a compact 'wire' container")
    lp_dtype, tok_dtype = meta.get("logprob_dtype"), meta.get("token_dtype")
    if lp_dtype not in LOGPROB_DTYPES:
        raise PayloadError(f"meta logprob_dtype {lp_dtype!r} is not one of {LOGPROB_DTYPES}")
    if tok_dtype not in TOKEN_DTYPES:
        raise PayloadError(f"meta token_dtype {tok_dtype!r} is not one of {TOKEN_DTYPES}")
    tools = [key in meta for key in TOOL_KEYS]
    if any(tools) and not all(tools):
        raise PayloadError(f"meta has {' and '.join(k for k, t in zip(TOOL_KEYS, tools) if t)} without "
                           f"{' and '.join(k for k, t in zip(TOOL_KEYS, tools) if not t)}")
    strs: dict[str, list[str]] = {}
    for key in str_keys(all(tools)):
        value = meta.get(key)
        if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
            raise PayloadError(f"meta {key!r} is missing or not a list of non-empty str")
        strs[key] = value
    n = len(strs["prompt_id"])
    if any(len(v) != n for v in strs.values()):
        raise PayloadError(f"meta lists differ in length: { {k: len(v) for k, v in strs.items()} }")
    if n > wire.max_groups:
        raise PayloadError(f"{n} groups exceed wire.max_groups={wire.max_groups}")
    check_token_cap(declared_length(arrays, "completion_ids"), wire)  # before decoding anything
    nbytes = sum(len(v.data) for v in arrays.values())
    if nbytes > wire.max_payload_bytes + len(arrays) * NPY_HEADER_MAX:
        raise PayloadError(f"{nbytes} array bytes exceed wire.max_payload_bytes="
                           f"{wire.max_payload_bytes}")
    a = _read_arrays(arrays, tok_dtype, lp_dtype)
    check_token_cap(len(a["completion_ids"]), wire)  # the declared shape may have lied
    if len(a["logprobs"]) != len(a["completion_ids"]):
        raise PayloadError(
            f"logprobs length {len(a['logprobs'])} != completion_ids length "
            f"{len(a['completion_ids'])}"
        )
    return Fields(strings=strs, prompt_ids=a["prompt_ids"].astype(np.int64),
                  prompt_offsets=a["prompt_offsets"],
                  completion_ids=a["completion_ids"].astype(np.int64),
                  completion_offsets=a["completion_offsets"], group_offsets=a["group_offsets"],
                  logprobs=decode_logprobs(a["logprobs"], lp_dtype), rewards=a["rewards"],
                  text=a.get("text"),
                  byte_lengths=None if "byte_lengths" not in a else a["byte_lengths"].astype(np.int64),
                  sampled=a.get("sampled"))


def declared_length(arrays: ArrayRecord, key: str) -> int:
    """Elements the sender declares for ``key`` (its shape; nothing decoded); 0 if unreadable."""
    try:
        return int(np.prod([int(d) for d in arrays[key].shape]))
    except Exception:  # a missing key or odd shape is reported by _read_arrays
        return 0


def _read_arrays(arrays: ArrayRecord, tok_dtype: str, lp_dtype: str) -> dict[str, np.ndarray]:
    keys = set(arrays.keys())
    missing = [k for k in _ARRAY_KEYS if k not in keys]
    if missing:
        raise PayloadError(f"arrays missing keys {missing}")
    text_keys = {"text", "byte_lengths"} & keys
    if text_keys and len(text_keys) != 2:
        raise PayloadError(f"arrays have {sorted(text_keys)} without {sorted({'text', 'byte_lengths'} - text_keys)}")
    extra = sorted(keys - set(_ARRAY_KEYS) - text_keys - {"sampled"})
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
    if text_keys:
        want.update({"text": np.dtype(np.uint8), "byte_lengths": np.dtype(np.int32)})
    if "sampled" in keys:
        want["sampled"] = np.dtype(np.uint8)
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
