"""What a vLLM rollout engine needs on its GPU beside the learner, and the share of the GPU to give it.

On a CUDA machine vLLM refuses to start unless ``gpu_memory_utilization`` x the device's total
memory is free at that moment (``vllm/v1/worker/utils.py``, ``request_memory``), even with
``kv_cache_memory_bytes`` set; and the node's learner shares the GPU: its weights are resident when
the engine starts, and its first optimizer step still allocates the gradients and AdamW's two
moment buffers (and, unless the engine sleeps during the update, the activations beside the
engine). So a node on vLLM (card ``engine: vllm``) holds:

- the engine's own copy of the weights, in :func:`engine_dtype` (a LoRA node: the base weights,
  and one adapter slot at its rank);
- the KV cache of the round's sequences (:func:`round_sequences` x prompt + ``max_new_tokens``
  tokens), or ``vllm_kv_cache_gib``;
- vLLM's own runtime memory (:data:`OVERHEAD`).

``ftis-flwr plan`` counts them (:func:`engine_parts`), ``ftis-flwr check`` refuses a card whose
plan cannot fit the GPU it sees (:func:`ftis_flwr.config.device_fit.device_fit_errors`), and the
engine asks :func:`engine_share` (or :func:`ftis_flwr.config.device_fit.planned_share`) for its
``gpu_memory_utilization`` at start. Pure Python, no torch at import (the configuration layer's
rule): the plan's architecture comes in as an argument (``plan.Arch``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ftis_flwr.config.choices import AdvantageMode, CardDtype
from ftis_flwr.config.dtypes import resolve_dtypes

GIB = 1024 ** 3
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
PROMPT_TOKENS = 256
"""Assumed prompt length (system prompt + a GSM8K question through the chat template)."""
BLOCK_TOKENS = 16
"""vLLM's KV-cache block (tokens): a sequence takes whole blocks, and the pool keeps one null block."""
OVERHEAD = 2.0 * GIB
"""vLLM's own memory besides its weights and KV cache, an assumption not measured on a GPU: the
CUDA context of its engine process (~0.5 GiB), and the peak of its profile run, the larger of the
activations of one batch at its default token budget (~1 GiB for Qwen2.5-1.5B/3B: gate/up
projections of 16,384 tokens in bfloat16) and the sampler's float32 logits and log-probs over
151,936 rows for its dummy batch of sequences (~1.2 GiB)."""
CUDA_GRAPHS = 1.0 * GIB
"""Added to :data:`OVERHEAD` when the card sets ``vllm_enforce_eager: false``: the CUDA graphs vLLM
captures (an assumption, not measured here)."""
MARGIN_FRACTION, MARGIN_MIN = 0.05, 1.0 * GIB
""":func:`margin`: left free on the GPU: the learner's estimate is calibrated to within ~5% of
measured update peaks (plan.ACTIVATION_ELEMENTS: 69.5 vs 69.6 GiB, 116.8 vs 110.7 GiB on an
H200), and PyTorch's caching allocator fragments; at least 1 GiB on a small GPU."""


class EngineMemoryError(ValueError):
    """The engine's weights, KV cache and runtime do not fit beside the learner: the message names
    every number and what would make them fit."""


def margin(total: float) -> float:
    """Bytes kept free on a GPU of ``total`` bytes: 5% of it, at least 1 GiB (see :data:`MARGIN_FRACTION`)."""
    return max(MARGIN_FRACTION * total, MARGIN_MIN)


def _gib(b: float) -> str:
    return f"{b / GIB:.1f} GiB"


def engine_dtype(card: Any) -> str:
    """The dtype vLLM samples in: ``vllm_dtype`` when set, else the card's ``compute_dtype``, else
    its ``dtype`` ("auto" resolved for the card's device as the node resolves it), except a LoRA
    card on a GPU in float32, which samples in bfloat16: vLLM's GPU LoRA kernels take float16 or
    bfloat16 only (``vllm/lora/ops/triton_ops/lora_shrink_op.py``). A card on the CPU keeps its
    compute dtype."""
    wanted = getattr(card, "vllm_dtype", "")
    if wanted and wanted != "auto":
        return wanted
    if wanted == "auto":  # as compute_dtype: auto: bfloat16 where the device computes it natively
        card = dataclasses.replace(card, compute_dtype="auto")
    resolved, _ = resolve_dtypes(card)
    dtype = resolved.compute_dtype or resolved.dtype
    if dtype == CardDtype.FLOAT32 and resolved.lora and resolved.device.startswith("cuda"):
        return "bfloat16"
    return dtype


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype: str) -> int:
    """Bytes of keys and values one token holds in the KV cache."""
    return 2 * layers * kv_heads * head_dim * DTYPE_BYTES[dtype]


