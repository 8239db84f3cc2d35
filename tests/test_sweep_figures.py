"""The sweep's figures (simulations/sweep_report.py) read as its tables do: accuracy and shares
in % on every y axis, the held-out splits named in words, checked on the matplotlib objects."""

from __future__ import annotations

import math

from test_sweep import _result

from simulations.sweep_report import build_figures, figures

RESULTS = dict([
    _result("size", "f-tis", "vertical", "50", 0, (0.5, 0.7, 0.4, 0.5), (0.6, 0.65, 0.2, 0.3), 0.25),
    _result("size", "f-tis", "vertical", "50", 1, (0.5, 0.6, 0.4, 0.4), (0.6, 0.70, 0.2, 0.2), 0.75),
    _result("size", "alone", "alone", "-", 0, (0.5, 0.55, 0.4, 0.45), (0.6, 0.62, 0.2, 0.25)),
])


def _line(ax, label: str) -> dict[float, float]:
    """round -> plotted value of the line of one config."""
    (line,) = [ln for ln in ax.get_lines() if ln.get_label() == label]
    return dict(zip(line.get_xdata(), line.get_ydata()))


def _approx(a: float, b: float) -> bool:
    return math.isclose(a, b, abs_tol=1e-9)


def test_sweep_figures_show_percent_and_name_the_splits(tmp_path):
    built = build_figures(list(RESULTS.values()), "test", "ood")
    assert set(built) == {"accuracy-size.png", "diagnostics-size.png", "final.png"}

    acc = built["accuracy-size.png"].axes
    assert len(acc) == 4  # 2 nodes x (in-distribution, out-of-distribution)
    for ax in acc:
        assert "%" in ax.get_ylabel() and "accuracy" in ax.get_ylabel()
        assert ax.get_xlabel() == "round"
    titles = [ax.get_title() for ax in acc]
    assert titles == ["small: accuracy, in-distribution (test split)",
                      "small: accuracy, out-of-distribution (ood split)",
                      "large: accuracy, in-distribution (test split)",
                      "large: accuracy, out-of-distribution (ood split)"]
    # small, f-tis: ID 50% at round 0, mean of 70% and 60% at round 4; OOD 40% -> mean of 50%, 40%
    small_id, small_ood = _line(acc[0], "f-tis vertical g=50"), _line(acc[1], "f-tis vertical g=50")
    assert _approx(small_id[0], 50.0) and _approx(small_id[4], 65.0)
    assert _approx(small_ood[0], 40.0) and _approx(small_ood[4], 45.0)
    assert _approx(_line(acc[3], "alone")[4], 25.0)
    assert acc[0].get_ylim()[1] > 100  # the whole 0-100% range, as the per-run plot draws it

    diag = built["diagnostics-size.png"].axes
    assert [ax.get_ylabel() for ax in diag] == ["% of received samples", "% of tokens"] * 2
    assert all(ax.get_xlabel() == "round" for ax in diag)
    assert "filtered" in diag[0].get_title() and "truncated" in diag[1].get_title()
    filtered = _line(diag[0], "f-tis vertical g=50")  # 50% in round 1, mean of 25% and 75% in round 4
    assert _approx(filtered[1], 50.0) and _approx(filtered[4], 50.0)
    assert _approx(_line(diag[1], "alone")[1], 10.0) and _approx(_line(diag[1], "alone")[4], 2.0)

    final = built["final.png"].axes
    assert [ax.get_title() for ax in final] == ["size: final accuracy, in-distribution (test split)",
                                                "size: final accuracy, out-of-distribution (ood split)"]
    for ax in final:
        assert "%" in ax.get_ylabel() and ax.get_xlabel() == "node"
    # bars in the order config x node: f-tis's (means over seeds 0, 1) then alone's, each (small, large)
    heights = [p.get_height() for p in final[0].patches]
    assert all(_approx(a, b) for a, b in zip(heights, [65.0, 67.5, 55.0, 62.0]))
    assert len(heights) == 4


def test_figures_writes_the_built_figures_under_their_names(tmp_path):
    paths = figures(list(RESULTS.values()), tmp_path, "test", "ood")
    assert [p.name for p in paths] == ["accuracy-size.png", "diagnostics-size.png", "final.png"]
    assert all(p.parent == tmp_path and p.stat().st_size > 1000 for p in paths)
