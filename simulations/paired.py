"""The paired rule: a claim judged on its per-seed differences by a confidence interval, so more
seeds can settle it (issue 39). Fixed before the runs of issue 39; ``verdicts.py`` shows it
beside the first rule ("every seed agrees"), which gets harder to meet as seeds are added.

For one claim, d_i = 100 * (acc_X - acc_Y) on seed i (same seed: same models, prompts and
sampling), in points, positive in the claim's direction. With n seeds:

- **mean** of d and its **paired Student-t 95% interval**, mean ± t_{0.975,n-1} * sd(d) / sqrt(n),
  sd with n - 1 in the denominator and the t quantile computed here (no scipy);
- **Wilcoxon signed-rank p**, two-sided and exact: zero differences dropped (Wilcoxon's
  convention), tied magnitudes given their mean rank, and the statistic's null distribution
  counted over all 2^n sign flips (a subset-sum count, exact for any n; no scipy);
- **minimum detectable difference** (MDD): the smallest true mean difference the interval
  would exclude 0 for with 80% power, (t_{0.975,n-1} + t_{0.80,n-1}) * sd(d) / sqrt(n).

The verdict, at the level 95%, from the interval [lo, hi] alone:

- a directional claim (X above Y): **reproduced** when lo > 0, **refuted** when hi < 0,
  **inconclusive** otherwise;
- a "level" claim (X level with Y) with margin ``LEVEL_MARGIN`` = 2 points (the first rule's
  "within ±2 points", so the two rules mean the same "level"): **reproduced** when
  -2 <= lo and hi <= 2, **refuted** when lo > 2 or hi < -2, **inconclusive** otherwise;
- fewer than ``MIN_SEEDS`` = 5 seeds: inconclusive under both rules (the first rule needs 5 too).

The Wilcoxon p and the MDD are reported beside the verdict, not used by it.

Calibration (``python -m simulations.paired --calibrate``, ``calibrate``): with no true effect
the rule should give a verdict on an "above" claim in 5% of studies. The rule first used a
percentile bootstrap interval of the mean (``bootstrap_interval``, 10,000 resamples), which is
narrower than the t interval at few seeds (the resampled means have (n-1)/n of the sample
mean's variance, and its tails are the sample's own): with no effect it gave a verdict in
17.0% of 2,000 simulated 5-seed studies and 10.7% at 8 seeds, the t interval in 6.0% and 5.1%
(normal differences; the table, with a heavy-tailed null too, is in docs/sweeps.md), so the t
interval replaced it before the runs of the coming study. ``bootstrap_interval`` is kept only
so that the calibration can show the two side by side; no verdict or table uses it.
"""

from __future__ import annotations

import argparse
import functools
import math
from collections.abc import Callable

import numpy as np

LEVEL = 0.95
LEVEL_MARGIN = 2.0
MIN_SEEDS = 5
POWER = 0.80
RESAMPLES = 10_000  # bootstrap_interval only (the calibration's comparison)
BOOTSTRAP_SEED = 39  # the issue the rule was written for; any fixed value would do
CALIBRATION_SEED = 39
CALIBRATION_STUDIES = 2_000
CALIBRATION_SEEDS = (5, 8, 16)
NULLS = ("normal", "t3")
NULL_NAMES = {"normal": "normal", "t3": "t, 3 df"}


def t_interval(d: list[float], level: float = LEVEL) -> tuple[float, float]:
    """The paired Student-t interval of the mean of ``d``: mean ± t_{(1+level)/2, n-1} * sd / sqrt(n),
    sd with n - 1 in the denominator. Needs at least 2 values."""
    x = np.asarray(d, dtype=float)
    n = len(x)
    if n < 2:
        raise ValueError(f"a t interval needs at least 2 differences, got {n}")
    mean = float(x.mean())
    half = t_quantile(1 - (1 - level) / 2, n - 1) * float(x.std(ddof=1)) / math.sqrt(n)
    return mean - half, mean + half


def bootstrap_interval(d: list[float], resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED,
                       level: float = LEVEL) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``d`` (seeds resampled with replacement): the
    rule's first interval, anti-conservative at few seeds; not used by any verdict, kept for
    ``calibrate``'s comparison."""
    x = np.asarray(d, dtype=float)
    idx = np.random.default_rng(seed).integers(0, len(x), size=(resamples, len(x)))
    means = x[idx].mean(axis=1)
    tail = 100 * (1 - level) / 2
    lo, hi = np.percentile(means, [tail, 100 - tail])
    return float(lo), float(hi)


