"""Greedy answers that stopped depending on the problem, read from the rows of metrics.jsonl.

Why: a model can end on one answer for every problem and still score, when the task pays part
of a wrong answer. In the cross-family study (docs/real-studies.md) Gemma answered the worked
example's ``rotule`` to all 128 test problems in two runs and ended on 5.46% from partial
credit alone, and no model of that study spelled a single word backward; nothing in the
accuracy said so. Each evaluation logs the share of distinct answers (``eval/<split>/distinct``)
and of answers with full credit (``eval/<split>/full_credit``); the summary's first lines name a
node whose share of distinct answers fell to :data:`FEW` or below and to under half of what it
was at the node's first evaluation, and a node whose last accuracy is partial credit only.
"""

from __future__ import annotations

import math

FEW = 0.1
"""Share of distinct greedy answers at or below which a collapse is said (with the fall below)."""
FALL = 0.5
"""A collapse is said only when the share also fell under this fraction of its first evaluation's:
a task with few possible answers (yes / no) has few distinct answers from the start."""
PREFIX = "eval/"


def _series(rows: list[dict], suffix: str) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """(node, split) -> [(round, value of ``eval/<split><suffix>``)] over the evaluated rounds."""
    out: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for row in rows:
        for node, m in (row.get("nodes") or {}).items():
            for key, value in m.items():
                if key.startswith(PREFIX) and key.endswith(suffix) and isinstance(value, (int, float)) \
                        and math.isfinite(value):
                    out.setdefault((node, key[len(PREFIX):-len(suffix)]), []).append((row["round"], float(value)))
    return out


def collapsed_answers(rows: list[dict]) -> list[str]:
    """One line per node and split whose greedy answers collapsed by the last evaluation."""
    out = []
    for (node, split), series in sorted(_series(rows, "/distinct").items()):
        if len(series) < 2:
            continue
        (r0, first), (r1, last) = series[0], series[-1]
        if last <= FEW and last < FALL * first:
            out.append(f"{node}'s greedy answers on {split} collapsed: {last:.1%} of them are distinct at round "
                       f"{r1} ({first:.1%} at round {r0}), so it gives most problems the same answer and its "
                       "accuracy there is whatever that answer scores (`ftis-flwr answers <run "
                       "folder>` shows them)")
    return out


def partial_credit_only(rows: list[dict]) -> list[str]:
    """One line per node and split whose last evaluation scored above 0 with no answer at full
    credit: its accuracy is the task's partial credit for wrong answers, nothing more."""
    full = _series(rows, "/full_credit")
    out = []
    for (node, split), series in sorted(_series(rows, "/accuracy").items()):
        rnd, acc = series[-1]
        credit = dict(full.get((node, split), []))
        if acc > 0 and credit.get(rnd) == 0:
            out.append(f"{node}'s accuracy on {split} ({acc:.1%} at round {rnd}) is partial credit only: none of its "
                       "greedy answers gets full credit (`ftis-flwr answers <run folder>` shows them)")
    return out
