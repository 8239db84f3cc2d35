"""What an update reports (algorithm §7), as a pure function of detached per-sample numbers.

:func:`ftis_flwr.maths.loss.compute_loss` fills one :class:`LossStats` per (micro-)batch from the very
forward the loss is built on. The metrics depend on nothing else, so a Node concatenates its
micro-batches' stats (:meth:`LossStats.concat`) and computes the metrics once per update instead
of a second pass over the whole batch.

Plain finite floats. Empty subsets: counts 0, w_* 1.0 (the neutral weight), fractions 0.0,
ess 1.0 (no foreign tokens: nothing to correct), kl_* 0.0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np

KL_METRIC_CAP = 1e12
"""``kl_mean_*`` metrics average per-sample KL clamped to [-1e12, 1e12]; medians are unclamped."""


@dataclass
class LossStats:
    """One (micro-)batch's detached numbers, on the CPU. Token arrays hold the real tokens only,
    row-major (sample 0's tokens, then sample 1's, ...), so batches of any width concatenate."""

    loss_sum: float
    denominator: float
    foreign: np.ndarray
    """[B] bool."""
    sources: list[str] | None
    advantages: np.ndarray
    """[B] float64 before the filter."""
    advantages_used: np.ndarray
    """[B] float64 after the filter."""
    filtered: np.ndarray
    filtered_negative: np.ndarray
    filtered_kl: np.ndarray
    would_filter: np.ndarray
    """[B] bool: the filter's decision whether or not the method filters."""
    counted: np.ndarray
    """[B] bool: in the denominator."""
    sample_kl: np.ndarray
    """[B] float64 KL(pi_old vs pi_gen) estimate."""
    n_tokens: np.ndarray
    """[B] int64 real tokens per sample."""
    log_ratio: np.ndarray
    """[N] float64 log pi_old - log pi_gen per real token."""
    w: np.ndarray
    """[N] float64 truncated weight min(pi_old / pi_gen, C) per real token."""
    clip: np.ndarray | None
    """[N] bool: the method's clip binds on the token at this update's weights (None: no clip)."""

    @staticmethod
    def concat(parts: Sequence[LossStats]) -> LossStats:
        """The stats of the batch made of ``parts`` (micro-batches of one update, in order)."""
        if not parts:
            raise ValueError("LossStats.concat needs at least one part")
        clips = [p.clip for p in parts]
        if any(c is None for c in clips) and not all(c is None for c in clips):
            raise ValueError("LossStats.concat: parts disagree on whether the method clips")
        out = {}
        for f in fields(LossStats):
            vals = [getattr(p, f.name) for p in parts]
            if f.name in ("loss_sum", "denominator"):
                out[f.name] = float(sum(vals))
            elif f.name == "sources":
                out[f.name] = None if any(v is None for v in vals) else [s for v in vals for s in v]
            elif f.name == "clip" and vals[0] is None:
                out[f.name] = None
            else:
                out[f.name] = np.concatenate(vals)
        return LossStats(**out)

    def per_token(self, per_sample: np.ndarray) -> np.ndarray:
        """A [B] sample selection spread to the [N] real tokens."""
        return np.repeat(per_sample, self.n_tokens)


def _weight_stats(w: np.ndarray, c: float) -> dict[str, float]:
    """w_mean/min/max, frac_tokens_truncated and ess = (sum w)^2 / (N sum w^2) over tokens ``w``.

    ess is 1.0 with no tokens and 0.0 when every weight underflowed to 0.
    """
    if w.size == 0:
        return {"w_mean": 1.0, "w_min": 1.0, "w_max": 1.0, "frac_tokens_truncated": 0.0,
                "ess": 1.0}
    s2 = float(np.sum(w * w))
    ess = float(np.sum(w)) ** 2 / (w.size * s2) if s2 > 0 else 0.0
    return {"w_mean": float(w.mean()), "w_min": float(w.min()), "w_max": float(w.max()),
            "frac_tokens_truncated": float(np.mean(w >= c)), "ess": ess}


QUANTILES = (50, 90, 99)
"""Per-source quantiles of the truncated weights and of |log pi_old - log pi_gen| (a far peer shows
in its tails, on either side: the filter's k3 grows with exp(gen - old))."""


