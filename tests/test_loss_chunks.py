"""The loss at chunk level (cross-tokenizer samples, ``LossInputs.chunks``), on synthetic tensors.

A chunk is receiver tokens covering the same bytes as a run of the sender's tokens; its log-prob is
the sum of its tokens' (chain rule) on either side. The truncated weight and the filter's KL are
taken per chunk; every token keeps its own gradient. With one token per chunk every number must
be the token path's: that is how same-tokenizer peers keep today's behaviour. ``word`` chunks
(``loss.cross_tokenizer_ratio=word``) are chunks merged to word boundaries: the token path again
when every word is one token, and otherwise each chunk's weight is the product of its tokens'.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ftis_flwr.config.schema import LossConfig
from ftis_flwr.maths.loss import LossInputs, compute_loss
from ftis_flwr.xtok.align import align, merge_to_words, word_boundaries

METHODS = ("nois", "tis", "vis", "f-nois", "f-tis", "f-vis")


def batch(seed: int, B: int = 5, T: int = 9):
    g = torch.Generator().manual_seed(seed)
    lp = (-torch.rand(B, T, generator=g, dtype=torch.float64) * 3).requires_grad_()
    gen = lp.detach() + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.7
    gen = gen.clamp(max=-1e-3)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, :3] = False  # left padding
    mask[3, 6:] = False  # right padding
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    foreign = torch.tensor([True, True, False, True, True])[:B]
    return lp, gen, mask, adv, foreign


def per_token_chunks(mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, mask.long().cumsum(dim=1) - 1, 0)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("reduction", ["sequence", "token"])
@pytest.mark.parametrize("old", [False, True])
def test_one_token_per_chunk_is_exactly_the_token_path(method, reduction, old):
    cfg = LossConfig(method=method, reduction=reduction, kl_threshold=0.3, trunc_c=1.5)
    outs, grads = [], []
    for chunks in (None, "per token"):
        lp, gen, mask, adv, foreign = batch(0)
        old_lp = (lp.detach() + 0.05) if old else None
        x = LossInputs(lp, gen, adv, mask, foreign, old_logprobs=old_lp,
                       chunks=None if chunks is None else per_token_chunks(mask))
        out = compute_loss(x, cfg)
        out.loss.backward()
        outs.append(out)
        grads.append(lp.grad.clone())
    a, b = outs
    assert torch.allclose(a.loss, b.loss, atol=1e-9, rtol=0) and torch.allclose(grads[0], grads[1], atol=1e-9)
    for key in ("sample_kl", "sample_w_mean", "filtered", "advantages_used"):
        assert torch.equal(getattr(a, key), getattr(b, key)) or torch.allclose(getattr(a, key), getattr(b, key),
                                                                                atol=1e-12), key
    assert a.metrics.keys() == b.metrics.keys()
    for key, value in a.metrics.items():
        assert math.isclose(value, b.metrics[key], rel_tol=1e-9, abs_tol=1e-12) or (
            math.isnan(value) and math.isnan(b.metrics[key])), key


def word_chunks(texts: list[str], mask: torch.Tensor) -> torch.Tensor:
    """``LossInputs.chunks`` of samples whose real tokens are the characters of ``texts`` on both
    sides (one byte each), merged to word boundaries as ``ratio="word"`` makes them."""
    out = torch.zeros(mask.shape, dtype=torch.long)
    for b, text in enumerate(texts):
        n = int(mask[b].sum())
        assert len(text.encode()) == n, (text, n)
        ones, at = np.ones(n, np.int64), np.arange(n)
        chunks = merge_to_words(align(ones, at, at + 1, n), ones, word_boundaries(text.encode()))
        out[b, mask[b]] = torch.from_numpy(chunks.receiver)
    return out


ONE_TOKEN_WORDS = ["1+2=3*4-5", "x=1+2.", "a b c d e", "7-8=9 ", "1,2;3:4!5"]
"""Texts of batch()'s real tokens (9, 6, 9, 6, 9 of them) whose every word is one character."""
WORDS = ["12+345=67", "ab cd ", "  hello  ", "(12)=x", "x=12 + 34"]
"""The same lengths with words of several characters (digit and letter runs, a whitespace run)."""


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("reduction", ["sequence", "token"])
@pytest.mark.parametrize("old", [False, True])
def test_word_chunks_of_one_token_words_are_exactly_the_token_path(method, reduction, old):
    cfg = LossConfig(method=method, reduction=reduction, kl_threshold=0.3, trunc_c=1.5)
    mask = batch(0)[2]
    chunks = word_chunks(ONE_TOKEN_WORDS, mask)
    assert torch.equal(chunks, per_token_chunks(mask))  # every word one token: one chunk a token
    assert not torch.equal(word_chunks(WORDS, mask), per_token_chunks(mask))  # words of several tokens: merged
    outs, grads = [], []
    for c in (None, chunks):
        lp, gen, mask, adv, foreign = batch(0)
        x = LossInputs(lp, gen, adv, mask, foreign, old_logprobs=(lp.detach() + 0.05) if old else None, chunks=c)
        out = compute_loss(x, cfg)
        out.loss.backward()
        outs.append(out)
        grads.append(lp.grad.clone())
    a, b = outs
    assert torch.allclose(a.loss, b.loss, atol=1e-9, rtol=0) and torch.allclose(grads[0], grads[1], atol=1e-9, rtol=0)
    assert torch.allclose(a.sample_kl, b.sample_kl, atol=1e-12) and torch.equal(a.filtered, b.filtered)


