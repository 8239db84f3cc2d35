"""The F-TIS loss family on synthetic tensors: gradients vs hand-derived ones, filter, numerics."""

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from ftis_flwr.config.schema import LossConfig
from ftis_flwr.maths.advantages import filter_mask, group_advantages
from ftis_flwr.maths.loss import LOSS_REGISTRY, LossInputs, compute_loss, get_loss_fn, register_loss

METHODS = ["nois", "vis", "tis", "f-nois", "f-vis", "f-tis"]
D = torch.float64


def _batch(seed=0, B=5, T=6, spread=0.5, dtype=D):
    """Random log-probs, ragged mask (row i has T - i % 3 tokens), mixed advantages."""
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(B, T, generator=g, dtype=dtype) * 2 - 0.1
    gen = lp + (torch.rand(B, T, generator=g, dtype=dtype) - 0.5) * 2 * spread
    mask = torch.ones(B, T, dtype=torch.bool)
    for i in range(B):
        mask[i, T - i % 3:] = False
    adv = torch.linspace(-1.5, 1.5, B, dtype=dtype)
    foreign = torch.arange(B) % 2 == 1
    return lp, gen, mask, adv, foreign


def _grad(lp, gen, mask, adv, foreign, cfg, sources=None):
    x = lp.clone().requires_grad_()
    out = compute_loss(LossInputs(x, gen, adv, mask, foreign, sources), cfg)
    out.loss.backward()
    return x.grad, out


def _n(mask):
    return mask.sum(1, keepdim=True).to(D)


@pytest.mark.parametrize("method", ["nois", "f-nois"])
def test_nois_gradient_both_reductions(method):
    lp, gen, mask, adv, foreign = _batch(spread=3.0)
    cfg = LossConfig(method=method, kl_threshold=1e9)  # nothing far: nothing filtered with "and"
    grad, out = _grad(lp, gen, mask, adv, foreign, cfg)
    B = lp.shape[0]
    torch.testing.assert_close(grad, -adv[:, None] / (_n(mask) * B) * mask)
    assert out.denominator == B
    grad_t, out_t = _grad(lp, gen, mask, adv, foreign, replace(cfg, reduction="token"))
    N = mask.sum().item()
    torch.testing.assert_close(grad_t, -adv[:, None] / N * mask)
    assert out_t.denominator == N
    expected_loss = -(adv[:, None] * mask).sum() / N
    torch.testing.assert_close(out_t.loss.detach(), expected_loss)


def test_tis_gradient_is_nois_times_detached_truncated_weight():
    lp, gen, mask, adv, foreign = _batch(spread=2.0)
    C = 2.0
    cfg = LossConfig(method="tis", trunc_c=C)
    grad, out = _grad(lp, gen, mask, adv, foreign, cfg)
    w = torch.clamp(torch.exp(lp - gen), max=C)
    B = lp.shape[0]
    # If w carried gradient, uncapped tokens would get an extra w*A term.
    torch.testing.assert_close(grad, -w * adv[:, None] / (_n(mask) * B) * mask)
    expected = -((w * adv[:, None] * mask).sum(1) / _n(mask)[:, 0]).mean()
    torch.testing.assert_close(out.loss.detach(), expected)
    assert (w[mask] == C).any() and (w[mask] < 1).any()  # the batch exercises both regimes


def test_truncation_caps_at_c_and_metrics_count_it():
    gen = torch.zeros(1, 3, dtype=D) - 1.0
    lp = gen + torch.log(torch.tensor([[5.0, 1.5, 0.1]], dtype=D))
    mask = torch.ones(1, 3, dtype=torch.bool)
    adv = torch.tensor([2.0], dtype=D)
    grad, out = _grad(lp, gen, mask, adv, torch.tensor([True]), LossConfig(method="tis"))
    torch.testing.assert_close(grad, -torch.tensor([[2.0, 1.5, 0.1]], dtype=D) * 2.0 / 3)
    assert out.metrics["w_max"] == 2.0
    assert out.metrics["w_min"] == pytest.approx(0.1)
    assert out.metrics["w_mean"] == pytest.approx(3.6 / 3)
    assert out.metrics["frac_tokens_truncated"] == pytest.approx(1 / 3)
    assert out.metrics["ess"] == pytest.approx(3.6 ** 2 / (3 * (4 + 2.25 + 0.01)))


