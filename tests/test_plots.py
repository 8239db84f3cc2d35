"""plot.png for a reader: units on every y axis, accuracy and shares in % (as the tables), the
held-out splits named in words, and the filter panel saying what "filtered" means."""

import pytest

from ftis_flwr.server.plots import _panels, plot_run, split_title

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
