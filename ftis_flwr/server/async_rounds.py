"""The asynchronous schedule (``exchange.schedule=async``): no node waits for the slowest one.

Why: rounds are synchronous by default, so in a federation of a small and a large model the
small one idles while the large one generates (docs/performance.md measures half of each round). Here the
strategy gives a node its next round as soon as its reply is in, with the other nodes' groups
that arrived since its last round (bounded staleness, as in asynchronous RL trainers such as
AReaL). The importance weights need no change: every group carries the log-probs of the policy
that sampled it, whichever update of its source that was.

Staleness of a group = updates its source has taken since it generated it, as far as the server
knows (the source's newest reply: 0).
A node's round k message carries, per other source, every payload it has not been sent yet
whose staleness is at most ``exchange.max_staleness``, joined into one payload per source
(:func:`ftis_flwr.wire.selection.merge`); older ones are dropped and counted. The budget
(``exchange.max_foreign_groups``) then applies as in synchronous rounds. Each node takes
``rounds.num_rounds`` rounds of its own, and a node that gets there while another has not keeps
going (its idle time trains it and feeds the others), then takes one final round once all have.

What a run logs: one row per *step* (the replies of one pull, usually one node's); each node's
own round is its ``round`` metric, ``wall_seconds`` the time since the first round was sent,
and per round ``foreign_staleness_mean`` / ``_max``, ``foreign_groups_stale_dropped``, and the
server's share of the round: ``server_reply_seconds`` (handling the node's previous reply,
saving included) and ``server_send_seconds`` (building and pushing this round's message).
After every step the server's side (the forwarding store, each node's last ended round, the
prompt cursor) is saved with the run (``ftis_flwr.server.state``), so a stopped run resumes
(``resume=<run dir>``): each node continues after its last round the server logged, rewinding
its own saved state if it had gone further, and the step numbers continue. Messages in flight
when the server stopped are sent again. A card's SuperNode that comes back under a new node id
(restarted or replaced) takes the card's place in the schedule (``node_rebound`` event); every
card must be served at the start of a fresh run, as in synchronous rounds, while a resumed run
goes on without a card whose SuperNode is away and takes it back when it returns.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from flwr.app import MetricRecord
from flwr.serverapp import Grid

from ftis_flwr.config.choices import AdvantageMode
from ftis_flwr.server.async_host import AsyncHost
from ftis_flwr.server.async_store import Sent, Store, join, restore_store, store_state
from ftis_flwr.server.budget import add_idle
from ftis_flwr.server.grid_io import POLL_INTERVAL, PROGRESS_EVERY
from ftis_flwr.server.replies import flatten
from ftis_flwr.server.roster import FederationError
from ftis_flwr.server.run_failure import RunFailed
from ftis_flwr.server.state import ServerState, ServerStateError, save_server_state

log = logging.getLogger("ftis_flwr.server.strategy")

ASYNC_HELLO_TIMEOUT = 30.0
"""Longest wait for a new SuperNode's HELLO answer while the other nodes' replies wait (a
deployed SuperNode answers in seconds: its 3 s poll, then a fresh ClientApp process)."""
PARKED_RETRY = 10.0
"""Seconds before a round is sent again to a node id that had no route but is listed again."""
REHELLO_AFTER = 300.0
"""Seconds before a node id that did not answer its HELLO is asked again."""


class AsyncRounds:
    """Runs an :class:`~ftis_flwr.server.strategy.FTISStrategy`'s rounds without a barrier between nodes.

    It reuses the strategy's message building (:meth:`FTISStrategy.message`, the budget) and reply
    handling (:meth:`FTISStrategy.aggregate_train`: binding, checks, rejections, metrics), so a
    node sees the same messages and the server applies the same checks as in synchronous rounds.
    """

    def __init__(self, strategy: AsyncHost, grid: Grid, timeout: float):
        self.s, self.grid, self.timeout = strategy, grid, timeout
        self.store = Store(strategy.cfg.exchange.max_staleness)
        self.inflight: dict[str, Sent] = {}   # message id -> what it is
        self.last_reply: dict[int, float] = {}  # node id -> when its last round ended
        self.ok: dict[int, bool] = {}           # node id -> did its latest round succeed
        self.done: dict[int, int] = {}          # node id -> the last round it ended (-1: none yet)
        self.final_sent: set[int] = set()       # node ids sent their last (non-generating) round
        self._undelivered: dict[int, int] = {}  # node id -> round whose message found no route, this step
        self._unbuilt: dict[int, str] = {}      # of those, node id -> why its message could not be built
        self.parked: dict[int, float] = {}      # node id with no route (its SuperNode gone) -> since when
        self.starting: set[int] = set()         # node ids whose first round (of this session) is out
        self._handled: dict[int, float] = {}    # node id -> server seconds its last reply took
        self._rehello: dict[int, float] = {}    # node id that did not answer its HELLO -> ask again at
        self.absent: dict[str, tuple[int, bool]] = {}
        """card -> (its last ended round, final round done) for a card whose SuperNode was away when
        the run resumed: it joins the schedule when a SuperNode serves it again"""
        self.t0 = time.monotonic()
        strategy.step_word = "step"

    # ---------------------------------------------------------------- sending
    def _next(self, nid: int, rnd: int) -> None:
        """Node ``nid`` ended its round ``rnd``: send what comes next, or nothing when it is done.

        Up to ``num_rounds`` every node follows the schedule. A node past it keeps taking rounds
        (generating, evaluating every ``eval_every`` of its own rounds) while another node has
        not ended its round ``num_rounds``: its time trains it and feeds the slower ones. Once all
        have, it takes one final round (an update on what arrived, no generation, evaluation)."""
        last = self.s.cfg.rounds.num_rounds
        # a node without a route (parked) is not waited for: it may never come back
        others_running = any(self.done.get(n, -1) < last for n in self.done if n != nid and n not in self.parked)
        self.done[nid] = rnd
        if rnd < last - 1 or (rnd < last and others_running):
            self._send(nid, rnd + 1, generate=True)
        elif rnd == last - 1:
            self._send(nid, last, generate=False)  # the schedule's last round, as in sync
        elif others_running:
            self._send(nid, rnd + 1, generate=True)
        elif nid not in self.final_sent:
            self._send(nid, rnd + 1, generate=False, evaluate=True)

    def _send(self, nid: int, rnd: int, *, generate: bool, evaluate: bool | None = None) -> None:
        s, t_send = self.s, time.perf_counter()
        name = s.roster.name(nid)
        prompts = s.next_prompts() if generate else []
        if not generate:
            self.final_sent.add(nid)
        given_before = {src: v for (r, src), v in self.store.given.items() if r == name}
        dropped_before = self.store.dropped.get(name, 0)
        fresh, dropped = ({}, 0) if s.cfg.advantage.mode == AdvantageMode.ALONE else self.store.take(
            name, {s.roster.names.get(nid), s.roster.claimed.get(nid)})
        try:
            others, staleness = {}, []
            for src, parts in fresh.items():
                others[src], st = join(parts)
                staleness += st
            # where a round's time outside the node goes (reported with the node's next round):
            # the server handling its last reply, then building and pushing this message
            extra = {"foreign_groups_stale_dropped": float(dropped),
                     "server_reply_seconds": self._handled.pop(nid, 0.0)}
            if staleness:
                extra.update(foreign_staleness_mean=sum(staleness) / len(staleness),
                             foreign_staleness_max=float(max(staleness)))
            msg = s.message(nid, rnd, prompts, others, evaluate=evaluate, limit=self._limit(nid), **extra)
        except Exception as exc:  # this node's round fails; its groups go out with its next one
            self.store.rewind(name, Sent(nid, rnd, 0.0, 0.0, given_before, dropped_before))
            self._unbuilt[nid] = s.unsent(nid, rnd, exc)
            self._undelivered[nid] = rnd
            return
        limit = self._limit(nid)
        now = time.monotonic()
        ids = list(self.grid.push_messages([msg]))
        s._received[nid]["server_send_seconds"] = time.perf_counter() - t_send
        mid = msg.metadata.message_id or (ids[0] if ids else "")
        if not mid or mid not in ids:
            self._undelivered[nid] = rnd
            return
        self.inflight[mid] = Sent(nid, rnd, now + limit, now, given_before, dropped_before)

    def _limit(self, nid: int) -> float:
        """How long the server waits for node ``nid``'s reply: a node's first round of a run (or of
        a resumed run) builds or restores it, so it gets the longer start-up deadline."""
        s = self.s
        return max(self.timeout, s.cfg.rounds.startup_timeout) if nid in self.starting else self.timeout

    # ---------------------------------------------------------------- loop
    def run(self) -> None:
        s, rounds = self.s, self.s.cfg.rounds.num_rounds
        nodes = s.bound_nodes(self.grid)
        self.starting = set(nodes)
        step = 0 if s._async_state is None else self._restore(s._async_state, nodes)
        for nid in nodes:
            self.last_reply[nid] = time.monotonic()
            if s._async_state is None:
                self.done[nid] = -1
                self._send(nid, s._first_round, generate=rounds > 0)
            elif nid not in self.final_sent:
                self._next(nid, self.done[nid])  # what comes after its last logged round, again
        next_note = time.monotonic() + PROGRESS_EVERY
        while self.inflight or self._undelivered:
            replies = list(self.grid.pull_messages(list(self.inflight))) if self.inflight else []
            now = time.monotonic()
            answered = {r.metadata.reply_to_message_id for r in replies}
            late = {mid: x for mid, x in self.inflight.items() if mid not in answered and now > x.deadline}
            if not replies and not late and not self._undelivered:
                if now >= next_note:
                    waiting = ", ".join(f"{s.roster.name(x.nid)} (round {x.rnd})" for x in self.inflight.values())
                    log.info("async: waiting for %s", waiting)
                    next_note = now + PROGRESS_EVERY
                time.sleep(POLL_INTERVAL)
                continue
            done = self._step(step, replies, late, now)
            step += 1
            for nid, rnd in done:
                self._next(nid, rnd)
            self._rebind()
            healthy = sum(self.ok.values())
            if healthy < s.cfg.rounds.min_nodes:
                failed = ", ".join(s.roster.name(n) for n, good in self.ok.items() if not good)
                raise FederationError(f"async step {step - 1}: {healthy} node(s) healthy, fewer than "
                                      f"rounds.min_nodes={s.cfg.rounds.min_nodes} (failed: {failed})")

    def _rebind(self) -> None:
        """A card's SuperNode came back under a new node id (restarted after a crash, or replaced):
        bind it as synchronous rounds do (:meth:`FTISStrategy.introduce`) and move the card's
        place in the schedule to it. A round in flight to the old id is sent again to the new one
        with the groups it carried; the card's worker state on disk is the same, so its worker
        resumes (rewinding if it had gone further). Checked after every step, one node-id listing;
        a HELLO only goes out when an unknown node id appears, and to one that did not answer, only
        after ``REHELLO_AFTER`` seconds (the others wait while it is asked: at most
        ``ASYNC_HELLO_TIMEOUT``)."""
        s, now = self.s, time.monotonic()
        live = set(self.grid.get_node_ids())
        for nid in [n for n, since in self.parked.items() if n in live and now - since >= PARKED_RETRY]:
            del self.parked[nid]  # its node id is reachable again: its next round, once more
            self._next(nid, self.done.get(nid, -1))
        unknown = s.roster.unknown(live)
        if not any(now >= self._rehello.get(nid, 0.0) for nid in unknown):
            return
        before = dict(s.roster.names)
        s.introduce(self.grid, min(self.timeout, ASYNC_HELLO_TIMEOUT), first=False)
        for nid in s.roster.unknown(self.grid.get_node_ids()):  # asked and silent: not every step
            self._rehello[nid] = time.monotonic() + REHELLO_AFTER
        for nid, name in list(s.roster.names.items()):
            old = next((o for o, n in before.items() if n == name and o != nid), None)
            if nid not in before and name in self.absent:  # away when the run resumed, back now
                last, final = self.absent.pop(name)
                self.done[nid], self.ok[nid], self.last_reply[nid] = last, True, time.monotonic()
                self.starting.add(nid)
                log.info("async: model card %r joins as node id %d; it continues after its round %d",
                         name, nid, last)
                s.on_event("node_rebound", node=name, old_node_id=None, node_id=nid, after_round=last)
                if final:
                    self.final_sent.add(nid)
                else:
                    self._next(nid, last)
                continue
            if nid in before or old is None or old in s.roster.names:
                continue  # not a card that moved (a new card cannot join: all are bound at the start)
            lost = [mid for mid, x in self.inflight.items() if x.nid == old]
            for mid in lost:  # its groups go again, to the new id
                self.store.rewind(name, self.inflight.pop(mid))
            self._undelivered.pop(old, None)
            self.parked.pop(old, None)
            last = self.done.pop(old, -1)
            final = old in self.final_sent
            self.final_sent.discard(old)
            self.ok.pop(old, None)
            self.last_reply.pop(old, None)
            self.starting.discard(old)
            self.done[nid], self.ok[nid], self.last_reply[nid] = last, True, time.monotonic()
            self.starting.add(nid)  # its worker may have to start again: the start-up deadline
            log.info("async: model card %r moved from node id %d to node id %d; it continues after its "
                     "round %d", name, old, nid, last)
            s.on_event("node_rebound", node=name, old_node_id=old, node_id=nid, after_round=last)
            if final and not lost:
                self.final_sent.add(nid)  # it had ended its final round already
            else:
                self._next(nid, last)

    # ---------------------------------------------------------------- state
    def _save(self, step: int, ended: dict[int, int]) -> None:
        """The server's side after ``step`` (``ended``: node id -> round it ended in this step):
        what a resumed run continues from. A node whose last round is still in flight is saved
        as not having had it (it is sent again)."""
        s = self.s
        if not s.state_dir:
            return
        snapshot = replace(self.store, given=dict(self.store.given), dropped=dict(self.store.dropped))
        for x in self.inflight.values():  # as before its message: the groups in it are sent again
            snapshot.rewind(s.roster.name(x.nid), x)
        payloads, store = store_state(snapshot)
        in_flight = {x.nid for x in self.inflight.values()}
        doc = {"store": store, "wall_seconds": time.monotonic() - self.t0,
               "done": {**{name: r for name, (r, _) in self.absent.items()},
                        **{s.roster.name(n): r for n, r in {**self.done, **ended}.items()}},
               "final_done": sorted([s.roster.name(n) for n in self.final_sent if n not in in_flight]
                                    + [name for name, (_, final) in self.absent.items() if final])}
        save_server_state(s.state_dir, ServerState(step, s._next_prompt, payloads, s.rejections.streaks, schedule=doc))

    def _restore(self, state: ServerState, nodes: list[int]) -> int:
        """Continue after ``state``: returns the next step number."""
        s, doc = self.s, state.schedule
        restore_store(self.store, state.groups, doc["store"])
        done = {str(k): int(v) for k, v in doc["done"].items()}
        missing = sorted(set(done) - {s.roster.name(n) for n in nodes})
        if len(missing) == len(done):
            raise ServerStateError("resuming an asynchronous run needs at least one of its nodes; none of "
                                   f"{', '.join(missing)} is connected")
        for name in missing:  # away at the restart: it joins when its SuperNode is back (_rebind)
            self.absent[name] = (done[name], name in doc["final_done"])
            log.warning("async: model card %r has no SuperNode yet; it continues after its round %d "
                        "when one serves it", name, done[name])
        for nid in nodes:
            self.done[nid] = done.get(s.roster.name(nid), -1)
            if s.roster.name(nid) in doc["final_done"]:
                self.final_sent.add(nid)
        if len(self.final_sent) == len(nodes):
            raise ValueError(f"nothing to resume: every node ended its last round by step {state.round}")
        self.t0 = time.monotonic() - float(doc["wall_seconds"])
        log.info("async: resuming after step %d; nodes' last rounds: %s", state.round,
                 ", ".join(f"{k} {v}" for k, v in done.items()))
        return state.round + 1

    def _step(self, step: int, replies: list, late: dict[str, Sent], now: float) -> list[tuple[int, int]]:
        """Hand one pull's replies (and the late or undelivered messages) to the strategy; log
        the step; returns (node id, round) of every round that ended."""
        s, t_step = self.s, time.perf_counter()
        ended = {x.nid: x for x in late.values()}
        s._sent = {mid: x.nid for mid, x in self.inflight.items()}
        s._lost = {x.nid: f"no reply within the {x.deadline - x.sent_at:.0f} s round timeout" for x in late.values()}
        for nid in self._undelivered:
            s._lost[nid] = self._unbuilt.get(nid) or ("the message could not be delivered (push_messages "
                                                     "returned no id for it); the node waits for a route")
        round_of = {x.nid: x.rnd for x in self.inflight.values()}
        round_of.update(self._undelivered)
        for r in replies:
            x = self.inflight.get(r.metadata.reply_to_message_id)
            if x is not None:
                ended[x.nid] = x
        s.aggregate_train(step, replies)
        s.peers.check()
        s.tasks.check()
        outcome = s.history[-1]
        for mid in list(self.inflight):
            if self.inflight[mid].nid in ended:
                del self.inflight[mid]
        by_name = {s.roster.name(nid): nid for nid in round_of}
        for name, payload in s._groups.items():  # the new groups of this step, by their source
            nid = by_name.get(name)
            if nid is not None and payload[2]:
                self.store.add(name, round_of[nid], payload, [c.name for c in s.cfg.nodes])
        spans = []
        for name, metrics in outcome.node_metrics.items():
            nid = by_name.get(name, -1)
            span = now - self.last_reply.get(nid, self.t0)
            spans.append(span)
            add_idle({name: metrics}, span)
            metrics["round_seconds"] = span
            metrics["wall_seconds"] = now - self.t0
        # a message that found no route (the SuperNode is gone) does not end a round: the node is
        # parked at its last ended round until its card moves to a new node id or its id is back,
        # instead of burning one round (and its prompts) per step while it is away
        unroutable = [nid for nid in self._undelivered if nid not in self._unbuilt]
        for nid in unroutable:
            self.parked.setdefault(nid, now)
            self.ok[nid] = False
        finished = [(nid, round_of[nid]) for nid in [*ended, *self._undelivered] if nid not in unroutable]
        for nid, _ in finished:
            self.last_reply[nid] = now
            self.ok[nid] = s.roster.name(nid) in outcome.node_metrics
            self.starting.discard(nid)
        self._undelivered, self._unbuilt = {}, {}
        outcome.server_metrics["round_seconds"] = max(spans) if spans else 0.0
        train, evals = flatten(outcome)
        s._result.train_metrics_clientapp[step] = MetricRecord(train)
        if evals:
            s._result.evaluate_metrics_clientapp[step] = MetricRecord(evals)
        if s.on_round is not None:
            s.on_round(step, outcome.node_metrics, outcome.server_metrics)
        self._save(step, dict(finished))
        if outcome.stop:
            raise RunFailed(outcome.stop)
        for nid, _ in finished:
            self._handled[nid] = time.perf_counter() - t_step
        return finished