@pytest.mark.parametrize("trunc_c", [1e6, 2.0])
def test_a_words_weight_is_the_product_of_its_tokens_weights(trunc_c):
    """The chain rule: a word chunk's weight is the product of its tokens' untruncated weights,
    truncated once at C; at the first update each token's TIS gradient is -w(word) A / n."""
    cfg = LossConfig(method="tis", reduction="token", trunc_c=trunc_c)
    runs = {}
    for name in ("token", "word"):
        lp, gen, mask, adv, foreign = batch(3)
        chunks = word_chunks(WORDS, mask) if name == "word" else None
        out = compute_loss(LossInputs(lp, gen, adv, mask, foreign, chunks=chunks), cfg)
        out.loss.backward()
        runs[name] = (out, lp.grad.clone(), chunks)
    (tok, tok_grad, _), (word, word_grad, chunks) = runs["token"], runs["word"]
    lp, gen, mask, adv, _ = batch(3)
    ratio = torch.exp(lp.detach() - gen)  # each token's untruncated weight
    want = torch.zeros_like(ratio)
    for b in range(mask.shape[0]):
        for k in chunks[b][mask[b]].unique():
            in_k = mask[b] & (chunks[b] == k)
            want[b, in_k] = ratio[b, in_k].prod().clamp(max=trunc_c)
    got = torch.zeros_like(ratio)
    got[mask] = torch.from_numpy(word.stats.w)
    assert torch.allclose(got, want, atol=1e-12, rtol=1e-12)
    merged = mask & (torch.stack([torch.bincount(c, minlength=9)[c] for c in chunks]) > 1)
    assert merged.sum() >= 10 and not torch.allclose(got[merged], torch.from_numpy(tok.stats.w)[merged[mask]])
    n = mask.sum()
    assert torch.allclose(word_grad, torch.where(mask, -want * adv[:, None] / n, 0.0), atol=1e-12)
    assert torch.allclose(tok_grad, torch.where(mask, -ratio.clamp(max=trunc_c) * adv[:, None] / n, 0.0), atol=1e-12)


def test_a_chunks_weight_and_kl_come_from_its_summed_log_probs():
    # one sample, 4 receiver tokens in chunks [0, 0, 1, 2]; the sender's log-probs per chunk are
    # carried as any split with the right sums (here: all on the chunk's first token)
    lp = torch.tensor([[-0.2, -0.3, -1.0, -0.5]], dtype=torch.float64, requires_grad=True)
    gen = torch.tensor([[-1.4, 0.0, -1.2, -0.1]], dtype=torch.float64)
    chunks = torch.tensor([[0, 0, 1, 2]])
    x = LossInputs(lp, gen, torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 4, dtype=torch.bool),
                   torch.tensor([True]), chunks=chunks)
    cfg = LossConfig(method="tis", trunc_c=2.0, reduction="token")
    out = compute_loss(x, cfg)
    w = [min(math.exp(-0.5 + 1.4), 2.0)] * 2 + [min(math.exp(0.2), 2.0), min(math.exp(-0.4), 2.0)]
    assert torch.allclose(torch.tensor(out.stats.w), torch.tensor(w, dtype=torch.float64))
    out.loss.backward()  # first update: ratio 1, gradient -w * A per token, / 4 tokens
    assert torch.allclose(lp.grad, -torch.tensor([w], dtype=torch.float64) / 4)
    d = torch.tensor([-0.9, -0.2, 0.4], dtype=torch.float64)  # per chunk: gen - old
    k3 = (torch.expm1(d) - d).mean()
    assert math.isclose(float(out.sample_kl[0]), float(k3), rel_tol=1e-12)


def test_vis_takes_the_chunk_ratio_with_a_per_token_gradient():
    lp = torch.tensor([[-0.2, -0.3, -1.0]], dtype=torch.float64, requires_grad=True)
    gen = torch.tensor([[-0.6, 0.0, -1.0]], dtype=torch.float64)
    x = LossInputs(lp, gen, torch.tensor([-1.0], dtype=torch.float64), torch.ones(1, 3, dtype=torch.bool),
                   torch.tensor([True]), chunks=torch.tensor([[0, 0, 1]]))
    out = compute_loss(x, LossConfig(method="vis", clip_eps=0.2, reduction="token"))
    out.loss.backward()
    rho0 = math.exp(-0.5 + 0.6)  # chunk 0: exp(sum lp - sum gen) = e^0.1, inside the clip for A < 0
    assert torch.allclose(lp.grad, torch.tensor([[rho0, rho0, 1.0]], dtype=torch.float64) / 3)


@pytest.mark.parametrize("bad,match", [
    (torch.tensor([[1, 1, 2]]), "must count 0, 1"),
    (torch.tensor([[0, 2, 3]]), "must count 0, 1"),
    (torch.tensor([[0, 1, 0]]), "must count 0, 1"),
    (torch.tensor([[0.0, 1.0, 2.0]]), "integer tensor"),
])
def test_chunks_out_of_order_are_refused(bad, match):
    lp = torch.zeros(1, 3, dtype=torch.float64) - 0.5
    with pytest.raises(ValueError, match=match):
        LossInputs(lp, lp.clone(), torch.ones(1, dtype=torch.float64), torch.ones(1, 3, dtype=torch.bool),
                   torch.tensor([True]), chunks=bad)