def round_sequences(exp: Any) -> int:
    """Sequences a node hands vLLM at once: the round's ``rounds.prompts_per_node`` prompts x the
    completions it samples of each (``rollout.group_size``; G / nodes in horizontal mode), or the
    ``rounds.eval_size`` greedy prompts of an evaluation when more (``eval_size: 0``, the whole
    split, is not known offline and not counted: vLLM runs what its KV cache cannot hold in waves)."""
    g = exp.rollout.group_size
    if exp.advantage.mode == AdvantageMode.HORIZONTAL:
        g //= max(1, len(exp.nodes))
    return max(exp.rounds.prompts_per_node * g, exp.rounds.eval_size)


def new_tokens(exp: Any) -> int:
    """Tokens a sequence holds after its prompt: ``rollout.max_new_tokens``, or an episode's budget
    with ``task.environment`` (:meth:`ftis_flwr.config.schema.ExperimentConfig.completion_tokens`)."""
    tokens = getattr(exp, "completion_tokens", None)
    return int(tokens()) if callable(tokens) else int(exp.rollout.max_new_tokens)


def sequence_tokens(card: Any, exp: Any, prompt_tokens: int = PROMPT_TOKENS) -> int:
    """Tokens one sequence takes in the KV cache: prompt + :func:`new_tokens` (at most the card's
    ``vllm_max_model_len``), in whole blocks of :data:`BLOCK_TOKENS`."""
    tokens = prompt_tokens + new_tokens(exp)
    if getattr(card, "vllm_max_model_len", 0):
        tokens = min(tokens, card.vllm_max_model_len)
    return math.ceil(tokens / BLOCK_TOKENS) * BLOCK_TOKENS


def engine_need(card: Any, exp: Any, arch: Any, prompt_tokens: int = PROMPT_TOKENS) -> tuple[float, float]:
    """``(weights, kv_cache)`` in bytes for a vLLM engine: ``arch.params()`` in :func:`engine_dtype`
    (a LoRA card adds one adapter slot at its rank), and ``vllm_kv_cache_gib`` when set, else the
    round's sequences (:func:`round_sequences` x :func:`sequence_tokens`, plus the null block), at
    least one ``vllm_max_model_len`` sequence (vLLM refuses a KV cache that cannot hold one).
    ``arch`` is a ``plan.Arch``."""
    dtype = engine_dtype(card)
    params = arch.params()
    if card.lora:
        params += arch.lora_params(card.lora_config.r, list(card.lora_config.target_modules))
    weights = float(params * DTYPE_BYTES[dtype])
    if getattr(card, "vllm_kv_cache_gib", 0):
        return weights, float(card.vllm_kv_cache_gib * GIB)
    per_token = kv_bytes_per_token(arch.layers, arch.kv_heads, arch.head_dim, dtype)
    tokens = round_sequences(exp) * sequence_tokens(card, exp, prompt_tokens) + BLOCK_TOKENS
    tokens = max(tokens, getattr(card, "vllm_max_model_len", 0) + BLOCK_TOKENS)
    return weights, float(tokens * per_token)


def engine_overhead(card: Any) -> float:
    """vLLM's runtime memory for ``card``: :data:`OVERHEAD`, plus :data:`CUDA_GRAPHS` without ``vllm_enforce_eager``."""
    return OVERHEAD + (0.0 if getattr(card, "vllm_enforce_eager", True) else CUDA_GRAPHS)


def engine_sleeps(card: Any) -> bool:
    """Whether the engine sleeps during the update: ``vllm_sleep`` on a GPU (vLLM's CPU build has no sleep mode)."""
    return bool(getattr(card, "vllm_sleep", True)) and card.device.startswith("cuda")


