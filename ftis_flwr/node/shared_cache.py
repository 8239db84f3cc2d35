"""What prompt sharing asks of a model's cache, in one place for its two users: the learner's
log-probs (``train.share_prompts``, :mod:`ftis_flwr.node.logprobs_shared`) and generation
(``rollout.share_prompts``, :mod:`ftis_flwr.node.engines.prefill`). A model whose forward or cache
cannot do it fails with one error that names the setting that turns sharing off."""

from __future__ import annotations

from typing import Any


class SharedCacheError(ValueError):
    """A model whose prompt cache cannot be shared across sequences; says what to set instead."""

    def __init__(self, model: Any, doing: str, setting: str, instead: str, why: str):
        super().__init__(f"{type(model).__name__} cannot {doing} with shared prompts: {why}. Set "
                         f"{setting}: false ({instead})")


def cache_of(out: Any) -> Any:
    """A forward output's cache (transformers 5.24 calls it ``cache``; older ones ``past_key_values``)."""
    return out.get("cache") or out.get("past_key_values")
