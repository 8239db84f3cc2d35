"""The F-TIS loss family over tensors: ``LossInputs -> LossOutputs`` (algorithm §4-7).

Methods (algorithm §5), per real token, with ``ratio = exp(lp - old)`` and
``w = min(exp(old - gen), C)`` (detached, truncated from above), where ``old`` is the detached
log-prob under the round-start policy pi_old (:attr:`LossInputs.old_logprobs`; by default the
current ``lp.detach()``, so ``ratio`` has value 1 and the gradient of log pi_theta):

* ``nois``: ``-ratio * A``
* ``vis``:  ``-min(rho * A, clip(rho, 1-eps, 1+eps) * A)``, ``rho = exp(lp - gen)`` with gradient
* ``tis``:  ``-w * min(ratio * A, clip(ratio, 1-eps, 1+eps) * A)``
* ``f-nois``, ``f-vis``, ``f-tis``: the same after the filter of algorithm §6
  (:func:`ftis_flwr.maths.advantages.filter_mask`), whose KL is taken between pi_old and pi_gen. By
  convention a registered name that starts with ``"f-"`` is filtered.

**Several updates per round** (``train.updates_per_round > 1``, as PPO and TRL's
``num_iterations``): the Node passes the first update's detached log-probs as ``old_logprobs`` to
every later update on the same batch, so ``ratio = pi_theta / pi_old`` and the tis clip binds once
the policy has moved, while ``w``, the KL and the filter's decisions stay those of the round
start (nois has no clip: its later steps follow ``pi_theta / pi_old * A`` unclipped). vis needs
no pi_old: its ratio ``rho = pi_theta / pi_gen`` already has a fixed anchor, the generator (PPO
with pi_old := pi_gen), so its clip binds against pi_gen at every update.

**Why ``loss_sum`` and ``denominator``.** The Node accumulates gradients over micro-batches by
calling ``backward()`` on each micro-batch's ``loss_sum`` and dividing the summed gradients by the
sum of the micro-batches' ``denominator``\\ s. ``loss_sum`` is the un-normalised sum (per-sequence
mean losses summed over counted sequences for ``reduction="sequence"``, token losses summed over
counted tokens for ``"token"``) and ``denominator`` counts those sequences or tokens, so the
result equals the full-batch gradient of ``loss = loss_sum / denominator`` exactly, for both
reductions and for ``filter_action="drop"`` (dropped samples are in neither).

**Chunks** (cross-tokenizer samples, :attr:`LossInputs.chunks`; alignment in
:mod:`ftis_flwr.xtok.align`). For a sample scored in the receiver's own tokens, a chunk k is a run of
receiver tokens covering the same bytes as a run of the sender's, and by the chain rule
``log pi(k) = sum of its tokens' log-probs`` on either side. Then, for every token t of chunk k:
``w_t = min(exp(sum_k old - sum_k gen), C)`` (detached); the filter's KL is the mean over chunks of
k3 (or k1) of ``sum_k gen - sum_k old``; and the token functions see ``gen_t`` replaced by
``lp_t.detach() - sum_k (lp.detach() - gen)``, so that ``lp - gen`` has the chunk's value with the
gradient of ``lp_t`` alone (vis: ``rho_k``, per token). The PPO ratio ``exp(lp - old)`` stays per
receiver token, and the normalisation rules are the token path's. One token per chunk is exactly
the token path (tests/test_loss_chunks.py, loss and gradients).

**Numerics.** Padding may hold anything (inf, NaN, 1e30): it is replaced with 0 by
``torch.where`` *before* any ``exp``, and nothing is ever multiplied by a mask. Real tokens must
be finite (a clear ``ValueError`` otherwise). Caps, all documented constants below:

* KL (filter and metrics) is computed in float64 on the CPU with ``d = gen - lp`` clamped above at
  :data:`KL_MAX_LOG_RATIO` inside ``exp``, so k3 <= ~3.8e260 per token stays finite; a sample
  with a huge KL is simply > g.
* ``w`` is computed as ``min(exp(min(lp - gen, log C + 1)), C)``: no overflow, exactly C when hit.
* vis: the log-ratio is capped at :data:`VIS_MAX_LOG_RATIO` with a straight-through gradient, so
  ``rho <= e^20`` and ``d rho / d lp = rho_capped``: with A < 0 and lp - gen = 100 the gradient
  keeps its direction but is bounded (true vis would overflow); for A > 0 the clip already zeroes
  it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ftis_flwr.maths.advantages import filter_mask
from ftis_flwr.maths.loss_chunks import Chunked, validate_chunks
from ftis_flwr.maths.loss_metrics import LossStats, loss_metrics
from ftis_flwr.maths.params import (
    FILTER_ACTIONS,
    KL_ESTIMATORS,
    REDUCTIONS,
    FilterAction,
    KlEstimator,
    LossConfig,
    Reduction,
)

KL_MAX_LOG_RATIO = 600.0
"""k3 uses ``exp(min(d, 600))`` in float64: finite for any finite input (e^600 ~ 3.8e260)."""
VIS_MAX_LOG_RATIO = 20.0
"""vis caps ``lp - gen`` at 20 before ``exp`` (rho <= 4.9e8), straight-through gradient."""
CLIPPED_RATIO = {"tis": "old", "f-tis": "old", "vis": "gen", "f-vis": "gen"}
"""Which log-ratio a method clips (``lp - old`` or ``lp - gen``), for the ``clip_frac`` metric."""



@dataclass
class LossInputs:
    """One (micro-)batch of B completions padded to T tokens. Validated on construction."""

    logprobs: torch.Tensor
    """[B, T] learner log-probs, normally with gradient (may have none: metrics-only call)."""
    gen_logprobs: torch.Tensor
    """[B, T] generator log-probs of the sampled distribution (algorithm §4)."""
    advantages: torch.Tensor
    """[B] advantages computed from whole groups before filtering."""
    mask: torch.Tensor
    """[B, T] bool or 0/1: real completion tokens (every row needs at least one)."""
    foreign: torch.Tensor
    """[B] bool: sample was generated by another node."""
    sources: Sequence[str] | None = None
    """Optional source node name per sample, for per-source metrics."""
    old_logprobs: torch.Tensor | None = None
    """[B, T] detached log-probs under the round-start policy pi_old; None: ``logprobs.detach()``
    (one update per batch). Later updates on the same batch pass the first update's."""
    chunks: torch.Tensor | None = None
    """[B, T] integer chunk of each real token (cross-tokenizer samples, :mod:`ftis_flwr.xtok.align`):
    per sample 0, 1, ... in order, a chunk being receiver tokens that cover the same bytes as a
    run of the sender's. ``gen_logprobs`` then needs only the right *chunk sums* (the sender's
    log-probs summed per chunk, spread over the chunk's tokens in any way). The importance
    quantities become chunk-level (see :func:`compute_loss`); None: every token its own chunk."""

    def __post_init__(self) -> None:
        _validate(self)