def _vis_expected(lp, gen, mask, adv, eps, B):
    rho = torch.exp(lp - gen)
    a = adv[:, None]
    binds = ((a > 0) & (rho > 1 + eps)) | ((a < 0) & (rho < 1 - eps))
    return torch.where(binds, 0.0, -rho * a) / (_n(mask) * B) * mask


def test_vis_gradient_inside_and_outside_clip():
    lp, gen, mask, adv, foreign = _batch(spread=0.6)
    cfg = LossConfig(method="vis", clip_eps=0.2)
    grad, out = _grad(lp, gen, mask, adv, foreign, cfg)
    torch.testing.assert_close(grad, _vis_expected(lp, gen, mask, adv, 0.2, lp.shape[0]))
    assert 0 < out.metrics["clip_frac"] < 1
    assert (grad[mask] == 0).any() and (grad[mask] != 0).any()


@pytest.mark.parametrize("a", [1.0, -1.0])
def test_vis_clip_activates_exactly_outside_interval(a):
    eps, tiny = 0.2, 1e-6
    rhos = torch.tensor([[1 + eps - tiny, 1 + eps + tiny, 1 - eps + tiny, 1 - eps - tiny]], dtype=D)
    gen = torch.full((1, 4), -2.0, dtype=D)
    lp = gen + torch.log(rhos)
    mask = torch.ones(1, 4, dtype=torch.bool)
    grad, out = _grad(lp, gen, mask, torch.tensor([a], dtype=D), torch.tensor([True]),
                      LossConfig(method="vis", clip_eps=eps))
    unclipped = -rhos * a / 4
    if a > 0:  # only rho > 1+eps is clipped
        expected = torch.stack([unclipped[0, 0], torch.tensor(0.0, dtype=D), unclipped[0, 2],
                                unclipped[0, 3]])
    else:  # only rho < 1-eps is clipped
        expected = torch.stack([unclipped[0, 0], unclipped[0, 1], unclipped[0, 2],
                                torch.tensor(0.0, dtype=D)])
    torch.testing.assert_close(grad[0], expected)
    assert out.metrics["clip_frac"] == 0.25


@pytest.mark.parametrize("reduction", ["sequence", "token"])
def test_on_policy_methods_agree_with_grpo(reduction):
    lp, _, mask, adv, foreign = _batch(seed=3)
    gen = lp.clone()
    x = lp.clone().requires_grad_()
    n = mask.sum(1).to(D)
    per_tok = -x * adv[:, None] * mask
    ref = (per_tok.sum(1) / n).mean() if reduction == "sequence" else per_tok.sum() / n.sum()
    ref.backward()
    for method in METHODS:
        grad, out = _grad(lp, gen, mask, adv, foreign, LossConfig(method=method, reduction=reduction))
        assert not out.filtered.any()
        torch.testing.assert_close(grad, x.grad, msg=f"{method} differs from on-policy GRPO")
        assert out.metrics["w_mean"] == 1.0 and out.metrics["ess"] == 1.0


# Samples for the filter: (foreign, A, d = gen - lp per token). d=5 -> k3 = e^5-6 ~ 142 > 50.
_ROWS = [(False, -1.0, 5.0), (True, -1.0, 5.0), (True, -1.0, 0.0), (True, 1.0, 5.0),
         (True, 0.0, 0.0), (True, 1.0, 0.0), (True, 0.0, 5.0)]


def _filter_batch(T=4):
    foreign = torch.tensor([r[0] for r in _ROWS])
    adv = torch.tensor([r[1] for r in _ROWS], dtype=D)
    d = torch.tensor([r[2] for r in _ROWS], dtype=D)
    gen = -torch.rand(len(_ROWS), T, generator=torch.Generator().manual_seed(1), dtype=D) - 0.5
    lp = gen - d[:, None]
    mask = torch.ones(len(_ROWS), T, dtype=torch.bool)
    mask[::2, -1] = False
    return lp, gen, mask, adv, foreign