def signed_ranks(d: list[float]) -> list[float]:
    """Ranks of |d| over the non-zero differences, ties given their mean rank, with d's sign."""
    x = [v for v in d if v != 0]
    order = sorted(range(len(x)), key=lambda i: abs(x[i]))
    ranks = [0.0] * len(x)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and abs(x[order[j + 1]]) == abs(x[order[i]]):
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return [math.copysign(r, v) for r, v in zip(ranks, x)]


def wilcoxon_p(d: list[float]) -> float:
    """Exact two-sided p of the Wilcoxon signed-rank test: the share of the 2^n sign flips of
    the ranks whose W+ (sum of positive ranks) is at least as far from n(n+1)/4 as the
    observed one. 1.0 when every difference is zero."""
    r = signed_ranks(d)
    if not r:
        return 1.0
    twice = [round(2 * abs(v)) for v in r]  # mean ranks are halves: count in half-ranks
    counts = [1] + [0] * sum(twice)  # counts[k]: sign flips whose 2 * W+ is k (exact integers)
    for w in twice:
        counts = [c + (counts[k - w] if k >= w else 0) for k, c in enumerate(counts)]
    observed = sum(w for w, v in zip(twice, r) if v > 0)
    centre = sum(twice) / 2
    far = [k for k in range(len(counts)) if abs(k - centre) >= abs(observed - centre) - 1e-9]
    return float(sum(counts[k] for k in far) / 2 ** len(twice))