def _validate(x: LossInputs) -> None:
    olds = () if x.old_logprobs is None else ("old_logprobs",)
    for name in ("logprobs", "gen_logprobs", "advantages", "mask", "foreign", *olds):
        if not isinstance(getattr(x, name), torch.Tensor):
            raise ValueError(f"LossInputs.{name} must be a torch.Tensor, "
                             f"got {type(getattr(x, name)).__name__}")
    lp, gen, mask = x.logprobs, x.gen_logprobs, x.mask
    if lp.ndim != 2 or lp.shape[0] < 1 or lp.shape[1] < 1:
        raise ValueError(f"LossInputs.logprobs must be [B, T] with B, T >= 1, got {tuple(lp.shape)}")
    B = lp.shape[0]
    checks = [("gen_logprobs", gen, lp.shape), ("mask", mask, lp.shape),
              ("advantages", x.advantages, (B,)), ("foreign", x.foreign, (B,))]
    real_valued = [("logprobs", lp), ("gen_logprobs", gen)]
    if x.old_logprobs is not None:
        if x.old_logprobs.requires_grad:
            raise ValueError("LossInputs.old_logprobs must be detached (pi_old is a constant)")
        checks.append(("old_logprobs", x.old_logprobs, lp.shape))
        real_valued.append(("old_logprobs", x.old_logprobs))
    for name, t, shape in checks:
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"LossInputs.{name} has shape {tuple(t.shape)}, expected {tuple(shape)}")
        if t.device != lp.device:
            raise ValueError(f"LossInputs.{name} is on {t.device}, logprobs on {lp.device}")
    for name, t in real_valued:
        if not t.is_floating_point():
            raise ValueError(f"LossInputs.{name} must be floating point, got {t.dtype}")
    if x.advantages.dtype == torch.bool or x.advantages.is_complex():
        raise ValueError(f"LossInputs.advantages must be real numbers, got {x.advantages.dtype}")
    if x.foreign.dtype != torch.bool:
        raise ValueError(f"LossInputs.foreign must be a bool tensor, got {x.foreign.dtype}")
    if mask.dtype != torch.bool and not ((mask == 0) | (mask == 1)).all():
        raise ValueError("LossInputs.mask must be bool or hold only 0 and 1")
    m = mask.bool()
    empty = (~m.any(dim=1)).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"LossInputs.mask: samples {empty} have no real tokens")
    for name, t in real_valued:
        bad = (m & ~torch.isfinite(t.detach())).nonzero()
        if len(bad):
            raise ValueError(f"LossInputs.{name} is not finite on real token (sample, position) "
                             f"{tuple(bad[0].tolist())} ({len(bad)} such tokens)")
    if not torch.isfinite(x.advantages.detach()).all():
        raise ValueError("LossInputs.advantages contain NaN or inf")
    if x.sources is not None:
        if len(x.sources) != B or not all(isinstance(s, str) for s in x.sources):
            raise ValueError(f"LossInputs.sources must be {B} strings, got {x.sources!r}")
    if x.chunks is not None:
        validate_chunks(x.chunks, m, lp.shape)


