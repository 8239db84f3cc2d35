"""Rollout engines: turn prompts into sampled groups with per-token sampling log-probs.

``make_engine(name, model, tokenizer)`` picks one by the model card's ``engine`` field. The
``hf`` engine (transformers ``generate``) is always available; ``vllm`` needs a CUDA machine and
the ``[vllm]`` extra and is not part of this build yet.
"""

from __future__ import annotations

from typing import Any

from .hf import HFEngine, Sample

__all__ = ["ENGINES", "HFEngine", "Sample", "make_engine"]

ENGINES = ("hf", "vllm")


def make_engine(name: str, model: Any, tokenizer: Any, **options: Any):
    """Build the rollout engine called ``name`` for ``(model, tokenizer)``; ``options`` are the
    engine's keyword arguments (``eos_token_ids``, ``vocab_size``)."""
    if name == "hf":
        return HFEngine(model, tokenizer, **options)
    if name == "vllm":
        raise RuntimeError(
            "vllm engine not available in this build: install the [vllm] extra on a CUDA machine"
        )
    raise ValueError(f"unknown engine {name!r}; expected one of {', '.join(ENGINES)}")
