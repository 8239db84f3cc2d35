"""Generation with each distinct prompt prefilled once (``rollout.share_prompts``, #24).

Why: a group's G completions are sampled from one prompt, and ``generate`` on G copies of it
runs the prompt's forward G times. On a real chat model the prompt (system prompt, a worked
example, the question: ~140 tokens for cpu-smollm2) is several times a completion, so most of
the prefill is repeated work. Here the distinct prompts of a generate batch run once, without
their last token, into a cache whose rows are then selected per sequence (an index, as beam
search reorders its cache); ``generate`` is handed that cache and runs only the last prompt
token and the new ones. The sampled tokens and their log-probs are those of the unshared call
(tests/test_shared_prefill.py: equal tokens, log-probs to 1e-5 in float32, on tiny Qwen2 models,
full and LoRA). ``python benchmarks/shared_prefill.py`` measures it on cpu-smollm2's full node.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch


class SharedPrefillError(ValueError):
    """A model whose generation cache cannot be shared across sequences; says what to set."""

    def __init__(self, model: Any, why: str):
        super().__init__(f"{type(model).__name__} cannot generate from a shared prompt cache: {why}. Set "
                         "rollout.share_prompts: false (every sequence then prefills its own prompt)")


def shared_prefill(model: Any, seqs: Sequence[Sequence[int]], input_ids: torch.Tensor,
                   attention_mask: torch.Tensor) -> Any | None:
    """The cache of every row of ``input_ids`` (``seqs`` left-padded, with ``attention_mask``)
    but its last column, with each distinct prompt run once; ``None`` when there is nothing to
    share (every prompt distinct) or a prompt has a single token (no prefix to cache). Pass it to
    ``generate`` as ``cache`` with the full ``input_ids``."""
    keys = [tuple(int(t) for t in s) for s in seqs]
    distinct = list(dict.fromkeys(keys))
    if len(distinct) == len(keys) or min(len(k) for k in keys) < 2:
        return None
    first = {k: keys.index(k) for k in distinct}
    rows = torch.tensor([first[k] for k in distinct], dtype=torch.long, device=input_ids.device)
    ids, mask = input_ids.index_select(0, rows)[:, :-1], attention_mask.index_select(0, rows)[:, :-1]
    pos = mask.long().cumsum(-1) - 1  # as generate numbers left-padded positions
    pos.masked_fill_(mask == 0, 1)
    try:
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
    except TypeError as exc:  # a forward without these arguments: named, not a trace from deep inside
        raise SharedPrefillError(model, f"its forward does not take a position_ids / logits_to_keep prefill "
                                 f"({exc})") from None
    cache = out.get("cache") or out.get("past_key_values")  # transformers 5.24 calls it "cache"
    which = torch.tensor([distinct.index(k) for k in keys], dtype=torch.long, device=input_ids.device)
    try:
        cache.batch_select_indices(which)  # each sequence continues from its own prompt's keys and values
    except (AttributeError, TypeError, NotImplementedError) as exc:
        raise SharedPrefillError(model, f"its cache ({type(cache).__name__}) cannot be selected per "
                                 f"sequence ({type(exc).__name__}: {exc})") from None
    return cache