@dataclass
class TokenTerms:
    """What a per-token loss function sees. Padding positions hold 0 in lp/gen."""

    lp: torch.Tensor
    """[B, T] learner log-probs (with gradient when the input had one)."""
    gen: torch.Tensor
    """[B, T] generator log-probs."""
    w: torch.Tensor
    """[B, T] detached truncated weight min(exp(old - gen), C)."""
    adv: torch.Tensor
    """[B, 1] advantages after the filter (0 for filtered samples)."""
    old: torch.Tensor
    """[B, T] detached round-start log-probs pi_old (``lp.detach()`` on a batch's first update):
    a ratio ``exp(lp - old)`` is 1 with gradient on the first update and pi_theta/pi_old after."""


TokenLossFn = Callable[[TokenTerms, LossConfig], torch.Tensor]
LOSS_REGISTRY: dict[str, TokenLossFn] = {}


def register_loss(*names: str, replace: bool = False) -> Callable[[TokenLossFn], TokenLossFn]:
    """Register a per-token loss ``fn(terms, config) -> [B, T]`` under one or more names."""
    if not names:
        raise ValueError("register_loss needs at least one method name")

    def deco(fn: TokenLossFn) -> TokenLossFn:
        for name in names:
            if name in LOSS_REGISTRY and not replace:
                raise ValueError(f"loss method {name!r} is already registered")
            LOSS_REGISTRY[name] = fn
        return fn

    return deco


def get_loss_fn(name: str) -> TokenLossFn:
    if name not in LOSS_REGISTRY:
        raise ValueError(f"unknown loss method {name!r}; valid: {', '.join(sorted(LOSS_REGISTRY))}")
    return LOSS_REGISTRY[name]


def is_filtered(name: str) -> bool:
    return name.startswith("f-")


def _ratio(t: TokenTerms) -> torch.Tensor:
    return torch.exp(t.lp - t.old)


@register_loss("nois", "f-nois")
def _nois(t: TokenTerms, cfg: LossConfig) -> torch.Tensor:
    return -_ratio(t) * t.adv


@register_loss("tis", "f-tis")
def _tis(t: TokenTerms, cfg: LossConfig) -> torch.Tensor:
    ratio = _ratio(t)
    clipped = ratio.clamp(1 - cfg.clip_eps, 1 + cfg.clip_eps)
    return -t.w * torch.minimum(ratio * t.adv, clipped * t.adv)


@register_loss("vis", "f-vis")
def _vis(t: TokenTerms, cfg: LossConfig) -> torch.Tensor:
    log_rho = t.lp - t.gen
    log_rho = log_rho - (log_rho - log_rho.clamp(max=VIS_MAX_LOG_RATIO)).detach()
    rho = torch.exp(log_rho)
    clipped = rho.clamp(1 - cfg.clip_eps, 1 + cfg.clip_eps)
    return -torch.minimum(rho * t.adv, clipped * t.adv)


