"""HF rollout engine vs the learner's log-probs (algorithm §4), on a tiny random Qwen2.

The point: for its own samples a node's ``gen`` must equal its ``lp`` (at the same temperature,
without truncation), and under top-k/top-p the gap must be exactly the renormalisation.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from ftis_flwr.node.engines import HFEngine, RolloutEngine, Sample, make_engine
from ftis_flwr.node.engines.hf import NEUTRAL_GENERATION_KWARGS, _WarpAndRecord
from ftis_flwr.node.logprobs import completion_logprobs, pack_batch

VOCAB = 40
PAD, EOS = 0, 1
# different lengths, so left padding matters inside one generate call
PROMPTS = [[5, 6], [7, 8, 9, 10, 11], [12, 13, 14, 15, 16, 17, 18, 19, 20]]
MAX_NEW = 12


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_tokenizer(pad: str = "<pad>", eos: str = "<eos>") -> PreTrainedTokenizerFast:
    words = ["<pad>", "<eos>"] + [f"w{i}" for i in range(2, VOCAB)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="w2"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=pad, eos_token=eos, unk_token="w2")


def make_model(seed: int = 0, eos_bias: float = 2.5, pad_id: int = PAD, dropout: float = 0.0):
    """Tiny Qwen2; a fixed bonus on the EOS logit (part of the model) makes EOS frequent."""
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64,
        tie_word_embeddings=True, pad_token_id=pad_id, eos_token_id=EOS, bos_token_id=None,
        initializer_range=0.1, attention_dropout=dropout,
    )
    model = Qwen2ForCausalLM(cfg)
    bias = torch.zeros(VOCAB)
    bias[EOS] = eos_bias
    model.lm_head.register_forward_hook(lambda _m, _i, out: out + bias.to(out.dtype))
    model.eval()
    return model


def flat(groups: list[list[Sample]]) -> list[Sample]:
    return [s for g in groups for s in g]


def learner_lp(model, samples: list[Sample], temperature: float = 1.0, pad_id: int = PAD):
    batch = pack_batch([PROMPTS[s.prompt_index] for s in samples], [s.tokens for s in samples], pad_id)
    with torch.no_grad():
        return completion_logprobs(model, batch, temperature=temperature), batch


def gen_matrix(samples: list[Sample], width: int) -> torch.Tensor:
    out = torch.zeros(len(samples), width)
    for k, s in enumerate(samples):
        out[k, : len(s.tokens)] = torch.from_numpy(s.logprobs)
    return out


def full_logits(model, prompt: list[int], completion: np.ndarray) -> torch.Tensor:
    """Logits predicting each completion token, from one unpadded sequence (independent path)."""
    ids = torch.tensor([list(prompt) + completion.tolist()])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    return logits[len(prompt) - 1 : len(prompt) + len(completion) - 1]


# --------------------------------------------------------------------------- equality


@pytest.mark.parametrize("pad_id", [PAD, EOS], ids=["pad!=eos", "pad==eos"])
def test_own_samples_logprobs_equal_learner_at_t1(pad_id):
    model = make_model(pad_id=pad_id)
    tok = make_tokenizer(pad="<eos>" if pad_id == EOS else "<pad>")
    engine = make_engine("hf", model, tok)
    assert engine.pad_token_id == pad_id and engine.eos_token_ids == [EOS]
    groups = engine.sample(PROMPTS, 4, temperature=1.0, max_new_tokens=MAX_NEW, batch_size=5, generator_seed=3)
    assert [len(g) for g in groups] == [4, 4, 4]
    assert all(s.prompt_index == i for i, g in enumerate(groups) for s in g)
    samples = flat(groups)
    assert any(s.finished for s in samples) and any(not s.finished for s in samples)
    lp, batch = learner_lp(model, samples, pad_id=pad_id)
    gen = gen_matrix(samples, lp.shape[1])
    torch.testing.assert_close(gen, lp, atol=1e-4, rtol=0)
    # the EOS token's log-prob is part of the match, and padding is 0 in lp
    for k, s in enumerate(samples):
        assert s.tokens.dtype == np.int64 and s.logprobs.dtype == np.float32
        assert (lp[k, len(s.tokens):] == 0).all()
        assert int(batch.completion_mask[k].sum()) == len(s.tokens)
    # and against an independent, unpadded forward pass
    s = next(x for x in samples if x.finished and x.prompt_index == 2)
    ref = torch.log_softmax(full_logits(model, PROMPTS[2], s.tokens), -1)
    ref = ref.gather(-1, torch.from_numpy(s.tokens)[:, None]).squeeze(-1)
    torch.testing.assert_close(torch.from_numpy(s.logprobs), ref, atol=1e-4, rtol=0)


def test_absolute_position_model_matches_learner():
    """GPT-2 has absolute position embeddings (RoPE is shift-invariant and cannot catch a wrong
    position offset): left-padded generation and the learner's packing must agree on positions."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(12)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=64,
                                       bos_token_id=EOS, eos_token_id=EOS, pad_token_id=PAD, initializer_range=0.1))
    model.eval()
    engine = HFEngine(model, make_tokenizer())
    samples = flat(engine.sample(PROMPTS, 3, max_new_tokens=MAX_NEW, batch_size=9, generator_seed=4))
    lp, _ = learner_lp(model, samples)
    torch.testing.assert_close(gen_matrix(samples, lp.shape[1]), lp, atol=1e-4, rtol=0)


