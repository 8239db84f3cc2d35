"""The run's plot.png: accuracy per held-out split, train reward, and the method's own
diagnostics (filtered share of received samples, truncated token share, KL of received
samples on a log scale: k3 reaches 1e5 and more for a far sample, the effective sample size of
the received weights and the farthest source's |log-ratio| p99), and, where peers of other
tokenizers trained through their text, the share of received tokens in multi-token chunks; one
colour per node, from exactly the rows the reporter logged."""

from __future__ import annotations

import math
from pathlib import Path

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


def _panels(splits: list[str], rows: list[dict] = ()) -> list[tuple[str, object, str, bool]]:
    """(title, metric getter, y label, sparse: evaluated rounds only)."""
    panels = [(f"Eval accuracy: {s}", (lambda k: lambda m: m.get(k))(f"{ACC_PREFIX}{s}{ACC_SUFFIX}"),
               "accuracy", True) for s in splits]
    panels += [
        ("Train reward (mean)", lambda m: m.get("reward_mean"), "reward", False),
        ("Filtered share of received samples", _ratio("filtered", "samples_foreign"), "share", False),
        ("Truncated IS weights (token share)", lambda m: m.get("frac_tokens_truncated"), "share", False),
        ("KL of received samples (mean k3 = E[e^d - d - 1], d = log gen - log pi)",
         lambda m: m.get("kl_mean_foreign"), "KL (log scale)", False),
        ("Effective sample size of received samples' weights", lambda m: m.get("ess"), "ESS (0..1)", False),
        ("Received |log-ratio| p99, farthest source", _worst_tail, "nats", False),
    ]
    if any(_xtok_share(m) is not None for row in rows for m in row["nodes"].values()):
        panels.append(("Cross-tokenizer: received tokens in multi-token chunks", _xtok_share, "share", False))
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
    for ax, (label, get, ylabel, sparse) in zip(axes, panels):
        for node, colour in zip(nodes, colours):
            xs, ys = [], []
            for row in rows:
                m = row["nodes"].get(node)
                v = None if m is None else get(m)
                if (sparse or steps) and v is None:
                    continue  # eval only every N rounds: connect the evaluated points
                xs.append(row["round"] if m is None else m.get("round", row["round"]))
                ys.append(math.nan if v is None else v)
            if any(math.isfinite(y) for y in ys):
                ax.plot(xs, ys, marker="o", markersize=3, color=colour, label=node)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("round")
        ax.set_ylabel(ylabel)
        if sparse or ylabel == "share":
            ax.set_ylim(-0.02, 1.02)
        if ylabel.endswith("(log scale)") and any(y > 0 for line in ax.get_lines() for y in line.get_ydata()
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
