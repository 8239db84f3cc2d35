"""Where an asynchronous run's rounds go, per node: the node's compute, the server's share
(``server_reply_seconds``, ``server_send_seconds``) and the rest (Flower's runtime and the
ClientApp's hop to the node's worker). README "Many nodes": the async breakdown.

    python benchmarks/round_breakdown.py runs/async-breakdown/runs/<run name>

Means over each node's rounds but its first (building the node) and its last (no generation).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from ftis_flwr.reporting import load_metrics  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    a = p.parse_args(argv)
    rows = load_metrics(a.run_dir)
    nodes = dict.fromkeys(n for r in rows for n in r["nodes"])
    print("| node | rounds | round s | compute s | server reply s | server send s | rest s | idle fraction |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for node in nodes:
        ms = [r["nodes"][node] for r in rows if node in r["nodes"]][1:-1]
        if "server_reply_seconds" not in (ms[0] if ms else {}):
            raise SystemExit(f"{a.run_dir}: node {node} has no server_reply_seconds (not an async run, "
                             "or one from before they were logged)")
        mean = {k: statistics.mean(m[k] for m in ms) for k in
                ("round_seconds", "compute_seconds", "server_reply_seconds", "server_send_seconds", "idle_fraction")}
        rest = mean["round_seconds"] - mean["compute_seconds"] - mean["server_reply_seconds"] - mean["server_send_seconds"]
        print(f"| {node} | {len(ms)} | {mean['round_seconds']:.3f} | {mean['compute_seconds']:.3f} | "
              f"{mean['server_reply_seconds']:.3f} | {mean['server_send_seconds']:.3f} | {rest:.3f} | "
              f"{mean['idle_fraction']:.3f} |")


if __name__ == "__main__":
    main()
