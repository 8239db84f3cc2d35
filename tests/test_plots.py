"""plot.png for a reader: units on every y axis, accuracy and shares in % (as the tables), the
held-out splits named in words, and the filter panel saying what "filtered" means."""

import pytest

from ftis_flwr.server.reporting.plots import _panels, plot_run, split_title

ROWS = [{"round": r, "nodes": {"a": {"round": r, "eval/test/accuracy": 0.25 * r, "eval/ood/accuracy": 0.1,
                                     "filtered": 9.0, "samples_foreign": 10.0, "reward_mean": 0.5}}}
        for r in range(3)]


def test_every_panel_names_its_unit_and_the_splits_are_spelled_out():
    panels = _panels(["test", "ood"], ROWS)
    titles = [p.title for p in panels]
    assert titles[:2] == ["Held-out accuracy: in-distribution test (test)",
                          "Held-out accuracy: out-of-distribution (ood)"]
    assert all(p.ylabel and p.ylabel not in ("share", "accuracy") for p in panels)
    assert all("%" in p.ylabel for p in panels if p.scale == 100.0)
    assert split_title("math500") == "math500"  # a split without words keeps its name


def test_the_filter_panel_says_what_filtered_means():
    filt = next(p for p in _panels([]) if p.title.startswith("Filtered"))
    assert "F-TIS filter" in filt.title and "KL estimate above the threshold g" in filt.title
    assert filt.ylabel == "% of received samples" and filt.get({"filtered": 9, "samples_foreign": 10}) == 0.9


def test_accuracy_is_drawn_in_percent(tmp_path, monkeypatch):
    """The tables give accuracy in %: the plot draws 0.5 as 50, on a 0-100 axis."""
    from matplotlib.figure import Figure

    drawn = {}
    real = Figure.savefig

    def keep(fig, path, *a, **k):
        drawn.update({ax.get_title(): ax for ax in fig.axes})
        return real(fig, path, *a, **k)

    monkeypatch.setattr(Figure, "savefig", keep)
    plot_run(tmp_path / "p.png", "t", ["a"], ["test", "ood"], ROWS)
    ax = drawn["Held-out accuracy: in-distribution test (test)"]
    assert list(ax.get_lines()[0].get_ydata()) == pytest.approx([0.0, 25.0, 50.0])
    assert ax.get_ylim() == (-2, 102) and ax.get_ylabel().startswith("accuracy (%")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def _drawn(monkeypatch) -> dict:
    """The axes of the next plot_run, by title, and the figure's hidden cells (``None``)."""
    from matplotlib.figure import Figure

    drawn = {}
    real = Figure.savefig

    def keep(fig, path, *a, **k):
        drawn.update({ax.get_title(): ax for ax in fig.axes if ax.get_visible()})
        drawn[None] = [ax for ax in fig.axes if not ax.get_visible()]
        return real(fig, path, *a, **k)

    monkeypatch.setattr(Figure, "savefig", keep)
    return drawn


KL_ROWS = [{"round": r, "nodes": {
    "a": {"round": r, "kl_median_foreign": 0.3, "kl_mean_foreign": 1e10, "g": 50.0, "eval/test/distinct": 0.6},
    "b": {"round": r, "kl_median_foreign": 0.5, "kl_mean_foreign": 3e4, "g": 50.0, "eval/test/distinct": 0.02}}}
    for r in range(3)]


def test_the_distinct_answers_are_drawn_beside_the_accuracy(tmp_path, monkeypatch):
    """The summary's collapse warning is seen in the picture: a panel per split of the share of
    distinct greedy answers, in %, right after the accuracy panels."""
    titles = [p.title for p in _panels(["test", "ood"], ROWS)]
    assert titles[2].startswith("Distinct greedy answers: in-distribution test (test)")
    assert titles[3].startswith("Distinct greedy answers: out-of-distribution (ood)")
    drawn = _drawn(monkeypatch)
    plot_run(tmp_path / "p.png", "t", ["a", "b"], ["test"], KL_ROWS)
    ax = next(a for t, a in drawn.items() if t and t.startswith("Distinct greedy answers"))
    assert [list(line.get_ydata()) for line in ax.get_lines()] == [[60.0] * 3, [2.0] * 3]


def test_the_kl_panel_draws_the_threshold_and_fits_its_values(tmp_path, monkeypatch):
    """The median KL of received samples (the mean is one far sample's: 1e10 here) on a log axis
    that holds both the medians and the dashed threshold g = 50, which it names."""
    drawn = _drawn(monkeypatch)
    plot_run(tmp_path / "p.png", "t", ["a", "b"], ["test"], KL_ROWS)
    ax = next(a for t, a in drawn.items() if t and t.startswith("KL of received samples"))
    lines = ax.get_lines()
    assert [list(line.get_ydata()) for line in lines[:2]] == [[0.3] * 3, [0.5] * 3]
    assert lines[2].get_linestyle() == "--" and list(lines[2].get_ydata()) == [50.0, 50.0]
    assert "g = 50" in [t.get_text() for t in ax.get_legend().get_texts()]
    low, high = ax.get_ylim()
    assert ax.get_yscale() == "log" and low <= 0.15 and 100 <= high < 1e3


def test_a_threshold_that_differs_between_nodes_is_drawn_per_node(tmp_path, monkeypatch):
    rows = [{"round": r, "nodes": {"a": {"kl_median_foreign": 1.0, "g": 10.0 + r},
                                   "b": {"kl_median_foreign": 2.0, "g": 50.0}}} for r in range(2)]
    drawn = _drawn(monkeypatch)
    plot_run(tmp_path / "p.png", "t", ["a", "b"], [], rows)
    ax = next(a for t, a in drawn.items() if t and t.startswith("KL of received samples"))
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["a", "b", "g (a)", "g (b)"]


def test_the_panels_leave_no_empty_cell(tmp_path, monkeypatch):
    """One split: accuracy, distinct answers and six diagnostics fill 4 columns by 2 rows; with the
    cross-tokenizer panel, 3 by 3; a cell left over (no evaluation, a cross-tokenizer run: 7 panels)
    names the run's settings."""
    from ftis_flwr.server.reporting.plots import layout

    assert [layout(n) for n in (6, 7, 8, 9, 10, 11)] == [3, 4, 4, 3, 5, 3]
    drawn = _drawn(monkeypatch)
    plot_run(tmp_path / "p.png", "t", ["a", "b"], ["test"], KL_ROWS)
    assert len([t for t in drawn if t]) == 8 and drawn[None] == []
    xtok = [{"round": 1, "nodes": {"a": {"b/xtok_tokens": 30.0, "b/xtok_multi_token_share": 0.5}}}]
    config = {"task": {"name": "dataset", "reward": "r.py:f"}, "loss": {"method": "f-tis", "trunc_c": 2.0,
              "kl_threshold": 50.0}, "advantage": {"mode": "vertical"}, "rounds": {"num_rounds": 40},
              "nodes": [{"name": "a"}, {"name": "b"}]}
    drawn = _drawn(monkeypatch)
    plot_run(tmp_path / "q.png", "t", ["a", "b"], [], xtok, config=config)
    cell = drawn["This run"]
    assert drawn[None] == [] and "vertical f-tis, C = 2.0, g = 50.0" in cell.texts[0].get_text()
