"""Rollout engine on ``transformers`` ``generate`` (algorithm §4: what ``gen`` must be).

Each sample carries the log-prob of every completion token under the distribution it was
*actually* drawn from: ``log_softmax`` of the logits after temperature, top-k and top-p, i.e.
renormalised over the kept support. How that is guaranteed with transformers 5.x:

* Every logits processor ``generate`` could add on its own (from the model's
  ``generation_config`` or the library defaults, e.g. the global default ``top_k=50``,
  repetition penalty, ``min_new_tokens``, suppressed tokens, min-p/typical/eta/epsilon
  cut-offs, forced BOS/EOS, sequence bias, watermarking) is switched off by passing neutral
  values explicitly (:data:`NEUTRAL_GENERATION_KWARGS`); explicit kwargs win over the model's
  config.
* Temperature, top-k and top-p are applied by our own processor, :class:`_WarpAndRecord`. With
  HF's warpers off, custom processors run last, so the scores it returns are exactly what
  ``generate`` feeds to ``softmax`` + ``multinomial``. It keeps ``log_softmax`` of one step and
  gathers the token that was drawn when it sees it on the next call (the last step is gathered
  from the returned sequences). Memory: one ``[B, V]`` step at a time, instead of the
  ``[B, steps, V]`` that ``output_scores=True`` would keep (25 GB for 64 x 640 Qwen tokens).

EOS: a completion is cut after its first EOS (the EOS token and its log-prob kept,
``finished=True``); one that ran into ``max_new_tokens`` has ``finished=False``. Works when the
pad id equals an EOS id. Generation runs in eval mode (no dropout) under ``inference_mode``, and
every module's train/eval flag is restored afterwards.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from ftis_flwr.node.engines.prefill import common_prefix, layout, shared_prefill
from ftis_flwr.node.shared_cache import with_cache

__all__ = ["Sample", "HFEngine", "NEUTRAL_GENERATION_KWARGS"]

NEUTRAL_GENERATION_KWARGS: dict[str, Any] = {
    "temperature": 1.0,
    "top_k": 0,
    "top_p": 1.0,
    "min_p": None,
    "top_h": None,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "bad_words_ids": None,
    "sequence_bias": None,
    "min_length": 0,
    "min_new_tokens": None,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "remove_invalid_values": False,
    "exponential_decay_length_penalty": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "guidance_scale": None,
    "renormalize_logits": False,
    "watermarking_config": None,
    "num_beams": 1,
    "num_return_sequences": 1,
    "stop_strings": None,
    "max_time": None,
    "max_length": None,
    "use_cache": True,
    "output_scores": False,
    "output_logits": False,
    "return_dict_in_generate": False,
}
"""What is passed to every ``generate`` call so that no processor but ours changes the logits.
Keys the installed ``GenerationConfig`` does not know are dropped (older transformers)."""


def check_prompts(prompts: list[list[int]], vocab_size: int | None, engine: str) -> list[list[int]]:
    """Prompts as lists of int ids, each non-empty and inside the vocabulary; ValueError naming
    the engine and the prompt otherwise (shared by every engine)."""
    if not isinstance(prompts, (list, tuple)) or len(prompts) == 0:
        raise ValueError(f"{engine}: prompts must be a non-empty list of token-id lists")
    out = []
    for i, p in enumerate(prompts):
        ids = [int(x) for x in p]
        if not ids:
            raise ValueError(f"{engine}: prompt {i} is empty")
        bad = [x for x in ids if x < 0 or (vocab_size is not None and x >= vocab_size)]
        if bad:
            raise ValueError(f"{engine}: prompt {i} has token id {bad[0]} outside [0, {vocab_size})")
        out.append(ids)
    return out


def check_sampling(engine: str, n: int, temperature: float, top_k: int, top_p: float,
                   max_new_tokens: int) -> None:
    """ValueError naming the engine and the setting when a sampling request is out of range
    (shared by every engine)."""
    if int(max_new_tokens) < 1:
        raise ValueError(f"{engine}: max_new_tokens must be >= 1, got {max_new_tokens}")
    if int(n) < 1:
        raise ValueError(f"{engine}.sample: n must be >= 1, got {n}")
    if not float(temperature) > 0:
        raise ValueError(f"{engine}.sample: temperature must be > 0, got {temperature}")
    if int(top_k) < 0:
        raise ValueError(f"{engine}.sample: top_k must be >= 0 (0 = off), got {top_k}")
    if not 0.0 < float(top_p) <= 1.0:
        raise ValueError(f"{engine}.sample: top_p must be in (0, 1], got {top_p}")


@dataclass
class Sample:
    """One completion: ids (final EOS included if emitted) and their sampling log-probs."""

    prompt_index: int
    tokens: np.ndarray  # int64 [n]
    logprobs: np.ndarray  # float32 [n]
    finished: bool  # True iff the completion ends with an EOS


class _WarpAndRecord(LogitsProcessor):
    """Temperature -> top-k -> top-p (HF semantics and order), recording sampled log-probs."""

    def __init__(self, temperature: float, top_k: int, top_p: float, vocab_size: int | None = None):
        self.vocab_size = vocab_size
        self.temperature = float(temperature)
        self.top_k = int(top_k)
        self.top_p = float(top_p)
        self._pending: torch.Tensor | None = None  # log_softmax of the last step, [B, V]
        self._steps: list[torch.Tensor] = []  # gathered log-probs, one [B] per step

    def warp(self, scores: torch.Tensor) -> torch.Tensor:
        s = _mask_unused_rows(scores.float(), self.vocab_size)
        if self.temperature != 1.0:
            s = s / self.temperature
        if 0 < self.top_k < s.shape[-1]:
            kth = torch.topk(s, self.top_k, dim=-1).values[..., -1:]
            s = s.masked_fill(s < kth, float("-inf"))
        if self.top_p < 1.0:
            # drop the least likely tokens whose cumulative mass is <= 1 - top_p; keep >= 1
            sorted_s, order = torch.sort(s, dim=-1, descending=False)
            cum = sorted_s.softmax(dim=-1).cumsum(dim=-1)
            drop_sorted = cum <= (1.0 - self.top_p)
            drop_sorted[..., -1] = False
            drop = drop_sorted.scatter(-1, order, drop_sorted)
            s = s.masked_fill(drop, float("-inf"))
        return s

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._pending is not None:  # the token drawn at the previous step is now visible
            self._steps.append(self._pending.gather(-1, input_ids[:, -1:]).squeeze(-1))
        warped = self.warp(scores)
        self._pending = torch.log_softmax(warped, dim=-1)
        return warped

    def collect(self, sequences: torch.Tensor, num_steps: int) -> torch.Tensor:
        """``[B, num_steps]`` log-probs of the generated tokens (the last ``num_steps`` columns)."""
        steps = list(self._steps)
        if len(steps) < num_steps and self._pending is not None:
            steps.append(self._pending.gather(-1, sequences[:, -1:]).squeeze(-1))
        if len(steps) < num_steps:
            raise RuntimeError(
                f"HFEngine: recorded {len(steps)} sampling steps but generate returned {num_steps}"
            )
        # a generate that ran (and undid) an extra step leaves one surplus record at the end
        return torch.stack(steps[:num_steps], dim=1)


def _mask_unused_rows(scores: torch.Tensor, vocab_size: int | None) -> torch.Tensor:
    """-inf on output rows past the tokenizer's vocabulary (Qwen2.5: 151,936 rows, 151,665
    tokens): such an id cannot be decoded, so it is never sampled nor chosen greedily."""
    if vocab_size is None or scores.shape[-1] <= vocab_size:
        return scores
    scores = scores.clone()
    scores[..., vocab_size:] = float("-inf")
    return scores


class _MaskUnused(LogitsProcessor):
    """Greedy decoding's only processor: keeps argmax inside the tokenizer's vocabulary."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        return _mask_unused_rows(scores, self.vocab_size)


