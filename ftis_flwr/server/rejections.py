"""Which sources' groups receivers rejected, round after round: events per source and a warning
for a source rejected in :data:`REJECTION_STREAK` rounds in a row.

Kept apart from the strategy because it is pure bookkeeping over what the receivers reported;
the streaks are part of the server's saved state, so a resumed run keeps counting.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ftis_flwr.server.replies import TrainReply
from ftis_flwr.wire import protocol

log = logging.getLogger(__name__)

REJECTION_STREAK = 3
"""Rounds in a row a source's groups are rejected by some receiver before the strategy warns."""


class Rejections:
    """The receivers' rejections per source; ``streaks``: source -> consecutive rounds rejected."""

    def __init__(self, on_event: Callable[..., None]):
        self.on_event = on_event
        self.streaks: dict[str, int] = {}

    def note(self, rnd: int, r: TrainReply, forwarded: list[str]) -> set[str]:
        """Log a receiver's rejections; one event per source it rejected (only among the sources
        really ``forwarded`` to it); returns those sources."""
        for reason in r.rejections:
            log.warning("node %s: %s", r.name, reason)
        sources = set()
        for src in forwarded:
            groups, samples, payloads = (r.metrics.get(f"{src}/{k}_rejected", 0.0)
                                         for k in ("groups", "samples", "payloads"))
            if groups > 0 or payloads > 0:
                sources.add(src)
                why = "; ".join(x for x in r.rejections if x.startswith(f"{src}: ")
                                and protocol.REWARDS_NOTE not in x and protocol.REFUSED_NOTE not in x)
                self.on_event("payload_rejected", round=rnd, node=r.name, source=src, groups=groups,
                              samples=samples, reason=why or "see the receiver's log")
            prefix = f"{src}/text_refused_"
            for key in sorted(k for k in r.metrics if k.startswith(prefix)):
                # completions the receiver's tokens cannot stand for: counted, never weighed
                self.on_event(f"text_refused:{key[len(prefix):]}", round=rnd, node=r.name, source=src,
                              samples=r.metrics[key], of=r.metrics.get(f"{src}/text_samples", 0.0))
            corrected = r.metrics.get(f"{src}/rewards_corrected", 0.0)
            if corrected > 0:  # claimed rewards the receiver's own scoring replaced: not used, seen
                self.on_event("rewards_corrected", round=rnd, node=r.name, source=src, samples=corrected)
        return sources

    def end_round(self, rnd: int, rejected: set[str]) -> None:
        """Count the round's ``rejected`` sources; warn for those rejected REJECTION_STREAK rounds in a row."""
        self.streaks = {src: self.streaks.get(src, 0) + 1 for src in rejected}
        for src, n in self.streaks.items():
            if n >= REJECTION_STREAK:
                log.warning("round %d: node %s keeps sending bad data: its groups were rejected in %d "
                            "consecutive rounds", rnd, src, n)
                self.on_event("payload_rejected_repeatedly", round=rnd, node=src, rounds=n)
