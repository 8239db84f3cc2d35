"""Generation with shared prompt prefixes prefilled once (rollout.share_prompts, #24): the same
sampled tokens, log-probs and ends, and the same greedy completions, as the unshared call, on real
tiny Qwen2 models (full and LoRA), for prompts with and without a common prefix (a task's system
prompt and worked example), of different lengths, in batches that cut groups apart; and the shared
path really runs the common prefix once and each distinct prompt once. On SmolLM2 (float32) the
sampled tokens were equal and generation took about half the time
(``python -m benchmarks.shared_prefill``)."""

import numpy as np
import pytest
import torch
from conftest import tiny_qwen2

from ftis_flwr.node.engines.hf import HFEngine
from ftis_flwr.node.engines.prefill import MIN_COMMON, common_prefix, layout, shared_prefill


def _model(lora: bool):
    return tiny_qwen2(lora, adapter_std=0.05).eval()


def _prompts(common: int = 0):
    g = torch.Generator().manual_seed(1)
    head = torch.randint(3, 62, (common,), generator=g).tolist()
    return [head + torch.randint(3, 62, (n,), generator=g).tolist() for n in (5, 9, 2)]


def _engine(model, share: bool) -> HFEngine:
    return HFEngine(model, None, eos_token_ids=[1], pad_token_id=0, vocab_size=64, share_prompts=share)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("batch_size", [12, 5], ids=["one-batch", "groups-cut"])
@pytest.mark.parametrize("common", [0, 11], ids=["distinct", "common-prefix"])
def test_shared_prefill_samples_what_the_unshared_call_samples(lora, batch_size, common):
    model = _model(lora)
    kw = dict(temperature=0.8, top_k=0, top_p=0.95, max_new_tokens=9, batch_size=batch_size, generator_seed=7)
    plain = _engine(model, False).sample(_prompts(common), 4, **kw)
    shared = _engine(model, True).sample(_prompts(common), 4, **kw)
    for g_plain, g_shared in zip(plain, shared):
        for a, b in zip(g_plain, g_shared):
            np.testing.assert_array_equal(a.tokens, b.tokens)
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5, rtol=0)
            assert a.finished == b.finished


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_greedy_with_a_common_prefix_completes_as_the_unshared_call(lora):
    model = _model(lora)
    prompts = _prompts(12) + _prompts(12)[:2]  # duplicates too
    shared = _engine(model, True).greedy(prompts, max_new_tokens=8, batch_size=4)
    plain = _engine(model, False).greedy(prompts, max_new_tokens=8, batch_size=4)
    for a, b in zip(shared, plain):
        np.testing.assert_array_equal(a, b)


def _forward_shapes(model, engine: HFEngine, prompts, n: int) -> list[tuple[int, int]]:
    seen: list[tuple[int, int]] = []
    hook = model.model.register_forward_pre_hook(
        lambda mod, args, kwargs: seen.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    try:
        engine.sample(prompts, n, temperature=1.0, max_new_tokens=3, batch_size=64, generator_seed=0)
    finally:
        hook.remove()
    return seen


def test_the_shared_path_runs_the_common_prefix_once_and_each_prompt_once():
    model = _model(False)
    width = max(len(p) for p in _prompts())
    seen = _forward_shapes(model, _engine(model, True), _prompts(), 4)
    assert seen[:2] == [(3, width - 1), (12, 1)], seen  # each distinct prompt once; then one token each
    seen = _forward_shapes(model, _engine(model, True), _prompts(10), 4)
    assert seen[:3] == [(1, 10), (3, width - 1), (12, 1)], seen  # the common prefix once, then the rests
    seen = _forward_shapes(model, _engine(model, False), _prompts(10), 4)
    assert seen[0] == (12, width + 10), seen  # unshared: every copy of every prompt, whole


def test_the_layout_keeps_every_tokens_position():
    seqs = [[7] * 9 + [3, 4], [7] * 9 + [5], [7] * 9 + [6, 8, 9]]
    assert common_prefix(seqs) == 9 and common_prefix([s[:5] for s in seqs]) == 0  # below MIN_COMMON
    assert MIN_COMMON <= 9
    ids, mask = layout(seqs, 0, 9)
    assert ids[1].tolist() == [7] * 9 + [0, 0, 5] and mask[1].tolist() == [1] * 9 + [0, 0, 1]
    for row, real, s in zip(ids.tolist(), mask.tolist(), seqs):
        assert [t for t, m in zip(row, real) if m] == s  # every real token, in order
        assert real[-1] == 1  # the prompts end together: generate's new tokens follow each one
    plain, _ = layout(seqs, 0, 0)
    assert plain[1].tolist() == [0, 0] + [7] * 9 + [5]  # common 0: plain left padding


def test_nothing_to_share_leaves_generation_as_it_was():
    model = _model(False)
    seqs = _prompts()
    ids, mask = layout(seqs, 0, 0)
    assert shared_prefill(model, seqs, ids, mask, 0) is None  # every prompt distinct, no common prefix
    seqs = [[5], [5], [7, 8]]
    ids, mask = layout(seqs, 0, 0)
    assert shared_prefill(model, seqs, ids, mask, 0) is None  # a one-token prompt has no prefix to cache
    seqs = _prompts(12)[:1]
    ids, mask = layout(seqs, 0, common_prefix(seqs))
    assert shared_prefill(model, seqs, ids, mask, common_prefix(seqs)) is None  # one row: nothing saved


def test_a_model_whose_cache_cannot_be_shared_is_named_with_the_setting_to_change(monkeypatch):
    """The seam, as for the learner's log-probs: a cache class without per-row selection is stood
    in for by making the real DynamicCache's selection refuse, for this test."""
    from transformers import DynamicCache

    from ftis_flwr.node.shared_cache import SharedCacheError

    def no_selection(self, indices):
        raise NotImplementedError("no per-row selection")

    monkeypatch.setattr(DynamicCache, "batch_select_indices", no_selection)
    with pytest.raises(SharedCacheError, match=r"cannot generate with shared prompts: its cache \(DynamicCache\) "
                                                r"cannot be batch_select_indices-ed.*rollout.share_prompts: false"):
        _engine(_model(False), True).sample(_prompts(11), 4, temperature=0.8, top_k=0, top_p=1.0,
                                            max_new_tokens=3, batch_size=12, generator_seed=7)