def _quantiles(name: str, x: np.ndarray) -> dict[str, float]:
    """``<name>_p50/_p90/_p99`` of ``x`` (0.0 for an empty selection: nothing to report)."""
    if x.size == 0:
        return {f"{name}_p{q}": 0.0 for q in QUANTILES}
    values = np.percentile(x, QUANTILES)
    return {f"{name}_p{q}": float(v) for q, v in zip(QUANTILES, values)}


def _kl_stats(kl: np.ndarray) -> tuple[float, float]:
    """(mean of KL clamped to +-KL_METRIC_CAP, median); (0.0, 0.0) for no samples."""
    if kl.size == 0:
        return 0.0, 0.0
    return float(np.clip(kl, -KL_METRIC_CAP, KL_METRIC_CAP).mean()), float(np.median(kl))


def clip_frac(s: LossStats) -> float | None:
    """Fraction of real tokens with a non-zero advantage where the clip binds (None: no clip)."""
    if s.clip is None:
        return None
    active = s.per_token(s.advantages_used != 0)
    return float(s.clip[active].mean()) if active.any() else 0.0


def loss_metrics(s: LossStats, trunc_c: float) -> dict[str, float]:
    """The algorithm §7 metrics of one update (or micro-batch) from its stats."""
    filt, fneg, fkl, foreign = s.filtered, s.filtered_negative, s.filtered_kl, s.foreign
    adv, kl = s.advantages, s.sample_kl
    kept = ~filt
    zero, negative = adv == 0, adv < 0

    def counts(sel: np.ndarray) -> dict[str, float]:
        return {"samples": float(sel.sum()), "samples_kept": float((sel & kept).sum()),
                "filtered": float((sel & filt).sum()),
                "filtered_negative": float((sel & fneg).sum()),
                "filtered_kl": float((sel & fkl).sum()),
                "filtered_zero_advantage": float((sel & filt & zero).sum()),
                "zero_advantage": float((sel & zero).sum()),
                "negative_advantage": float((sel & negative).sum())}

    loss = s.loss_sum / s.denominator if s.denominator > 0 else 0.0
    met = {"loss": loss, "denominator": s.denominator, **counts(np.ones_like(foreign)),
           "samples_foreign": float(foreign.sum()), "samples_own": float((~foreign).sum()),
           "samples_counted": float(s.counted.sum()),
           "samples_effective": float((kept & ~zero).sum()),
           "positive_advantage": float((adv > 0).sum()), "would_filter": float(s.would_filter.sum()),
           "tokens": float(s.n_tokens.sum()), "tokens_counted": float(s.n_tokens[s.counted].sum())}
    stats = _weight_stats(s.w, trunc_c)
    met.update({k: v for k, v in stats.items() if k != "ess"})
    met["ess"] = _weight_stats(s.w[s.per_token(foreign)], trunc_c)["ess"]
    met["kl_mean_foreign"], met["kl_median_foreign"] = _kl_stats(kl[foreign])
    met["kl_mean_own"], met["kl_median_own"] = _kl_stats(kl[~foreign])
    frac = clip_frac(s)
    if frac is not None:
        met["clip_frac"] = frac
    if s.sources is not None:
        src = np.asarray(s.sources, dtype=object)
        for name in sorted(set(s.sources)):
            sel = src == name
            tokens = s.per_token(sel)
            per = {**counts(sel), "foreign": float((sel & foreign).sum()),
                   **_weight_stats(s.w[tokens], trunc_c), **_quantiles("w", s.w[tokens]),
                   **_quantiles("abs_log_ratio", np.abs(s.log_ratio[tokens]))}
            per["kl_mean"], per["kl_median"] = _kl_stats(kl[sel])
            met.update({f"{name}/{k}": v for k, v in per.items()})
    return met


def own_gap(s: LossStats) -> dict[str, float]:
    """|log pi_old - log pi_gen| on own samples' tokens: 0 up to rounding when the learner scores
    exactly the distribution the engine sampled from (the on-policy check). {} without own."""
    own = s.per_token(~s.foreign)
    if not own.any():
        return {}
    gap = np.abs(s.log_ratio[own])
    return {"own_logprob_gap_max": float(gap.max()), "own_logprob_gap_mean": float(gap.mean())}
