"""A node whose training reward stayed at zero, read from the rows of metrics.jsonl.

Why: GRPO learns from the differences between the rewards of one group. A node all of whose
completions score 0 has groups of equal rewards, so every advantage is 0: its own samples teach
it nothing, and F-TIS (whose filter keeps a far sample only when its advantage is positive) lets
little of its peers' through. In the cross-tokenizer preset run on a task that is not arithmetic,
the BPE node earned 0.00 for 40 rounds and the summary said nothing. The summary's first lines now
name such a node and the two usual causes: its model's warm start (what it can write at all) and
a reward that never pays what it writes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ftis_flwr.server.reporting.run_names import task_label

MOSTLY = 0.5
"""Share of a node's rounds with a zero mean reward above which the summary warns."""
MIN_ROUNDS = 3
"""Rounds with a reward a node needs before the warning is said (round 0 and two more)."""
ARITHMETIC = ("arithmetic", "arithmetic-heldout")
"""Tasks a tiny model's warm start (2-digit additions and subtractions) is made for."""


def _rewards(node: str, rows: list[dict]) -> list[float]:
    out = []
    for row in rows:
        v = (row.get("nodes") or {}).get(node, {}).get("reward_mean")
        if isinstance(v, (int, float)) and math.isfinite(v):
            out.append(float(v))
    return out


def _warm_start(card: Mapping[str, Any], task: Mapping[str, Any]) -> str:
    source = str(card.get("source") or "tiny")
    if source == "tiny":
        model = (f"a tiny model ({card.get('tiny_tokenizer') or 'char'} tokenizer) warm-started on 2-digit "
                 f"arithmetic ({card.get('warmstart_ops') or '+-'}) only")
        if task.get("name") in ARITHMETIC:
            return (f"its model's warm start ({model}) left it writing no right answer: raise its "
                    "warmstart_target or warmstart_steps")
        return f"its model's warm start ({model}) may never write this task's ({task_label(task)}) answers"
    return (f"its model ({source}) may not write answers in the form the reward pays for (a chat model "
            "without task.chat, a base model asked for a format it was never shown)")


def _reward(task: Mapping[str, Any], node: str) -> str:
    names = list(task.get("rewards") or []) or ([task["reward"]] if task.get("reward") else [])
    which = f"the reward ({', '.join(map(str, names))})" if names else f"the task's own reward ({task.get('name')})"
    return (f"{which} may never pay what this model writes: score a few of its completions by hand (the "
            f"trackers' samples/{node} table; `ftis-flwr check` scores cheap answers with it)")


def zero_reward(rows: list[dict], config: Mapping[str, Any]) -> list[str]:
    """One line per node whose mean training reward (``reward_mean``) was 0 in most of its rounds.

    Args:
        rows: The rounds logged (``{"round", "nodes": {node: metrics}}``).
        config: The run's configuration (its ``nodes`` and ``task``), as config.json holds it.

    Returns:
        The warnings, in the order of the run's nodes: how many rounds, what the others earned,
            and why it may be.
    """
    cards = {str(c.get("name")): c for c in config.get("nodes") or [] if isinstance(c, Mapping)}
    task = config.get("task") or {}
    names = list(cards) or sorted({n for row in rows for n in row.get("nodes") or {}})
    series = {n: _rewards(n, rows) for n in names}
    out = []
    for node, values in series.items():
        zeros = sum(1 for v in values if v == 0.0)
        if len(values) < MIN_ROUNDS or zeros <= MOSTLY * len(values):
            continue
        paid = {n: sum(v) / len(v) for n, v in series.items() if n != node and v and sum(v) > 0}
        others = (f"The other nodes earned {', '.join(f'{n} {m:.2f}' for n, m in paid.items())} on average on the "
                  "same task, so the task does pay. " if paid else "No other node earned a reward either. ")
        out.append(f"{node}'s training reward was 0 in {zeros} of its {len(values)} rounds: with rewards of 0 or "
                   "more, every completion of its groups scored 0, so their advantages were 0 and it learned nothing "
                   "from its own samples. "
                   f"{others}Why it may be: {_warm_start(cards.get(node, {}), task)}; or "
                   f"{_reward(task, node)}")
    return out