def test_temperature_matches_learner_at_same_temperature():
    model = make_model(seed=1)
    engine = HFEngine(model, make_tokenizer())
    samples = flat(engine.sample(PROMPTS, 3, temperature=0.7, max_new_tokens=MAX_NEW, batch_size=4, generator_seed=0))
    lp_t, _ = learner_lp(model, samples, temperature=0.7)
    gen = gen_matrix(samples, lp_t.shape[1])
    torch.testing.assert_close(gen, lp_t, atol=1e-4, rtol=0)
    lp_1, _ = learner_lp(model, samples, temperature=1.0)
    assert (gen - lp_1).abs().max() > 1e-2  # the temperature really changes the numbers


def _kept_support(probs: torch.Tensor, top_k: int, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Mass and membership of the kept support per row: top-k, then top-p on the renormalised rest."""
    order = torch.argsort(probs, dim=-1, descending=True)
    sorted_p = probs.gather(-1, order)
    keep = torch.ones_like(sorted_p, dtype=torch.bool)
    if top_k:
        keep[:, top_k:] = False
    if top_p < 1.0:
        q = torch.where(keep, sorted_p, 0.0)
        cum = (q / q.sum(-1, keepdim=True)).cumsum(-1)
        first = (cum >= top_p).float().argmax(-1)  # smallest prefix reaching top_p
        keep &= torch.arange(probs.shape[-1])[None, :] <= first[:, None]
    member = torch.zeros_like(keep).scatter(-1, order, keep)
    return (sorted_p * keep).sum(-1), member


@pytest.mark.parametrize(
    "temperature,top_k,top_p", [(1.0, 5, 1.0), (1.0, 0, 0.7), (0.8, 6, 0.9)], ids=["topk5", "topp0.7", "t0.8-k6-p0.9"]
)
def test_truncated_sampling_logprobs_are_renormalised(temperature, top_k, top_p):
    model = make_model(seed=2)
    engine = HFEngine(model, make_tokenizer())
    samples = flat(
        engine.sample(PROMPTS, 3, temperature=temperature, top_k=top_k, top_p=top_p,
                      max_new_tokens=MAX_NEW, batch_size=9, generator_seed=5)
    )
    lp, _ = learner_lp(model, samples, temperature=temperature)
    masses = []
    for k, s in enumerate(samples):
        n = len(s.tokens)
        probs = torch.softmax(full_logits(model, PROMPTS[s.prompt_index], s.tokens) / temperature, -1)
        mass, member = _kept_support(probs, top_k, top_p)
        tokens = torch.from_numpy(s.tokens)
        assert member.gather(-1, tokens[:, None]).all(), "sampled a token outside the kept support"
        diff = torch.from_numpy(s.logprobs) - lp[k, :n]
        torch.testing.assert_close(diff, -torch.log(mass), atol=1e-4, rtol=0)
        masses.append(mass)
    assert torch.cat(masses).max() < 0.999  # truncation really happened


def test_recorded_logprobs_are_those_generate_samples_from():
    """Our processor's output is what generate softmaxes: compare with output_scores."""
    model = make_model(seed=3)
    model.generation_config = GenerationConfig(top_k=3, temperature=0.3, repetition_penalty=3.0, min_new_tokens=8)
    rec = _WarpAndRecord(temperature=0.9, top_k=7, top_p=0.95)
    kw = {k: v for k, v in NEUTRAL_GENERATION_KWARGS.items() if hasattr(GenerationConfig(), k)}
    kw.update(output_scores=True, return_dict_in_generate=True)
    engine = HFEngine(model, make_tokenizer())
    ids, mask = engine._left_pad(PROMPTS)
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=MAX_NEW,
                             eos_token_id=EOS, pad_token_id=PAD, logits_processor=LogitsProcessorList([rec]), **kw)
    gen_ids = out.sequences[:, ids.shape[1]:]
    scores = torch.stack(out.scores, 1)  # processed scores, as sampled from
    expected = torch.log_softmax(scores, -1).gather(-1, gen_ids[..., None]).squeeze(-1)
    torch.testing.assert_close(rec.collect(gen_ids, gen_ids.shape[1]), expected, atol=1e-6, rtol=0)


