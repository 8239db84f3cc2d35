"""The compact wire format's numbers: bit-packed integers and 16-bit log-probs.

Why apart from :mod:`ftis_flwr.wire.compact`: the container's layout and these encodings change for
different reasons; the container re-exports every name here.
"""

from __future__ import annotations

import numpy as np

from ftis_flwr.config.choices import LogprobCodec
from ftis_flwr.wire.groups import PayloadError

LP_CODECS = ("fp32", "fp16", "bf16")
"""The log-prob codecs in wire order: the index is the container's codec flag, so never reorder
(the set is ``config.choices.LOGPROB_CODECS``, checked by a test)."""


def bits_for(max_value: int) -> int:
    """Bits that hold every value in [0, max_value] (0 when max_value is 0)."""
    return int(max_value).bit_length()


def pack_bits(values: np.ndarray, width: int) -> bytes:
    """Values (< 2**width, width <= 32) as ``width``-bit fields, most significant bit first,
    zero padded to a whole byte."""
    v = np.asarray(values).ravel()
    if width == 0 or len(v) == 0:
        return b""
    bits = np.unpackbits(v.astype(">u4").view(np.uint8).reshape(-1, 4), axis=1)
    return np.packbits(bits[:, 32 - width :].ravel()).tobytes()


def packed_len(count: int, width: int) -> int:
    return (count * width + 7) // 8


def unpack_bits(buf: memoryview, count: int, width: int, what: str) -> np.ndarray:
    """Inverse of :func:`pack_bits` (int64); PayloadError if a padding bit is set."""
    if width == 0 or count == 0:
        return np.zeros(count, np.int64)
    bits = np.unpackbits(np.frombuffer(buf, np.uint8))
    if bits[count * width :].any():
        raise PayloadError(f"compact payload: section {what!r} has non-zero padding bits")
    padded = np.zeros((count, 32), np.uint8)
    padded[:, 32 - width :] = bits[: count * width].reshape(count, width)
    return np.packbits(padded, axis=1).view(">u4").ravel().astype(np.int64)


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """fp32 -> upper 16 bits of the bit pattern, rounded to nearest even (as torch does)."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def bf16_to_fp32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def encode_logprobs(flat: np.ndarray, codec: str, *, check: bool = True) -> np.ndarray:
    """fp32 log-probs in the wire codec's numpy dtype; PayloadError if a value overflows it
    (``check``: what an honest sender wants; a forger's packer casts whatever it is given)."""
    if codec == LogprobCodec.FP32:
        return flat.astype(np.float32)
    if codec == LogprobCodec.FP16:
        with np.errstate(over="ignore"):  # reported below, as a PayloadError
            out = flat.astype(np.float16)
    elif codec == LogprobCodec.BF16:
        out = bf16_bits(flat)
    else:
        raise ValueError(f"logprob_dtype must be one of {LP_CODECS}, got {codec!r}")
    if check and not np.all(np.isfinite(decode_logprobs(out, codec))):
        raise PayloadError(f"log-probs overflow {codec} (smallest {flat.min()})")
    return out


def decode_logprobs(wire: np.ndarray, codec: str) -> np.ndarray:
    if codec == LogprobCodec.BF16:
        return bf16_to_fp32(wire)
    return wire.astype(np.float32)


_LP_WIRE = {"fp32": np.dtype("<f4"), "fp16": np.dtype("<f2"), "bf16": np.dtype("<u2")}

