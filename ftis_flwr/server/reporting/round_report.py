"""Where a run's rounds went (``ftis-flwr report RUN``), read from its ``metrics.jsonl``: per round,
the round's wall time and each node's train / generate / eval seconds; for an asynchronous run,
per node, what a step's time is made of.

A node's phases run one after the other; the nodes share the machine's cores, so a synchronous
round takes about as long as the slowest node's train + generate (+ eval where the round
evaluates) plus Flower's hops. "-" marks a phase the node did not run that round (round 0 trains
nothing, the last round generates nothing, most rounds do not evaluate).

The asynchronous breakdown: the node's compute, its worker's decoding, checks and encoding, the
ClientApp's hop to the worker, the server's share (``server_reply_seconds``,
``server_send_seconds``) and what is left, Flower's runtime carrying the message to the ClientApp
and back; means over each node's steps but its first (building the node) and its last (no
generation).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from ftis_flwr.server.reporting.summary import _finite, load_metrics

PHASES = ("seconds_train", "seconds_generate", "seconds_eval")
RAN = 0.05
"""Seconds below which a phase counts as not run (round 0's train phase logs ~1e-7 s)."""
ASYNC_KEYS = ("round_seconds", "compute_seconds", "worker_seconds", "clientapp_seconds", "server_reply_seconds",
              "server_send_seconds", "idle_fraction")


def _seconds(m: dict | None, key: str) -> str:
    v = _finite((m or {}).get(key))
    return f"{v:.1f}" if v is not None and v >= RAN else "-"


def round_table(records: list[dict], order: list[str] = ()) -> str:
    """Markdown: one row per logged round, one ``train / generate / eval s`` column per node (in
    ``order``, the run's card order, then any other)."""
    nodes = list(dict.fromkeys([*order, *(n for r in records for n in r.get("nodes", {}))]))
    lines = ["| round | round s | " + " | ".join(f"{n}: train / generate / eval s" for n in nodes) + " |",
             "| --- | --- |" + " --- |" * len(nodes)]
    for r in records:
        cells = []
        for n in nodes:
            m = r.get("nodes", {}).get(n)
            cells.append(" / ".join(_seconds(m, k) for k in PHASES) if m else "no reply")
        lines.append(f"| {r['round']} | {_seconds(r.get('server', {}), 'round_seconds')} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def breakdown(ms: list[dict[str, float]]) -> dict[str, float | None]:
    """Mean seconds per part of a node's steps (None: not logged by this run)."""
    mean = {k: statistics.mean(m[k] for m in ms) if all(k in m for m in ms) else None for k in ASYNC_KEYS}
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


def async_table(records: list[dict]) -> str | None:
    """Markdown: the asynchronous breakdown per node (module docstring); None for a synchronous
    run (no ``server_reply_seconds`` logged) or one with too few steps to leave out the ends."""
    nodes = list(dict.fromkeys(n for r in records for n in r.get("nodes", {})))
    rows = []
    for node in nodes:
        ms = [r["nodes"][node] for r in records if node in r.get("nodes", {})][1:-1]
        if not ms or not all("server_reply_seconds" in m and "compute_seconds" in m and "round_seconds" in m
                             for m in ms):
            continue
        b = breakdown(ms)
        rows.append(f"| {node} | {len(ms)} | {b['round_seconds']:.3f} | {b['compute_seconds']:.3f} | "
                    f"{_s(b['worker_other'])} | {_s(b['clientapp_hop'])} | {b['server']:.3f} "
                    f"({b['server_reply_seconds']:.3f} + {b['server_send_seconds']:.3f}) | {_s(b['flower'])} | "
                    f"{b['rest']:.3f} | {_s(b['idle_fraction'])} |")
    if not rows:
        return None
    return "\n".join(["| node | steps | step s | compute s | worker decode/encode s | ClientApp hop s | server s "
                      "(reply + send) | Flower runtime s | rest s | idle fraction |",
                      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |", *rows])


def run_report(run_dir: str | Path) -> str:
    """The report of one run (module docstring); FileNotFoundError / ValueError saying what the
    folder lacks."""
    records = load_metrics(run_dir)
    if not records:
        raise ValueError(f"{run_dir}: no round logged yet")
    last = records[-1]
    config = Path(run_dir) / "config.json"
    order = [c["name"] for c in json.loads(config.read_text()).get("nodes", [])] if config.is_file() else []
    out = [f"{run_dir}: {len(records)} rounds logged, {last.get('elapsed', float('nan')):.0f} s from the start "
           "to the last", "", round_table(records, order)]
    steps = async_table(records)
    if steps is not None:
        out += ["", "Each node's steps (means, its first and last step left out):", "", steps]
    return "\n".join(out)
