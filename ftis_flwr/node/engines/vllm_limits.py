"""The limits vLLM declares on one request, held before a request leaves this process.

vLLM checks some request fields only inside its engine core, where a violation kills the core
(``EngineDeadError`` in the caller) instead of failing one call. On a GPU vLLM 0.32/0.33 run
Model Runner V2 (``vllm/config/vllm.py``, ``VllmConfig.use_v2_model_runner``: on wherever Triton
is), whose sampler keeps per-request tables of fixed width and raises when a request needs more
(``vllm/v1/worker/gpu/sample/logit_bias.py``, ``LogitBiasState.add_request``; ``logprob.py``;
``bad_words.py``). vLLM's CPU build has no Triton and runs the old runner, which has none of
these caps: every CPU run would pass a request that crashes a GPU. So every ``SamplingParams``
the engine builds goes through :func:`check_request` first, against the caps of the vLLM
installed here where it declares them (:func:`declared_limits`), else the values read from vLLM
0.33.0's source (:data:`VLLM_033_LIMITS`).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

__all__ = ["VLLM_033_LIMITS", "RequestLimitError", "check_request", "declared_limits", "request_fields"]

VLLM_033_LIMITS: dict[str, int] = {
    "allowed_token_ids": 1024,  # logit_bias.py MAX_NUM_ALLOWED_TOKEN_IDS
    "logit_bias": 1024,  # logit_bias.py MAX_NUM_LOGIT_BIAS_TOKENS
    "stop_token_ids_with_min_tokens": 128,  # logit_bias.py MAX_NUM_STOP_TOKEN_IDS (when min_tokens > 0)
    "logprob_token_ids": 128,  # sampling_params.py MAX_LOGPROB_TOKEN_IDS
    "bad_words": 128,  # envs.py VLLM_MAX_NUM_BAD_WORDS (default)
    "bad_words_total_tokens": 1024,  # envs.py VLLM_MAX_BAD_WORDS_TOTAL_TOKENS (default)
    "logprobs": 20,  # config/model.py ModelConfig.max_logprobs (default)
}
"""Model Runner V2's per-request caps in vLLM 0.33.0 (files under ``vllm/``, names as declared
there); ``logprobs`` is the engine-wide ``max_logprobs`` default, which this engine never raises."""

_SOURCES: dict[str, tuple[str, str]] = {
    "allowed_token_ids": ("vllm.v1.worker.gpu.sample.logit_bias", "MAX_NUM_ALLOWED_TOKEN_IDS"),
    "logit_bias": ("vllm.v1.worker.gpu.sample.logit_bias", "MAX_NUM_LOGIT_BIAS_TOKENS"),
    "stop_token_ids_with_min_tokens": ("vllm.v1.worker.gpu.sample.logit_bias", "MAX_NUM_STOP_TOKEN_IDS"),
    "logprob_token_ids": ("vllm.sampling_params", "MAX_LOGPROB_TOKEN_IDS"),
}
"""Where the installed vLLM declares each cap (module, constant)."""


class RequestLimitError(ValueError):
    """A request vLLM would refuse inside its engine core (which then dies)."""


def declared_limits() -> dict[str, int]:
    """The caps of the vLLM installed here, read from its own modules where they exist; the
    0.33.0 values for the rest (and for all of them without vLLM)."""
    limits = dict(VLLM_033_LIMITS)
    for key, (module, name) in _SOURCES.items():
        try:
            limits[key] = int(getattr(importlib.import_module(module), name))
        except Exception:  # noqa: BLE001 - not installed, a build without the GPU runner, renamed
            continue
    return limits


def check_request(fields: Mapping[str, Any], limits: Mapping[str, int] | None = None) -> None:
    """Raise :class:`RequestLimitError`, naming the field, its size and vLLM's cap, when one
    request's ``SamplingParams`` keyword arguments exceed what Model Runner V2 accepts."""
    limits = VLLM_033_LIMITS if limits is None else limits
    problems = []

    def over(key: str, size: int, what: str) -> None:
        if size > limits[key]:
            problems.append(f"{what}: {size} > {limits[key]}")

    over("allowed_token_ids", len(fields.get("allowed_token_ids") or ()), "allowed_token_ids")
    over("logit_bias", len(fields.get("logit_bias") or ()), "logit_bias")
    over("logprob_token_ids", len(fields.get("logprob_token_ids") or ()), "logprob_token_ids")
    if int(fields.get("min_tokens") or 0) > 0:
        stops = len(fields.get("stop_token_ids") or ())
        over("stop_token_ids_with_min_tokens", stops, "stop_token_ids (with min_tokens > 0)")
    bad = list(fields.get("bad_words") or ())
    over("bad_words", len(bad), "bad_words")
    logprobs = fields.get("logprobs")
    if logprobs is not None and int(logprobs) >= 0:
        over("logprobs", int(logprobs), "logprobs")
    if problems:
        raise RequestLimitError(
            "VLLMEngine: this request exceeds what vLLM's GPU sampler (Model Runner V2) accepts, which "
            "would kill the engine: " + "; ".join(problems) + " (caps in ftis_flwr/node/engines/vllm_limits.py)")


def request_fields(eos_token_ids: list[int], **kw: Any) -> dict[str, Any]:
    """The ``SamplingParams`` keyword arguments of one request: everything that could reshape
    the distribution set neutral (π_gen is then exactly temperature, top-k, top-p), the node's
    stop ids, no detokenising; ``kw`` (n, temperature, top_k, top_p, max_tokens, logprobs, seed) on
    top. No ``allowed_token_ids``: the engine's model has no rows past the tokenizer."""
    fields: dict[str, Any] = dict(repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0,
                                  min_p=0.0, min_tokens=0, ignore_eos=False,
                                  stop_token_ids=[int(i) for i in eos_token_ids],
                                  detokenize=False, skip_special_tokens=False)
    fields.update(kw)
    return fields
