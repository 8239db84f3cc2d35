"""Which dtypes a node computes in: ``dtype: auto`` / ``compute_dtype: auto`` resolved on the
machine that runs the node (#24).

Why apart: a preset is written once and runs on machines of different kinds. bfloat16 halves a
real model's memory and is faster where the hardware computes it natively, but on a CPU without
native bfloat16 (AVX2-only: no ``avx512_bf16`` / ``amx_bf16``) a bfloat16 matmul runs 40-60x slower
than float32. ``auto`` picks bfloat16 only where it is native, and the node says what it chose.
No torch at import: the configuration layer (the memory plan) resolves cards too.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

AUTO = "auto"

BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
"""x86 CPU flags (``/proc/cpuinfo``) of native bfloat16 arithmetic. Without them torch runs a
bfloat16 matmul 40-60x slower than float32 (``python -m benchmarks.bf16_matmul``, AMD EPYC
with AVX2 only: 355 ms against 5.6 ms idle, 434 against 10.5 under load), and the cpu-smollm2
federation's first update took ~35 min instead of ~1."""


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes in bfloat16 natively (see :data:`BF16_CPU_FLAGS`); True when it
    cannot be told (not Linux, or not x86: ARM's bf16 support is not checked here)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return True
    if "flags" not in flags:  # not an x86 cpuinfo
        return True
    return any(f" {flag}" in flags for flag in BF16_CPU_FLAGS)


def native_bf16(device: str) -> bool:
    """Whether ``device`` ("cpu", "cuda", "cuda:1") computes in bfloat16 natively."""
    if device.startswith("cuda"):
        import torch

        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    return cpu_has_native_bf16()


def resolve_dtypes(card):
    """``(card, note)``: the card with ``auto`` in ``dtype`` / ``compute_dtype`` replaced (dtype:
    bfloat16 where the device computes it natively, else float32; compute_dtype: bfloat16 there,
    else "" = the weights' dtype), and one line saying what was chosen and why (None when the
    card asks for no ``auto``)."""
    if AUTO not in (card.dtype, card.compute_dtype):
        return card, None
    native = native_bf16(card.device)
    dtype = ("bfloat16" if native else "float32") if card.dtype == AUTO else card.dtype
    compute = ("bfloat16" if native else "") if card.compute_dtype == AUTO else card.compute_dtype
    why = (f"{card.device} computes bfloat16 natively" if native else
           f"{card.device} has no native bfloat16" + (f" ({' / '.join(BF16_CPU_FLAGS)} not in /proc/cpuinfo)"
                                                        if card.device == "cpu" else ""))
    note = (f"node {card.name}: dtype {card.dtype} -> {dtype}, compute_dtype {card.compute_dtype or '-'} -> "
            f"{compute or dtype} ({why})")
    return dataclasses.replace(card, dtype=dtype, compute_dtype=compute), note


def warn_slow_bf16(card) -> str | None:
    """A warning when a CPU card computes in bfloat16 on a CPU without native bfloat16 (the
    setting is kept: the user chose it); None otherwise."""
    if card.device != "cpu" or "bfloat16" not in (card.dtype, card.compute_dtype) or cpu_has_native_bf16():
        return None
    return (f"node {card.name}: dtype={card.dtype!r} compute_dtype={card.compute_dtype!r} on a CPU without "
            f"native bfloat16 ({' / '.join(BF16_CPU_FLAGS)} not in /proc/cpuinfo): bfloat16 matmuls run "
            f"40-60x slower than float32 here; set dtype: float32 and compute_dtype: '' on this card")
