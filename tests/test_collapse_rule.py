"""The collapse rule of the 40-round study (simulations/collapse.py, fixed in
sweeps/xfamily-upper-40.yaml before its first run): the one-sided Fisher test against hand-computed
and scipy values, the categories, and the counts and onset rounds the rule's text quotes from the
20-round study, recomputed from that study's stored runs (simulations/results/sweep-xfamily-upper)."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulations.collapse import category, counts, fisher_greater, node_runs, table

REPO = Path(__file__).resolve().parents[1]



def test_the_one_sided_fisher_test_and_the_significant_counts_the_rule_lists():
    """4 of 8 against 0 of 8: C(4,4) C(12,4) / C(16,8) = 495 / 12870 = 0.0385. The rule lists the
    NoIS:X counts significant at 0.05 with 8 seeds each: 4:0, 6:1, 7:2, 8:3, 8:4; one fewer NoIS
    collapse (or one more X collapse) is not."""
    assert fisher_greater(4, 8, 0, 8) == pytest.approx(495 / 12870)
    for a, b in ((4, 0), (6, 1), (7, 2), (8, 3), (8, 4)):
        assert fisher_greater(a, 8, b, 8) < 0.05, (a, b)
    for a, b in ((3, 0), (5, 1), (6, 2), (7, 3), (8, 5)):
        assert fisher_greater(a, 8, b, 8) >= 0.05, (a, b)
    scipy = pytest.importorskip("scipy.stats")
    for a, b in ((4, 0), (6, 1), (2, 2), (8, 3)):
        assert fisher_greater(a, 8, b, 8) == pytest.approx(
            scipy.fisher_exact([[a, 8 - a], [b, 8 - b]], alternative="greater").pvalue)


def test_the_categories():
    assert category(0, 0.01, 0.01) == "prevents"
    assert category(2, 0.01, 0.03) == "reduces"
    assert category(3, 0.04, 0.2) == "delays"
    assert category(3, 0.2, 0.2) == "not shown"
    assert category(0, 0.2, 0.2) == "not shown (too few NoIS collapses to tell)"


def test_the_20_round_studys_collapses_and_onsets_as_the_rule_quotes_them():
    """NoIS collapsed Gemma in seeds 2, 4, 6, 7 with onsets 18, 4, 16, 18; the word-boundary and
    sequence F-TIS arms in seed 7 at 19; SmolLM2 never; every other node-run stayed at 0.273 or
    above."""
    runs = node_runs(REPO / "simulations" / "results" / "sweep-xfamily-upper")
    assert len(runs) == 80
    fallen = sorted((r.arm, r.seed, r.onset()) for r in runs if r.collapsed_by(20))
    assert fallen == [("f-tis vertical g=50 [xfamily-upper-seq]", 7, 19),
                      ("f-tis vertical g=50 [xfamily-upper-word]", 7, 19),
                      ("nois vertical [xfamily-upper]", 2, 18), ("nois vertical [xfamily-upper]", 4, 4),
                      ("nois vertical [xfamily-upper]", 6, 16), ("nois vertical [xfamily-upper]", 7, 18)]
    assert all(r.node == "gemma" for r in runs if r.collapsed_by(20))
    assert min(r.accuracy[20] for r in runs if not r.collapsed_by(20)) == pytest.approx(0.2734375)
    assert counts(runs, "nois vertical [xfamily-upper]", "gemma", 20) == (4, 8)
    rows = table(runs, early=20, late=20)
    assert "| gemma | f-tis vertical g=50 [xfamily-upper] | 8 | 0 | 0 | 0 | - | 0.038 | 0.038 | prevents |" in rows
