"""How far each node's received samples were from it, run by run: what the filter and the truncation
saw. docs/real-models.md, "The cross-family pair over seeds".

    python simulations/foreign_kl.py docs/sweep-xfamily/run-data/*/

Per run directory (holding ``metrics.jsonl``) and node, over the training rounds (round 0 trains
nothing): the median KL of the samples it received (the filter drops a received sample with
advantage <= 0 whose KL is above g, SPEC section 6), min..max over rounds; the share of received
samples the filter dropped (mean over rounds); of the received samples' tokens, the largest share
whose importance weight hit C, and the largest weight. A node that received nothing shows "-".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from ftis_flwr.server.summary import _finite, load_metrics  # noqa: E402

HEADER = ("| run | node | median KL of received samples (min..max) | filtered (mean) | "
          "truncated tokens (max) | largest weight |")


def _g(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.1e}"


def _per_source(m: dict, node: str, metric: str) -> list[float]:
    """``<source>/<metric>`` of every source but the node itself (its own samples weigh about 1)."""
    return [v for k, x in m.items() if k.endswith(f"/{metric}") and not k.startswith(f"{node}/")
            and (v := _finite(x)) is not None]


def node_row(node: str, rounds: list[dict]) -> tuple[str, str, str, str]:
    """One node's metrics rows (training rounds) -> the four cells of its table row; truncation
    and weights are the received samples' (per source), not the node's own."""
    kl, filtered, truncated, w = [], [], [], []
    for m in rounds:
        received = _finite(m.get("samples_foreign"))
        if not received:
            continue
        if (v := _finite(m.get("kl_median_foreign"))) is not None:
            kl.append(v)
        filtered.append((_finite(m.get("filtered")) or 0.0) / received)
        truncated += _per_source(m, node, "frac_tokens_truncated")
        w += _per_source(m, node, "w_max")
    return (f"{_g(min(kl))}..{_g(max(kl))}" if kl else "-",
            f"{100 * sum(filtered) / len(filtered):.0f}%" if filtered else "-",
            f"{100 * max(truncated):.1f}%" if truncated else "-",
            _g(max(w)) if w else "-")


def table(run_dirs: list[Path]) -> str:
    lines = [HEADER, "| --- | --- | --- | --- | --- | --- |"]
    for run in run_dirs:
        records = [r for r in load_metrics(run) if r.get("round", 0) > 0]
        nodes = dict.fromkeys(n for r in records for n in r.get("nodes", {}))
        for node in nodes:
            cells = node_row(node, [r["nodes"][node] for r in records if node in r.get("nodes", {})])
            lines.append(f"| {run.name} | {node} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dirs", nargs="+", help="run directories, each holding metrics.jsonl")
    a = ap.parse_args(argv)
    runs = [Path(d) for d in a.run_dirs]
    missing = [str(d) for d in runs if not (d / "metrics.jsonl").is_file()]
    if missing:
        print("no metrics.jsonl in: " + ", ".join(missing) + " (give run directories)", file=sys.stderr)
        return 2
    print(table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