def _generation_kwargs(**overrides: Any) -> dict[str, Any]:
    known = GenerationConfig()
    kw = {k: v for k, v in NEUTRAL_GENERATION_KWARGS.items() if hasattr(known, k)}
    kw.update(overrides)
    return kw


@contextlib.contextmanager
def _eval_mode(model: torch.nn.Module):
    """Eval mode (no dropout) for the block; restores every module's own flag afterwards."""
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, was_training in flags:
            m.training = was_training


def _ids_tuple(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    return (int(value),)


class HFEngine:
    """Samples groups and greedy completions with ``model.generate``.

    ``eos_token_ids`` defaults to the tokenizer's EOS plus the model's ``generation_config`` EOS
    ids (e.g. both ``<|im_end|>`` and ``<|endoftext|>`` for Qwen instruct models);
    ``pad_token_id`` to the tokenizer's pad id, else the first EOS id. ``vocab_size`` is the
    sampling vocabulary, ``len(tokenizer)`` by default: output rows past it are never emitted,
    and the learner scores the same restricted distribution (``completion_logprobs``).
    ``share_prompts`` prefills the batch's common prompt prefix once and each distinct prompt's
    rest once (the G copies of a group's prompt share its cache: :mod:`ftis_flwr.node.engines.prefill`).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        eos_token_ids: list[int] | None = None,
        pad_token_id: int | None = None,
        vocab_size: int | None = None,
        share_prompts: bool = True,
    ):
        self.model = model
        self.share_prompts = bool(share_prompts)
        """Prefill a batch's common prompt prefix and each distinct prompt once (:mod:`.prefill`)."""
        self.tokenizer = tokenizer
        if eos_token_ids is None:
            ids = list(_ids_tuple(getattr(tokenizer, "eos_token_id", None)))
            gen_cfg = getattr(model, "generation_config", None)
            for i in _ids_tuple(getattr(gen_cfg, "eos_token_id", None)):
                if i not in ids:
                    ids.append(i)
            eos_token_ids = ids
        if not eos_token_ids:
            raise ValueError("HFEngine: no EOS token id (tokenizer and generation_config have none)")
        self.eos_token_ids = [int(i) for i in eos_token_ids]
        if pad_token_id is None:
            pad_token_id = getattr(tokenizer, "pad_token_id", None)
        self.pad_token_id = int(self.eos_token_ids[0] if pad_token_id is None else pad_token_id)
        rows = self._embedding_rows()
        if vocab_size is None:
            vocab_size = len(tokenizer) if hasattr(tokenizer, "__len__") else rows
        if rows is not None and vocab_size is not None and vocab_size > rows:
            raise ValueError(f"HFEngine: the tokenizer has {vocab_size} tokens but the model only "
                             f"{rows} embedding rows: they do not belong together")
        self.vocab_size = vocab_size

    def _embedding_rows(self) -> int | None:
        emb = self.model.get_input_embeddings() if hasattr(self.model, "get_input_embeddings") else None
        return int(emb.weight.shape[0]) if emb is not None else None

    @property
    def device(self) -> torch.device:
        for p in self.model.parameters():
            return p.device
        return torch.device("cpu")

    # ---------------------------------------------------------------- validation
    def _check_prompts(self, prompts: list[list[int]]) -> list[list[int]]:
        return check_prompts(prompts, self.vocab_size, "HFEngine")

    @staticmethod
    def _check_common(max_new_tokens: int, batch_size: int) -> None:
        if int(max_new_tokens) < 1:
            raise ValueError(f"HFEngine: max_new_tokens must be >= 1, got {max_new_tokens}")
        if int(batch_size) < 1:
            raise ValueError(f"HFEngine: batch_size must be >= 1, got {batch_size}")

    # ---------------------------------------------------------------- generation
    def _left_pad(self, seqs: list[list[int]], common: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """``seqs`` ending together on this engine's device (:func:`.prefill.layout`: plain left
        padding, or with ``common`` the shared prefix first)."""
        ids, mask = layout(seqs, self.pad_token_id, common)
        return ids.to(self.device), mask.to(self.device)

    def _generate(self, seqs: list[list[int]], **kwargs: Any) -> tuple[torch.Tensor, int]:
        """Run one ``generate`` on ``seqs`` laid out to end together (their common prefix
        prefilled once with ``share_prompts``); returns (generated ids [B, S], S)."""
        common = common_prefix(seqs) if self.share_prompts else 0
        input_ids, attention_mask = self._left_pad(seqs, common)
        cache = shared_prefill(self.model, seqs, input_ids, attention_mask, common) if self.share_prompts else None
        out = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            **(with_cache(self.model, cache) if cache is not None else {}),
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            **_generation_kwargs(**kwargs),
        )
        sequences = out if isinstance(out, torch.Tensor) else out.sequences
        width = input_ids.shape[1]
        return sequences[:, width:], sequences.shape[1] - width

    def _cut(self, ids: np.ndarray) -> tuple[int, bool]:
        """Length to keep (through the first EOS) and whether an EOS was emitted."""
        hits = np.flatnonzero(np.isin(ids, self.eos_token_ids))
        if hits.size:
            return int(hits[0]) + 1, True
        return int(ids.shape[0]), False

    @contextlib.contextmanager
    def _seeded(self, seed: int | None):
        """Seed the CPU RNG (and the model's CUDA device's) inside ``fork_rng``; no-op for None."""
        if seed is None:
            yield
            return
        dev = self.device
        cuda_idx = (dev.index if dev.index is not None else torch.cuda.current_device()) if dev.type == "cuda" else None
        with torch.random.fork_rng(devices=[] if cuda_idx is None else [cuda_idx]):
            torch.random.default_generator.manual_seed(int(seed))
            if cuda_idx is not None:
                with torch.cuda.device(cuda_idx):
                    torch.cuda.manual_seed(int(seed))
            yield

    def sample(
        self,
        prompts: list[list[int]],
        n: int,
        *,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        max_new_tokens: int,
        batch_size: int,
        generator_seed: int | None = None,
    ) -> list[list[Sample]]:
        """``n`` sampled completions per prompt, as ``result[prompt_index][j]``.

        All ``len(prompts) * n`` sequences go through batched ``generate`` calls of at most
        ``batch_size`` sequences (sorted by prompt length to limit padding). ``top_k=0`` and
        ``top_p=1.0`` mean off. ``generator_seed`` seeds torch inside ``fork_rng`` (the global
        RNG is left untouched); results for a seed also depend on ``batch_size``. ``None``
        draws from (and advances) the global RNG.
        """
        prompts = self._check_prompts(prompts)
        self._check_common(max_new_tokens, batch_size)
        check_sampling("HFEngine", n, temperature, top_k, top_p, max_new_tokens)
        jobs = [(i, j) for i in range(len(prompts)) for j in range(int(n))]
        jobs.sort(key=lambda job: len(prompts[job[0]]))
        results: list[list[Sample | None]] = [[None] * int(n) for _ in prompts]
        with self._seeded(generator_seed), _eval_mode(self.model), torch.inference_mode():
            for start in range(0, len(jobs), int(batch_size)):
                chunk = jobs[start : start + int(batch_size)]
                recorder = _WarpAndRecord(temperature, top_k, top_p, self.vocab_size)
                gen_ids, steps = self._generate(
                    [prompts[i] for i, _ in chunk],
                    do_sample=True,
                    max_new_tokens=int(max_new_tokens),
                    logits_processor=LogitsProcessorList([recorder]),
                )
                logps = recorder.collect(gen_ids, steps).float().cpu().numpy()
                gen_np = gen_ids.cpu().numpy().astype(np.int64)
                for row, (i, j) in enumerate(chunk):
                    keep, finished = self._cut(gen_np[row])
                    results[i][j] = Sample(
                        prompt_index=i,
                        tokens=gen_np[row, :keep].copy(),
                        logprobs=logps[row, :keep].astype(np.float32),
                        finished=finished,
                    )
        return [[s for s in group if s is not None] for group in results]

    def greedy(
        self, prompts: list[list[int]], *, max_new_tokens: int, batch_size: int
    ) -> list[np.ndarray]:
        """Greedy completion ids per prompt (int64), EOS and everything after it stripped."""
        prompts = self._check_prompts(prompts)
        self._check_common(max_new_tokens, batch_size)
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        out: list[np.ndarray | None] = [None] * len(prompts)
        with _eval_mode(self.model), torch.inference_mode():
            for start in range(0, len(order), int(batch_size)):
                chunk = order[start : start + int(batch_size)]
                gen_ids, _ = self._generate(
                    [prompts[i] for i in chunk],
                    do_sample=False,
                    top_k=None,  # sample-only flag; None keeps generate from warning about it
                    max_new_tokens=int(max_new_tokens),
                    logits_processor=LogitsProcessorList(
                        [_MaskUnused(self.vocab_size)] if self.vocab_size else []),
                )
                gen_np = gen_ids.cpu().numpy().astype(np.int64)
                for row, i in enumerate(chunk):
                    keep, finished = self._cut(gen_np[row])
                    out[i] = gen_np[row, : keep - 1 if finished else keep].copy()
        return [o for o in out if o is not None]
