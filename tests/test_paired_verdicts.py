"""The paired rule (simulations/paired.py) on synthetic per-seed differences, and its columns in
verdicts.py's table beside today's rule."""

from __future__ import annotations

import math
import sys
from itertools import product
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "simulations")]

import paired  # noqa: E402
from paired import bootstrap_interval, cells, decide, mdd, t_quantile, wilcoxon_p  # noqa: E402

# 16 seeds of one effect: the first 5 split widely (one below 0), the other 11 all above 0
SIXTEEN = [4.0, -3.0, 0.5, 2.5, 1.0, 1.5, 2.0, 0.5, 3.0, 1.0, 2.5, 1.5, 0.5, 2.0, 1.0, 1.5]


def test_bootstrap_interval_of_known_cases():
    """Constant differences: the interval is that constant. d = (0, 0, 0, 0, 10): a resample's
    mean is 2K, K ~ Binomial(5, 1/5); P(K = 0) = 0.328 > 0.025 and P(K <= 2) = 0.942 < 0.975 <=
    P(K <= 3) = 0.993, so the percentile interval is [0, 6]. Many seeds: close to mean ± 1.96 se."""
    assert bootstrap_interval([2.0] * 5) == (2.0, 2.0)
    assert bootstrap_interval([0, 0, 0, 0, 10]) == (0.0, 6.0)
    d = np.random.default_rng(0).normal(1.0, 2.0, 400)
    lo, hi = bootstrap_interval(list(d))
    se = d.std(ddof=1) / math.sqrt(len(d))
    assert lo == pytest.approx(d.mean() - 1.96 * se, abs=0.2 * se)
    assert hi == pytest.approx(d.mean() + 1.96 * se, abs=0.2 * se)
    # reproducible: the same differences give the same interval (a fixed RNG seed)
    assert bootstrap_interval(SIXTEEN) == bootstrap_interval(SIXTEEN)
    assert paired.RESAMPLES == 10_000


def _brute_wilcoxon(d: list[float]) -> float:
    """Every sign flip of the ranks, one by one (the definition paired.wilcoxon_p counts)."""
    r = [abs(v) for v in paired.signed_ranks(d)]
    obs = sum(v for v in paired.signed_ranks(d) if v > 0)
    centre = sum(r) / 2
    flips = [sum(x for x, s in zip(r, signs) if s) for signs in product((0, 1), repeat=len(r))]
    return sum(abs(w - centre) >= abs(obs - centre) - 1e-9 for w in flips) / len(flips)


def test_exact_wilcoxon_against_hand_computed_values():
    # n = 5, all above: W+ = 15 or 0 are the only ones as extreme, 2 of 32 flips
    assert wilcoxon_p([1, 2, 3, 4, 5]) == 2 / 32
    assert wilcoxon_p([-0.5, -1, -7, -2, -3]) == 2 / 32
    # n = 6 all above: 2 / 64
    assert wilcoxon_p([0.1, 0.2, 0.3, 0.4, 0.5, 0.6]) == 2 / 64
    # ranks 1..5, the 2 negative: W+ = 13; W+ >= 13 in 3 of 32 flips ({}, {1}, {2} left out), twice
    assert wilcoxon_p([1, -2, 3, 4, 5]) == 6 / 32
    # a zero dropped, |1| tied: ranks 1.5, 1.5, 3, 4, W+ = 8.5 of 10; 6 of 16 flips as far from 5
    assert paired.signed_ranks([0, 1, -1, 2, 3]) == [1.5, -1.5, 3.0, 4.0]
    assert wilcoxon_p([0, 1, -1, 2, 3]) == 6 / 16
    assert wilcoxon_p([0, 0, 0, 0, 0]) == 1.0
    # balanced: W+ at the centre, every flip is as extreme
    assert wilcoxon_p([1, -1, 2, -2]) == 1.0
    for d in ([0.5, -1.5, 2.5, 3.1, -4.2, 5.3, 6.6, 1.1], SIXTEEN[:12], [1, 1, -1, 2, 2, -3, 3, 4]):
        assert wilcoxon_p(d) == pytest.approx(_brute_wilcoxon(d), abs=1e-12)


def test_exact_wilcoxon_matches_scipy_without_ties():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(5)
    for n in (5, 8, 12, 20):
        d = list(rng.normal(0.5, 1.0, n))
        assert wilcoxon_p(d) == pytest.approx(stats.wilcoxon(d, method="exact").pvalue, rel=1e-9)


