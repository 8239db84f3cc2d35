"""The messages of a run outside its rounds, for :class:`~ftis_flwr.server.strategy.FTISStrategy`:
who serves which model card (HELLO, at the start and for nodes that join later), every node's
model built before the first round with its progress in the server's log (BUILD), stopping the
workers when a run ends early (STOP), and collecting every node's final checkpoint (FINISH).

A mixin, so the strategy module keeps the rounds and this one the membership and the end of a
run. What it needs from the strategy it is mixed into is declared as :class:`LifecycleHost`: the
experiment, the roster, the run's names and directories, the event callback, and the strategy's
message exchange (``_send``, which records the nodes it lost in ``_lost``, and ``_reply_node``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from ftis_flwr.config.node_keys import node_keys
from ftis_flwr.config.schema import ExperimentConfig
from ftis_flwr.server.grid_io import HELLO_TIMEOUT, wait_for_nodes
from ftis_flwr.server.replies import BadReply, record, short_reason
from ftis_flwr.server.roster import FederationError, Roster, hello_notes, read_hello
from ftis_flwr.wire import protocol

log = logging.getLogger("ftis_flwr.server.strategy")

BUILD_POLL = 3.0
"""Seconds between two build-status queries while a node builds its model."""
BUILD_ANSWER_TIMEOUT = 60.0
"""How long one build-status query waits for its answers (a node answers at once; starting its
worker takes seconds): a node that does not answer is left to the first round, and never holds
the others' progress reports up for longer."""


def query_type(key: str) -> str:
    """The Flower message type of the query whose record is ``key``: ``"query.<action>"``, the
    action being the key's last part (protocol.HELLO ``"ftis.hello"`` -> ``"query.hello"``).
    Flower routes it to the ClientApp's ``@app.query("<action>")`` function, and refuses it with
    a clear error where the app registers none."""
    return f"{MessageType.QUERY}.{key.rpartition('.')[2]}"


@runtime_checkable
class LifecycleHost(Protocol):
    """What :class:`Lifecycle` reads and calls on the strategy it is mixed into
    (:class:`~ftis_flwr.server.strategy.FTISStrategy` sets or defines each of these). The mixin
    writes only ``_lost`` (it takes the lost nodes of its own exchanges) and ``checkpoints``."""

    cfg: ExperimentConfig
    """The run's experiment: its model cards (``nodes``) and ``rounds.min_nodes``."""
    connect_timeout: float
    """Seconds to wait for the SuperNodes to connect before the first HELLO."""
    roster: Roster
    """Node id <-> model card, bound by HELLO (and by each round's replies)."""
    run_name: str
    """Sent with every query: the node's worker folder is keyed by it."""
    out_dir: str
    """Where the nodes save their final models (sent with FINISH)."""
    checkpoints: dict[str, str]
    """Card -> path of its saved final model, filled by :meth:`Lifecycle.finish`."""
    on_event: Callable[..., None]
    """``on_event(kind, **fields)``: a run event (``node_left_out``, ``checkpoint``...) for the report."""
    _experiment_json: str
    """The experiment as JSON, sent with every query."""
    _lost: dict[int, str]
    """Node id -> why the last :meth:`_send` got no reply from it."""

    def _send(self, grid: Grid, messages: list[Message], timeout: float, what: str = "") -> list[Message]:
        """Send ``messages`` and return the replies within ``timeout``; the rest go to ``_lost``."""
        ...

    def _reply_node(self, reply: Message, rnd: int | str, done: set[int]) -> int | None:
        """The node id ``reply`` answers for, or None to discard it (unknown, or in ``done``)."""
        ...


# A type checker reads the mixin as its host: every member above is known on ``self``. At run time
# the mixin is a plain class, so nothing of the protocol shadows the strategy's own members.
if TYPE_CHECKING:
    _Host = LifecycleHost
else:
    _Host = object


