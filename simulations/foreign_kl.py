"""How far each node's received samples were from it, run by run: what the filter and the truncation
saw. docs/real-studies.md, "The cross-family pair over seeds".

    python -m simulations.foreign_kl simulations/results/sweep-xfamily/run-data/*/

Per run directory (holding ``metrics.jsonl``) and node, over the training rounds (round 0 trains
nothing): the median KL of the samples it received (the filter drops a received sample with
advantage <= 0 whose KL is above g, SPEC section 6), min..max over rounds; the share of received
samples the filter dropped (mean over rounds); of the received samples' tokens, the largest share
whose importance weight hit C, and the largest weight; the effective sample size of the received
samples' weights, as a fraction of their tokens (mean over rounds and sources); and, for runs with
``loss.cross_tokenizer_ratio=word``, the share of byte chunks that word boundaries merged (mean
over rounds and sources). A node that received nothing shows "-".

``--by-config`` folds the seeds of one configuration (run names that differ only in ``seed-N``)
into one row per node: each cell is the range over runs of the per-run figure.

    python -m simulations.foreign_kl --by-config simulations/results/sweep-xfamily-rg/run-data/*/
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from ftis_flwr.server.reporting.summary import _finite, load_metrics

COLUMNS = ("median KL of received samples (min..max)", "filtered (mean)", "truncated tokens (max)",
           "largest weight", "ESS (mean)", "word-merged chunks (mean)")


def _g(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.1e}"


def _per_source(m: dict, node: str, metric: str) -> list[float]:
    """``<source>/<metric>`` of every source but the node itself (its own samples weigh about 1)."""
    return [v for k, x in m.items() if k.endswith(f"/{metric}") and not k.startswith(f"{node}/")
            and (v := _finite(x)) is not None]


def node_figures(rounds: list[dict], node: str) -> dict[str, tuple[float, float] | float | None]:
    """One node's metrics rows (training rounds) -> its figures; truncation, weights, ESS and the
    merged share are the received samples' (per source), not the node's own."""
    kl, filtered, truncated, w, ess, merged = [], [], [], [], [], []
    for m in rounds:
        received = _finite(m.get("samples_foreign"))
        if not received:
            continue
        if (v := _finite(m.get("kl_median_foreign"))) is not None:
            kl.append(v)
        filtered.append((_finite(m.get("filtered")) or 0.0) / received)
        truncated += _per_source(m, node, "frac_tokens_truncated")
        w += _per_source(m, node, "w_max")
        ess += _per_source(m, node, "ess")
        merged += _per_source(m, node, "xtok_word_merged_share")
    return {"kl": (min(kl), max(kl)) if kl else None, "filtered": _mean(filtered),
            "truncated": max(truncated) if truncated else None, "w": max(w) if w else None,
            "ess": _mean(ess), "merged": _mean(merged)}


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _pct(v: float, digits: int = 0) -> str:
    return f"{100 * v:.{digits}f}%"


def _cells(figs: list[dict]) -> list[str]:
    """The table cells for one run's figures (one dict) or a configuration's (several: ranges)."""
    def span(key: str, fmt) -> str:
        vals = [f[key] for f in figs if f[key] is not None]
        if not vals:
            return "-"
        lo, hi = min(vals), max(vals)
        return fmt(lo) if fmt(lo) == fmt(hi) else f"{fmt(lo)}..{fmt(hi)}"
    kls = [f["kl"] for f in figs if f["kl"] is not None]
    kl = f"{_g(min(k[0] for k in kls))}..{_g(max(k[1] for k in kls))}" if kls else "-"
    return [kl, span("filtered", _pct), span("truncated", lambda v: _pct(v, 1)), span("w", _g),
            span("ess", lambda v: f"{v:.2f}"), span("merged", lambda v: _pct(v, 1))]


def _runs(run_dirs: list[Path]) -> list[tuple[Path, str, list[dict]]]:
    """(run, node, the node's training-round metrics) for every node of every run, in order."""
    out = []
    for run in run_dirs:
        records = [r for r in load_metrics(run) if r.get("round", 0) > 0]
        for node in dict.fromkeys(n for r in records for n in r.get("nodes", {})):
            out.append((run, node, [r["nodes"][node] for r in records if node in r.get("nodes", {})]))
    return out


def config_name(run: Path) -> str:
    """The run's name without its seed (``...__seed-3`` -> ``...``)."""
    return re.sub(r"_*seed-\d+$", "", run.name) or run.name


def table(run_dirs: list[Path], by_config: bool = False) -> str:
    """One row per run and node, or (``by_config``) per configuration and node with the number of
    runs it folds."""
    first = "| configuration | runs | node | " if by_config else "| run | node | "
    width = len(COLUMNS) + first.count("|") - 1
    lines = [first + " | ".join(COLUMNS) + " |", "| " + " | ".join(["---"] * width) + " |"]
    groups: dict[tuple[object, str], tuple[str, list[dict]]] = {}
    for run, node, rounds in _runs(run_dirs):
        label = config_name(run) if by_config else run.name
        key = (label if by_config else run, node)  # without --by-config, one row per run directory
        groups.setdefault(key, (label, []))[1].append(node_figures(rounds, node))
    for (_, node), (label, figs) in groups.items():
        count = f"{len(figs)} | " if by_config else ""
        lines.append(f"| {label} | {count}{node} | " + " | ".join(_cells(figs)) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dirs", nargs="+", help="run directories, each holding metrics.jsonl")
    ap.add_argument("--by-config", action="store_true",
                    help="one row per configuration and node, the range over its seeds' runs")
    a = ap.parse_args(argv)
    runs = [Path(d) for d in a.run_dirs]
    missing = [str(d) for d in runs if not (d / "metrics.jsonl").is_file()]
    if missing:
        print("no metrics.jsonl in: " + ", ".join(missing) + " (give run directories)", file=sys.stderr)
        return 2
    print(table(runs, a.by_config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
