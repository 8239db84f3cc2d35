"""The run's plot.png: accuracy and the share of distinct greedy answers per held-out split (a
node whose answers collapse to one is seen, not only read in the summary), train reward, and the
method's own diagnostics (filtered share of received samples, truncated token share, the median
KL of received samples on a log scale with each node's threshold g dashed: k3 reaches 1e5 and
more for a far sample, so the mean, in metrics.jsonl, is one far sample's; the effective sample
size of the received weights and the farthest source's |log-ratio| p99), and, where peers of
other tokenizers trained through their text, the share of received tokens in multi-token chunks;
one colour per node, from exactly the rows the reporter logged. The panels fill 3 to 5 columns
with as few empty cells as can be; a cell left over names the run's settings.

Written for a reader who has not read the code: every y axis says what it counts and in which
unit, accuracy and shares are in % (as the summary tables give accuracy), the splits are named
in words ("test" is the in-distribution test split, "ood" the out-of-distribution one) and the
filter panel says what "filtered" means."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

ACC_PREFIX, ACC_SUFFIX = "eval/", "/accuracy"
DISTINCT_SUFFIX = "/distinct"


def _ratio(num: str, den: str):
    def get(m: dict):
        a, b = m.get(num), m.get(den)
        return None if a is None or not b else a / b
    return get


XTOK_SHARE, XTOK_TOKENS = "/xtok_multi_token_share", "/xtok_tokens"


def _xtok_share(m: dict) -> float | None:
    """A node's share of received (text-path) tokens in multi-token chunks, over its sources."""
    tokens = {k[: -len(XTOK_TOKENS)]: v for k, v in m.items() if k.endswith(XTOK_TOKENS) and v}
    if not tokens:
        return None
    return sum(m.get(src + XTOK_SHARE, 0.0) * n for src, n in tokens.items()) / sum(tokens.values())


def _worst_tail(m: dict) -> float | None:
    """The largest p99 of |log pi_old - log pi_gen| over a node's sources: the farthest peer's
    (its own samples' is ~0, so it never wins)."""
    tails = [v for k, v in m.items() if k.endswith("/abs_log_ratio_p99") and v is not None and math.isfinite(v)]
    return max(tails) if tails else None


SPLIT_NAMES = {"test": "in-distribution test", "ood": "out-of-distribution", "validation": "validation"}
"""Held-out split -> the words a plot uses for it (any other split keeps its own name)."""


def split_title(split: str) -> str:
    """``ood`` -> ``out-of-distribution (ood)``: the words, and the name the tables use."""
    words = SPLIT_NAMES.get(split)
    return f"{words} ({split})" if words else split


class Panel(NamedTuple):
    """One panel: its title, the metric read from a node's row, the y axis label (with its unit),
    whether only evaluated rounds have it, the factor to the unit shown (100: a share in %),
    whether the axis spans the whole 0-100% range, and a threshold read from the same row drawn
    dashed (``ref``: the KL panel's g)."""

    title: str
    get: Callable[[dict], float | None]
    ylabel: str
    sparse: bool = False
    scale: float = 1.0
    bounded: bool = False
    ref: Callable[[dict], float | None] | None = None


def _metric(key: str) -> Callable[[dict], float | None]:
    return lambda m: m.get(key)


def _kl(m: dict) -> float | None:
    """The median KL estimate of the received samples (the mean where a row has no median)."""
    v = m.get("kl_median_foreign")
    return m.get("kl_mean_foreign") if v is None else v


def _panels(splits: list[str], rows: list[dict] = ()) -> list[Panel]:
    panels = [Panel(f"Held-out accuracy: {split_title(s)}", _metric(f"{ACC_PREFIX}{s}{ACC_SUFFIX}"),
                    "accuracy (% of problems, greedy)", sparse=True, scale=100.0, bounded=True) for s in splits]
    panels += [Panel(f"Distinct greedy answers: {split_title(s)}\n(near 0: one answer for most problems)",
                     _metric(f"{ACC_PREFIX}{s}{DISTINCT_SUFFIX}"), "% of answers that differ", sparse=True,
                     scale=100.0, bounded=True) for s in splits]
    panels += [
        Panel("Train reward: mean of the groups the node generated", _metric("reward_mean"),
              "reward (the task's own scale)"),
        Panel("Filtered: received samples the F-TIS filter dropped\n"
              "(KL estimate above the threshold g, advantage <= 0)",
              _ratio("filtered", "samples_foreign"), "% of received samples", scale=100.0, bounded=True),
        Panel("Truncated importance weights (weight reached C)", _metric("frac_tokens_truncated"),
              "% of tokens", scale=100.0, bounded=True),
        Panel("KL of received samples to the learner, median k3\n(k3 = E[e^d - d - 1], d = log gen - log pi; "
              "dashed: g)", _kl, "KL estimate, nats (log scale)", ref=_metric("g")),
        Panel("Effective sample size of received samples' weights", _metric("ess"),
              "ESS, % of received tokens", scale=100.0, bounded=True),
        Panel("Received |log-ratio| p99, farthest source", _worst_tail, "|log pi - log gen|, nats"),
    ]
    if any(_xtok_share(m) is not None for row in rows for m in row["nodes"].values()):
        panels.append(Panel("Cross-tokenizer: received tokens in multi-token chunks", _xtok_share,
                            "% of received tokens", scale=100.0, bounded=True))
    return panels


