"""Where a synchronous run's rounds went, round by round: the round's wall time and each node's
train / generate / eval seconds, from the run's ``metrics.jsonl``. docs/real-models.md, "A round
of the pair through Flower".

    python benchmarks/round_times.py runs/<run name>

A node's phases run one after the other; the nodes share the machine's cores, so a round takes
about as long as the slowest node's train + generate (+ eval where the round evaluates) plus
Flower's hops. "-" marks a phase the node did not run that round (round 0 trains nothing, the
last round generates nothing, most rounds do not evaluate).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from ftis_flwr.server.summary import _finite, load_metrics  # noqa: E402

PHASES = ("seconds_train", "seconds_generate", "seconds_eval")
RAN = 0.05
"""Seconds below which a phase counts as not run (round 0's train phase logs ~1e-7 s)."""


def _seconds(m: dict, key: str) -> str:
    v = _finite(m.get(key))
    return f"{v:.1f}" if v is not None and v >= RAN else "-"


def table(records: list[dict]) -> str:
    """Markdown: one row per logged round, one ``train / generate / eval s`` column per node."""
    nodes = list(dict.fromkeys(n for r in records for n in r.get("nodes", {})))
    lines = ["| round | round s | " + " | ".join(f"{n}: train / generate / eval s" for n in nodes) + " |",
             "| --- | --- |" + " --- |" * len(nodes)]
    for r in records:
        cells = []
        for n in nodes:
            m = r.get("nodes", {}).get(n)
            cells.append(" / ".join(_seconds(m, k) for k in PHASES) if m else "no reply")
        lines.append(f"| {r['round']} | {_seconds(r.get('server', {}), 'round_seconds')} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", help="a run's directory (runs/<run name>), holding metrics.jsonl")
    a = ap.parse_args(argv)
    try:
        records = load_metrics(a.run_dir)
    except FileNotFoundError as exc:
        print(f"{exc}: give a run's directory (runs/<run name>)", file=sys.stderr)
        return 2
    if not records:
        print(f"{a.run_dir}: no round logged yet", file=sys.stderr)
        return 2
    print(table(records))
    last = records[-1]
    print(f"\n{len(records)} rounds logged, {last.get('elapsed', float('nan')):.0f} s from the start to the last")
    return 0


if __name__ == "__main__":
    sys.exit(main())