@dataclass
class LossOutputs:
    """Loss, its micro-batching parts, per-sample decisions (detached, CPU) and metrics."""

    loss: torch.Tensor
    """Scalar ``loss_sum / denominator``; exactly 0 (still a graph) when denominator is 0."""
    loss_sum: torch.Tensor
    """Scalar un-normalised sum: backward on it per micro-batch, divide grads by sum of denominators."""
    denominator: float
    """Counted sequences ("sequence") or their real tokens ("token")."""
    kept: torch.Tensor
    """[B] bool: not filtered (its advantage reaches the gradient; it may still be 0)."""
    counted: torch.Tensor
    """[B] bool: in the denominator (all samples, or the kept ones with filter_action "drop")."""
    filtered: torch.Tensor
    filtered_negative: torch.Tensor
    filtered_kl: torch.Tensor
    """[B] bool masks from :func:`ftis_flwr.maths.advantages.filter_mask` (all False unless f-*)."""
    sample_kl: torch.Tensor
    """[B] float64 per-sample KL estimate between pi_old and pi_gen (finite)."""
    sample_w_mean: torch.Tensor
    """[B] float64 mean truncated weight over each sample's real tokens."""
    advantages_used: torch.Tensor
    """[B] float64 advantages after the filter."""
    stats: LossStats
    """The detached numbers the metrics are computed from (concatenate micro-batches' stats)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """:func:`ftis_flwr.maths.loss_metrics.loss_metrics` of ``stats`` ({} when not asked for)."""


def compute_loss(inputs: LossInputs, config: LossConfig, *, metrics: bool = True) -> LossOutputs:
    """The loss of ``config.method`` on one (micro-)batch, with filter decisions and stats.

    ``metrics=False`` skips building the metrics dict: a Node concatenates its micro-batches'
    ``stats`` and calls :func:`ftis_flwr.maths.loss_metrics.loss_metrics` once per update.
    """
    # ftis_flwr.config.validation checks the settings; the maths asserts only what its branches need
    assert config.trunc_c > 0 and config.kl_estimator in KL_ESTIMATORS and config.reduction in REDUCTIONS \
        and config.filter_action in FILTER_ACTIONS, f"validate this LossConfig first: {config}"
    token_fn = get_loss_fn(config.method)
    dev = inputs.logprobs.device
    work = torch.promote_types(inputs.logprobs.dtype, torch.float32)
    m = inputs.mask.bool()
    has_old = inputs.old_logprobs is not None

    # Detached quantities in float64 on the CPU (filter decisions and metrics), all from pi_old.
    m_c = m.cpu()
    lp_c = inputs.logprobs.detach().cpu().double()
    old_c = inputs.old_logprobs.cpu().double() if has_old else lp_c
    gen_c = inputs.gen_logprobs.detach().cpu().double()
    n_tok = m_c.sum(dim=1).double()
    chunked = Chunked(inputs.chunks, m_c)
    # log pi_old - log pi_gen per chunk, on each of its tokens (a token is its own chunk by default)
    log_ratio = chunked.spread(torch.where(m_c, old_c - gen_c, 0.0))
    d = -log_ratio  # read once per chunk, at its first token
    tok_kl = (torch.expm1(d.clamp(max=KL_MAX_LOG_RATIO)) - d) if config.kl_estimator == KlEstimator.K3 else d
    sample_kl = torch.where(chunked.first, tok_kl, 0.0).sum(dim=1) / chunked.count  # mean over chunks
    adv = inputs.advantages.detach().cpu().double()
    foreign = inputs.foreign.cpu()
    candidates = filter_mask(adv, sample_kl, foreign, threshold=config.kl_threshold,
                             rule=config.filter_rule, scope=config.filter_scope)
    no = torch.zeros_like(foreign)
    filtered, f_neg, f_kl = candidates if is_filtered(config.method) else (no, no, no)
    kept = ~filtered
    counted = kept if config.filter_action == FilterAction.DROP else torch.ones_like(kept)
    adv_used = torch.where(filtered, 0.0, adv)

    # The differentiable part, on the input's device.
    lp = torch.where(m, inputs.logprobs.to(work), 0.0)
    old = torch.where(m, inputs.old_logprobs.to(work), 0.0) if has_old else lp.detach()
    gen = torch.where(m, inputs.gen_logprobs.to(work), 0.0)
    log_c = math.log(config.trunc_c)
    # chunk level (the token path when every token is its own chunk): w from sum(old - gen) over
    # the chunk, then gen replaced so that lp - gen is the chunk's sum(lp - gen), per-token gradient
    dev_chunks = chunked.to(dev)
    w = torch.exp(dev_chunks.spread(old - gen).clamp(max=log_c + 1.0)).clamp(max=config.trunc_c)
    gen = dev_chunks.chunk_gen(lp.detach(), gen)
    terms = TokenTerms(lp=lp, gen=gen, w=w, adv=adv_used.to(dev, work)[:, None], old=old)
    tok_loss = token_fn(terms, config)
    if tuple(tok_loss.shape) != tuple(lp.shape):
        raise ValueError(f"loss method {config.method!r} returned shape {tuple(tok_loss.shape)}, "
                         f"expected {tuple(lp.shape)}")
    tok_loss = torch.where(m, tok_loss, 0.0)
    if config.reduction == Reduction.SEQUENCE:
        per_seq = tok_loss.sum(dim=1) / n_tok.to(dev, work)
        denominator = float(counted.sum())
    else:
        per_seq = tok_loss.sum(dim=1)
        denominator = float(n_tok[counted].sum())
    loss_sum = torch.where(counted.to(dev), per_seq, 0.0).sum()
    loss = loss_sum / denominator if denominator > 0 else loss_sum * 0.0
    loss_sum_value = float(loss_sum.detach())
    if not math.isfinite(loss_sum_value):
        raise FloatingPointError(f"loss method {config.method!r} produced a non-finite loss")

    w64 = torch.exp(log_ratio.clamp(max=log_c + 1.0)).clamp(max=config.trunc_c)
    sample_w = torch.where(m_c, w64, 0.0).sum(dim=1) / n_tok
    gen_clip = chunked.chunk_gen(lp_c, gen_c)  # vis clips lp - gen: the chunk's, as in the loss
    stats = LossStats(
        loss_sum=loss_sum_value, denominator=denominator, foreign=foreign.numpy(),
        sources=None if inputs.sources is None else list(inputs.sources),
        advantages=adv.numpy(), advantages_used=adv_used.numpy(), filtered=filtered.numpy(),
        filtered_negative=f_neg.numpy(), filtered_kl=f_kl.numpy(),
        would_filter=candidates[0].numpy(), counted=counted.numpy(), sample_kl=sample_kl.numpy(),
        n_tokens=m_c.sum(dim=1).numpy(), log_ratio=log_ratio[m_c].numpy(), w=w64[m_c].numpy(),
        clip=_clip_binds(config, *(torch.where(m_c, t, 0.0) for t in (lp_c, old_c, gen_clip)),
                         adv_used)[m_c].numpy() if config.method in CLIPPED_RATIO else None)
    out = LossOutputs(loss=loss, loss_sum=loss_sum, denominator=denominator, kept=kept,
                      counted=counted, filtered=filtered, filtered_negative=f_neg,
                      filtered_kl=f_kl, sample_kl=sample_kl, sample_w_mean=sample_w,
                      advantages_used=adv_used, stats=stats)
    if metrics:
        out.metrics = loss_metrics(stats, config.trunc_c)
    return out


def _clip_binds(cfg: LossConfig, lp: torch.Tensor, old: torch.Tensor, gen: torch.Tensor,
                adv: torch.Tensor) -> torch.Tensor:
    """[B, T] where the method's PPO clip zeroes the gradient at the current weights (float64,
    inputs 0 on padding)."""
    if CLIPPED_RATIO[cfg.method] == "old":
        ratio = torch.exp(lp - old)
    else:
        ratio = torch.exp((lp - gen).clamp(max=VIS_MAX_LOG_RATIO))
    a = adv[:, None]
    return ((a > 0) & (ratio > 1 + cfg.clip_eps)) | ((a < 0) & (ratio < 1 - cfg.clip_eps))
