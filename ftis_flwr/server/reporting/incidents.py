"""What went wrong in a run, counted for its summary: failures and rejections from events.jsonl.

Why apart: the strategy writes one event per incident (a node's failed round, a payload the server
or a receiver rejected, claimed rewards a receiver corrected, a SuperNode left out, a checkpoint not
saved); an operator reads them as a table beside the accuracies, so no rejection is only a log line.
"""

from __future__ import annotations

INCIDENTS = {"node_failed": "node", "payload_rejected": "source", "rewards_corrected": "source",
             "node_left_out": "node_id", "checkpoint_failed": "node", "text_refused": "source"}
"""Event kinds the summary counts, each with the field naming whom it is about; a kind may carry
a detail after a colon (``text_refused:unknown_token``), kept apart in the table."""


def incidents(events: list[dict]) -> list[dict]:
    """One row per (event kind, whom it is about, who saw it) of :data:`INCIDENTS`: how many times,
    in which rounds, and the groups and samples involved (rejections and corrections)."""
    rows: dict[tuple, dict] = {}
    for e in events:
        kind = str(e.get("event"))
        if kind.split(":")[0] not in INCIDENTS:
            continue
        about = INCIDENTS[kind.split(":")[0]]
        who, by = str(e.get(about, "?")), str(e.get("node", "")) if about == "source" else ""
        row = rows.setdefault((kind, who, by), {"event": kind, "who": who, "by": by, "times": 0,
                                                "rounds": [], "groups": 0.0, "samples": 0.0})
        row["times"] += 1
        if isinstance(e.get("round"), int) and e["round"] not in row["rounds"]:
            row["rounds"].append(e["round"])
        for k in ("groups", "samples"):
            if isinstance(e.get(k), (int, float)):
                row[k] += float(e[k])
    return list(rows.values())
