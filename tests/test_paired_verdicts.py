"""The paired rule (simulations/paired.py) on synthetic per-seed differences, and its columns in
verdicts.py's table beside today's rule."""

from __future__ import annotations

import math
from itertools import product
from pathlib import Path

import numpy as np
import pytest

from simulations import paired
from simulations.paired import bootstrap_interval, calibrate, cells, decide, mdd, t_interval, t_quantile, wilcoxon_p

REPO = Path(__file__).resolve().parents[1]


# 16 seeds of one effect: the first 5 split widely (one below 0), the other 11 all above 0
SIXTEEN = [4.0, -3.0, 0.5, 2.5, 1.0, 1.5, 2.0, 0.5, 3.0, 1.0, 2.5, 1.5, 0.5, 2.0, 1.0, 1.5]


def test_t_interval_of_hand_computed_cases():
    """(1, 2, 3, 4, 5): mean 3, sd sqrt(2.5), se sqrt(2.5 / 5) = 0.70711, t_{0.975, 4} = 2.77645, so
    3 ± 1.96324. (0, 0, 0, 0, 10): mean 2, sd sqrt(80 / 4) = 4.4721, se 2, so 2 ± 5.55289.
    Constant differences: the interval is that constant. Many seeds: close to mean ± 1.96 se."""
    lo, hi = t_interval([1, 2, 3, 4, 5])
    assert (lo, hi) == (pytest.approx(1.036757, abs=1e-6), pytest.approx(4.963243, abs=1e-6))
    lo, hi = t_interval([0, 0, 0, 0, 10])
    assert (lo, hi) == (pytest.approx(-3.552890, abs=1e-6), pytest.approx(7.552890, abs=1e-6))
    assert t_interval([2.0] * 5) == (2.0, 2.0)
    d = np.random.default_rng(0).normal(1.0, 2.0, 400)
    lo, hi = t_interval(list(d))
    se = d.std(ddof=1) / math.sqrt(len(d))
    assert lo == pytest.approx(d.mean() - 1.966 * se, abs=0.002 * se)  # t_{0.975, 399} = 1.9659
    assert hi == pytest.approx(d.mean() + 1.966 * se, abs=0.002 * se)
    with pytest.raises(ValueError):
        t_interval([1.0])


def test_t_interval_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(4)
    for n in (2, 5, 8, 16, 30):
        d = rng.normal(0.3, 1.5, n)
        want = stats.t.interval(0.95, n - 1, loc=d.mean(), scale=stats.sem(d))
        assert t_interval(list(d)) == pytest.approx(want, abs=1e-9)


def test_the_bootstrap_is_narrower_than_the_t_interval_at_few_seeds():
    """The replaced percentile interval of (1.5, 2, 1, 1.8, 1.2) lies inside ±2 ("level"
    reproduced); the t interval, [0.988, 2.012], does not (inconclusive). The bootstrap stays
    reproducible (a fixed RNG seed) for the calibration's comparison."""
    d = [1.5, 2.0, 1.0, 1.8, 1.2]
    b_lo, b_hi = bootstrap_interval(d)
    lo, hi = t_interval(d)
    assert lo < b_lo and b_hi < hi and hi == pytest.approx(2.011951, abs=1e-6)
    assert decide(d, "level", interval=bootstrap_interval) == "reproduced"
    assert decide(d, "level") == "inconclusive"
    assert bootstrap_interval(SIXTEEN) == bootstrap_interval(SIXTEEN)


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
    """True mean = the MDD of the true sd at 16 seeds: the rule reproduces the claim in about 80%
    of 1,000 simulated studies (the noncentral t gives 0.800; binomial sd 0.013)."""
    n, sd = 16, 2.0
    effect = (t_quantile(0.975, n - 1) + t_quantile(0.80, n - 1)) * sd / math.sqrt(n)
    rng = np.random.default_rng(2)
    hits = sum(decide(list(rng.normal(effect, sd, n)), "above") == "reproduced" for _ in range(1000))
    assert 0.76 <= hits / 1000 <= 0.84


