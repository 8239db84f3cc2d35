"""Whether a vLLM node's plan fits the GPU this machine shows, and the engine's planned share of it:
the plan's estimate (:mod:`ftis_flwr.config.plan`) held against the engine's memory rules
(:mod:`ftis_flwr.config.engine_memory`). Apart from both, so neither imports the other; torch is
imported only where an NVIDIA driver is present (:func:`cuda_total_bytes`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ftis_flwr.config import plan
from ftis_flwr.config.choices import Engine
from ftis_flwr.config.engine_memory import (
    EngineMemoryError,
    _gib,
    engine_share,
    fixes,
    learner_reserve,
    margin,
)


def planned_share(card: Any, exp: Any, *, total: float, free: float, arch: Any = None) -> float:
    """:func:`engine_share` from the card's plan (``vllm_gpu_memory_utilization: 0``): ``total`` and
    ``free`` are the device's bytes now; ``arch`` a ``plan.Arch`` (default: the plan's for the card's
    source). Raises :class:`EngineMemoryError` also when the architecture is unknown."""
    est = plan.estimate(card, exp, arch=arch)
    if est is None:
        raise EngineMemoryError(f"node {card.name}: the architecture of {card.source!r} is not known here, so "
                                f"vLLM's memory share cannot be planned: set nodes.{card.name}."
                                "vllm_gpu_memory_utilization (a fraction of the GPU in (0, 1])")
    return engine_share(total=total, free=free, learner_reserve=learner_reserve(est), weights=est.engine_copy,
                        kv_cache=est.kv_cache, overhead=est.engine_runtime, node=card.name)


def cuda_total_bytes(device: str) -> float | None:
    """The total memory of ``device`` ("cuda", "cuda:N", the first of "cuda:i,j") when this machine
    shows it, else None. torch is imported here only, and only where an NVIDIA driver is present
    (``/dev/nvidiactl``) or torch is loaded already: a check on a machine without a GPU stays
    torch-free and fast. Reading a device's properties creates no CUDA context."""
    if not device.startswith("cuda") or ("torch" not in sys.modules and not Path("/dev/nvidiactl").exists()):
        return None
    try:
        import torch

        index = int(device.partition(":")[2].split(",")[0] or 0)
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            return None
        return float(torch.cuda.get_device_properties(index).total_memory)
    except Exception:
        return None


def device_fit_errors(card: Any, exp: Any, where: str, total: float | None = None) -> list[str]:
    """A vLLM card on a GPU whose plan (learner + engine, :func:`margin` kept free) exceeds that
    GPU's ``total`` bytes (default: what this machine shows, :func:`cuda_total_bytes`; none shown:
    no message, ``ftis-flwr plan`` still shows the figures). An explicit
    ``vllm_gpu_memory_utilization`` is the user's: not checked here."""
    if card.engine != Engine.VLLM or not card.device.startswith("cuda") or card.vllm_gpu_memory_utilization:
        return []
    total = cuda_total_bytes(card.device) if total is None else total
    est = None if total is None else plan.estimate(card, exp)
    if est is None or est.total + margin(total) <= total:
        return []
    engine = est.engine_copy + est.kv_cache + est.engine_runtime
    turns = ("the larger of the engine's" if est.engine_sleeps else "the engine's")
    act = (f"and the update's {_gib(est.activations)} activations (it sleeps during the update)"
           if est.engine_sleeps else f"+ the update's {_gib(est.activations)} activations (vllm_sleep off)")
    return [f"{where}.engine='vllm' on {card.device} ({_gib(total)} in all) needs {_gib(est.total)} + a "
            f"{_gib(margin(total))} margin: the learner's {_gib(est.weights)} weights + "
            f"{_gib(est.gradients)} grads + {_gib(est.optimizer)} AdamW, then {turns} {_gib(est.engine_copy)} "
            f"weights + {_gib(est.kv_cache)} KV cache + {_gib(est.engine_runtime)} runtime ({_gib(engine)}) {act}; "
            + fixes(card.name, activations=est.activations > engine, sleeps=est.engine_sleeps)]
