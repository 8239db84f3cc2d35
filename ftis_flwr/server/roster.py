"""Which Flower node id serves which model card of the run: bound once, checked on every reply.

Why apart: membership is the strategy's security boundary (a node's name is what receivers
filter on) and has rules of its own: a node id is bound to a card by its HELLO answer (or its
first good reply), one card has one live node id, a SuperNode serving no card is left out, and
before the first round of a fresh run every card must be served. Pure bookkeeping: no grid, no messages.
"""

from __future__ import annotations

import logging

from flwr.app import ConfigRecord, Message

from ftis_flwr.config.node_keys import fingerprint
from ftis_flwr.server.replies import BadReply, record, short_reason
from ftis_flwr.wire import protocol

log = logging.getLogger(__name__)


class FederationError(RuntimeError):
    """The federation cannot go on (too few nodes connected or replying, cards not served)."""


def read_hello(reply: Message) -> tuple[str, str, bool]:
    """(card name or "", reason, unknown card?) from a HELLO answer; BadReply if malformed."""
    if reply.has_error():
        raise BadReply(f"code {reply.error.code}: {short_reason(reply.error.reason)}")
    rec = record(reply.content, protocol.HELLO, ConfigRecord)
    name, reason, unknown = rec.get("node", ""), rec.get("reason", ""), rec.get("unknown", False)
    if not isinstance(name, str) or not isinstance(reason, str) or not isinstance(unknown, bool):
        raise BadReply(f"hello needs str 'node', str 'reason', bool 'unknown', got {dict(rec)!r}")
    return name, reason, unknown


def hello_notes(reply: Message) -> list[str]:
    """The lines a node said in its HELLO answer before building (:func:`ftis_flwr.config.plan.build_notes`);
    none from a node that sends none, one saying so from a node whose notes are not text."""
    try:
        notes = record(reply.content, protocol.HELLO, ConfigRecord).get("notes", "")
    except BadReply:
        return []
    if not isinstance(notes, str):
        return [f"its HELLO notes are not text ({type(notes).__name__}); ignored"]
    return [line for line in notes.splitlines() if line.strip()][:8]


class Roster:
    def __init__(self, cards: list[str], pins: dict[str, bytes] | None = None):
        self.cards = list(cards)
        self.pins = dict(pins or {})  # card name -> DER of the one public key that may claim it
        self.names: dict[int, str] = {}      # Flower node id -> card name it serves
        self.owners: dict[str, int] = {}     # card name -> the node id bound to it
        self.claimed: dict[int, str] = {}    # node id -> name its last good reply claimed
        self.left_out: dict[int, str] = {}   # node id -> why it takes no part in this run

    def name(self, nid: int) -> str:
        return self.names.get(nid, f"node-{nid}")

    def by_card(self, per_node: dict) -> dict[str, object]:
        """Node id -> value, as card name -> value in the federation's order (replies come in any
        order; a line naming several nodes should read the same on every run)."""
        named = {self.name(nid): value for nid, value in per_node.items()}
        rank = {card: i for i, card in enumerate(self.cards)}
        return dict(sorted(named.items(), key=lambda kv: (rank.get(kv[0], len(rank)), kv[0])))

    def unknown(self, node_ids) -> list[int]:
        """Node ids neither bound nor left out: they get a HELLO."""
        return [n for n in sorted(node_ids) if n not in self.names and n not in self.left_out]

    def bind(self, nid: int, name: str, live: set[int]) -> str | None:
        """Bind a node id to a card; the reason it cannot, or None. ``live``: node ids connected."""
        bound = self.names.get(nid)
        if bound is not None and bound != name:
            return f"node id {nid} served model card {bound!r} and now claims {name!r}"
        owner = self.owners.get(name)
        if owner is not None and owner != nid:
            if owner in live:  # two SuperNodes claim one model card: the first keeps it
                return (f"model card {name!r} is already served by node id {owner}; give each "
                        "SuperNode its own card")
            log.warning("model card %r moves from node id %d (gone) to node id %d", name, owner, nid)
            del self.names[owner]
        self.names[nid], self.owners[name] = name, nid
        return None

    def admit(self, nid: int, name: str, reason: str, unknown: bool, live: set[int],
              key: bytes | None = None) -> str | None:
        """Apply one HELLO answer: bind, leave out (no card, a card pinned to another key, a card
        already served), or return the problem. ``key``: DER of the node's public key, if known."""
        if not name and not unknown:
            self.left_out[nid] = reason
            return None
        if name not in self.cards:
            return reason or f"it serves model card {name!r}, which the experiment does not define"
        if name in self.pins and key != self.pins[name]:
            self.left_out[nid] = (f"it claims model card {name!r}, which is pinned to the SuperNode key "
                                  f"{fingerprint(self.pins[name])}; this SuperNode's key is {fingerprint(key)}"
                                  + ("" if key else " (no node keys: an authenticated deployment, SuperLink "
                                                    "--enable-supernode-auth, is needed)"))
            return None
        owner = self.owners.get(name)
        if owner is not None and owner != nid and owner in live and self.names.get(nid) is None:
            # a second SuperNode claims a card already served: the first to answer keeps it, and
            # this one is left out and named (one misconfigured or hostile SuperNode cannot stop
            # a federation from starting)
            self.left_out[nid] = (f"it claims model card {name!r}, which node id {owner} already serves; "
                                  "give each SuperNode its own card")
            return None
        return self.bind(nid, name, live)

    def check_complete(self, problems: dict[int, str]) -> None:
        """Before the first round: FederationError listing every problem and unserved card."""
        served = set(self.names.values())
        lines = [f"node id {nid}: {why}" for nid, why in problems.items()]
        lines += [f"model card {name!r} has no SuperNode: start one with --node-config 'card=\"{name}\"' "
                  "(simulation: num-supernodes = the number of cards)"
                  for name in self.cards if name not in served]
        if lines:
            lines += [f"node id {nid} is left out: {why}" for nid, why in sorted(self.left_out.items())]
            bound = ", ".join(f"{n} = node id {i}" for i, n in sorted(self.names.items())) or "none"
            raise FederationError("the federation cannot start:\n  " + "\n  ".join(lines)
                                  + f"\n  (cards served so far: {bound})")