@pytest.mark.parametrize("rule", ["and", "or"])
@pytest.mark.parametrize("scope", ["foreign", "all"])
@pytest.mark.parametrize("action", ["zero", "drop"])
@pytest.mark.parametrize("reduction", ["sequence", "token"])
def test_filter_rules_scopes_actions(rule, scope, action, reduction):
    lp, gen, mask, adv, foreign = _filter_batch()
    cfg = LossConfig(method="f-nois", filter_rule=rule, filter_scope=scope, filter_action=action,
                     reduction=reduction)
    grad, out = _grad(lp, gen, mask, adv, foreign, cfg)
    far = torch.tensor([r[2] > 0 for r in _ROWS])
    neg = adv <= 0
    eligible = foreign | (scope == "all")
    exp_f = eligible & ((neg & far) if rule == "and" else (neg | far))
    assert out.filtered.tolist() == exp_f.tolist()
    assert out.filtered_negative.tolist() == (exp_f & neg).tolist()
    assert out.filtered_kl.tolist() == (exp_f & far).tolist()
    assert out.kept.tolist() == (~exp_f).tolist()
    counted = torch.ones_like(exp_f) if action == "zero" else ~exp_f
    a_used = torch.where(exp_f, 0.0, adv)
    if reduction == "sequence":
        denom = int(counted.sum())
        torch.testing.assert_close(grad, -a_used[:, None] / (_n(mask) * denom) * mask)
    else:
        denom = int(mask[counted].sum())
        torch.testing.assert_close(grad, -a_used[:, None] / denom * mask)
    assert out.denominator == denom
    m = out.metrics
    assert m["filtered"] == exp_f.sum().item()
    assert m["filtered_negative"] == (exp_f & neg).sum().item()
    assert m["filtered_kl"] == (exp_f & far).sum().item()
    assert m["filtered_zero_advantage"] == (exp_f & (adv == 0)).sum().item()
    assert m["zero_advantage"] == 2 and m["negative_advantage"] == 3
    assert m["samples_counted"] == counted.sum().item()
    assert m["tokens_counted"] == mask[counted].sum().item()
    # Every sample not reaching the gradient is counted somewhere.
    unfiltered_zero = m["zero_advantage"] - m["filtered_zero_advantage"]
    assert m["samples"] == m["samples_effective"] + m["filtered"] + unfiltered_zero


def test_unfiltered_methods_report_what_the_filter_would_do():
    lp, gen, mask, adv, foreign = _filter_batch()
    _, out = _grad(lp, gen, mask, adv, foreign, LossConfig(method="tis"))
    assert not out.filtered.any() and out.metrics["filtered"] == 0
    assert out.metrics["would_filter"] == 2  # foreign, A<=0 and far: rows 1 and 6


def test_kl_estimators_and_summaries():
    lp, gen, mask, adv, foreign = _filter_batch()
    out = compute_loss(LossInputs(lp, gen, adv, mask, foreign), LossConfig())
    d = torch.tensor([r[2] for r in _ROWS], dtype=D)
    torch.testing.assert_close(out.sample_kl, torch.exp(d) - d - 1)
    k1 = compute_loss(LossInputs(lp, gen, adv, mask, foreign), LossConfig(kl_estimator="k1"))
    torch.testing.assert_close(k1.sample_kl, d)
    kl_f = (torch.exp(d) - d - 1)[foreign].numpy()
    assert out.metrics["kl_mean_foreign"] == pytest.approx(kl_f.mean())
    assert out.metrics["kl_median_foreign"] == pytest.approx(np.median(kl_f))
    assert out.metrics["kl_median_own"] == pytest.approx(math.exp(5) - 6)
    # Tiny d: k3 = d^2/2 + d^3/6 + ... accurately (expm1, no cancellation in exp(d) - 1).
    lp_tiny = gen + 1e-7
    dt = gen - lp_tiny
    k3 = torch.where(mask, dt ** 2 / 2 + dt ** 3 / 6, 0.0).sum(1) / mask.sum(1)
    tiny = compute_loss(LossInputs(lp_tiny, gen, adv, mask, foreign), LossConfig())
    torch.testing.assert_close(tiny.sample_kl, k3, rtol=1e-6, atol=0)
    # d beyond float64's exp range (learner gives the token ~e^-1000): still finite, still far.
    huge = compute_loss(LossInputs(gen - 1000.0, gen, adv, mask, foreign), LossConfig())
    assert torch.isfinite(huge.sample_kl).all() and (huge.sample_kl > 1e200).all()
    assert all(math.isfinite(v) for v in huge.metrics.values())