class Lifecycle(_Host):
    """HELLO, BUILD, STOP and FINISH for a :class:`LifecycleHost` (see the module docstring)."""

    def _wait_for_nodes(self, grid: Grid) -> list[int]:
        ids = wait_for_nodes(grid, len(self.cfg.nodes), self.connect_timeout)
        if len(ids) < self.cfg.rounds.min_nodes:
            raise FederationError(f"only {len(ids)} node(s) connected within {self.connect_timeout:.0f} s; "
                                  f"rounds.min_nodes={self.cfg.rounds.min_nodes}")
        return ids

    def introduce(self, grid: Grid, timeout: float, *, first: bool) -> None:
        """Ask every node id not yet known which card it serves (protocol.HELLO) and bind it.

        A SuperNode that serves no card, or claims a card another live node id already serves
        (the first to answer keeps it), is reported once and left out. ``first`` (before the
        first round of a fresh run): a node naming an unknown card or a card without a node
        refuses the run (FederationError listing each, with the fix); later, and when a run
        resumes, such a node is only left out and a card without a node waits for one.

        Args:
            grid: Flower's grid, for the node ids connected now.
            timeout: Seconds to wait for the HELLO answers; a node that does not answer is
                asked again before the next round.
            first: Whether this is the first HELLO of a fresh run (every card must be served).

        Raises:
            FederationError: ``first``, and a node named an unknown card or a card has no node.
        """
        roster = self.roster
        live = set(grid.get_node_ids())  # a card whose node id is gone may move to a new one
        new = roster.unknown(live)
        problems: dict[int, str] = {}
        unanswered: dict[int, str] = {}  # not delivered or no answer in time: asked again next round
        if new:
            keys = node_keys(grid) if roster.pins else {}
            messages = [self._query(protocol.HELLO, nid) for nid in new]
            replies = self._send(grid, messages, timeout, what="which card do you serve")
            unanswered, done = dict(self._lost), set()
            self._lost = {}
            for reply in replies:
                nid = self._reply_node(reply, "hello", done | set(unanswered))
                if nid is None:
                    continue
                done.add(nid)
                try:
                    name, reason, unknown = read_hello(reply)
                    why = roster.admit(nid, name, reason, unknown, live, keys.get(nid))
                except Exception as exc:  # whatever a node sent, the others go on
                    why = str(exc) if isinstance(exc, BadReply) else f"{type(exc).__name__}: {exc}"
                if why is not None:
                    problems[nid] = why
                elif nid in roster.left_out:
                    log.warning("node id %d serves no model card of this run and is left out: %s",
                                nid, roster.left_out[nid])
                    self.on_event("node_left_out", node_id=nid, reason=roster.left_out[nid])
                else:
                    log.info("node id %d serves model card %r", nid, roster.names[nid])
                    for note in hello_notes(reply):
                        log.warning("node id %d: %s", nid, note[:1000])
        if first:
            roster.check_complete({**unanswered, **problems})
        for nid, why in problems.items():  # a later joiner with a problem: left out, not fatal
            roster.left_out[nid] = why
            log.warning("node id %d is left out: %s", nid, why)
            self.on_event("node_left_out", node_id=nid, reason=why)

    def await_builds(self, grid: Grid, limit: float) -> None:
        """Before the first round: have every bound node build its model now (protocol.BUILD) and
        log how far each is, every few seconds, until all are ready or failed, or ``limit``
        seconds have passed. The first round then finds them built; a node that failed, or did not
        answer, is left to the first round, which builds (or fails) it as before.

        Args:
            grid: Flower's grid.
            limit: Seconds to wait for every build in all (``rounds.startup_timeout`` at least).
        """
        pending = set(self.roster.names)
        said: dict[int, str] = {}
        deadline = time.monotonic() + limit
        while pending and time.monotonic() < deadline:
            messages = [self._query(protocol.BUILD, nid) for nid in sorted(pending)]
            wait = max(0.1, min(BUILD_ANSWER_TIMEOUT, deadline - time.monotonic()))
            replies = self._send(grid, messages, wait, what="building the models")
            done: set[int] = set()
            for nid, why in self._lost.items():  # the first round asks it again
                log.warning("node %s did not answer while building (%s); the first round builds it",
                            self.roster.name(nid), why)
                pending.discard(nid)
            for reply in replies:
                nid = self._reply_node(reply, "build", done)
                if nid is None:
                    continue
                done.add(nid)
                name = self.roster.name(nid)
                try:
                    if reply.has_error():
                        raise BadReply(f"code {reply.error.code}: {short_reason(reply.error.reason)}")
                    rec = record(reply.content, protocol.BUILD, ConfigRecord)
                    state, seconds = str(rec.get("state", "")), float(rec.get("seconds", 0.0))
                    progress, error = str(rec.get("progress", "")), str(rec.get("error", ""))
                except Exception as exc:  # whatever a node sent, the others go on
                    log.warning("node %s: no build status (%s); the first round builds it", name, exc)
                    pending.discard(nid)
                    continue
                if state == "ready":
                    log.info("node %s ready: built in %.0f s", name, seconds)
                    self.on_event("node_built", node=name, seconds=seconds)
                    pending.discard(nid)
                elif state == "building":
                    line = f"node {name} building ({seconds:.0f} s): {progress or 'starting'}"
                    if progress != said.get(nid):
                        log.info("%s", line)
                        said[nid] = progress
                else:  # failed, or a worker that will not build: the first round tries and reports
                    log.warning("node %s could not build its model (%s); the first round tries again",
                                name, error or state)
                    pending.discard(nid)
            if pending:
                time.sleep(BUILD_POLL)
        if pending:
            log.warning("still building after %.0f s: %s; the first round waits for them", limit,
                        ", ".join(sorted(self.roster.name(n) for n in pending)))

    def _query(self, key: str, nid: int, **extra: str) -> Message:
        """A query message (protocol.HELLO, BUILD, STOP or FINISH) carrying the experiment and run
        name, typed :func:`query_type` so Flower routes it to its handler."""
        return Message(content=RecordDict({key: ConfigRecord({
            "experiment": self._experiment_json, "run_name": self.run_name, **extra})}),
            dst_node_id=nid, message_type=query_type(key))

    def _stop_workers(self, grid: Grid) -> None:
        """The run ends early: tell every bound node to stop its worker (best effort, short wait)."""
        messages = [self._query(protocol.STOP, nid) for nid in sorted(self.roster.names)]
        try:
            self._send(grid, messages, min(HELLO_TIMEOUT, 30.0), what="stop")
        except Exception as exc:  # the grid itself may be what failed
            log.warning("could not tell the nodes to stop their workers: %s", exc)

    def finish(self, grid: Grid, timeout: float) -> dict[str, str]:
        """Ask each node to save its final model (and stop its worker).

        A node that fails to (error, malformed or missing reply) is logged as ``checkpoint_failed``.

        Args:
            grid: Flower's grid.
            timeout: Seconds to wait for the nodes to save their models.

        Returns:
            Card name -> path of its saved model (``checkpoints``), for the nodes that saved one.
        """
        messages = [self._query(protocol.FINISH, nid, out_dir=self.out_dir)
                    for nid in sorted(grid.get_node_ids()) if nid in self.roster.names]
        replies = self._send(grid, messages, timeout, what="saving final models")
        failures, done = dict(self._lost), set()
        for reply in replies:
            nid = self._reply_node(reply, "finish", done | set(failures))
            if nid is None:
                continue
            done.add(nid)
            try:
                name, path = self._read_checkpoint(nid, reply)
            except Exception as exc:  # whatever a node sent, the others' checkpoints are kept
                failures[nid] = str(exc) if isinstance(exc, BadReply) else f"{type(exc).__name__}: {exc}"
                continue
            self.checkpoints[name] = path
            self.on_event("checkpoint", node=name, path=path)
        for nid, reason in failures.items():
            name = self.roster.name(nid)
            log.warning("node %s could not save its model: %s", name, reason)
            self.on_event("checkpoint_failed", node=name, reason=reason)
        return self.checkpoints

    def _read_checkpoint(self, nid: int, reply: Message) -> tuple[str, str]:
        """(card name, path) from a finish reply, checked against the node id's bound name."""
        if reply.has_error():
            raise BadReply(f"code {reply.error.code}: {short_reason(reply.error.reason)}")
        rec = record(reply.content, protocol.CHECKPOINT, ConfigRecord)
        name, path = rec.get("node"), rec.get("path")
        if not isinstance(name, str) or not isinstance(path, str) or not path:
            raise BadReply(f"record {protocol.CHECKPOINT!r} needs str 'node' and 'path', got "
                           f"{name!r}, {path!r}")
        bound, owner = self.roster.names.get(nid, name), self.roster.owners.get(name, nid)
        if owner != nid:
            raise BadReply(f"node id {nid} claims the checkpoint of model card {name!r}, which node id "
                           f"{owner} serves")
        if name != bound:
            raise BadReply(f"node id {nid} serves model card {bound!r} but its checkpoint claims {name!r}")
        return name, path