def test_false_verdict_rate_is_the_nominal_5_percent():
    """No true effect, d ~ Normal(0, 1), 2,000 studies of 8 seeds: an "above" claim is reproduced
    or refuted in 3-7% of them (5% nominal, binomial sd 0.5%). The replaced bootstrap interval
    fails the same check at 5 seeds (about 17%). Heavy tails (t, 3 df) keep the t rule at or
    below 5% (it is conservative there)."""
    assert 0.03 <= calibrate(8, "normal") <= 0.07
    assert calibrate(5, "normal", studies=500, interval=bootstrap_interval) > 0.10
    assert calibrate(8, "t3") <= 0.06
    assert calibrate(8, "normal") == calibrate(8, "normal")  # a fixed seed
    with pytest.raises(ValueError):
        calibrate(8, "cauchy")


def test_calibrate_prints_its_table():
    out = paired.calibration_table(seeds=(5,), studies=50, bootstrap=False)
    assert out.splitlines()[0] == "| null | interval | 5 seeds |"
    assert [r.split(" | ")[:2] for r in out.splitlines()[2:]] == [["| normal", "t interval (the rule)"],
                                                                  ["| t, 3 df", "t interval (the rule)"]]


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
    assert cells([3.0], "above") == "+3.0 [-] | 1 | - | inconclusive (1 seeds < 5)"  # no t interval of 1 value


def test_level_claim_with_its_margin():
    """Level: the interval inside [-2, +2] reproduces; wholly outside refutes; else inconclusive."""
    assert paired.LEVEL_MARGIN == 2.0
    assert decide([0.5, -0.5, 1.0, -1.0, 0.0, 0.5], "level") == "reproduced"
    assert decide([1.5, 1.7, 1.3, 1.6, 1.4], "level") == "reproduced"  # all above 0, yet level: [1.30, 1.70]
    assert decide([1.5, 2.0, 1.0, 1.8, 1.2], "level") == "inconclusive"  # [0.99, 2.01] crosses +2
    assert decide([5, 6, 4, 7, 5], "level") == "refuted"
    assert decide([-5, -6, -4, -7, -5], "level") == "refuted"
    assert decide([3, -3, 4, -4, 1], "level") == "inconclusive"
    assert decide([2.5, 1.5, 3.0, 1.0, 2.0], "level") == "inconclusive"  # straddles +2
    assert decide([0.1, 0.2, 0.1, 0.2], "level") == "inconclusive"  # 4 seeds


def _today(d: list[float]) -> str:
    """Today's rule for an "above" claim (verdicts.verdict), in its first word."""
    from simulations.verdicts import verdict

    return verdict(d, "above").split(" (")[0]


def test_more_seeds_settle_the_paired_rule_but_not_the_all_seeds_rule():
    """The same effect: at 5 seeds both rules are inconclusive; at 16 the paired interval lies
    above 0 (reproduced) while "every seed agrees" still fails on the one seed below 0."""
    five = SIXTEEN[:5]
    assert (decide(five, "above"), _today(five)) == ("inconclusive", "inconclusive")
    lo5, hi5 = t_interval(five)  # mean 1, sd 2.622: 1 ± 3.256
    assert (lo5, hi5) == (pytest.approx(-2.2557, abs=1e-4), pytest.approx(4.2557, abs=1e-4))
    assert (decide(SIXTEEN, "above"), _today(SIXTEEN)) == ("reproduced", "inconclusive")
    assert t_interval(SIXTEEN)[0] == pytest.approx(0.5640, abs=1e-4)  # 1.375 ± 0.811
    assert sum(x < 0 for x in SIXTEEN) == 1


def test_more_seeds_settle_it_over_many_simulated_studies():
    """200 studies of a true effect of 1.2 points, sd 2: from 5 to 16 seeds the paired rule
    reproduces more often (power 0.18 -> 0.61, noncentral t), "every seed above 0" less often
    (0.73^5 = 20% -> 0.73^16 = 0.6%)."""
    def rates(n: int) -> tuple[float, float]:
        rng = np.random.default_rng(1)
        studies = [list(rng.normal(1.2, 2.0, n)) for _ in range(200)]
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
    from simulations.verdicts import claims

    results = []
    for seed, d in enumerate(SIXTEEN):
        results += [_result("s", "alone", seed, 0.60), _result("s", "nois", seed, 0.60 - d / 100),
                    _result("s", "f-tis", seed, 0.60)]
    rows = claims(results)
    assert rows[0].split(" | ")[5:] == ["today's rule", "mean [95% interval]", "Wilcoxon p", "MDD", "paired rule |"]
    assert all(r.count("|") == 11 for r in rows)
    by = {(r.split(" | ")[1], r.split(" | ")[2]): r.split(" | ") for r in rows[2:]}
    a = by[("(a) NoIS ends below alone (ID)", "weak")]
    lo, hi = t_interval(SIXTEEN)
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


