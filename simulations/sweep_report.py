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
        fig.legend(list(handles.values()), list(handles), loc="outside right upper", fontsize=7)


def _figure(rows: int, cols: int):
    from matplotlib.figure import Figure  # no pyplot: no global backend, no display

    fig = Figure(figsize=(5 * cols, 3.4 * rows), dpi=100, layout="constrained")
    return fig, fig.subplots(rows, cols, squeeze=False)


def figures(results: list[dict], out: Path, id_split: str, ood_split: str) -> list[Path]:
    """Per setup: accuracy per round (ID, OOD) and filtered/truncated per round, per node, one
    colour per config, mean with the seeds' min..max shaded; and final ID/OOD per setup."""
    from matplotlib.ticker import MaxNLocator

    written: list[Path] = []
    by_group = groups(results)
    setups = list(dict.fromkeys(r["point"]["setup"] for r in results))
    # one colour per config across every figure of the sweep
    index = {c: k for k, c in enumerate(sorted({c for _, c in by_group}))}
    for setup in setups:
        cfgs = [(c, rs) for (s, c), rs in by_group.items() if s == setup]
        nodes = list(cfgs[0][1][0]["summary"]["nodes"])
        for kind, panels in (("accuracy", ((id_split, f"{id_split} accuracy (ID)"),
                                           (ood_split, f"{ood_split} accuracy (OOD)"))),
                             ("diagnostics", (("filtered", "filtered share of received"),
                                              ("truncated", "truncated token share")))):
            fig, axes = _figure(len(nodes), 2)
            for i, node in enumerate(nodes):
                for j, (metric, label) in enumerate(panels):
                    ax, drew = axes[i][j], False
                    for cfg, rs in cfgs:
                        k = index[cfg]
                        series = []
                        for r in rs:
                            d = r["summary"]["nodes"].get(node, {})
                            series.append(d.get("accuracy", {}).get(metric, []) if kind == "accuracy"
                                          else d.get(metric, []))
                        drew |= _band(ax, series, _colour(k), cfg, _style(k))
                    ax.set_title(f"{node}: {label}", fontsize=9)
                    ax.set_xlabel("round")
                    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
                    ax.grid(alpha=0.3)
                    if not drew:
                        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
            _legend(fig, axes)
            fig.suptitle(f"{setup}: {kind} (mean over seeds, min..max shaded)")
            path = out / f"{kind}-{setup}.png"
            fig.savefig(path)
            written.append(path)
    # final ID and OOD accuracy per setup: one bar per (config, node), error bar = min..max
    fig, axes = _figure(len(setups), 2)
    for i, setup in enumerate(setups):
        cfgs = [(c, rs) for (s, c), rs in by_group.items() if s == setup]
        nodes = list(cfgs[0][1][0]["summary"]["nodes"])
        for j, (metric, label) in enumerate(((id_split, "ID"), (ood_split, "OOD"))):
            ax = axes[i][j]
            width = 0.8 / max(1, len(cfgs))
            for b, (cfg, rs) in enumerate(cfgs):
                k = index[cfg]
                means, lo, hi = [], [], []
                for node in nodes:
                    v = [_last(r["summary"]["nodes"].get(node, {}).get("accuracy", {}).get(metric, []))
                         for r in rs]
                    v = [x for x in v if x is not None] or [math.nan]
                    m = sum(v) / len(v)
                    means.append(m)
                    lo.append(m - min(v))
                    hi.append(max(v) - m)
                xs = [n + b * width for n in range(len(nodes))]
                ax.bar(xs, means, width, yerr=[lo, hi], color=_colour(k), label=cfg, capsize=2,
                       hatch=("", "//", "..")[(k // 20) % 3])
            ax.set_xticks([n + 0.4 - width / 2 for n in range(len(nodes))], nodes)
            ax.set_title(f"{setup}: final {label} accuracy ({metric})", fontsize=9)
            ax.grid(alpha=0.3, axis="y")
            if j == 1:  # one legend per setup, beside its right panel (the configs differ by setup)
                ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle("final accuracy per setup (mean over seeds, min..max bars)")
    path = out / "final.png"
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
