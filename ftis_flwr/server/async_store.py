"""The asynchronous schedule's forwarding store: each source's payloads by the round that made
them, and which receiver has had which (:mod:`ftis_flwr.server.async_rounds` drives it).

A node's next round carries every payload of the others it has not had yet, no older than
``exchange.max_staleness`` of its source's rounds, joined into one payload per source; an older
one is forgotten and counted as dropped for each receiver that never had it. A message lost in
flight gives its groups back (:meth:`Store.rewind`), and the store is saved with the run
(:func:`store_state`, :func:`restore_store`) so a resumed run forwards what it would have.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ftis_flwr.server.budget import Payload
from ftis_flwr.wire.selection import Cuttable, group_count, merge

log = logging.getLogger("ftis_flwr.server.strategy")


@dataclass
class Sent:
    """One round message in flight."""

    nid: int
    rnd: int
    deadline: float
    sent_at: float
    given_before: dict[str, int] = field(default_factory=dict)
    """source -> the receiver's ``Store.given`` entry before this message took its groups (a
    saved state rolls it back: a resumed run sends them again)"""
    dropped_before: int = 0


@dataclass
class Store:
    """Every source's payloads still young enough to forward, by the source's round (version)."""

    max_staleness: int
    payloads: dict[str, dict[int, Payload]] = field(default_factory=dict)
    latest: dict[str, int] = field(default_factory=dict)
    given: dict[tuple[str, str], int] = field(default_factory=dict)
    """(receiver, source) -> newest version of the source already sent to (or dropped for) it"""
    dropped: dict[str, int] = field(default_factory=dict)
    """receiver -> groups too stale to forward to it, not yet reported"""

    def add(self, source: str, version: int, payload: Payload, receivers: list[str]) -> None:
        """Keep ``source``'s groups of its round ``version``; forget (and count as dropped for each
        of ``receivers`` that never had them) versions now more than ``max_staleness`` old."""
        self.payloads.setdefault(source, {})[version] = payload
        self.latest[source] = max(version, self.latest.get(source, version))
        for v in [v for v in self.payloads[source] if v < self.latest[source] - self.max_staleness]:
            n = group_count(*self.payloads[source].pop(v)[:2])
            for r in receivers:
                if r != source and self.given.get((r, source), -1) < v:
                    self.dropped[r] = self.dropped.get(r, 0) + n

    def rewind(self, receiver: str, sent: Sent) -> None:
        """Undo what a message to ``receiver`` that was lost (``sent``) took from the store: its
        groups and its stale-drop count go out again with the receiver's next message."""
        self.given = {k: v for k, v in self.given.items() if k[0] != receiver}
        self.given.update({(receiver, src): v for src, v in sent.given_before.items()})
        pending = sent.dropped_before + self.dropped.pop(receiver, 0)  # its count + drops since
        if pending:
            self.dropped[receiver] = pending

    def take(self, receiver: str, exclude: set[str]) -> tuple[dict[str, list[tuple[int, Payload]]], int]:
        """Per source (but ``exclude``), the (staleness, payload) pairs ``receiver`` has not had
        yet, oldest first; and how many groups became too stale before it could have them."""
        fresh: dict[str, list[tuple[int, Payload]]] = {}
        for src, versions in self.payloads.items():
            if src in exclude:
                continue
            seen = self.given.get((receiver, src), -1)
            fresh_src = [(self.latest[src] - v, versions[v]) for v in sorted(versions) if v > seen]
            if fresh_src:
                fresh[src] = fresh_src
            self.given[(receiver, src)] = self.latest[src]
        return fresh, self.dropped.pop(receiver, 0)


def store_state(store: Store) -> tuple[dict[str, Payload], dict]:
    """The store as ``ServerState`` parts: payloads keyed ``<source>@<version>``, the rest JSON."""
    payloads = {f"{src}@{v}": p for src, versions in store.payloads.items() for v, p in versions.items()}
    return payloads, {"latest": store.latest, "given": [[r, src, v] for (r, src), v in store.given.items()],
                      "dropped": store.dropped}


def restore_store(store: Store, payloads: dict[str, Payload], doc: dict) -> None:
    for key, payload in payloads.items():
        src, _, version = key.rpartition("@")
        store.payloads.setdefault(src, {})[int(version)] = payload
    store.latest = {str(k): int(v) for k, v in doc["latest"].items()}
    store.given = {(str(r), str(src)): int(v) for r, src, v in doc["given"]}
    store.dropped = {str(k): int(v) for k, v in doc["dropped"].items()}


def join(parts: list[tuple[int, Payload]]) -> tuple[Payload, list[int]]:
    """One payload (and per-group staleness) from one source's payloads, oldest first. When
    they cannot be joined (packed differently), only the newest is kept and the rest logged."""
    if len(parts) == 1:
        stale, payload = parts[0]
        return payload, [stale] * group_count(payload[0], payload[1])
    try:
        reads = [Cuttable(p[0], p[1]) for _, p in parts]
        arrays, meta = merge(reads)
    except Exception as exc:  # whatever the bytes are: the newest goes alone
        log.warning("async: %d payloads of one source could not be joined (%s); forwarding the newest", len(parts), exc)
        return join(parts[-1:])
    indices = [i for _, p in parts for i in p[2]]
    staleness = [s for (s, _), r in zip(parts, reads) for _ in range(r.n)]
    return (arrays, meta, indices), staleness
