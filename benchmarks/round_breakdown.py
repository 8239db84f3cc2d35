"""Where an asynchronous run's rounds go, per node: the node's compute, its worker's decoding,
checks and encoding, the ClientApp's hop to the worker, the server's share
(``server_reply_seconds``, ``server_send_seconds``) and what is left: Flower's runtime carrying
the message to the ClientApp and back. docs/performance.md, "No waiting on the slowest model": the async breakdown.

    python benchmarks/round_breakdown.py runs/async-breakdown/runs/<run name>

Means over each node's rounds but its first (building the node) and its last (no generation).
Runs from before ``worker_seconds`` / ``clientapp_seconds`` were logged show only the sum ("rest").
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from ftis_flwr.server.summary import load_metrics  # noqa: E402

KEYS = ("round_seconds", "compute_seconds", "worker_seconds", "clientapp_seconds", "server_reply_seconds",
        "server_send_seconds", "idle_fraction")


def breakdown(ms: list[dict[str, float]]) -> dict[str, float | None]:
    """Mean seconds per part of a node's rounds (None: not logged by this run)."""
    mean = {k: statistics.mean(m[k] for m in ms) if all(k in m for m in ms) else None for k in KEYS}
    server = mean["server_reply_seconds"] + mean["server_send_seconds"]
    rest = mean["round_seconds"] - mean["compute_seconds"] - server
    out = {**mean, "server": server, "rest": rest, "worker_other": None, "clientapp_hop": None, "flower": None}
    if mean["worker_seconds"] is not None and mean["clientapp_seconds"] is not None:
        out["worker_other"] = mean["worker_seconds"] - mean["compute_seconds"]
        out["clientapp_hop"] = mean["clientapp_seconds"] - mean["worker_seconds"]
        out["flower"] = mean["round_seconds"] - mean["clientapp_seconds"] - server
    return out


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    a = p.parse_args(argv)
    rows = load_metrics(a.run_dir)
    nodes = dict.fromkeys(n for r in rows for n in r["nodes"])
    print("| node | rounds | round s | compute s | worker decode/encode s | ClientApp hop s | server s "
          "(reply + send) | Flower runtime s | rest s | idle fraction |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for node in nodes:
        ms = [r["nodes"][node] for r in rows if node in r["nodes"]][1:-1]
        if "server_reply_seconds" not in (ms[0] if ms else {}):
            raise SystemExit(f"{a.run_dir}: node {node} has no server_reply_seconds (not an async run, "
                             "or one from before they were logged)")
        b = breakdown(ms)
        print(f"| {node} | {len(ms)} | {b['round_seconds']:.3f} | {b['compute_seconds']:.3f} | "
              f"{_s(b['worker_other'])} | {_s(b['clientapp_hop'])} | {b['server']:.3f} "
              f"({b['server_reply_seconds']:.3f} + {b['server_send_seconds']:.3f}) | {_s(b['flower'])} | "
              f"{b['rest']:.3f} | {b['idle_fraction']:.3f} |")


if __name__ == "__main__":
    main()
