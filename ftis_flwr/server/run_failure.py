"""Why a run stops or ends failed, said once and on one line.

Why apart: the strategy records one failure per node and round (``events.jsonl`` keeps each
reason), but an operator needs the one line that says what failed and what to do, not
the same traceback once per node and per layer, and ``ftis-flwr run`` needs the run to end
failed (exit 1) when it did not do what it was asked. Three rules:

- a node's failure reason is cut to the words that say it (:func:`.replies.short_reason`): the Ray and
  Flower wrapping of an exception a ClientApp raised, and a traceback's frames, are left out;
- a reward that fails (raises, returns the wrong number of values or a non-finite one:
  ``RewardError``) stops the run after the round in which it failed (:func:`reward_stop`): every
  node computes the same reward code on every round, so every later round would fail the same
  way, and a run that trains on nothing is worse than one that stops;
- an environment that fails (``EnvironmentFault``: ``task.environment``'s ``reset`` or ``get_reward``)
  stops the run the same way (:func:`environment_stop`);
- a node that failed every round (:func:`failed_throughout`) makes the run end failed once its
  outputs are written: the run's results are the other nodes' alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ftis_flwr.server.replies import short_reason
from ftis_flwr.server.roster import FederationError


class RunFailed(FederationError):
    """The run stopped, or ended, failed; the message is one line: what failed and what to do."""


_REWARD = re.compile(r"RewardError: (?P<fault>reward .*)")
"""A reward's failure as the task's reward functions word it (``ftis_flwr.tasks.reward_funcs``)."""


def reward_fault(reason: object) -> str:
    """The reward's failure in a node's failure reason (``reward 'f' raised ValueError: ...``),
    or "" when the node failed for another reason."""
    found = _REWARD.search(short_reason(reason, limit=10_000))
    return found.group("fault").strip() if found else ""


def node_list(nodes: list[str]) -> str:
    """``node a`` / ``nodes a and b`` / ``nodes a, b and c``."""
    if len(nodes) == 1:
        return f"node {nodes[0]}"
    return f"nodes {', '.join(nodes[:-1])} and {nodes[-1]}"


def by_reason(failures: Mapping[str, str]) -> str:
    """``"a, b: <reason>; c: <other reason>"``: each reason once, after the nodes that failed with it."""
    grouped: dict[str, list[str]] = {}
    for node, reason in failures.items():
        grouped.setdefault(short_reason(reason), []).append(str(node))
    return "; ".join(f"{', '.join(nodes)}: {reason}" for reason, nodes in grouped.items())


def reward_stop(rnd: int, failures: Mapping[str, str], word: str = "round") -> str:
    """The line that stops the run when a node's failure in ``rnd`` is its reward's, or "".

    Args:
        rnd: The round (the step, under the asynchronous schedule).
        failures: Node name -> its failure reason this round.
        word: What ``rnd`` counts ("round" or "step").

    Returns:
        One line naming each failed reward with the nodes it failed on (the same fault once),
            and the fix; "" when no reward failed.
    """
    faults: dict[str, list[str]] = {}
    for node, reason in failures.items():
        fault = reward_fault(reason)
        if fault:
            faults.setdefault(fault, []).append(node)
    if not faults:
        return ""
    said = "; ".join(f"{node_list(nodes)}: {fault}" for fault, nodes in faults.items())
    return (f"{word} {rnd}: the reward failed on {said}. The run stopped at once: every node computes the "
            "same reward on every round, so each would fail again. Fix the reward function (it must return "
            "one finite number, or None, per completion) and run again; `ftis-flwr check` calls it on cheap "
            "answers first")


_ENVIRONMENT = re.compile(r"EnvironmentFault: (?P<fault>.*)")
"""An environment's failure (``task.environment``) as :mod:`ftis_flwr.tasks.environment` words it."""


def environment_stop(rnd: int, failures: Mapping[str, str], word: str = "round") -> str:
    """The line that stops the run when a node's failure in ``rnd`` is its environment's
    (``reset`` or ``get_reward`` raised, hung or broke TRL's contract), or "": every node runs the
    same environment on the same rows, so the next rounds would fail the same way (as a reward's)."""
    faults: dict[str, list[str]] = {}
    for node, reason in failures.items():
        found = _ENVIRONMENT.search(short_reason(reason, limit=10_000))
        if found:
            faults.setdefault(found.group("fault").strip(), []).append(node)
    if not faults:
        return ""
    said = "; ".join(f"{node_list(nodes)}: {fault}" for fault, nodes in faults.items())
    return (f"{word} {rnd}: the environment failed on {said}. The run stopped at once: every node runs the same "
            "environment on the same rows, so each would fail again. Fix the environment (task.environment: "
            "reset(**row) returns None or a string, get_reward() a finite number) and run again")


def failed_throughout(rows: list[dict], events: list[dict], nodes: list[str], steps: bool = False) -> str:
    """The line that ends the run failed when a node replied in no round at all, or "".

    Args:
        rows: The rounds logged (``{"round", "nodes", ...}``), as the reporter keeps them.
        events: The run's events (``node_failed`` with its ``reason``).
        nodes: Every node of the run.
        steps: The rows are an asynchronous run's steps.

    Returns:
        One line naming each such node, how many rounds it failed and its last reason.
    """
    if not rows:
        return ""
    never = [n for n in nodes if not any(n in row["nodes"] for row in rows)]
    if not never:
        return ""
    last = {e.get("node"): e.get("reason", "") for e in events if e.get("event") == "node_failed"}
    span = f"{'steps' if steps else 'rounds'} {rows[0]['round']}-{rows[-1]['round']}"
    said = "; ".join(f"{n}: {short_reason(last[n], 300)}" for n in never if last.get(n))
    return (f"{node_list(never)} failed every {'step' if steps else 'round'} ({span}), so the run's results are "
            f"the other nodes' alone" + (f"; last reason: {said}" if said else "")
            + " (each reason is in events.jsonl)")


def exception_line(exc: BaseException) -> str:
    """What stopped a run, on one line: a run failure's own words, else the exception's type and
    its message's first line."""
    text = str(exc).strip()
    if isinstance(exc, FederationError):
        return " ".join(line.strip() for line in text.splitlines() if line.strip())
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
