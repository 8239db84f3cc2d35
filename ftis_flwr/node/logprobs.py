"""The learner's per-token log-probs of completions (algorithm §4: ``lp``).

``lp[t] = log pi_theta(a_t | prompt, a_<t)`` under ``log_softmax(logits / temperature)`` over the
full vocabulary, with gradient. It must agree with what the rollout engine reports for its own
samples (``gen``), otherwise the importance ratio is biased even on-policy; the engine tests check
that equality token by token.

Layout (why it is not plain right padding): prompts are *left*-padded to a common width ``P`` and
completions *right*-padded to ``T``, so completion token ``t`` of every row sits in column
``P + t`` and the logits that predict it are the contiguous columns ``P-1 .. P+T-2``. The model
then projects only those ``T`` hidden states onto the vocabulary (``logits_to_keep``), instead of
all ``P+T``: the ``[B, T, V]`` logits are the only vocabulary-sized tensor materialised. Position
ids are computed from the attention mask (``cumsum - 1``), exactly as ``generate`` does for its
left-padded prompts, so each real token has the same position in both.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["PackedBatch", "pack_batch", "completion_logprobs"]


@dataclass
class PackedBatch:
    """Prompts + completions ready for one forward pass.

    ``input_ids``/``attention_mask``/``position_ids``: ``[B, P+T]`` (prompt left-padded to ``P``,
    completion right-padded to ``T``). ``completion_ids``/``completion_mask``: ``[B, T]``; the mask
    is float32, 1.0 on real completion tokens (the final EOS included), 0.0 on padding.
    ``completion_lengths``: ``[B]`` real completion lengths.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    completion_lengths: torch.Tensor
    prompt_width: int

    @property
    def completion_width(self) -> int:
        return int(self.completion_ids.shape[1])

    def to(self, device: torch.device | str) -> PackedBatch:
        """A copy on ``device`` (tensors only; widths unchanged)."""
        return PackedBatch(
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            position_ids=self.position_ids.to(device),
            completion_ids=self.completion_ids.to(device),
            completion_mask=self.completion_mask.to(device),
            completion_lengths=self.completion_lengths.to(device),
            prompt_width=self.prompt_width,
        )


def _as_id_list(seq: Sequence[int], what: str, i: int) -> list[int]:
    try:
        ids = [int(x) for x in seq]
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} {i} is not a sequence of integer token ids") from exc
    if any(x < 0 for x in ids):
        raise ValueError(f"{what} {i} contains a negative token id")
    return ids


def pack_batch(
    prompts: list[Sequence[int]], completions: list[Sequence[int]], pad_id: int
) -> PackedBatch:
    """Pack ``B`` (prompt, completion) pairs; see the module docstring for the layout.

    Raises ``ValueError`` on mismatched lengths, an empty batch, an empty prompt (the first
    completion token needs a preceding token to be predicted from) or all-empty completions.
    """
    if len(prompts) != len(completions):
        raise ValueError(
            f"pack_batch: {len(prompts)} prompts but {len(completions)} completions"
        )
    if not prompts:
        raise ValueError("pack_batch: empty batch")
    p_ids = [_as_id_list(p, "prompt", i) for i, p in enumerate(prompts)]
    c_ids = [_as_id_list(c, "completion", i) for i, c in enumerate(completions)]
    for i, p in enumerate(p_ids):
        if not p:
            raise ValueError(f"pack_batch: prompt {i} is empty")
    width_p = max(len(p) for p in p_ids)
    width_t = max(len(c) for c in c_ids)
    if width_t == 0:
        raise ValueError("pack_batch: every completion is empty")
    b = len(p_ids)
    input_ids = torch.full((b, width_p + width_t), int(pad_id), dtype=torch.long)
    attention_mask = torch.zeros((b, width_p + width_t), dtype=torch.long)
    completion_ids = torch.full((b, width_t), int(pad_id), dtype=torch.long)
    completion_mask = torch.zeros((b, width_t), dtype=torch.float32)
    lengths = torch.zeros(b, dtype=torch.long)
    for i, (p, c) in enumerate(zip(p_ids, c_ids)):
        input_ids[i, width_p - len(p) : width_p] = torch.tensor(p, dtype=torch.long)
        attention_mask[i, width_p - len(p) : width_p] = 1
        if c:
            ct = torch.tensor(c, dtype=torch.long)
            input_ids[i, width_p : width_p + len(c)] = ct
            attention_mask[i, width_p : width_p + len(c)] = 1
            completion_ids[i, : len(c)] = ct
            completion_mask[i, : len(c)] = 1.0
        lengths[i] = len(c)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp_min(0).masked_fill(attention_mask == 0, 0)
    return PackedBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        completion_lengths=lengths,
        prompt_width=width_p,
    )


def _model_device(model: torch.nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def _accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether the (unwrapped) causal LM's forward takes ``logits_to_keep``."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        return "logits_to_keep" in inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return False


def completion_logprobs(
    model: torch.nn.Module, batch: PackedBatch, temperature: float = 1.0,
    vocab_size: int | None = None,
) -> torch.Tensor:
    """``[B, T]`` float32 log-probs of each completion token under ``log_softmax(logits / T)``.

    Over the first ``vocab_size`` output rows (the tokenizer's vocabulary: the rows the engine
    samples from; None = all rows), with no top-k/top-p truncation (the learner's policy is the
    untruncated one),
    with gradient through ``model``; padded positions are 0.0. Works for plain HF causal LMs and
    peft-wrapped ones. Runs ``model`` in whatever train/eval mode it is in.
    """
    if not temperature > 0:
        raise ValueError(f"completion_logprobs: temperature must be > 0, got {temperature}")
    device = _model_device(model)
    batch = batch.to(device)
    width_t = batch.completion_width
    kwargs = dict(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
    )
    if _accepts_logits_to_keep(model):
        # last T+1 columns: P-1 .. P+T-1; the final one predicts nothing we need
        logits = model(**kwargs, logits_to_keep=width_t + 1).logits
    else:
        logits = model(**kwargs).logits
    logits = logits[:, -(width_t + 1) : -1, :]
    if logits.shape[1] != width_t:
        raise RuntimeError(
            f"completion_logprobs: model returned {logits.shape[1]} logit columns, expected {width_t}"
        )
    logits = logits.float()
    if vocab_size is not None and logits.shape[-1] > vocab_size:
        if int(batch.completion_ids.max()) >= vocab_size:
            raise ValueError(f"completion_logprobs: a completion token id is >= the vocabulary "
                             f"size {vocab_size}")
        logits = logits[..., :vocab_size]
    if temperature != 1.0:
        logits = logits / temperature
    token_logits = logits.gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1)
    lp = token_logits - torch.logsumexp(logits, dim=-1)
    return lp.masked_fill(batch.completion_mask == 0, 0.0)
