"""Generation with each distinct prompt prefilled once (rollout.share_prompts, #24): the same
sampled tokens, log-probs and ends as the unshared call, on real tiny Qwen2 models (full and
LoRA), with prompts of different lengths (left padding) and batches that cut groups apart; and
the shared path really runs each prompt once (the first decoding forward sees one token per
sequence, not the prompt). On SmolLM2 (float32, 2 prompts x 8) the tokens were equal and
generation took about half the time (``python benchmarks/shared_prefill.py``)."""

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from ftis_flwr.node.engines.hf import HFEngine
from ftis_flwr.node.engines.prefill import shared_prefill
from ftis_flwr.node.tiny import tiny_config


def _model(lora: bool):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("small", 70, 0, 1))
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                 task_type="CAUSAL_LM"))
        for name, p in model.named_parameters():  # B = 0 at init: make the adapters count
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.05)
    return model.eval()


def _prompts():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, 62, (n,), generator=g).tolist() for n in (5, 9, 2)]


def _engine(model, share: bool) -> HFEngine:
    return HFEngine(model, None, eos_token_ids=[1], pad_token_id=0, vocab_size=64, share_prompts=share)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("batch_size", [12, 5], ids=["one-batch", "groups-cut"])
def test_shared_prefill_samples_what_the_unshared_call_samples(lora, batch_size):
    model = _model(lora)
    kw = dict(temperature=0.8, top_k=0, top_p=0.95, max_new_tokens=9, batch_size=batch_size, generator_seed=7)
    plain = _engine(model, False).sample(_prompts(), 4, **kw)
    shared = _engine(model, True).sample(_prompts(), 4, **kw)
    for g_plain, g_shared in zip(plain, shared):
        for a, b in zip(g_plain, g_shared):
            np.testing.assert_array_equal(a.tokens, b.tokens)
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5, rtol=0)
            assert a.finished == b.finished


def test_the_shared_path_runs_each_prompt_once():
    model = _model(False)
    seen: list[tuple[int, int]] = []
    hook = model.model.register_forward_pre_hook(
        lambda mod, args, kwargs: seen.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    try:
        _engine(model, True).sample(_prompts(), 4, temperature=1.0, max_new_tokens=3, batch_size=12,
                                    generator_seed=0)
    finally:
        hook.remove()
    width = max(len(p) for p in _prompts())
    assert seen[0] == (3, width - 1), seen  # the three distinct prompts, once, without their last token
    assert seen[1] == (12, 1), seen  # generate starts from the cache: each sequence's last prompt token
    seen.clear()
    hook = model.model.register_forward_pre_hook(
        lambda mod, args, kwargs: seen.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    try:
        _engine(model, False).sample(_prompts(), 4, temperature=1.0, max_new_tokens=3, batch_size=12,
                                     generator_seed=0)
    finally:
        hook.remove()
    assert seen[0] == (12, width), seen  # unshared: every copy of every prompt


def test_nothing_to_share_leaves_generation_as_it_was():
    model = _model(False)
    eng = _engine(model, True)
    seqs = _prompts()
    ids, mask = eng._left_pad(seqs)
    assert shared_prefill(model, seqs, ids, mask) is None  # every prompt distinct (greedy evaluation)
    seqs = [[5], [5], [7, 8]]
    ids, mask = eng._left_pad(seqs)
    assert shared_prefill(model, seqs, ids, mask) is None  # a one-token prompt has no prefix to cache
    greedy_shared = eng.greedy(_prompts(), max_new_tokens=6, batch_size=8)
    greedy_plain = _engine(model, False).greedy(_prompts(), max_new_tokens=6, batch_size=8)
    for a, b in zip(greedy_shared, greedy_plain):
        np.testing.assert_array_equal(a, b)