# --------------------------------------------------------------------------- EOS, config, modes


@pytest.mark.parametrize("pad_id", [PAD, EOS], ids=["pad!=eos", "pad==eos"])
def test_eos_cut_and_finished_flags(pad_id):
    model = make_model(seed=4, eos_bias=3.0, pad_id=pad_id)
    engine = HFEngine(model, make_tokenizer(pad="<eos>" if pad_id == EOS else "<pad>"))
    samples = flat(engine.sample(PROMPTS, 6, max_new_tokens=MAX_NEW, batch_size=8, generator_seed=11))
    finished = [s for s in samples if s.finished]
    assert finished and any(not s.finished for s in samples)
    assert any(len(s.tokens) < MAX_NEW - 1 for s in finished)
    for s in samples:
        assert len(s.tokens) == len(s.logprobs) >= 1
        eos_at = np.flatnonzero(s.tokens == EOS)
        if s.finished:
            assert eos_at.tolist() == [len(s.tokens) - 1]  # ends with its only EOS
            assert len(s.tokens) <= MAX_NEW
        else:
            assert eos_at.size == 0 and len(s.tokens) == MAX_NEW
        assert np.all(s.logprobs <= 0) and np.all(np.isfinite(s.logprobs))
    _, batch = learner_lp(model, samples, pad_id=pad_id)
    for k, s in enumerate(samples):
        n = len(s.tokens)
        assert batch.completion_mask[k, :n].eq(1).all() and batch.completion_mask[k, n:].eq(0).all()
        assert batch.completion_ids[k, n:].eq(pad_id).all()


def test_model_generation_config_does_not_leak_into_sampling_or_greedy():
    model = make_model(seed=5, eos_bias=3.0)
    model.generation_config = GenerationConfig(
        do_sample=True, top_k=3, top_p=0.5, temperature=0.3, repetition_penalty=2.0, min_new_tokens=6,
        suppress_tokens=[EOS, 7], no_repeat_ngram_size=1, typical_p=0.5, min_p=0.2, eos_token_id=EOS,
    )
    engine = HFEngine(model, make_tokenizer())
    samples = flat(engine.sample(PROMPTS, 4, max_new_tokens=MAX_NEW, batch_size=6, generator_seed=2))
    lp, _ = learner_lp(model, samples)
    torch.testing.assert_close(gen_matrix(samples, lp.shape[1]), lp, atol=1e-4, rtol=0)
    assert any(s.finished and len(s.tokens) < 6 for s in samples)  # min_new_tokens / suppress ignored
    greedy = engine.greedy(PROMPTS[:1], max_new_tokens=MAX_NEW, batch_size=1)
    assert greedy[0].tolist() == manual_greedy(model, PROMPTS[0])