def test_t_quantiles_and_the_mdd_formula():
    """t table values (df 4: 2.776, 0.941; df 15: 2.131, 0.866). MDD of (1, 2, 3, 4, 5):
    (2.7764 + 0.9410) * sqrt(2.5) / sqrt(5) = 2.629; a quarter of the sd at four times the seeds
    and the same quantiles would halve it."""
    assert t_quantile(0.975, 4) == pytest.approx(2.776, abs=5e-4)
    assert t_quantile(0.80, 4) == pytest.approx(0.941, abs=5e-4)
    assert t_quantile(0.975, 15) == pytest.approx(2.131, abs=5e-4)
    assert t_quantile(0.80, 15) == pytest.approx(0.866, abs=5e-4)
    assert t_quantile(0.975, 1) == pytest.approx(12.706, abs=5e-3)
    assert t_quantile(0.025, 4) == pytest.approx(-2.776, abs=5e-4)
    assert mdd([1, 2, 3, 4, 5]) == pytest.approx((2.776445 + 0.940965) * math.sqrt(2.5) / math.sqrt(5), rel=1e-5)
    assert mdd([1, 2, 3, 4, 5]) == pytest.approx(2.6286, abs=1e-4)
    assert mdd([3.0]) is None
    assert mdd([2.0] * 6) == 0.0
    assert mdd(SIXTEEN) < mdd(SIXTEEN[:5]) / 3  # 16 seeds detect 3-4 times smaller effects here


def test_t_quantiles_match_scipy():
    stats = pytest.importorskip("scipy.stats")
    for df in range(1, 40):
        for q in (0.8, 0.975):
            assert t_quantile(q, df) == pytest.approx(stats.t.ppf(q, df), abs=1e-9)


def test_mdd_has_about_80_percent_power_at_16_seeds():
    """True mean = the MDD of the true sd at 16 seeds: the rule reproduces the claim in at least
    80% of 300 simulated studies (the percentile interval is a little narrower than a t interval,
    so a little more)."""
    n, sd = 16, 2.0
    effect = (t_quantile(0.975, n - 1) + t_quantile(0.80, n - 1)) * sd / math.sqrt(n)
    rng = np.random.default_rng(2)
    hits = sum(decide(list(rng.normal(effect, sd, n)), "above") == "reproduced" for _ in range(300))
    assert 0.78 <= hits / 300 <= 0.95


def test_directional_verdicts_reach_each_outcome():
    assert decide([1, 2, 3, 4, 5], "above") == "reproduced"
    assert decide([-1, -2, -3, -4, -5], "above") == "refuted"
    assert decide([1, -2, 3, -4, 5], "above") == "inconclusive"
    # one seed against the others does not stop the interval clearing 0
    assert decide([3, 4, 5, 4, -1, 3, 4, 5], "above") == "reproduced"
    # all seeds tied at 0: the interval is [0, 0], on neither side
    assert decide([0] * 6, "above") == "inconclusive"
    # too few seeds: inconclusive whatever they say
    assert decide([5, 6, 7, 8], "above") == "inconclusive"
    assert cells([5, 6, 7, 8], "above").endswith("inconclusive (4 seeds < 5)")


def test_level_claim_with_its_margin():
    """Level: the interval inside [-2, +2] reproduces; wholly outside refutes; else inconclusive."""
    assert paired.LEVEL_MARGIN == 2.0
    assert decide([0.5, -0.5, 1.0, -1.0, 0.0, 0.5], "level") == "reproduced"
    assert decide([1.5, 2.0, 1.0, 1.8, 1.2], "level") == "reproduced"  # all above 0, yet level
    assert decide([5, 6, 4, 7, 5], "level") == "refuted"
    assert decide([-5, -6, -4, -7, -5], "level") == "refuted"
    assert decide([3, -3, 4, -4, 1], "level") == "inconclusive"
    assert decide([2.5, 1.5, 3.0, 1.0, 2.0], "level") == "inconclusive"  # straddles +2
    assert decide([0.1, 0.2, 0.1, 0.2], "level") == "inconclusive"  # 4 seeds


def _today(d: list[float]) -> str:
    """Today's rule for an "above" claim (verdicts.verdict), in its first word."""
    from verdicts import verdict

    return verdict(d, "above").split(" (")[0]