def test_out_keeps_the_note_quoted_at_the_top_of_the_page_it_redraws(tmp_path, capsys):
    """A kept page opens with a note (which reward its runs trained with); redrawing its table with
    ``--out`` replaces the table and keeps the note. A page without one gets the table alone."""
    import json

    from simulations.verdicts import main

    sweep = tmp_path / "sweep"
    (sweep / "results").mkdir(parents=True)
    for seed, d in enumerate(SIXTEEN[:5]):
        for r in (_result("s", "alone", seed, 0.60), _result("s", "nois", seed, 0.60 - d / 100)):
            (sweep / "results" / f"{r['point']['key']}.json").write_text(json.dumps(r))
    page = tmp_path / "verdicts.md"
    page.write_text("> These runs trained with the old reward.\n> Read them as such.\n\n| old | table |\n")
    main([str(sweep), "--out", str(page)])
    table = capsys.readouterr().out
    assert table.startswith("| setup | claim |") and "old | table" not in page.read_text()
    assert page.read_text() == "> These runs trained with the old reward.\n> Read them as such.\n\n" + table
    fresh = tmp_path / "fresh.md"
    main([str(sweep), "--out", str(fresh)])
    assert fresh.read_text() == capsys.readouterr().out == table


def test_seeds_for_a_target_mdd():
    """sd 1 ([0, sqrt 2]): the MDD is (t_{.975,n-1} + t_{.8,n-1}) / sqrt(n): 1.267 at 7 seeds and
    1.153 at 8, so an MDD of 1.2 needs 8 seeds. The MDD a study has is reached at its own seed
    count; no spread needs 2 seeds; one seed, or a target of 0, says nothing."""
    from simulations.paired import seeds_for

    one = [0.0, math.sqrt(2.0)]
    assert seeds_for(one, 1.2) == 8
    assert seeds_for(one, 1.27) == 7
    assert seeds_for(SIXTEEN, mdd(SIXTEEN)) == 16
    assert seeds_for(SIXTEEN, mdd(SIXTEEN) / 2) > 16 * 3  # half the MDD: about four times the seeds
    assert seeds_for([2.0] * 5, 0.5) == 2
    assert seeds_for([1.0], 2.0) is None and seeds_for(one, 0.0) is None
    assert seeds_for(one, 1e-3, most=100) is None


def test_the_plan_column_says_how_many_seeds_would_reach_the_mdd(capsys):
    """verdicts.py --plan P adds a last column, in the full and the brief table: the seeds whose
    MDD would be P points for each claim that ran (paired.seeds_for), "-" for one that did not."""
    from simulations.paired import seeds_for
    from simulations.verdicts import brief, claims

    results = []
    for seed, d in enumerate(SIXTEEN):
        results += [_result("s", "alone", seed, 0.60), _result("s", "nois", seed, 0.60 - d / 100),
                    _result("s", "f-tis", seed, 0.60)]
    rows = claims(results, plan=2.0)
    assert rows[0].endswith("| paired rule | seeds for an MDD of 2 |") and all(r.count("|") == 12 for r in rows)
    by = {(r.split(" | ")[1], r.split(" | ")[2]): r.split(" | ") for r in rows[2:]}
    assert by[("(a) NoIS ends below alone (ID)", "weak")][10] == f"{seeds_for(SIXTEEN, 2.0)} |"
    assert by[("(b) F-NoIS recovers most of NoIS's loss", "-")][9:] == ["not run", "- |"]
    plain = claims(results)  # without --plan: the same rows, less the last column
    assert len(plain) == len(rows) and all(b.startswith(a) and b.count("|") == a.count("|") + 1
                                           for a, b in zip(plain, rows))
    short = brief(rows)
    assert short[0].endswith("| paired rule | seeds for an MDD of 2 |")
    assert all(r.count("|") == 7 for r in short)
