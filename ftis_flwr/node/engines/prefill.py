"""Generation with shared prompt prefixes prefilled once (``rollout.share_prompts``, #24).

Why: on a real chat model the prompt is most of the tokens a generate call runs, and most of it
is repeated. A group's G completions are sampled from one prompt, and every prompt of a task
starts with the same system prompt and worked examples (cpu-smollm2's basic-math prompts: 131 of
~143 tokens in common). ``generate`` on a left-padded batch runs all of it once per sequence; on a
CPU the prefill was 17 of the 24 s of a greedy evaluation batch of 32 problems.

Here a batch is laid out as ``[common prefix | padding | rest of the prompt]`` (:func:`layout`;
the positions count real tokens only, as ``generate`` numbers them, so every token keeps the
position it has in a left-padded batch), the common prefix runs once, its cache is repeated for
each distinct prompt, the distinct prompts' rests (without their last token) run once on top,
and the cache rows are selected for each sequence (an index, as beam search reorders its cache).
``generate`` is handed that cache and runs only the last prompt token and the new ones. The
tokens and log-probs are those of the unshared call to float32 rounding
(tests/test_shared_prefill.py on tiny Qwen2 models, full and LoRA; Gemma 3's hybrid cache in
tests/test_real_xfamily.py). ``python -m benchmarks.shared_prefill`` measures it on cpu-smollm2.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ftis_flwr.node.shared_cache import SharedCacheError, cache_of, with_cache

MIN_COMMON = 8
"""A common prefix shorter than this many tokens is not run on its own (one more forward call
would cost more than it saves); the batch is then plainly left-padded."""


def _unshareable(model: Any, why: str) -> SharedCacheError:
    return SharedCacheError(model, "generate", "rollout.share_prompts", "every sequence then prefills its own "
                            "prompt", why)


def common_prefix(seqs: Sequence[Sequence[int]]) -> int:
    """Tokens every prompt starts with, at most the shortest prompt's length minus one (every
    row keeps a last token of its own to run in ``generate``); 0 below :data:`MIN_COMMON`."""
    shortest = min(len(s) for s in seqs)
    n = 0
    while n < shortest - 1 and all(s[n] == seqs[0][n] for s in seqs):
        n += 1
    return n if n >= MIN_COMMON else 0


def layout(seqs: Sequence[Sequence[int]], pad_id: int, common: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` ``[B, W]``: each row its first ``common`` tokens, then
    padding, then the rest of its prompt, so the prompts end together (``common`` 0: plain left
    padding)."""
    rest = max(len(s) for s in seqs) - common
    ids = torch.full((len(seqs), common + rest), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(seqs), common + rest), dtype=torch.long)
    for i, s in enumerate(seqs):
        s = [int(t) for t in s]
        ids[i, :common] = torch.tensor(s[:common], dtype=torch.long)
        mask[i, :common] = 1
        if len(s) > common:
            ids[i, common + rest - (len(s) - common):] = torch.tensor(s[common:], dtype=torch.long)
            mask[i, common + rest - (len(s) - common):] = 1
    return ids, mask


def _positions(mask: torch.Tensor) -> torch.Tensor:
    pos = mask.long().cumsum(-1) - 1  # as generate numbers them: real tokens only
    return pos.masked_fill_(mask == 0, 1)


def _run(model: Any, cache: Any = None, **kwargs: Any) -> Any:
    try:
        past = with_cache(model, cache) if cache is not None else {}
        return cache_of(model(use_cache=True, logits_to_keep=1, **kwargs, **past))
    except TypeError as exc:  # a forward without these arguments: named, not a trace from deep inside
        raise _unshareable(model, f"its forward does not take a cached, positioned prefill ({exc})") from None


def _rows(model: Any, cache: Any, how: str, arg: Any) -> None:
    try:
        getattr(cache, how)(arg)
    except (AttributeError, TypeError, NotImplementedError) as exc:
        raise _unshareable(model, f"its cache ({type(cache).__name__}) cannot be {how}-ed "
                                  f"({type(exc).__name__}: {exc})") from None


def shared_prefill(model: Any, seqs: Sequence[Sequence[int]], input_ids: torch.Tensor,
                   attention_mask: torch.Tensor, common: int) -> Any | None:
    """The cache of every row of ``input_ids`` (``seqs`` laid out by :func:`layout` with
    ``common``) but its last column, with the common prefix run once and each distinct prompt's
    rest once; ``None`` when nothing would be saved (one row, or every prompt distinct and no
    common prefix). Pass it to ``generate`` with the full ``input_ids``, under the name
    :func:`ftis_flwr.node.shared_cache.with_cache` gives it."""
    keys = [tuple(int(t) for t in s) for s in seqs]
    distinct = list(dict.fromkeys(keys))
    if len(keys) < 2 or (common == 0 and len(distinct) == len(keys)) or min(len(k) for k in keys) < 2:
        return None
    device = input_ids.device
    slot = {k: i for i, k in enumerate(distinct)}
    row_of = {k: row for row, k in enumerate(keys)}  # any row of a prompt holds the same ids and mask
    rows = torch.tensor([row_of[k] for k in distinct], dtype=torch.long, device=device)
    ids, mask = input_ids.index_select(0, rows), attention_mask.index_select(0, rows)
    pos = _positions(mask)
    cache = None
    if common:
        cache = _run(model, input_ids=ids[:1, :common], attention_mask=mask[:1, :common],
                     position_ids=pos[:1, :common])
        _rows(model, cache, "batch_repeat_interleave", len(distinct))
    if ids.shape[1] - 1 > common:
        cache = _run(model, input_ids=ids[:, common:-1], attention_mask=mask[:, :-1],
                     position_ids=pos[:, common:-1], cache=cache)
    which = torch.tensor([slot[k] for k in keys], dtype=torch.long, device=device)
    _rows(model, cache, "batch_select_indices", which)  # each sequence continues from its own prompt
    return cache