def test_advantages_before_filtering_reach_the_loss():
    rewards = np.array([[1.0, 0.0, 0.0, 0.0]])
    adv = torch.tensor(group_advantages(rewards)[0])
    gen = torch.full((4, 2), -1.0, dtype=D)
    lp = gen - 5.0  # every sample far
    mask = torch.ones(4, 2, dtype=torch.bool)
    foreign = torch.ones(4, dtype=torch.bool)
    grad, out = _grad(lp, gen, mask, adv, foreign, LossConfig(method="f-nois"))
    expect_f, _, _ = filter_mask(adv, out.sample_kl, foreign, threshold=50.0)
    assert out.filtered.tolist() == expect_f.tolist() == [False, True, True, True]
    # The survivor keeps the advantage computed with the filtered samples in its group.
    torch.testing.assert_close(grad[0], -adv[0] / (2 * 4) * torch.ones(2, dtype=D))
    assert adv[0] > 1.7


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("estimator", ["k3", "k1"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_garbage_padding_and_extreme_log_ratios_stay_finite(method, estimator, dtype):
    B, T = 4, 7
    gen = torch.full((B, T), -3.0, dtype=dtype)
    lp = gen.clone()
    lp[0, :3] = gen[0, :3] + 100.0   # learner far more confident than the generator
    lp[1, :3] = gen[1, :3] - 100.0   # learner gives the token ~0 probability
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[:, :3] = True
    garbage = torch.tensor([float("inf"), float("nan"), 1e30, float("-inf")], dtype=dtype)
    lp[:, 3:] = garbage
    gen[:, 3:] = garbage.flip(0)
    adv = torch.tensor([-1.0, -1.0, 1.0, 1.0], dtype=dtype)
    foreign = torch.tensor([True, True, True, False])
    for reduction in ("sequence", "token"):
        cfg = LossConfig(method=method, kl_estimator=estimator, reduction=reduction,
                         filter_scope="all")
        x = lp.clone().requires_grad_()
        out = compute_loss(LossInputs(x, gen, adv, mask, foreign, ["a", "b", "b", "me"]), cfg)
        out.loss.backward()
        assert torch.isfinite(out.loss).item() and torch.isfinite(x.grad).all()
        assert (x.grad[:, 3:] == 0).all()
        assert torch.isfinite(out.sample_kl).all()
        bad = {k: v for k, v in out.metrics.items() if not math.isfinite(v)}
        assert not bad, bad
    if estimator == "k3":
        assert out.sample_kl[1] > 1e40 and out.sample_kl[0] > 50  # both simply far
    if method == "vis":  # A<0, lp-gen=100: bounded but non-zero push down (straight-through cap)
        assert (x.grad[0, :3] > 0).all()


def test_padding_values_do_not_change_anything():
    lp, gen, mask, adv, foreign = _batch(seed=5)
    lp2, gen2 = lp.clone(), gen.clone()
    lp2[~mask] = float("nan")
    gen2[~mask] = float("inf")
    for method in METHODS:
        cfg = LossConfig(method=method)
        g1, o1 = _grad(lp, gen, mask, adv, foreign, cfg)
        g2, o2 = _grad(lp2, gen2, mask, adv, foreign, cfg)
        torch.testing.assert_close(g1, g2)
        assert o1.metrics == o2.metrics


@pytest.mark.parametrize("method", ["f-tis", "f-vis", "nois"])
@pytest.mark.parametrize("reduction", ["sequence", "token"])
@pytest.mark.parametrize("action", ["zero", "drop"])
def test_micro_batching_is_exact(method, reduction, action):
    lp, gen, mask, adv, foreign = _filter_batch(T=5)
    gen = gen + torch.linspace(-0.3, 0.3, 5, dtype=D)  # token-dependent weights
    cfg = LossConfig(method=method, reduction=reduction, filter_action=action, filter_rule="or")
    full, _ = _grad(lp, gen, mask, adv, foreign, cfg)
    x = lp.clone().requires_grad_()
    denom = 0.0
    for sl in (slice(0, 2), slice(2, 4), slice(4, 7)):  # rows 2-3 are all filtered under "or"
        out = compute_loss(LossInputs(x[sl], gen[sl], adv[sl], mask[sl], foreign[sl]), cfg)
        out.loss_sum.backward()
        denom += out.denominator
    torch.testing.assert_close(x.grad / denom, full)


def test_all_dropped_gives_exact_zero_with_a_graph():
    lp, gen, mask, adv, foreign = _filter_batch()
    keep = [1, 2]  # both filtered under rule "or"
    cfg = LossConfig(method="f-tis", filter_rule="or", filter_action="drop")
    grad, out = _grad(lp[keep], gen[keep], mask[keep], adv[keep], foreign[keep], cfg)
    assert out.denominator == 0 and out.loss.item() == 0.0
    assert (grad == 0).all() and out.metrics["loss"] == 0.0


def test_works_without_gradient_and_gives_same_metrics():
    lp, gen, mask, adv, foreign = _batch(seed=7, spread=2.0)
    cfg = LossConfig(method="f-tis", filter_rule="or")
    _, with_grad = _grad(lp, gen, mask, adv, foreign, cfg)
    no_grad = compute_loss(LossInputs(lp, gen, adv, mask, foreign), cfg)
    assert not no_grad.loss.requires_grad
    assert no_grad.metrics == with_grad.metrics


def test_per_source_metrics():
    lp, gen, mask, adv, foreign = _filter_batch()
    sources = ["me", "a", "a", "b", "b", "a", "b"]
    cfg = LossConfig(method="f-tis", filter_rule="or")
    _, out = _grad(lp, gen, mask, adv, foreign, cfg, sources=sources)
    m = out.metrics
    assert m["me/samples"] == 1 and m["a/samples"] == 3 and m["b/samples"] == 3
    assert m["me/foreign"] == 0 and m["a/foreign"] == 3
    assert m["a/filtered"] + m["b/filtered"] + m["me/filtered"] == m["filtered"]
    assert m["a/filtered"] == 2 and m["a/filtered_negative"] == 2 and m["a/filtered_kl"] == 1
    assert m["b/filtered_zero_advantage"] == 2
    for key in ("w_mean", "w_min", "w_max", "frac_tokens_truncated", "kl_mean", "kl_median",
                "ess", "samples_kept", "filtered_negative", "filtered_kl"):
        assert f"b/{key}" in m
    assert m["me/kl_median"] == pytest.approx(math.exp(5) - 6)
    for src in ("me", "a", "b"):  # per-source tails: ordered quantiles of the weights and log-ratios
        for name in ("w", "abs_log_ratio"):
            p50, p90, p99 = (m[f"{src}/{name}_p{q}"] for q in (50, 90, 99))
            assert p50 <= p90 <= p99
        assert m[f"{src}/w_p99"] <= m[f"{src}/w_max"] + 1e-12 and m[f"{src}/w_p50"] >= m[f"{src}/w_min"] - 1e-12
    assert m["me/abs_log_ratio_p50"] == pytest.approx(5.0)  # d = gen - old = 5 on every own token
    assert m["me/frac_tokens_truncated"] == 0.0  # d=5 means w = e^-5 < C


def test_empty_subsets_have_defined_values():
    lp, gen, mask, adv, _ = _batch()
    own = torch.zeros(lp.shape[0], dtype=torch.bool)
    out = compute_loss(LossInputs(lp, gen, adv, mask, own), LossConfig())
    m = out.metrics
    assert m["samples_foreign"] == 0 and m["ess"] == 1.0
    assert m["kl_mean_foreign"] == 0.0 and m["kl_median_foreign"] == 0.0


def test_registry_unknown_and_new_method():
    with pytest.raises(ValueError, match="f-tis.*nois|nois.*f-tis"):
        get_loss_fn("grpo")
    lp, gen, mask, adv, foreign = _filter_batch()
    with pytest.raises(ValueError, match="unknown loss method 'grpo'"):
        compute_loss(LossInputs(lp, gen, adv, mask, foreign), LossConfig(method="grpo"))

    @register_loss("double-nois", "f-double-nois")
    def _double(t, cfg):
        return -2.0 * torch.exp(t.lp - t.lp.detach()) * t.adv

    try:
        with pytest.raises(ValueError, match="already registered"):
            register_loss("double-nois")(_double)
        ref, _ = _grad(lp, gen, mask, adv, foreign, LossConfig(method="f-nois"))
        got, out = _grad(lp, gen, mask, adv, foreign, LossConfig(method="f-double-nois"))
        torch.testing.assert_close(got, 2 * ref)
        assert out.filtered.any()
        _, plain = _grad(lp, gen, mask, adv, foreign, LossConfig(method="double-nois"))
        assert not plain.filtered.any()
    finally:
        LOSS_REGISTRY.pop("double-nois", None)
        LOSS_REGISTRY.pop("f-double-nois", None)


def _valid():
    lp, gen, mask, adv, foreign = _batch(B=3, T=4)
    return dict(logprobs=lp, gen_logprobs=gen, advantages=adv, mask=mask, foreign=foreign)


@pytest.mark.parametrize("change, message", [
    (dict(gen_logprobs=torch.zeros(3, 5, dtype=D)), "gen_logprobs has shape"),
    (dict(advantages=torch.zeros(4, dtype=D)), "advantages has shape"),
    (dict(foreign=torch.zeros(3)), "foreign must be a bool"),
    (dict(mask=torch.full((3, 4), 2)), "only 0 and 1"),
    (dict(logprobs=torch.zeros(3, 4, dtype=torch.long)), "floating point"),
    (dict(logprobs=torch.zeros(3)), r"\[B, T\]"),
    (dict(advantages=torch.tensor([0.0, float("nan"), 1.0])), "advantages contain NaN"),
    (dict(sources=["a", "b"]), "sources must be 3 strings"),
    (dict(gen_logprobs=[[0.0]]), "must be a torch.Tensor"),
])
def test_input_validation(change, message):
    with pytest.raises(ValueError, match=message):
        LossInputs(**{**_valid(), **change})


def test_validation_of_rows_and_real_tokens():
    v = _valid()
    v["mask"] = v["mask"].clone()
    v["mask"][1] = False
    with pytest.raises(ValueError, match=r"samples \[1\] have no real tokens"):
        LossInputs(**v)
    v = _valid()
    v["gen_logprobs"] = v["gen_logprobs"].clone()
    v["gen_logprobs"][2, 0] = float("-inf")
    with pytest.raises(ValueError, match=r"gen_logprobs is not finite on real token .*\(2, 0\)"):
        LossInputs(**v)
    v = _valid()
    v["mask"] = v["mask"].long()  # 0/1 integers are accepted
    LossInputs(**v)


@pytest.mark.parametrize("field, value, message", [
    ("reduction", "mean", "sequence, token"), ("filter_action", "mask", "zero, drop"),
    ("kl_estimator", "k2", "k3, k1"), ("filter_rule", "xor", "and, or"),
    ("trunc_c", 0.0, "trunc_c"), ("clip_eps", 1.5, "clip_eps"),
])
def test_config_validation(field, value, message):
    """A bad LossConfig is the configuration's to reject, by key (the maths does not check it again)."""
    from ftis_flwr.config.schema import ConfigError, ExperimentConfig
    from ftis_flwr.config.validation import validate

    with pytest.raises(ConfigError, match=message):
        validate(ExperimentConfig(loss=replace(LossConfig(), **{field: value})), import_registries=False)


# --- Several updates per round: pi_old fixed at the round start (algorithm §5, PPO num_iterations) --

def _previous_token_loss(method, lp, gen, adv_used, cfg):
    """The per-token losses as written before pi_old existed (ratio and w from lp.detach())."""
    ratio = torch.exp(lp - lp.detach())
    w = torch.exp((lp.detach() - gen).clamp(max=math.log(cfg.trunc_c) + 1.0)).clamp(max=cfg.trunc_c)
    a = adv_used[:, None]
    if method.endswith("nois"):
        return -ratio * a
    if method.endswith("tis"):
        return -w * torch.minimum(ratio * a, ratio.clamp(1 - cfg.clip_eps, 1 + cfg.clip_eps) * a)
    log_rho = lp - gen
    rho = torch.exp(log_rho - (log_rho - log_rho.clamp(max=20.0)).detach())
    return -torch.minimum(rho * a, rho.clamp(1 - cfg.clip_eps, 1 + cfg.clip_eps) * a)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("reduction", ["sequence", "token"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_first_update_is_bit_for_bit_the_single_update_loss(method, reduction, dtype):
    """One update per round is unchanged: with old_logprobs absent or equal to lp.detach(), the
    loss and gradient are bit-identical to the formulas before pi_old existed."""
    lp, gen, mask, adv, foreign = _filter_batch(T=5)
    lp, gen, adv = lp.to(dtype), (gen + torch.linspace(-0.4, 0.4, 5, dtype=D)).to(dtype), adv.to(dtype)
    cfg = LossConfig(method=method, reduction=reduction, filter_rule="or")
    x = lp.clone().requires_grad_()
    out = compute_loss(LossInputs(x, gen, adv, mask, foreign), cfg)
    out.loss_sum.backward()
    y = lp.clone().requires_grad_()
    with_old = compute_loss(LossInputs(y, gen, adv, mask, foreign, old_logprobs=lp.clone()), cfg)
    with_old.loss_sum.backward()
    z = lp.clone().requires_grad_()
    lp_m = torch.where(mask, z, 0.0)
    tok = _previous_token_loss(method, lp_m, torch.where(mask, gen, 0.0),
                               out.advantages_used.to(dtype), cfg)
    tok = torch.where(mask, tok, 0.0)
    n = mask.sum(1).to(dtype)
    per_seq = tok.sum(1) / n if reduction == "sequence" else tok.sum(1)
    ref = torch.where(out.counted, per_seq, 0.0).sum()
    ref.backward()
    assert torch.equal(out.loss_sum.detach(), ref.detach())
    assert torch.equal(x.grad, z.grad) and torch.equal(y.grad, z.grad)
    assert with_old.metrics == out.metrics


def _moved(seed=11, B=6, T=5):
    """pi_old, and a policy that moved after one update: row r's tokens moved by DELTAS[r]."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=D) - 0.2
    gen = old + (torch.rand(B, T, generator=g, dtype=D) - 0.5)
    deltas = torch.tensor([0.5, -0.5, 0.05, -0.05, 0.5, -0.5], dtype=D)  # log(1.2) = 0.18
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0, 1.0], dtype=D)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, -2:] = False
    return old, old + deltas[:, None], gen, adv, mask, torch.ones(B, dtype=torch.bool)


def test_tis_clip_binds_against_pi_old_on_a_later_update():
    """A > 0 and lp - lp_old > log(1+eps) (row 0), or A < 0 and below log(1-eps) (row 1): zero
    gradient. Inside the interval or on the helpful side: -w_old * ratio * A."""
    old, lp, gen, adv, mask, foreign = _moved()
    C, eps = 2.0, 0.2
    cfg = LossConfig(method="tis", trunc_c=C, clip_eps=eps)
    x = lp.clone().requires_grad_()
    out = compute_loss(LossInputs(x, gen, adv, mask, foreign, old_logprobs=old), cfg)
    out.loss.backward()
    w_old = torch.clamp(torch.exp(old - gen), max=C)
    ratio = torch.exp(lp - old)
    binds = torch.tensor([True, True, False, False, False, False])[:, None].expand_as(lp)
    B = lp.shape[0]
    expected = torch.where(binds, 0.0, -w_old * ratio * adv[:, None]) / (_n(mask) * B) * mask
    torch.testing.assert_close(x.grad, expected)
    assert (x.grad[0] == 0).all() and (x.grad[1][mask[1]] == 0).all()
    n_real = mask.sum().item()
    assert out.metrics["clip_frac"] == pytest.approx((mask[0].sum() + mask[1].sum()).item() / n_real)


def test_weight_kl_and_filter_stay_at_the_round_start():
    """A later update keeps w = min(pi_old/pi_gen, C), the KL and the filter's decisions even when
    the current policy is far from where it started."""
    B, T = 2, 4
    gen = torch.full((B, T), -1.0, dtype=D)
    old = gen.clone()                       # on-policy at the round start: KL 0, w 1
    lp = gen - torch.tensor([[6.0], [0.3]], dtype=D)  # row 0 moved far: KL(lp) = e^6 - 7 > 50
    adv = torch.tensor([-1.0, 1.0], dtype=D)
    mask = torch.ones(B, T, dtype=torch.bool)
    foreign = torch.ones(B, dtype=torch.bool)
    cfg = LossConfig(method="f-tis")
    x = lp.clone().requires_grad_()
    out = compute_loss(LossInputs(x, gen, adv, mask, foreign, old_logprobs=old), cfg)
    out.loss.backward()
    assert not out.filtered.any()           # decided on pi_old: not far
    torch.testing.assert_close(out.sample_kl, torch.zeros(B, dtype=D))
    assert out.metrics["w_mean"] == 1.0 and out.metrics["w_min"] == 1.0
    # row 0: A < 0 and ratio e^-6 < 1 - eps: clipped; row 1: A > 0, ratio e^-0.3 < 1: -w*ratio*A
    torch.testing.assert_close(x.grad[0], torch.zeros(T, dtype=D))
    torch.testing.assert_close(x.grad[1], -torch.exp(torch.tensor(-0.3, dtype=D)).expand(T) / (T * B))
    # Without pi_old the same call would filter row 0 and weigh row 1 by e^-0.3 (the drift fixed).
    drift = compute_loss(LossInputs(lp, gen, adv, mask, foreign), cfg)
    assert drift.filtered.tolist() == [True, False] and drift.metrics["w_min"] < 1.0


def test_vis_ratio_is_anchored_at_the_generator_not_pi_old():
    """vis's rho = pi_theta/pi_gen already has a fixed anchor: old_logprobs changes only the
    filter's KL (f-vis), never the vis gradient."""
    old, lp, gen, adv, mask, foreign = _moved()
    for method in ("vis", "f-vis"):
        cfg = LossConfig(method=method, kl_threshold=1e9)
        g_old, o_old = _grad(lp, gen, mask, adv, foreign, cfg)
        x = lp.clone().requires_grad_()
        out = compute_loss(LossInputs(x, gen, adv, mask, foreign, old_logprobs=old), cfg)
        out.loss.backward()
        torch.testing.assert_close(x.grad, g_old)
        assert out.metrics["clip_frac"] == o_old.metrics["clip_frac"]


def test_old_logprobs_validation():
    v = _valid()
    with pytest.raises(ValueError, match="old_logprobs has shape"):
        LossInputs(**v, old_logprobs=torch.zeros(3, 5, dtype=D))
    with pytest.raises(ValueError, match="old_logprobs must be detached"):
        LossInputs(**v, old_logprobs=v["logprobs"].clone().requires_grad_())
    bad = v["logprobs"].clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"old_logprobs is not finite on real token .*\(0, 0\)"):
        LossInputs(**v, old_logprobs=bad)
    with pytest.raises(ValueError, match="old_logprobs must be a torch.Tensor"):
        LossInputs(**v, old_logprobs=[[0.0]])


@pytest.mark.parametrize("method", ["f-tis", "vis", "nois"])
def test_metrics_from_micro_batch_stats_equal_the_whole_batch(method):
    """A Node computes the metrics once from its micro-batches' stats (each trimmed to its own
    width): the same numbers as one compute_loss over the whole batch."""
    from ftis_flwr.maths.loss_metrics import LossStats, loss_metrics

    lp, gen, mask, adv, foreign = _filter_batch(T=5)
    mask[2:4, 3:] = False  # rows 2-3 are shorter: their micro-batch is narrower
    gen = gen + torch.linspace(-0.3, 0.3, 5, dtype=D)
    sources = ["me", "a", "a", "b", "b", "a", "b"]
    cfg = LossConfig(method=method, filter_rule="or")
    whole = compute_loss(LossInputs(lp, gen, adv, mask, foreign, sources), cfg).metrics
    parts = []
    for sl in (slice(0, 2), slice(2, 4), slice(4, 7)):
        width = int(mask[sl].sum(1).max())
        x = LossInputs(lp[sl, :width], gen[sl, :width], adv[sl], mask[sl, :width], foreign[sl],
                       sources[sl])
        out = compute_loss(x, cfg, metrics=False)
        assert out.metrics == {}
        parts.append(out.stats)
    got = loss_metrics(LossStats.concat(parts), cfg.trunc_c)
    assert got.keys() == whole.keys()
    assert got == pytest.approx(whole, rel=1e-12, abs=0)
    assert ("clip_frac" in got) == (method != "nois")
