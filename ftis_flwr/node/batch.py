"""The learner's batch: a round's samples, and one micro-batch's forward laid out for the loss.

Why apart from the node: what the loss sees of a micro-batch (the learner's log-probs, pi_gen's,
the mask, the chunk ids of the text path, a sequence ratio's per-token pi_gen, an episode's sampled
tokens) is one pure
construction from the samples and the model, whatever the node's ranks or engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from ftis_flwr.maths.loss import LossInputs
from ftis_flwr.node.logprobs import completion_logprobs, pack_batch
from ftis_flwr.node.logprobs_shared import shared_prompt_logprobs
from ftis_flwr.xtok.translate import sequence_gen


class Sample(NamedTuple):
    """One completion the learner trains on, as :meth:`Node._samples` lays the batch out."""

    prompt: np.ndarray
    completion: np.ndarray
    gen_logprobs: np.ndarray
    """log pi_gen per completion token (on the text path: this node's tokens, chunk-assigned)."""
    advantage: float
    foreign: bool
    source: str
    """The node that generated it."""
    chunks: np.ndarray | None
    """Chunk id per token on the text path; None on the token path."""
    sampled: np.ndarray | None = None
    """An episode's sampled mask (``Group.sampled_masks``, algorithm §13): only its 1 tokens enter
    the loss (ratio, weight, the filter's KL, the token mean); None: every token (a single turn)."""


def loss_inputs(model: Any, chunk: Sequence[Sample], old: torch.Tensor | None = None, *, pad_id: int,
                vocab_size: int, temperature: float, share_prompts: bool, sequence_ratio: bool,
                compute: Callable[[], Any]) -> LossInputs:
    """One micro-batch's forward through ``model`` (under ``compute()``, its autocast), as the loss
    takes it; ``old``: its pi_old log-probs from the round's first update (updates after the first)."""
    prompts, comps, gens, advs, foreign, sources, chunks, sampled = zip(*chunk)
    device = model.device
    with compute():
        if share_prompts:  # each distinct prompt runs once (ftis_flwr/node/logprobs_shared.py)
            lp, mask = shared_prompt_logprobs(model, prompts, comps, pad_id=pad_id, temperature=temperature,
                                              vocab_size=vocab_size)
        else:
            batch = pack_batch(list(prompts), list(comps), pad_id=pad_id)
            lp = completion_logprobs(model, batch.to(device), temperature=temperature, vocab_size=vocab_size)
            mask = batch.completion_mask.to(device).bool()
    if any(s is not None for s in sampled):  # an episode's context tokens are not the model's
        model_tokens = torch.ones(mask.shape, dtype=torch.bool)
        for i, s in enumerate(sampled):
            if s is not None:
                model_tokens[i, : len(s)] = torch.from_numpy(np.asarray(s, dtype=bool))
        mask = mask & model_tokens.to(mask.device)
    gen = torch.zeros_like(lp, dtype=torch.float32)
    for i, g in enumerate(gens):
        gen[i, : len(g)] = torch.from_numpy(np.asarray(g, dtype=np.float32))
    chunk_ids = None
    if any(c is not None for c in chunks):
        chunk_ids = torch.zeros(lp.shape, dtype=torch.long)
        for i, (c, comp, s) in enumerate(zip(chunks, comps, sampled)):
            chunk_ids[i, : len(comp)] = torch.from_numpy(c) if c is not None else torch.arange(len(comp)) \
                if s is None else torch.from_numpy(_own_chunks(s))
        if sequence_ratio:
            gen = sequence_gen(gen, old if old is not None else lp.detach(), chunks, comps)
        chunk_ids = chunk_ids.to(device)
    return LossInputs(
        logprobs=lp.float(),
        gen_logprobs=gen,
        advantages=torch.tensor(advs, dtype=torch.float32, device=device),
        mask=mask,
        foreign=torch.tensor(foreign, dtype=torch.bool, device=device),
        sources=list(sources),
        old_logprobs=None if old is None else old.to(device),
        chunks=chunk_ids,
    )


def _own_chunks(sampled: np.ndarray) -> np.ndarray:
    """A token-path episode beside text-path samples: each sampled token its own chunk, counted over
    the sampled tokens only (a tool token takes the chunk before it; the loss masks it out)."""
    return np.maximum(np.cumsum(np.asarray(sampled, bool)) - 1, 0).astype(np.int64)