def test_more_seeds_settle_the_paired_rule_but_not_the_all_seeds_rule():
    """The same effect: at 5 seeds both rules are inconclusive; at 16 the paired interval lies
    above 0 (reproduced) while "every seed agrees" still fails on the one seed below 0."""
    five = SIXTEEN[:5]
    assert (decide(five, "above"), _today(five)) == ("inconclusive", "inconclusive")
    lo5, hi5 = bootstrap_interval(five)
    assert lo5 < 0 < hi5
    assert (decide(SIXTEEN, "above"), _today(SIXTEEN)) == ("reproduced", "inconclusive")
    assert bootstrap_interval(SIXTEEN)[0] > 0
    assert sum(x < 0 for x in SIXTEEN) == 1


def test_more_seeds_settle_it_over_many_simulated_studies():
    """200 studies of a true effect of 1 point, sd 2: from 5 to 16 seeds the paired rule reproduces
    more often, "every seed above 0" less often (0.69^16 = 0.3%)."""
    def rates(n: int) -> tuple[float, float]:
        rng = np.random.default_rng(1)
        studies = [list(rng.normal(1.0, 2.0, n)) for _ in range(200)]
        return (sum(decide(d, "above") == "reproduced" for d in studies) / 200,
                sum(_today(d) == "reproduced" for d in studies) / 200)

    (paired5, today5), (paired16, today16) = rates(5), rates(16)
    assert paired16 > paired5 + 0.2
    assert today16 < today5
    assert paired16 > 0.5 and today16 < 0.02


def _result(setup: str, method: str, seed: int, weak: float) -> dict:
    nodes = {n: {"accuracy": {"test": [[0, 0.5], [10, weak if n == "weak" else 0.7]],
                              "ood": [[0, 0.3], [10, 0.3]]}} for n in ("weak", "strong")}
    g = "50" if method.startswith("f-") else "-"
    mode = "alone" if method == "alone" else "vertical"
    return {"point": {"key": f"{setup}__{method}__{mode}__g-{g}__seed-{seed}", "setup": setup,
                      "method": method, "mode": mode, "g": g, "seed": seed},
            "summary": {"nodes": nodes, "rounds": 10, "run_dir": ""}, "wall_s": 1.0}


def test_verdicts_table_shows_both_rules_side_by_side():
    """(a) on 16 seeds whose alone - NoIS differences are SIXTEEN: today's rule inconclusive
    (15/16), the paired rule reproduced, with its mean, interval, Wilcoxon p and MDD cells; (c)
    with F-TIS equal to alone in every seed: level under both. Seeds 0-4 only: both inconclusive."""
    from verdicts import claims

    results = []
    for seed, d in enumerate(SIXTEEN):
        results += [_result("s", "alone", seed, 0.60), _result("s", "nois", seed, 0.60 - d / 100),
                    _result("s", "f-tis", seed, 0.60)]
    rows = claims(results)
    assert rows[0].split(" | ")[5:] == ["today's rule", "mean [95% interval]", "Wilcoxon p", "MDD", "paired rule |"]
    assert all(r.count("|") == 11 for r in rows)
    by = {(r.split(" | ")[1], r.split(" | ")[2]): r.split(" | ") for r in rows[2:]}
    a = by[("(a) NoIS ends below alone (ID)", "weak")]
    lo, hi = bootstrap_interval(SIXTEEN)
    assert a[4:] == ["16", "inconclusive (above in 15/16 seeds)", f"+1.4 [{lo:+.2f}, {hi:+.2f}]",
                     f"{wilcoxon_p(SIXTEEN):.3g}", f"{mdd(SIXTEEN):.1f}", "reproduced |"]
    c = by[("(c) F-TIS level with alone (ID)", "weak")]
    assert c[5].startswith("reproduced (mean within ±2 points") and c[9] == "reproduced |"
    assert by[("(b) F-NoIS recovers most of NoIS's loss", "-")][5:] == [
        "not run (needs f-nois runs: sweeps/extra-*.yaml)", "-", "-", "-", "not run |"]
    five = claims([r for r in results if r["point"]["seed"] < 5])
    a5 = {(r.split(" | ")[1], r.split(" | ")[2]): r.split(" | ")
          for r in five[2:]}[("(a) NoIS ends below alone (ID)", "weak")]
    assert a5[5] == "inconclusive (above in 4/5 seeds)" and a5[9] == "inconclusive |"
