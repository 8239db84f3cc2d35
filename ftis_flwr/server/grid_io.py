"""Talking to the nodes through Flower's Grid: push messages, pull their replies with a deadline,
and wait for SuperNodes to connect, never silently (a line every so often says what is awaited).

Why apart: this is the only place that knows how Flower's grids report an undeliverable message
("" from the SuperLink's grid, no entry from the in-memory one), so the strategy deals only in
replies and per-node reasons.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from flwr.app import Message
from flwr.serverapp import Grid

log = logging.getLogger("ftis_flwr.server.strategy")

PROGRESS_EVERY = 30.0
"""Seconds between "waiting for ..." lines while replies are outstanding."""
POLL_INTERVAL = 0.02
"""Seconds between two pulls of outstanding replies: on average half of it is added to every
round after the last reply lands. The offline default's Flower tax in simulation, two runs side
by side on a loaded 2-core machine (benchmarks/flower_tax.py sim): 0.143 and 0.057 at 0.2 s,
0.063 and 0.046 at 0.02 s. A pull is one lock (simulation) or one local RPC to the SuperLink
(deployment), so 50 a second are cheap."""

HELLO_TIMEOUT = 120.0
"""Longest wait for the answers to HELLO (they build nothing: seconds, a ClientApp start)."""


@dataclass
class Exchange:
    replies: list[Message] = field(default_factory=list)
    sent: dict[str, int] = field(default_factory=dict)
    """message id -> destination node id, for every message the grid accepted"""
    lost: dict[int, str] = field(default_factory=dict)
    """node id -> why no reply came (not delivered, or no reply before the deadline)"""


def exchange(grid: Grid, messages: list[Message], timeout: float, *, what: str = "",
             name_of: Callable[[int], str] = str) -> Exchange:
    """Push ``messages``, then pull until each delivered one is answered or ``timeout`` passes."""
    out = Exchange()
    ids = list(grid.push_messages(messages))
    returned = {i for i in ids if i}
    for i, msg in enumerate(messages):
        # Flower's grids stamp a message's id before pushing it and return "" (SuperLink) or
        # nothing (in-memory) for one they could not store: match by id, not by position
        mid = msg.metadata.message_id or (ids[i] if len(ids) == len(messages) else "")
        if mid and mid in returned:
            out.sent[mid] = msg.metadata.dst_node_id
        else:
            out.lost[msg.metadata.dst_node_id] = ("the message could not be delivered "
                                                  "(push_messages returned no id for it)")
    pending = set(out.sent)
    start = time.monotonic()
    deadline, next_note = start + timeout, start + PROGRESS_EVERY
    while pending and time.monotonic() < deadline:
        for reply in grid.pull_messages(list(pending)):
            out.replies.append(reply)
            pending.discard(reply.metadata.reply_to_message_id)
        if pending:
            time.sleep(POLL_INTERVAL)
        if pending and time.monotonic() >= next_note:  # a long wait is never silent
            waiting = ", ".join(sorted(name_of(out.sent[m]) for m in pending))
            log.info("%s: %d of %d replies after %.0f s; waiting for %s (up to %.0f s more)",
                     what, len(out.sent) - len(pending), len(out.sent), time.monotonic() - start,
                     waiting, deadline - time.monotonic())
            next_note += PROGRESS_EVERY
    for mid in pending:
        out.lost[out.sent[mid]] = f"no reply within the {timeout:.0f} s round timeout"
    return out


def wait_for_nodes(grid: Grid, want: int, timeout: float) -> list[int]:
    """Node ids once ``want`` are connected or ``timeout`` passed, with a line every 10 s."""
    deadline = time.monotonic() + timeout
    shown, next_line = None, time.monotonic() + 10.0
    while True:
        ids = sorted(grid.get_node_ids())
        if len(ids) >= want or time.monotonic() > deadline:
            return ids
        if time.monotonic() >= next_line and ids != shown:
            log.info("waiting for SuperNodes: %d connected (node ids %s), the experiment has %d "
                     "model cards; %.0f s left", len(ids), ids, want, deadline - time.monotonic())
            shown, next_line = ids, time.monotonic() + 10.0
        time.sleep(1.0)