def test_generation_runs_in_eval_mode_and_restores_flags():
    model = make_model(seed=6, dropout=0.5)
    model.train()
    model.model.layers[0].eval()  # a module the caller keeps in eval must stay so
    engine = HFEngine(model, make_tokenizer())
    samples = flat(engine.sample(PROMPTS, 2, max_new_tokens=MAX_NEW, batch_size=6, generator_seed=1))
    assert model.training and model.model.layers[1].training and not model.model.layers[0].training
    model.eval()
    lp, _ = learner_lp(model, samples)  # dropout-free reference
    torch.testing.assert_close(gen_matrix(samples, lp.shape[1]), lp, atol=1e-4, rtol=0)


def test_seed_reproducible_and_global_rng_untouched():
    model = make_model(seed=7)
    engine = HFEngine(model, make_tokenizer())
    state = torch.get_rng_state()
    a = flat(engine.sample(PROMPTS, 3, max_new_tokens=MAX_NEW, batch_size=4, generator_seed=42))
    b = flat(engine.sample(PROMPTS, 3, max_new_tokens=MAX_NEW, batch_size=4, generator_seed=42))
    assert torch.equal(state, torch.get_rng_state())
    c = flat(engine.sample(PROMPTS, 3, max_new_tokens=MAX_NEW, batch_size=4, generator_seed=43))
    assert all(np.array_equal(x.tokens, y.tokens) and np.array_equal(x.logprobs, y.logprobs) for x, y in zip(a, b))
    assert any(not np.array_equal(x.tokens, z.tokens) for x, z in zip(a, c))


# --------------------------------------------------------------------------- greedy


def manual_greedy(model, prompt: list[int], max_new: int = MAX_NEW) -> list[int]:
    ids = list(prompt)
    out: list[int] = []
    with torch.no_grad():
        for _ in range(max_new):
            nxt = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            if nxt == EOS:
                break
            out.append(nxt)
            ids.append(nxt)
    return out


def test_greedy_deterministic_and_matches_argmax_loop():
    model = make_model(seed=8, eos_bias=1.0)
    engine = HFEngine(model, make_tokenizer())
    first = engine.greedy(PROMPTS, max_new_tokens=MAX_NEW, batch_size=2)
    second = engine.greedy(PROMPTS, max_new_tokens=MAX_NEW, batch_size=3)
    assert [x.tolist() for x in first] == [x.tolist() for x in second]
    for prompt, got in zip(PROMPTS, first):
        assert got.dtype == np.int64 and EOS not in got.tolist()
        assert got.tolist() == manual_greedy(model, prompt)


# --------------------------------------------------------------------------- gradients


def _sampled_batch(model):
    engine = HFEngine(model, make_tokenizer())
    samples = flat(engine.sample(PROMPTS, 2, max_new_tokens=8, batch_size=6, generator_seed=0))
    return samples, pack_batch([PROMPTS[s.prompt_index] for s in samples], [s.tokens for s in samples], PAD)


def test_gradient_flows_through_completion_logprobs():
    model = make_model(seed=9)
    _, batch = _sampled_batch(model)
    lp = completion_logprobs(model, batch, temperature=0.9)
    assert lp.requires_grad and lp.dtype == torch.float32
    (lp * batch.completion_mask).sum().backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert all(g is not None for g in grads.values())
    assert grads["model.layers.0.self_attn.q_proj.weight"].abs().sum() > 0
    assert grads["model.embed_tokens.weight"].abs().sum() > 0


