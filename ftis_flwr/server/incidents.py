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
MOSTLY = 0.5
"""Share of a source's text-path samples a receiver refused above which the summary warns first."""


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


def mostly_refused(rows: list[dict]) -> list[str]:
    """``"b could not represent most of a's samples ..."`` for each (source, receiver) whose
    text-path samples the receiver mostly refused (over :data:`MOSTLY` of ``<source>/text_samples``
    summed over the run's rows in metrics.jsonl), with the share of each reason."""
    totals: dict[tuple[str, str], dict[str, float]] = {}
    for row in rows:
        for node, m in (row.get("nodes") or {}).items():
            for key, value in m.items():
                src, sep, name = key.partition("/")
                if sep and isinstance(value, (int, float)) and (name == "text_samples" or
                                                                 name.startswith("text_refused")):
                    t = totals.setdefault((src, node), {})
                    t[name] = t.get(name, 0.0) + float(value)
    out = []
    for (src, node), t in totals.items():
        received, refused = t.get("text_samples", 0.0), t.get("text_refused", 0.0)
        if received and refused / received > MOSTLY:
            why = ", ".join(f"{k[len('text_refused_'):]} {v / received:.0%}"
                            for k, v in sorted(t.items(), key=lambda x: -x[1]) if k.startswith("text_refused_"))
            out.append(f"{node} could not represent most of {src}'s samples in its own tokens: it refused "
                       f"{refused:.0f} of {received:.0f} ({refused / received:.0%}: {why}) and trained on "
                       "the rest only (docs/cross-tokenizer.md)")
    return out
