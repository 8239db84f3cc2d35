"""A sweep's outputs from its result files: results.csv, results.md and PNG figures.

Everything here reads only the ``<key>.json`` result files (see ``sweep.py``), so tables and
figures can be rebuilt at any time (``sweep.py GRID --report-only``) and tested from
hand-written results. Spread over seeds is shown as min..max: with 2-5 seeds that says more
than a standard deviation.
"""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

POINT_FIELDS = ("key", "setup", "method", "mode", "g", "seed")
NODE_FIELDS = ("name", "id_first", "id_last", "ood_first", "ood_last", "filtered_last", "truncated_last")


def load_results(out: Path) -> list[dict[str, Any]]:
    """Every finished result file under ``out`` (sorted by key)."""
    return [json.loads(p.read_text()) for p in sorted(Path(out).glob("results/*.json"))]


def _last(series: list) -> float | None:
    return series[-1][1] if series else None


def _first(series: list) -> float | None:
    return series[0][1] if series else None


def node_row(data: dict, id_split: str, ood_split: str) -> dict[str, float | None]:
    acc = data.get("accuracy", {})
    return {"id_first": _first(acc.get(id_split, [])), "id_last": _last(acc.get(id_split, [])),
            "ood_first": _first(acc.get(ood_split, [])), "ood_last": _last(acc.get(ood_split, [])),
            "filtered_last": _last(data.get("filtered", [])),
            "truncated_last": _last(data.get("truncated", []))}


def write_csv(results: list[dict], path: Path, id_split: str, ood_split: str) -> None:
    """One row per run: the grid point, wall seconds, then per node (by position) its figures."""
    width = max((len(r["summary"]["nodes"]) for r in results), default=0)
    header = [*POINT_FIELDS, "rounds", "wall_s", "run_dir"]
    header += [f"node{i}_{f}" for i in range(width) for f in NODE_FIELDS]
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        for r in results:
            row = [r["point"][f] for f in POINT_FIELDS] + [r["summary"]["rounds"], f"{r['wall_s']:.1f}",
                                                           r["summary"]["run_dir"]]
            for name, data in r["summary"]["nodes"].items():
                vals = node_row(data, id_split, ood_split)
                row += [name] + ["" if vals[f] is None else f"{vals[f]:.4f}" for f in NODE_FIELDS[1:]]
            w.writerow(row)


def mean_range(xs: list[float | None], spec: str = ".3f") -> str:
    """"mean (min..max)" of the finite values (one value alone; "–" when there are none)."""
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return "–"
    mean = sum(xs) / len(xs)
    if len(xs) == 1:
        return format(mean, spec)
    return f"{mean:{spec}} ({min(xs):{spec}}..{max(xs):{spec}})"