def _series(rows: list[dict], node: str, get: Callable[[dict], float | None], *, sparse: bool, steps: bool,
            scale: float = 1.0) -> tuple[list[float], list[float]]:
    """A node's (rounds, values) for one metric: a round it failed is a gap (NaN), except where
    only some rounds have the metric (evaluations) or the rows are steps, whose points connect."""
    xs, ys = [], []
    for row in rows:
        m = row["nodes"].get(node)
        v = None if m is None else get(m)
        if (sparse or steps) and v is None:
            continue
        xs.append(row["round"] if m is None else m.get("round", row["round"]))
        ys.append(math.nan if v is None else v * scale)
    return xs, ys


def layout(n: int) -> int:
    """Columns for ``n`` panels: 3 to 5, the fewest empty cells, then the fewest columns."""
    return min(range(3, 6), key=lambda c: (-n % c, c)) if n > 3 else max(n, 1)


def _draw_ref(ax, panel: Panel, rows: list[dict], nodes: list[str], colours: list[str], steps: bool) -> None:
    """The panel's threshold, dashed: one black line when every node's is the same (a constant one
    across the panel), else one per node in its colour."""
    lines = {}
    for node in nodes:
        xs, ys = _series(rows, node, panel.ref, sparse=True, steps=steps, scale=panel.scale)
        if any(math.isfinite(y) for y in ys):
            lines[node] = (xs, ys)
    if len({tuple(ys) for _, ys in lines.values()}) == 1:
        xs, ys = next(iter(lines.values()))
        values = {y for y in ys if math.isfinite(y)}
        if len(values) == 1:
            g = values.pop()
            ax.axhline(g, color="black", linestyle="--", linewidth=1, label=f"g = {g:g}")
        else:
            ax.plot(xs, ys, color="black", linestyle="--", linewidth=1, label="g")
        return
    for node, colour in zip(nodes, colours):
        if node in lines:
            ax.plot(*lines[node], color=colour, linestyle="--", linewidth=1, label=f"g ({node})")


def _fit_log(ax) -> None:
    """A log axis spanning the positive values drawn (data and threshold), a factor 2 either side."""
    values = [y for line in ax.get_lines() for y in line.get_ydata() if math.isfinite(y) and y > 0]
    if values:
        ax.set_yscale("log")
        ax.set_ylim(min(values) / 2, max(values) * 2)


def settings_text(config: dict | None) -> str:
    """The run's settings in a few lines, for a cell the panels leave over."""
    if not config:
        return ""
    loss, rounds, task = config.get("loss") or {}, config.get("rounds") or {}, config.get("task") or {}
    nodes = [str(c.get("name")) for c in config.get("nodes") or [] if isinstance(c, dict)]
    lines = [f"task: {task.get('name', '?')}" + (f" ({task.get('reward')})" if task.get("reward") else ""),
             f"{(config.get('advantage') or {}).get('mode', '')} {loss.get('method', '')}, "
             f"C = {loss.get('trunc_c', '?')}, g = {loss.get('kl_threshold', '?')}",
             f"G = {(config.get('rollout') or {}).get('group_size', '?')}, "
             f"{rounds.get('prompts_per_node', '?')} prompts per node and round",
             f"{rounds.get('num_rounds', '?')} rounds, evaluated every {rounds.get('eval_every', '?')}",
             "nodes: " + ", ".join(nodes)]
    return "\n".join(lines)


def plot_run(path: Path, title: str, nodes: list[str], splits: list[str], rows: list[dict],
             steps: bool = False, config: dict | None = None, failure: str = "") -> None:
    """Write the panels as one PNG; a panel without data says so. ``steps``: the rows are an
    asynchronous run's steps, so each node is drawn against its own round and a node absent
    from a row is busy (synchronous rows: absent = failed, drawn as a gap). ``config``: the
    run's (config.json), whose settings fill a cell the panels leave over. ``failure``: why the
    run failed, in red under the title."""
    from matplotlib.figure import Figure  # no pyplot: no global backend, no display needed
    from matplotlib.ticker import MaxNLocator

    panels = _panels(splits, rows)
    cols = layout(len(panels))
    nrows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(5.2 * cols, 3.8 * nrows), dpi=110, layout="constrained")
    axes = fig.subplots(nrows, cols, squeeze=False).ravel()
    colours = [f"C{i % 10}" for i in range(len(nodes))]
    for ax, panel in zip(axes, panels):
        for node, colour in zip(nodes, colours):
            xs, ys = _series(rows, node, panel.get, sparse=panel.sparse, steps=steps, scale=panel.scale)
            if any(math.isfinite(y) for y in ys):
                ax.plot(xs, ys, marker="o", markersize=3, color=colour, label=node)
        has_data = bool(ax.get_lines())
        if panel.ref is not None and has_data:
            _draw_ref(ax, panel, rows, nodes, colours, steps)
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel("round")
        ax.set_ylabel(panel.ylabel)
        if panel.bounded:
            ax.set_ylim(-2, 102)
        if panel.ylabel.endswith("(log scale)"):
            _fit_log(ax)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if rows and not steps:
            ax.set_xlim(rows[0]["round"] - 0.5, rows[-1]["round"] + 0.5)
        ax.grid(alpha=0.3)
        if has_data:
            ax.legend(loc="best", fontsize=8)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    spare = axes[len(panels):]
    text = settings_text(config)
    for i, ax in enumerate(spare):
        if i == 0 and text:
            ax.axis("off")
            ax.set_title("This run", fontsize=10)
            ax.text(0.02, 0.95, text, ha="left", va="top", fontsize=9, family="monospace", transform=ax.transAxes)
        else:
            ax.set_visible(False)
    if failure:
        title += "\n" + textwrap.fill(f"Run failed: {failure}", width=40 * cols)
    fig.suptitle(title, color="firebrick" if failure else "black")
    fig.savefig(path)
