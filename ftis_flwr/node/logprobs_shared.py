"""The learner's log-probs with each distinct prompt run once (#24): the prompt's forward is shared
by every completion of it, with gradient.

Why: a group's G completions share one prompt, and on a real chat model the prompt (system
prompt, a worked example, the question: ~300 tokens for cpu-smollm2) is many times longer than
a completion (~20 tokens). :func:`ftis_flwr.node.logprobs.completion_logprobs` runs prompt +
completion per sample, so most of an update's time and activation memory went into G copies of
the same prompt. Here the distinct prompts of a micro-batch run once (left-padded, with cache),
their keys and values are selected per sample (an index into the cache: gradients from every
completion flow back into its prompt's single forward), and the completions run on top. The
first completion token is predicted by the prompt's last position. The result is the same
``[B, T]`` layout, values and gradients as the packed path (tests/test_logprobs_shared.py: to
1e-5 in float32 on the tiny Qwen2, a LoRA one and real SmolLM2), computed on P + G*T tokens
instead of G*(P + T).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ftis_flwr.node.logprobs import _model_device
from ftis_flwr.node.shared_cache import SharedCacheError, cache_of, with_cache


def _unshareable(model: torch.nn.Module, why: str) -> SharedCacheError:
    return SharedCacheError(model, "score", "train.share_prompts", "every sample then runs its own prompt", why)


def shared_prompt_logprobs(model: torch.nn.Module, prompts: Sequence[Sequence[int]],
                           completions: Sequence[Sequence[int]], *, pad_id: int, temperature: float = 1.0,
                           vocab_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``([B, T] float32 log-probs, [B, T] bool mask)`` of each completion token under
    ``log_softmax(logits / temperature)`` over the first ``vocab_size`` rows, with gradient;
    completions right-padded to the longest (0.0 on padding), as the packed path lays them out."""
    if not temperature > 0:
        raise ValueError(f"shared_prompt_logprobs: temperature must be > 0, got {temperature}")
    if len(prompts) != len(completions) or not prompts:
        raise ValueError(f"shared_prompt_logprobs: {len(prompts)} prompts for {len(completions)} completions")
    device = _model_device(model)
    keys = [tuple(int(t) for t in p) for p in prompts]
    if any(not k for k in keys):
        raise ValueError("shared_prompt_logprobs: an empty prompt")
    row = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    distinct = list(row)
    which = torch.tensor([row[k] for k in keys], dtype=torch.long, device=device)
    width_p = max(len(k) for k in distinct)
    p_ids = torch.full((len(distinct), width_p), int(pad_id), dtype=torch.long)
    p_mask = torch.zeros((len(distinct), width_p), dtype=torch.long)
    for i, k in enumerate(distinct):
        p_ids[i, width_p - len(k):] = torch.tensor(k)
        p_mask[i, width_p - len(k):] = 1
    p_ids, p_mask = p_ids.to(device), p_mask.to(device)
    p_pos = (p_mask.cumsum(-1) - 1).clamp_min(0)
    out = model(input_ids=p_ids, attention_mask=p_mask, position_ids=p_pos, use_cache=True, logits_to_keep=1)
    first = out.logits[:, -1, :].index_select(0, which)  # [B, V]: predicts completion token 0
    cache = cache_of(out)
    try:
        cache.batch_select_indices(which)  # each sample attends to its own prompt's keys and values
    except (AttributeError, TypeError, NotImplementedError) as exc:
        raise _unshareable(model, f"its cache ({type(cache).__name__}) cannot be selected per sample "
                                  f"({type(exc).__name__}: {exc})") from None

    c_lists = [[int(t) for t in c] for c in completions]
    width_t = max(len(c) for c in c_lists)
    if width_t == 0:
        raise ValueError("shared_prompt_logprobs: every completion is empty")
    c_ids = torch.full((len(c_lists), width_t), int(pad_id), dtype=torch.long)
    c_mask = torch.zeros((len(c_lists), width_t), dtype=torch.bool)
    for i, c in enumerate(c_lists):
        c_ids[i, :len(c)] = torch.tensor(c, dtype=torch.long)
        c_mask[i, :len(c)] = True
    c_ids, c_mask = c_ids.to(device), c_mask.to(device)
    if width_t > 1:  # completion tokens 0..T-2 predict tokens 1..T-1
        attn = torch.cat([p_mask.index_select(0, which), c_mask[:, :-1].long()], dim=1)
        pos = p_mask.sum(-1).index_select(0, which)[:, None] + torch.arange(width_t - 1, device=device)
        try:
            rest = model(input_ids=c_ids[:, :-1], attention_mask=attn, position_ids=pos,
                         use_cache=False, **with_cache(model, cache)).logits
        except TypeError as exc:  # a forward that takes no cache: named, not a trace from deep inside
            raise _unshareable(model, f"its forward takes no cache ({exc})") from None
        logits = torch.cat([first[:, None, :], rest], dim=1)
    else:
        logits = first[:, None, :]
    logits = logits.float()
    if vocab_size is not None and logits.shape[-1] > vocab_size:
        if int(c_ids[c_mask].max()) >= vocab_size:
            raise ValueError(f"shared_prompt_logprobs: a completion token id is >= the vocabulary size {vocab_size}")
        logits = logits[..., :vocab_size]
    if temperature != 1.0:
        logits = logits / temperature
    token = logits.gather(-1, c_ids.unsqueeze(-1)).squeeze(-1)
    lp = token - torch.logsumexp(logits, dim=-1)
    return lp.masked_fill(~c_mask, 0.0), c_mask