def t_cdf(t: float, df: int) -> float:
    """Student t CDF for an integer number of degrees of freedom (closed form, Abramowitz and
    Stegun 26.7.3-4)."""
    theta = math.atan(abs(t) / math.sqrt(df))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if df % 2:
        term, total = math.cos(theta), 0.0
        for k in range(1, (df - 1) // 2 + 1):  # cos + (2/3) cos^3 + (2*4)/(3*5) cos^5 ...
            total += term
            term *= c2 * (2 * k) / (2 * k + 1)
        a = 2 / math.pi * (theta + s * total) if df > 1 else 2 * theta / math.pi
    else:
        term, total = 1.0, 0.0
        for k in range(1, df // 2 + 1):  # 1 + (1/2) cos^2 + (1*3)/(2*4) cos^4 ...
            total += term
            term *= c2 * (2 * k - 1) / (2 * k)
        a = s * total
    return 0.5 + math.copysign(a / 2, t)


@functools.cache
def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on ``t_cdf``)."""
    if p < 0.5:
        return -t_quantile(1 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


def mdd(d: list[float], level: float = LEVEL, power: float = POWER) -> float | None:
    """Minimum detectable difference: (t_{1-(1-level)/2, n-1} + t_{power, n-1}) * sd(d) / sqrt(n);
    None with fewer than 2 seeds."""
    n = len(d)
    if n < 2:
        return None
    return _mdd(float(np.std(np.asarray(d, dtype=float), ddof=1)), n, level, power)


def _mdd(sd: float, n: int, level: float, power: float) -> float:
    """The MDD of n seeds whose differences have standard deviation ``sd``."""
    return (t_quantile(1 - (1 - level) / 2, n - 1) + t_quantile(power, n - 1)) * sd / math.sqrt(n)


def seeds_for(d: list[float], target: float, level: float = LEVEL, power: float = POWER,
              most: int = 10_000) -> int | None:
    """How many seeds would bring the MDD (``mdd``) down to ``target`` points, if the per-seed
    differences kept the spread of ``d``: the smallest n >= 2 with (t_{1-(1-level)/2, n-1} +
    t_{power, n-1}) * sd(d) / sqrt(n) <= target (it falls as n grows, so a bisection finds it).
    None with fewer than 2 seeds, or above ``most``."""
    if len(d) < 2 or target <= 0:
        return None
    sd = float(np.std(np.asarray(d, dtype=float), ddof=1))
    if _mdd(sd, most, level, power) > target:
        return None
    lo, hi = 1, most  # the MDD falls as n grows: bisect for the first n at or under the target
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if _mdd(sd, mid, level, power) <= target else (mid, hi)
    return hi


def judge(lo: float, hi: float, kind: str, margin: float = LEVEL_MARGIN) -> str:
    """The verdict an interval [lo, hi] gives a claim of ``kind`` "above" (d > 0 claimed) or
    "level" (|d| <= margin claimed)."""
    if kind == "level":
        if -margin <= lo and hi <= margin:
            return "reproduced"
        return "refuted" if lo > margin or hi < -margin else "inconclusive"
    if lo > 0:
        return "reproduced"
    return "refuted" if hi < 0 else "inconclusive"


def decide(d: list[float], kind: str, margin: float = LEVEL_MARGIN,
           interval: Callable[[list[float]], tuple[float, float]] = t_interval) -> str:
    """"reproduced", "refuted" or "inconclusive" for a claim of ``kind`` "above" or "level", from
    the t interval of the mean (``interval``: another interval, for ``calibrate`` only)."""
    if len(d) < MIN_SEEDS:
        return "inconclusive"
    return judge(*interval(d), kind, margin)


def null_differences(rng: np.random.Generator, null: str, n: int) -> list[float]:
    """n differences with no true effect: "normal", Normal(0, 1); "t3", Student t with 3 degrees
    of freedom scaled to variance 1 (divided by sqrt(3)), heavy-tailed."""
    if null == "normal":
        return list(rng.normal(0.0, 1.0, n))
    if null == "t3":
        return list(rng.standard_t(3, n) / math.sqrt(3))
    raise ValueError(f"unknown null {null!r}: one of {NULLS}")


def calibrate(n: int, null: str = "normal", studies: int = CALIBRATION_STUDIES,
              seed: int = CALIBRATION_SEED,
              interval: Callable[[list[float]], tuple[float, float]] | None = None) -> float:
    """The false-verdict rate: the share of ``studies`` simulated n-seed studies with no true
    effect (``null_differences``) in which an "above" claim is reproduced or refuted. Each
    (null, n) draws from its own ``default_rng((seed, n, null index))``, so a rate is the same
    whatever else is computed. It measures ``decide`` as the verdicts use it;
    ``interval=bootstrap_interval``: the rule's first interval instead."""
    rng = np.random.default_rng((seed, n, NULLS.index(null)))
    other = {} if interval is None else {"interval": interval}
    return sum(decide(null_differences(rng, null, n), "above", **other) != "inconclusive"
               for _ in range(studies)) / studies


def calibration_table(seeds: tuple[int, ...] = CALIBRATION_SEEDS, studies: int = CALIBRATION_STUDIES,
                      bootstrap: bool = True) -> str:
    """Markdown: the false-verdict rate per null and number of seeds, for the t interval (the
    rule) and, with ``bootstrap``, the percentile bootstrap it replaced (about 20 s more)."""
    rules = [("t interval (the rule)", None)]
    if bootstrap:
        rules.append(("percentile bootstrap (replaced)", bootstrap_interval))
    rows = ["| null | interval | " + " | ".join(f"{n} seeds" for n in seeds) + " |",
            "|" + " --- |" * (2 + len(seeds))]
    for null in NULLS:
        for name, interval in rules:
            rates = [calibrate(n, null, studies, interval=interval) for n in seeds]
            rows.append(f"| {NULL_NAMES[null]} | {name} | "
                        + " | ".join(f"{100 * r:.1f}%" for r in rates) + " |")
    return "\n".join(rows)


HEADER = "mean [95% interval] | Wilcoxon p | MDD | paired rule"
NOT_RUN = "- | - | - | not run"


def cells(d: list[float], kind: str) -> str:
    """The paired rule's four table cells: the mean with its t interval (to 0.01, as the interval
    decides: a lower end of 2.03 refutes "level" within ±2), the exact Wilcoxon p, the MDD for
    these n seeds, the verdict."""
    if not d:
        return "- | - | - | inconclusive (0 seeds)"
    m = mdd(d)
    word = decide(d, kind)
    if len(d) < MIN_SEEDS:
        word += f" ({len(d)} seeds < {MIN_SEEDS})"
    if len(d) < 2:
        interval = f"{float(np.mean(d)):+.1f} [-]"
    else:
        lo, hi = t_interval(d)
        interval = f"{float(np.mean(d)):+.1f} [{lo:+.2f}, {hi:+.2f}]"
    return f"{interval} | {wilcoxon_p(d):.3g} | {'-' if m is None else f'{m:.1f}'} | {word}"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calibrate", action="store_true",
                   help="print the false-verdict rate with no true effect (2,000 studies per cell)")
    p.add_argument("--studies", type=int, default=CALIBRATION_STUDIES)
    p.add_argument("--no-bootstrap", action="store_true", help="leave out the replaced bootstrap rows")
    a = p.parse_args(argv)
    if not a.calibrate:
        p.error("nothing to do: pass --calibrate")
    print(calibration_table(studies=a.studies, bootstrap=not a.no_bootstrap))


if __name__ == "__main__":
    main()