def groups(results: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """(setup, config) -> results of that grid point over seeds, in grid order."""
    out: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in results:
        p = r["point"]
        out[(p["setup"], config_label(p))].append(r)
    return out


def config_label(p: dict) -> str:
    """"f-tis vertical g=50", "nois vertical", "alone"."""
    if p["mode"] == "alone":
        return "alone"
    return f"{p['method']} {p['mode']}" + ("" if p["g"] == "-" else f" g={p['g']}")


def markdown(results: list[dict], id_split: str, ood_split: str, title: str = "") -> str:
    """Per setup x method x mode x g and per node: mean (min..max) over seeds."""
    if not results:
        return "no finished run"
    lines = [f"# {title}".rstrip(), "", f"{len(results)} finished runs. Accuracy: greedy, "
             f"`{id_split}` (in-distribution) and `{ood_split}` (out-of-distribution); each cell "
             "is the mean over seeds (min..max). Change in points = last - first evaluation. "
             "Filtered = share of received samples filtered in the last round; truncated = "
             "share of tokens whose IS weight hit C in the last round.", ""]
    for setup in dict.fromkeys(r["point"]["setup"] for r in results):
        lines += [f"## {setup}", "",
                  "| config | seeds | node | ID first | ID last | ID change | OOD first | OOD last | "
                  "OOD change | filtered | truncated |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for (s, cfg), rs in groups(results).items():
            if s != setup:
                continue
            seeds = ",".join(str(r["point"]["seed"]) for r in rs)
            for node in rs[0]["summary"]["nodes"]:
                vals = [node_row(r["summary"]["nodes"].get(node, {}), id_split, ood_split) for r in rs]
                # col and diff are called only in this iteration's row below: the loop's vals and col are this node's
                col = lambda f: [v[f] for v in vals]  # noqa: E731, B023
                diff = lambda a, b: [None if x is None or y is None else 100 * (y - x)  # noqa: E731
                                     for x, y in zip(col(a), col(b))]  # noqa: B023
                lines.append(f"| {cfg} | {seeds} | {node} | {mean_range(col('id_first'))} | "
                             f"{mean_range(col('id_last'))} | {mean_range(diff('id_first', 'id_last'), '+.1f')} | "
                             f"{mean_range(col('ood_first'))} | {mean_range(col('ood_last'))} | "
                             f"{mean_range(diff('ood_first', 'ood_last'), '+.1f')} | "
                             f"{mean_range(col('filtered_last'), '.2f')} | "
                             f"{mean_range(col('truncated_last'), '.3f')} |")
        lines.append("")
    return "\n".join(lines)


def _colour(k: int) -> str:
    """The k-th config's colour: tab20's 20 (darker shades first), so a grid with more than 10
    configs never draws two in one colour (tab10 repeats after 10)."""
    from matplotlib import colormaps

    return colormaps["tab20"](((2 * k) % 20 + (k // 10) % 2) / 20)


def _style(k: int) -> str:
    """Line style: solid for the first 20 configs, then dashed, dotted."""
    return ("-", "--", ":")[(k // 20) % 3]


def _band(ax, runs: list[list], colour, label: str, linestyle: str = "-") -> bool:
    """Mean line and min..max band of several [round, value] series over their common rounds."""
    by_round: dict[int, list[float]] = defaultdict(list)
    for series in runs:
        for rnd, v in series:
            if v is not None and math.isfinite(v):
                by_round[int(rnd)].append(v)
    xs = sorted(r for r, vs in by_round.items() if len(vs) == len(runs))
    if not xs:
        return False
    ys = [by_round[x] for x in xs]
    ax.plot(xs, [sum(v) / len(v) for v in ys], marker="o", markersize=3, color=colour, label=label,
            linestyle=linestyle)
    if len(runs) > 1:
        ax.fill_between(xs, [min(v) for v in ys], [max(v) for v in ys], color=colour, alpha=0.2)
    return True


def _legend(fig, axes) -> None:
    """One legend for the figure, outside the panels (every panel draws the same configs)."""
    handles: dict[str, object] = {}
    for ax in (a for row in axes for a in row):
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="outside right center", fontsize=7,
                   title="config", title_fontsize=7)


def _figure(rows: int, cols: int):
    from matplotlib.figure import Figure  # no pyplot: no global backend, no display

    fig = Figure(figsize=(5 * cols, 3.4 * rows), dpi=100, layout="constrained")
    return fig, fig.subplots(rows, cols, squeeze=False)


ACCURACY_LABEL = "accuracy (% of problems, greedy)"


def split_words(split: str, ood: bool) -> str:
    """A held-out split in words, by its role in the sweep: ``in-distribution (test split)``,
    ``out-of-distribution (ood split)`` (the tables' ID and OOD columns)."""
    return f"{'out-of-distribution' if ood else 'in-distribution'} ({split} split)"


def _percent(series: list) -> list:
    """[round, share] -> [round, share in %] (None stays None)."""
    return [[rnd, None if v is None else 100.0 * v] for rnd, v in series]


def build_figures(results: list[dict], id_split: str, ood_split: str) -> dict[str, Any]:
    """The figures ``figures`` writes, by file name, as matplotlib Figures (nothing written):
    per setup accuracy per round (in- and out-of-distribution) and filtered/truncated shares per
    round, per node, one colour per config, mean with the seeds' min..max shaded; and final
    accuracy per setup. Accuracy and shares are in % (the tables' points), every y axis says its
    unit and the splits are named in words."""
    from matplotlib.ticker import MaxNLocator

    built: dict[str, Any] = {}
    by_group = groups(results)
    setups = list(dict.fromkeys(r["point"]["setup"] for r in results))
    # one colour per config across every figure of the sweep
    index = {c: k for k, c in enumerate(sorted({c for _, c in by_group}))}
    splits = ((id_split, split_words(id_split, ood=False)), (ood_split, split_words(ood_split, ood=True)))
    # (metric, title, y label) per panel
    kinds = (("accuracy", "held-out accuracy",
              [(m, f"accuracy, {words}", ACCURACY_LABEL) for m, words in splits]),
             ("diagnostics", "filtered and truncated shares",
              [("filtered", "filtered: received samples the filter dropped", "% of received samples"),
               ("truncated", "truncated importance weights (weight reached C)", "% of tokens")]))
    for setup in setups:
        cfgs = [(c, rs) for (s, c), rs in by_group.items() if s == setup]
        nodes = list(cfgs[0][1][0]["summary"]["nodes"])
        for kind, what, panels in kinds:
            fig, axes = _figure(len(nodes), 2)
            for i, node in enumerate(nodes):
                for j, (metric, title, ylabel) in enumerate(panels):
                    ax, drew = axes[i][j], False
                    for cfg, rs in cfgs:
                        k = index[cfg]
                        series = []
                        for r in rs:
                            d = r["summary"]["nodes"].get(node, {})
                            series.append(_percent(d.get("accuracy", {}).get(metric, []) if kind == "accuracy"
                                                   else d.get(metric, [])))
                        drew |= _band(ax, series, _colour(k), cfg, _style(k))
                    ax.set_title(f"{node}: {title}", fontsize=9)
                    ax.set_xlabel("round")
                    ax.set_ylabel(ylabel, fontsize=8)
                    if metric == "truncated":  # a few % at most: the whole 0-100 would flatten it
                        ax.set_ylim(bottom=0)
                    else:
                        ax.set_ylim(-2, 102)
                    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
                    ax.grid(alpha=0.3)
                    if not drew:
                        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
            _legend(fig, axes)
            fig.suptitle(f"{setup}: {what} per round (mean over seeds, min..max shaded)")
            built[f"{kind}-{setup}.png"] = fig
    # final in- and out-of-distribution accuracy per setup: one bar per (config, node), error bar = min..max
    fig, axes = _figure(len(setups), 2)
    for i, setup in enumerate(setups):
        cfgs = [(c, rs) for (s, c), rs in by_group.items() if s == setup]
        nodes = list(cfgs[0][1][0]["summary"]["nodes"])
        for j, (metric, words) in enumerate(splits):
            ax = axes[i][j]
            width = 0.8 / max(1, len(cfgs))
            for b, (cfg, rs) in enumerate(cfgs):
                k = index[cfg]
                means, lo, hi = [], [], []
                for node in nodes:
                    v = [_last(r["summary"]["nodes"].get(node, {}).get("accuracy", {}).get(metric, []))
                         for r in rs]
                    v = [100.0 * x for x in v if x is not None] or [math.nan]
                    m = sum(v) / len(v)
                    means.append(m)
                    lo.append(m - min(v))
                    hi.append(max(v) - m)
                xs = [n + b * width for n in range(len(nodes))]
                ax.bar(xs, means, width, yerr=[lo, hi], color=_colour(k), label=cfg, capsize=2,
                       hatch=("", "//", "..")[(k // 20) % 3])
            ax.set_xticks([n + 0.4 - width / 2 for n in range(len(nodes))], nodes)
            ax.set_xlabel("node")
            ax.set_ylabel(f"final {ACCURACY_LABEL}", fontsize=8)
            ax.set_ylim(0, 102)
            ax.set_title(f"{setup}: final accuracy, {words}", fontsize=9)
            ax.grid(alpha=0.3, axis="y")
            if j == 1:  # one legend per setup, beside its right panel (the configs differ by setup)
                ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="config",
                          title_fontsize=7)
    fig.suptitle("final held-out accuracy per setup, in % (mean over seeds, min..max bars)")
    built["final.png"] = fig
    return built


def figures(results: list[dict], out: Path, id_split: str, ood_split: str) -> list[Path]:
    """Write ``build_figures``' figures to ``out`` (accuracy-<setup>.png, diagnostics-<setup>.png,
    final.png); the paths written."""
    written: list[Path] = []
    for name, fig in build_figures(results, id_split, ood_split).items():
        path = out / name
        fig.savefig(path)
        written.append(path)
    return written


def write_all(out: Path, id_split: str, ood_split: str, title: str = "") -> list[Path]:
    """results.csv, results.md and the figures from ``out/results/*.json``; the paths written."""
    results = load_results(out)
    write_csv(results, out / "results.csv", id_split, ood_split)
    (out / "results.md").write_text(markdown(results, id_split, ood_split, title) + "\n")
    paths = [out / "results.csv", out / "results.md"]
    if results:
        paths += figures(results, out, id_split, ood_split)
    return paths
