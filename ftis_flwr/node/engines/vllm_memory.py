"""Where a vLLM engine's GPU memory comes from when the learner sits on the same card.

vLLM starts only if ``gpu_memory_utilization`` x the card is free (``vllm/v1/worker/utils.py``,
``request_memory``), a check it makes even when ``kv_cache_memory_bytes`` is given; the learner is
already resident then, and its first update still allocates gradients and AdamW's state. So the
engine's share is planned from the memory free at its start less what the learner will still
take (:func:`ftis_flwr.config.engine_memory.engine_share`, which ``ftis-flwr plan`` and ``check``
use too), its KV cache is sized to the round's sequences, and engines on one machine start one
at a time. GPU only; nothing here has run on a GPU yet (docs/vllm.md).
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

import torch

from ftis_flwr.node.engines.vllm_weights import engine_tensors

__all__ = ["engine_plan_options", "kv_shape", "one_engine_starting", "plan_gpu_memory"]

log = logging.getLogger(__name__)


def plan_gpu_memory(model: Any, config: Any, *, vocab: int, dtype: str, max_model_len: int, utilization: float,
                    kv_cache_gib: float, reserve: float, kv_tokens: int, runtime: float, node: str) -> dict[str, Any]:
    """``gpu_memory_utilization`` and ``kv_cache_memory_bytes`` for vLLM on this GPU: as given
    where the card sets them, else planned from the memory free now (the learner is resident)
    less what the learner still allocates (``reserve``), refused with the numbers when the
    engine's weights and KV cache do not fit (:func:`ftis_flwr.config.engine_memory.engine_share`)."""
    from ftis_flwr.config.engine_memory import BLOCK_TOKENS, OVERHEAD, engine_share, kv_bytes_per_token

    free, total = torch.cuda.mem_get_info()
    per_token = kv_bytes_per_token(*kv_shape(config), dtype)
    kv = float(kv_cache_gib) * (1 << 30) if kv_cache_gib else \
        float(per_token * max(int(kv_tokens), max_model_len + BLOCK_TOKENS))  # vLLM needs one whole sequence
    weights = float(sum(t.numel() for t in engine_tensors(model, vocab))) * \
        torch.finfo(getattr(torch, dtype)).bits / 8
    if not utilization:
        utilization = engine_share(total=float(total), free=float(free), learner_reserve=float(reserve),
                                   weights=weights, kv_cache=kv, overhead=float(runtime or OVERHEAD), node=node)
    log.info("vLLM engine%s: %.2f of the GPU (%.1f of %.1f GiB free), KV cache %.2f GiB, weights %.2f GiB",
             f" of node {node}" if node else "", utilization, free / 2**30, total / 2**30, kv / 2**30,
             weights / 2**30)
    return {"gpu_memory_utilization": float(utilization), "kv_cache_memory_bytes": int(kv)}


def kv_shape(config: Any) -> tuple[int, int, int]:
    """(layers, KV heads, head size) of a decoder config (a multimodal wrapper's text config)."""
    config = getattr(config, "text_config", None) or config
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", 0) or config.hidden_size // heads)
    return int(config.num_hidden_layers), int(getattr(config, "num_key_value_heads", None) or heads), head_dim


@contextlib.contextmanager
def one_engine_starting():
    """Hold the machine's vLLM start lock (``<tmp>/ftis-vllm-start.lock``) while an engine
    measures the free memory and starts, so two nodes on one GPU do not both count the same
    free memory."""
    import fcntl
    import tempfile

    with open(Path(tempfile.gettempdir()) / "ftis-vllm-start.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def engine_plan_options(card: Any, experiment: Any, model: torch.nn.Module) -> dict[str, Any]:
    """What a vLLM engine on a GPU plans its memory with, from the node's card, experiment and
    learner, by the rules ``ftis-flwr plan`` shows (:mod:`ftis_flwr.config.engine_memory`):
    ``learner_reserve_bytes``, what the learner allocates after the engine starts (gradients,
    AdamW's two moments and the activations that do not fit the sleeping engine's memory;
    without the plan's architecture, the first two from the model itself), ``kv_tokens``, the
    round's sequences in whole KV blocks, and ``runtime_bytes``, vLLM's own. Empty for another
    engine or a CPU card."""
    if str(card.engine) != "vllm" or not str(card.device).startswith("cuda"):
        return {}
    from ftis_flwr.config.engine_memory import (
        BLOCK_TOKENS,
        engine_overhead,
        learner_reserve,
        round_sequences,
        sequence_tokens,
    )
    from ftis_flwr.config.plan import estimate

    est = estimate(card, experiment)
    if est is not None:
        reserve = learner_reserve(est)
    else:
        reserve = 3.0 * sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        log.warning("node %s: %s is not an architecture the plan knows: the engine's share leaves room for the "
                    "learner's gradients and AdamW state only, not its activations", card.name, card.source)
    tokens = round_sequences(experiment) * sequence_tokens(card, experiment) + BLOCK_TOKENS
    return {"learner_reserve_bytes": float(reserve), "kv_tokens": int(tokens), "runtime_bytes": engine_overhead(card)}
