"""Did a rerun repeat its run? Two run folders (each with a ``metrics.jsonl``) compared round by round.

    python -m simulations.repeat_check simulations/results/sweep-xfamily-rg/run-data/<key> runs/repeat/runs/<key>/<run>

A run on another CPU computes the same float32 ops with other kernels, so its losses move in the
last digits; what decides whether it *repeats* is whether every node drew the same samples
(same rewards, same token counts) and ended with the same accuracies. This prints, per node, the
evaluated accuracies side by side, the first round whose samples differ (none: the runs repeat),
and how far the rest of the metrics moved (largest relative difference, per metric, over values
of at least ``NEAR_ZERO``). Timings and sizes of saved state are left out: they differ between
any two runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ftis_flwr.server.reporting.summary import load_metrics
from simulations.runs import _num

SAMPLED = ("reward_mean", "tokens", "samples", "samples_kept", "train_reward_own", "train_reward_foreign")
"""Metrics fixed by what a node drew and kept: equal in every round when a rerun repeats."""

NEAR_ZERO = 1e-4
"""Values below this in both runs (an on-policy loss, the KL of a node's own samples) are rounding
noise whatever the CPU; their relative differences are not reported."""

SKIPPED = ("seconds", "time", "elapsed", "idle_fraction", "state_bytes", "worker_starts")
"""Parts of metric names that measure the machine, not the run."""


def load_rounds(run: Path) -> list[dict[str, Any]]:
    """The rows of ``<run>/metrics.jsonl`` (one per round; the project's reader), or SystemExit
    naming what is missing."""
    try:
        return load_metrics(run)
    except FileNotFoundError:
        raise SystemExit(f"{run}: no metrics.jsonl (give a run folder or a study's run-data/<key>)") from None


def compare(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> dict[str, Any]:
    """Per node: ``accuracy`` {split: [(round, a, b)]}, ``parted`` (the first round a SAMPLED
    metric differs, with it, or None), ``moved`` {metric: largest relative difference}."""
    if [r["round"] for r in a] != [r["round"] for r in b]:
        raise ValueError(f"the runs have different rounds: {[r['round'] for r in a]} / {[r['round'] for r in b]}")
    nodes = sorted(set(a[0]["nodes"]) & set(b[0]["nodes"]))
    if not nodes:
        raise ValueError("the runs share no node name")
    out: dict[str, Any] = {}
    for name in nodes:
        acc: dict[str, list] = {}
        parted, moved = None, {}
        for ra, rb in zip(a, b, strict=True):
            ma, mb = ra["nodes"].get(name) or {}, rb["nodes"].get(name) or {}
            for key in sorted(set(ma) | set(mb)):
                if any(part in key for part in SKIPPED):
                    continue
                va, vb = _num(ma.get(key)), _num(mb.get(key))
                if key.startswith("eval/") and key.endswith("/accuracy") and (va, vb) != (None, None):
                    acc.setdefault(key[len("eval/"):-len("/accuracy")], []).append((ra["round"], va, vb))
                elif key in SAMPLED and va != vb and parted is None:
                    parted = (ra["round"], key, va, vb)
                elif va is not None and vb is not None and va != vb and max(abs(va), abs(vb)) >= NEAR_ZERO:
                    rel = abs(va - vb) / max(abs(va), abs(vb))
                    moved[key] = max(moved.get(key, 0.0), rel)
        out[name] = {"accuracy": acc, "parted": parted, "moved": moved}
    return out


def report(result: dict[str, Any], most: int = 4) -> str:
    lines = []
    for name, r in result.items():
        acc = "; ".join(f"{split} " + ", ".join(f"round {k}: {100 * x:.2f} / {100 * y:.2f}" if None not in (x, y)
                                                 else f"round {k}: {x} / {y}" for k, x, y in rows)
                        for split, rows in r["accuracy"].items())
        lines.append(f"{name}: accuracy, %, first run / rerun: {acc or 'none evaluated'}")
        if r["parted"] is None:
            lines.append(f"{name}: the same samples in every round ({', '.join(SAMPLED)} equal)")
        else:
            k, key, x, y = r["parted"]
            lines.append(f"{name}: the samples part at round {k} ({key}: {x} / {y})")
        top = sorted(r["moved"].items(), key=lambda kv: -kv[1])[:most]
        if top:
            lines.append(f"{name}: other metrics moved by at most " + ", ".join(f"{k} {v:.1e}" for k, v in top)
                         + f" (relative; values under {NEAR_ZERO:g} left out)")
    same = all(r["parted"] is None and all(x == y for rows in r["accuracy"].values() for _, x, y in rows)
               for r in result.values())
    lines.append("the runs repeat: same samples and same accuracies" if same else "the runs do not repeat")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("first", type=Path, help="a run folder with metrics.jsonl (e.g. a study's run-data/<key>)")
    ap.add_argument("rerun", type=Path, help="the rerun's folder")
    args = ap.parse_args(argv)
    try:
        result = compare(load_rounds(args.first), load_rounds(args.rerun))
    except ValueError as exc:
        raise SystemExit(f"{args.first} / {args.rerun}: {exc}") from None
    print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