def test_gradient_and_equality_with_peft_lora():
    from peft import LoraConfig, get_peft_model

    model = make_model(seed=10)
    peft_model = get_peft_model(
        model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0,
                          init_lora_weights=False)
    )
    samples, batch = _sampled_batch(peft_model)
    peft_model.eval()
    with torch.no_grad():
        lp_ref = completion_logprobs(peft_model, batch)
    torch.testing.assert_close(gen_matrix(samples, lp_ref.shape[1]), lp_ref, atol=1e-4, rtol=0)
    with peft_model.disable_adapter(), torch.no_grad():  # the adapter really changes the policy
        assert (completion_logprobs(peft_model, batch) - lp_ref).abs().max() > 1e-3
    peft_model.train()
    completion_logprobs(peft_model, batch).sum().backward()
    named = list(peft_model.named_parameters())
    lora = [(n, p) for n, p in named if "lora_" in n]
    assert lora and all(p.grad is not None and p.grad.abs().sum() > 0 for _, p in lora)
    assert all(p.grad is None for n, p in named if "lora_" not in n)


# --------------------------------------------------------------------------- packing, errors


def test_pack_batch_layout_and_errors():
    b = pack_batch([[3, 4, 5], [6]], [[7], [8, 9, 1]], pad_id=PAD)
    assert b.input_ids.tolist() == [[3, 4, 5, 7, 0, 0], [0, 0, 6, 8, 9, 1]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1]]
    assert b.position_ids.tolist() == [[0, 1, 2, 3, 0, 0], [0, 0, 0, 1, 2, 3]]
    assert b.completion_mask.tolist() == [[1, 0, 0], [1, 1, 1]]
    assert b.completion_lengths.tolist() == [1, 3] and b.prompt_width == 3
    with pytest.raises(ValueError, match="2 prompts but 1 completions"):
        pack_batch([[1], [2]], [[3]], PAD)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        pack_batch([[1], []], [[3], [4]], PAD)
    with pytest.raises(ValueError, match="every completion is empty"):
        pack_batch([[1]], [[]], PAD)
    with pytest.raises(ValueError, match="temperature"):
        completion_logprobs(make_model(), b, temperature=0.0)


def test_engine_registry_and_input_errors():
    model = make_model()
    assert isinstance(make_engine("hf", model, make_tokenizer()), HFEngine)
    with pytest.raises(RuntimeError, match=r"vllm engine not available in this build: on a CUDA machine "
                                           r"`pip install vllm==0.33.0"):
        make_engine("vllm", model, make_tokenizer())
    with pytest.raises(ValueError, match="unknown engine 'jax'"):
        make_engine("jax", model, make_tokenizer())
    assert isinstance(HFEngine(model, make_tokenizer()), RolloutEngine)

    engine = HFEngine(model, make_tokenizer())
    common = dict(max_new_tokens=4, batch_size=2)
    for kwargs, msg in [
        (dict(prompts=[], n=2), "non-empty list"),
        (dict(prompts=[[1], []], n=2), "prompt 1 is empty"),
        (dict(prompts=[[1, VOCAB]], n=2), f"token id {VOCAB} outside"),
        (dict(prompts=[[3]], n=0), "n must be >= 1"),
        (dict(prompts=[[3]], n=1, temperature=0.0), "temperature must be > 0"),
        (dict(prompts=[[3]], n=1, top_k=-1), "top_k must be >= 0"),
        (dict(prompts=[[3]], n=1, top_p=0.0), r"top_p must be in \(0, 1\]"),
    ]:
        with pytest.raises(ValueError, match=msg):
            engine.sample(kwargs.pop("prompts"), kwargs.pop("n"), **kwargs, **common)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        engine.greedy([[3]], max_new_tokens=0, batch_size=1)


def test_an_engine_of_ones_own_without_greedy_is_refused_by_name(tmp_path):
    """An import-path engine must sample and answer greedily (the node evaluates with greedy): one
    that cannot is refused when it is built, naming what it lacks, not at the first evaluation."""
    (tmp_path / "half_engine.py").write_text(
        "class Half:\n    def sample(self, prompts, n, **kw):\n        return []\n\n\n"
        "def build(model, tokenizer, **kw):\n    return Half()\n")
    with pytest.raises(TypeError, match=r"built a Half without greedy: an engine samples with sample"):
        make_engine(f"{tmp_path / 'half_engine.py'}:build", make_model(), make_tokenizer())
