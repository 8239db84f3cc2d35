"""The run's plot.png: accuracy per held-out split, train reward, and the method's own
diagnostics (filtered share of received samples, truncated token share, KL of received
samples on a log scale: k3 reaches 1e5 and more for a far sample, the effective sample size of
the received weights and the farthest source's |log-ratio| p99), and, where peers of other
tokenizers trained through their text, the share of received tokens in multi-token chunks; one
colour per node, from exactly the rows the reporter logged.

Written for a reader who has not read the code: every y axis says what it counts and in which
unit, accuracy and shares are in % (as the summary tables give accuracy), the splits are named
in words ("test" is the in-distribution test split, "ood" the out-of-distribution one) and the
filter panel says what "filtered" means."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

ACC_PREFIX, ACC_SUFFIX = "eval/", "/accuracy"


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
    whether only evaluated rounds have it, the factor to the unit shown (100: a share in %) and
    whether the axis spans the whole 0-100% range."""

    title: str
    get: Callable[[dict], float | None]
    ylabel: str
    sparse: bool = False
    scale: float = 1.0
    bounded: bool = False


def _metric(key: str) -> Callable[[dict], float | None]:
    return lambda m: m.get(key)


def _panels(splits: list[str], rows: list[dict] = ()) -> list[Panel]:
    panels = [Panel(f"Held-out accuracy: {split_title(s)}", _metric(f"{ACC_PREFIX}{s}{ACC_SUFFIX}"),
                    "accuracy (% of problems, greedy)", sparse=True, scale=100.0, bounded=True) for s in splits]
    panels += [
        Panel("Train reward: mean of the groups the node generated", _metric("reward_mean"),
              "reward (the task's own scale)"),
        Panel("Filtered: received samples the F-TIS filter dropped\n"
              "(KL estimate above the threshold g, advantage <= 0)",
              _ratio("filtered", "samples_foreign"), "% of received samples", scale=100.0, bounded=True),
        Panel("Truncated importance weights (weight reached C)", _metric("frac_tokens_truncated"),
              "% of tokens", scale=100.0, bounded=True),
        Panel("KL of received samples to the learner, mean k3\n(k3 = E[e^d - d - 1], d = log gen - log pi)",
              _metric("kl_mean_foreign"), "KL estimate, nats (log scale)"),
        Panel("Effective sample size of received samples' weights", _metric("ess"),
              "ESS, % of received tokens", scale=100.0, bounded=True),
        Panel("Received |log-ratio| p99, farthest source", _worst_tail, "|log pi - log gen|, nats"),
    ]
    if any(_xtok_share(m) is not None for row in rows for m in row["nodes"].values()):
        panels.append(Panel("Cross-tokenizer: received tokens in multi-token chunks", _xtok_share,
                            "% of received tokens", scale=100.0, bounded=True))
    return panels


def plot_run(path: Path, title: str, nodes: list[str], splits: list[str], rows: list[dict],
             steps: bool = False) -> None:
    """Write the panels as one PNG; a panel without data says so. ``steps``: the rows are an
    asynchronous run's steps, so each node is drawn against its own round and a node absent
    from a row is busy (synchronous rows: absent = failed, drawn as a gap)."""
    from matplotlib.figure import Figure  # no pyplot: no global backend, no display needed
    from matplotlib.ticker import MaxNLocator

    panels = _panels(splits, rows)
    cols = min(3, len(panels))
    nrows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(5.2 * cols, 3.8 * nrows), dpi=110, layout="constrained")
    axes = fig.subplots(nrows, cols, squeeze=False).ravel()
    colours = [f"C{i % 10}" for i in range(len(nodes))]
    for ax, panel in zip(axes, panels):
        for node, colour in zip(nodes, colours):
            xs, ys = [], []
            for row in rows:
                m = row["nodes"].get(node)
                v = None if m is None else panel.get(m)
                if (panel.sparse or steps) and v is None:
                    continue  # eval only every N rounds: connect the evaluated points
                xs.append(row["round"] if m is None else m.get("round", row["round"]))
                ys.append(math.nan if v is None else v * panel.scale)
            if any(math.isfinite(y) for y in ys):
                ax.plot(xs, ys, marker="o", markersize=3, color=colour, label=node)
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel("round")
        ax.set_ylabel(panel.ylabel)
        if panel.bounded:
            ax.set_ylim(-2, 102)
        if panel.ylabel.endswith("(log scale)") and any(y > 0 for line in ax.get_lines() for y in line.get_ydata()
                                                  if math.isfinite(y)):
            ax.set_yscale("log")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if rows and not steps:
            ax.set_xlim(rows[0]["round"] - 0.5, rows[-1]["round"] + 0.5)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize=8)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    fig.suptitle(title)
    fig.savefig(path)
