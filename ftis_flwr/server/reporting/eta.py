"""How long the rest of a run will take, from the rounds it has already logged.

A real pair's rounds are of two kinds: a training round (train + generate, about a minute for
SmolLM2 on 2 cores) and one that also evaluates (greedy decoding of the held-out problems, which
can cost more than the training). So a plain "mean round time x rounds left" is wrong by the
evaluation whenever the rounds seen so far and the rounds left evaluate differently. The estimate
here keeps the two apart: a round costs its recent median training time, plus the last measured
evaluation time in the rounds that evaluate. Round 0 (it builds the models and evaluates, with no
training) gives the evaluation time only, so the first estimate comes after round 1.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence

from ftis_flwr.server.reporting.summary import _finite

RECENT = 5
"""Training rounds the median is taken over: recent enough to follow a run that slows down (longer
completions), several so that one slow round (a resumed worker's reload) does not swing it."""


def eval_seconds(nodes: Mapping[str, Mapping]) -> float:
    """The round's evaluation time: the slowest node's ``seconds_eval`` (the nodes evaluate at
    once), 0 when no node evaluated."""
    return max((_finite(m.get("seconds_eval")) or 0.0 for m in nodes.values()), default=0.0)


def seconds_left(rows: Sequence[Mapping], num_rounds: int,
                 evaluates: Callable[[int], bool]) -> float | None:
    """Seconds until round ``num_rounds`` ends, after the last of ``rows`` (``round``, ``nodes``,
    ``server`` with ``round_seconds``); None while no training round has been timed."""
    if not rows:
        return None
    last = rows[-1]["round"]
    if last >= num_rounds:
        return 0.0
    train, evals = [], []
    for row in rows:
        wall = _finite(row["server"].get("round_seconds"))
        ev = eval_seconds(row["nodes"])
        if ev > 0:
            evals.append(ev)
        if wall is not None and row["round"] > 0:
            train.append(max(wall - ev, 0.0))
    if not train:
        return None
    step = statistics.median(train[-RECENT:])
    ev = evals[-1] if evals else 0.0
    return sum(step + (ev if evaluates(k) else 0.0) for k in range(last + 1, num_rounds + 1))


def format_left(seconds: float) -> str:
    """'~40 s left', '~12 min left', '~1 h 05 min left'."""
    s = max(int(round(seconds)), 0)
    if s < 90:
        return f"~{s} s left"
    m = int(round(s / 60))
    return f"~{m} min left" if m < 60 else f"~{m // 60} h {m % 60:02d} min left"