def engine_parts(card: Any, exp: Any, arch: Any) -> tuple[float, float, float, bool]:
    """``(weights, kv_cache, runtime, sleeps)`` of ``card``'s vLLM engine, what the plan's table shows."""
    weights, kv = engine_need(card, exp, arch)
    return weights, kv, engine_overhead(card), engine_sleeps(card)


PLAN_NOTE = (" A vllm node holds its engine's own copy of the weights (in the dtype it samples in, with a LoRA "
             "node's adapter), the KV cache of the round's sequences (rounds.prompts_per_node x G of prompt + "
             "max_new_tokens, or vllm_kv_cache_gib) and vLLM's runtime (assumed, not measured); on a GPU with "
             "vllm_sleep the engine sleeps during the update: per rank = weights + grads + AdamW + the larger of "
             "(engine copy + KV cache + vLLM runtime) and activations; without it, all of them.")
"""What the plan's note adds under its table when a node runs vLLM."""


def vllm_part(est: Any) -> str:
    """The placement line's words on a vLLM node's engine (``est``: its ``plan.Estimate``)."""
    engine = est.engine_copy + est.kv_cache + est.engine_runtime
    return f" (its vLLM engine {_gib(engine)}, {'asleep during' if est.engine_sleeps else 'beside'} the update)"


def fixes(node: str, *, activations: bool = False, kv_room: float = 0.0, sleeps: bool = False) -> str:
    """What makes a vLLM node fit its GPU (engine=vllm runs on one GPU: ranks are not available):
    ``activations`` when the update's activations are what overflows, ``kv_room`` the KV cache that
    would fit (bytes; 0: not told), ``sleeps`` when the engine already sleeps during the update."""
    room = f" (to {_gib(kv_room)} or less)" if kv_room > 0 else ""
    sleep = "" if sleeps else f"set nodes.{node}.vllm_sleep=true, "
    first = (f"lower train.micro_batch_size or set nodes.{node}.compute_dtype=bfloat16 (the update's "
             "activations), or " if activations else "")
    return (f"{first}lower rollout.group_size or rounds.prompts_per_node (the KV cache holds their product "
            f"of sequences) or nodes.{node}.vllm_max_model_len, set nodes.{node}.vllm_kv_cache_gib lower{room} "
            f"(vLLM then runs the round in waves), {sleep}or use a larger GPU "
            f"(engine=vllm runs on one GPU: nodes.{node}.ranks > 1 is not available)")


def engine_share(*, total: float, free: float, learner_reserve: float, weights: float, kv_cache: float,
                 overhead: float = OVERHEAD, node: str = "") -> float:
    """The ``gpu_memory_utilization`` to give vLLM, a fraction of the device's memory: ``(free - learner_reserve
    - margin) / total`` (rounded down to 1e-4), ``free`` being what the device has free now (the
    learner's weights resident), ``learner_reserve`` what the learner still allocates while the
    engine holds its memory (:func:`learner_reserve`) and :func:`margin` what stays free. Raises
    :class:`EngineMemoryError`, naming every number, when ``weights + kv_cache + overhead`` exceed
    that budget."""
    keep = margin(total)
    budget = free - learner_reserve - keep
    need = weights + kv_cache + overhead
    if need > budget:
        who = f"node {node}: " if node else ""
        raise EngineMemoryError(
            f"{who}vLLM's engine needs {_gib(weights)} weights + {_gib(kv_cache)} KV cache + {_gib(overhead)} "
            f"runtime = {_gib(need)}, but the GPU ({_gib(total)} in all) has {_gib(free)} free, less "
            f"{_gib(learner_reserve)} the learner still allocates and a {_gib(keep)} margin: {_gib(budget)} "
            f"left; {fixes(node or '<name>', kv_room=budget - weights - overhead)}")
    return math.floor(budget / total * 1e4) / 1e4


def learner_reserve(est: Any) -> float:
    """What the learner of a node's plan (``plan.Estimate`` of a vLLM card) allocates beside the
    engine after the engine starts: its gradients and AdamW state, and its activations, all of
    them without sleep, the part above the engine's memory with sleep (the two then take turns)."""
    engine = est.engine_copy + est.kv_cache + est.engine_runtime
    act = max(0.0, est.activations - engine) if est.engine_sleeps else est.activations
    return est.gradients + est.optimizer + act
