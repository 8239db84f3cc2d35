"""FTISStrategy: the Flower strategy that schedules prompts and redistributes groups.

It never sees a model, a tokenizer or a gradient: it hands prompt indices out, forwards each
node's groups (tokens + generator log-probs, as the node encoded them) to the others the next
round, and collects metrics. Flower 1.42's built-in ``Strategy.start`` loop is train -> evaluate;
F-TIS needs one message per node per round (train on last round's groups, then generate), so
``start`` is overridden. Use it from any ServerApp::

    strategy = FTISStrategy(load_experiment("cpu-pair"), on_round=my_callback)
    result = strategy.start(grid)          # inside @app.main()

With ``exchange.max_foreign_groups`` > 0 each node gets at most that many of the others' groups
per round, chosen by ``exchange.select`` (:mod:`ftis_flwr.server.budget`), so its bytes received and
update time stay flat as nodes join. Per node per round the strategy records what it forwarded
(``foreign_groups_received``, ``foreign_bytes_received``) and how much of the round the node
computed (``compute_seconds``) or waited (``idle_fraction``).

Rounds: round 0 only generates (and evaluates the starting models); rounds 1..R each take one
update per node on the groups of the round before, then generate again (not after the last).

One node must not crash or fool it: a node's name is bound to its Flower node id at its first
reply, forwarded groups are stamped with that name and the prompt indices the node was given
(receivers check both), and any malformed, undeliverable, late or missing reply becomes a failure
of that node with a reason. A failure that is the reward's (every node computes the same reward on
every round) stops the run after its round (:mod:`ftis_flwr.server.run_failure`).
"""

from __future__ import annotations

import copy
import json
import logging
import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy
from flwr.serverapp.strategy.result import Result

from ftis_flwr.config.choices import AdvantageMode, Schedule
from ftis_flwr.config.node_keys import pinned_der
from ftis_flwr.config.schema import ExperimentConfig, to_dict
from ftis_flwr.server.budget import ForeignBudget, add_idle
from ftis_flwr.server.grid_io import HELLO_TIMEOUT, exchange
from ftis_flwr.server.lifecycle import Lifecycle
from ftis_flwr.server.peer_tokenizers import PeerTokenizers
from ftis_flwr.server.rejections import Rejections
from ftis_flwr.server.replies import (
    BadReply,
    RejectedPayload,
    RoundOutcome,
    TrainReply,
    flatten,
    read_train_reply,
    short_reason,
)
from ftis_flwr.server.reporting.run_names import run_name as default_run_name
from ftis_flwr.server.roster import FederationError, Roster
from ftis_flwr.server.run_failure import RunFailed, by_reason, environment_stop, reward_stop
from ftis_flwr.server.state import ServerState, ServerStateError, save_server_state
from ftis_flwr.server.task_agreement import TaskAgreement
from ftis_flwr.wire import protocol
from ftis_flwr.wire.rollouts import payload_bytes
from ftis_flwr.wire.selection import group_count

log = logging.getLogger(__name__)

PROMPT_STRIDE = 1_009
"""Train-index offset per unit of ``rounds.seed`` (indices wrap modulo the train split)."""
RoundCallback = Callable[[int, dict[str, dict[str, float]], dict[str, float]], None]


NEXT_MARGIN = 30.0
"""Seconds the server may take between a round's deadline and its next messages (aggregating,
saving its state and the round's reports, cutting payloads) beyond a HELLO to new SuperNodes."""


def next_within(limit: float) -> float:
    """Seconds from a round message within which the node's next message comes while the run goes
    on: the round's wait, a HELLO to SuperNodes that joined meanwhile, and :data:`NEXT_MARGIN`.
    A node's worker that hears nothing by then exits (the run ended without a STOP reaching it)."""
    return float(limit + min(limit, HELLO_TIMEOUT) + NEXT_MARGIN)


class FTISStrategy(Lifecycle, Strategy):
    """Collaborative GRPO rounds: vertical (default), horizontal or alone (algorithm §2).

    Args:
        experiment: The run's configuration; the strategy keeps its own copy (:meth:`start` may
            change its number of rounds) and sends it, as JSON, to every node.
        run_name: The run's name, which keys each node's worker and saved state; default: one
            made from the experiment (:func:`ftis_flwr.server.reporting.reporter.run_name`).
        out_dir: Where the nodes save their final models (``<out_dir>/<node>``); default:
            ``<run_dir>/<run name>/checkpoints``, made absolute here on the server.
        on_round: ``on_round(round, node_metrics, server_metrics)`` after each round's replies:
            ``node_metrics`` maps each node that replied to its metrics, ``server_metrics`` holds
            the server's own (``nodes_replied``, ``round_seconds``...).
        on_event: ``on_event(kind, **fields)`` for each run event (``node_failed``,
            ``payload_rejected``, ``checkpoint``...), as the reporter writes them to events.jsonl.
        connect_timeout: Seconds to wait for the SuperNodes to connect before the first HELLO.
        state_dir: Where the strategy saves its state after every round so that a stopped run
            can be resumed (:meth:`restore`); empty: not saved.
        on_samples: ``on_samples(round, node, rows)`` with a few of a node's new completions at
            evaluated rounds (``report.samples_per_node``), for a tracker's table.
    """

    def __init__(self, experiment: ExperimentConfig, *, run_name: str = "", out_dir: str = "",
                 on_round: RoundCallback | None = None, on_event: Callable[..., None] | None = None,
                 connect_timeout: float = 120.0, state_dir: str = "",
                 on_samples: Callable[[int, str, list[dict]], None] | None = None):
        self.cfg = copy.deepcopy(experiment)  # never the caller's object: start() may change it
        self.run_name = run_name or default_run_name(experiment)
        self.out_dir = out_dir or str(Path(experiment.run_dir).expanduser().resolve() / self.run_name
                                      / "checkpoints")
        """Where nodes save their final models (``<out_dir>/<node>``); absolute, resolved here on
        the server, so it never depends on where a node's worker runs."""
        self.state_dir = state_dir
        """Where the strategy saves its state after every round (``server_state/`` in it), so a
        stopped run can be resumed (:meth:`restore`); empty: not saved."""
        self._first_round = 0
        self.on_round = on_round
        self.on_samples = on_samples
        """``on_samples(round, node, rows)``: a few of a node's new completions at evaluated rounds
        (``report.samples_per_node``), for a tracker's table."""
        self.on_event = on_event or (lambda kind, **fields: None)
        self.connect_timeout = connect_timeout
        self._experiment_json = json.dumps(to_dict(experiment))
        self._next_prompt = PROMPT_STRIDE * experiment.rounds.seed  # rounds.seed offsets the schedule
        self.roster = Roster([c.name for c in experiment.nodes],  # node id <-> card, bound by HELLO
                             {c.name: pinned_der(c.public_key) for c in experiment.nodes if c.public_key})
        # last round's groups by source name, with the train indices that source was assigned
        self._groups: dict[str, tuple[ArrayRecord, ConfigRecord, list[int]]] = {}
        self._async_state: ServerState | None = None
        """A saved asynchronous run's state to continue from (:meth:`restore`)."""
        self._result = Result()  # the run's result: start() begins a new one
        self._assigned: dict[int, list[int]] = {}   # node id -> train indices, round in flight
        self._forwarded: dict[int, list[str]] = {}  # node id -> sources sent to it, round in flight
        self._received: dict[int, dict[str, float]] = {}  # node id -> foreign groups/bytes sent to it
        self.budget = ForeignBudget(experiment.exchange, experiment.rounds.seed, experiment.wire,
                                    on_event=lambda kind, **fields: self.on_event(kind, **fields))
        """Which foreign groups each node gets (``exchange.*``); all of them by default."""
        self.rejections = Rejections(lambda kind, **fields: self.on_event(kind, **fields))
        """Which sources receivers rejected; its ``streaks`` are saved with the server's state."""
        self._sent: dict[str, int] = {}           # message id -> destination node id
        self._lost: dict[int, str] = {}           # node id -> why no reply came, round in flight
        self._unsent: dict[int, str] = {}         # node id -> why its message could not be built
        self.history: list[RoundOutcome] = []
        self.step_word = "round"
        """What a history entry is called in logs: "step" under the asynchronous schedule."""
        self.checkpoints: dict[str, str] = {}
        self._round_limit = experiment.rounds.round_timeout
        """How long the server waits for the replies of the round in flight (synchronous rounds)."""
        self.peers = PeerTokenizers(experiment, lambda kind, **fields: self.on_event(kind, **fields))
        """Each card's tokenizer as its node reports it: who sends texts, who cannot train together."""
        self.tasks = TaskAgreement()
        """Each card's task parts: a node whose rewards come from another task stops the run."""

    # ------------------------------------------------------------ resume
    def restore(self, state: ServerState) -> None:
        """Continue after ``state.round``: :meth:`start` runs the rounds after it, forwarding the
        groups saved with it. The nodes (same ``run_name``) resume or rewind their own state.

        Args:
            state: The server state saved in the run's ``state_dir``
                (:func:`ftis_flwr.server.state.load_server_state`).

        Raises:
            ServerStateError: The state is of the other schedule (synchronous against
                asynchronous rounds) than the experiment's ``exchange.schedule``.
        """
        self._next_prompt = state.next_prompt
        self.rejections.streaks = dict(state.streaks)
        if (state.schedule is not None) != (self.cfg.exchange.schedule == Schedule.ASYNC):
            kind = "asynchronous" if state.schedule else "synchronous"
            raise ServerStateError(f"the saved server state is of {kind} rounds, the run's configuration "
                                   f"says exchange.schedule={self.cfg.exchange.schedule}")
        if state.schedule is not None:  # AsyncRounds takes it from here: steps, store, nodes' rounds
            self._async_state = state
            return
        self._first_round = state.round + 1
        self._groups = dict(state.groups)

    def _save_state(self, rnd: int) -> None:
        if self.state_dir:
            save_server_state(self.state_dir, ServerState(rnd, self._next_prompt, self._groups,
                                                        self.rejections.streaks))

    # ------------------------------------------------------------ schedule
    def _prompts(self, node_ids: list[int], rnd: int) -> dict[int, list[int]]:
        if rnd == self.cfg.rounds.num_rounds:
            return {nid: [] for nid in node_ids}
        if self.cfg.advantage.mode == AdvantageMode.HORIZONTAL:
            shared = self.next_prompts()
            return {nid: shared for nid in node_ids}
        return {nid: self.next_prompts() for nid in node_ids}

    def next_prompts(self) -> list[int]:
        """The next ``rounds.prompts_per_node`` train indices of the schedule (vertical).

        Returns:
            Consecutive train indices (a node wraps them modulo its train split); each call
                advances the schedule.
        """
        b = self.cfg.rounds.prompts_per_node
        self._next_prompt += b
        return list(range(self._next_prompt - b, self._next_prompt))

    def _group_size(self) -> int:
        g = self.cfg.rollout.group_size
        return g // len(self.cfg.nodes) if self.cfg.advantage.mode == AdvantageMode.HORIZONTAL else g

    # ------------------------------------------------- Strategy interface
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """One message per node: prompt indices + the other nodes' groups of last round, stamped.

        Only node ids bound to a card (see :meth:`introduce`) take part. A node whose message
        cannot be built fails this round alone (:meth:`unsent`).

        Args:
            server_round: The round (0: generate and evaluate only).
            arrays: Unused: F-TIS ships no weights (Flower's signature).
            config: Unused (Flower's signature); the round's settings come from the experiment.
            grid: Flower's grid, for the node ids connected now.

        Returns:
            One ``train`` message per bound node (see :meth:`message`).
        """
        node_ids = self.bound_nodes(grid)
        prompts = self._prompts(node_ids, server_round)
        self._assigned, self._forwarded, self._received, self._unsent = {}, {}, {}, {}
        messages = []
        for nid in node_ids:
            me = {self.roster.names.get(nid), self.roster.claimed.get(nid)}  # an impostor gets no copy either
            others = {src: p for src, p in self._groups.items() if src not in me}
            try:
                messages.append(self.message(nid, server_round, prompts[nid], others))
            except Exception as exc:  # one node's message, never the round: it fails this round alone
                self._unsent[nid] = self.unsent(nid, server_round, exc)
        return messages

    def unsent(self, nid: int, rnd: int, exc: Exception) -> str:
        """Why node ``nid``'s round ``rnd`` message could not be built (logged with its traceback):
        a failure of that node for the round, whatever raised.

        Args:
            nid: The Flower node id.
            rnd: The round (the step, under the asynchronous schedule).
            exc: What raised while the message was built.

        Returns:
            The failure's reason, as the round's report names it.
        """
        log.exception("%s %d: the message for node %s could not be built", self.step_word, rnd,
                      self.roster.name(nid))
        return f"the server could not build its message: {type(exc).__name__}: {exc}"

    def bound_nodes(self, grid: Grid) -> list[int]:
        """The node ids bound to a card, in the experiment's card order, not by Flower node id
        (random per run): each card gets the same prompts whatever ids the SuperNodes have, so a
        seed reproduces a run.

        Args:
            grid: Flower's grid, for the node ids connected now.

        Returns:
            The connected node ids that serve a card of the experiment.
        """
        order = {c.name: i for i, c in enumerate(self.cfg.nodes)}
        return sorted((nid for nid in grid.get_node_ids() if nid in self.roster.names),
                      key=lambda nid: order.get(self.roster.names[nid], len(order)))

    def message(self, nid: int, rnd: int, prompts: list[int], others: dict, evaluate: bool | None = None,
                limit: float | None = None, **received: float) -> Message:
        """Node ``nid``'s message of its round ``rnd``: its prompt indices and the other nodes'
        groups, cut to the foreign-group budget (none when training alone). Records what was
        forwarded, for the reply's checks and the round's metrics.

        Args:
            nid: The Flower node id the message goes to.
            rnd: The node's round (the asynchronous schedule's rounds are per node).
            prompts: The train indices the node generates groups for (empty: the last round,
                which only trains and evaluates).
            others: Source card -> ``(arrays, meta, train indices it was given)``: the groups
                the other nodes sent, as they travel.
            evaluate: Whether the node evaluates this round; None: the schedule's
                (``rounds.eval_every`` and the last round).
            limit: Seconds the server waits for this reply; None: the round's wait.
            **received: Extra per-node figures recorded with ``foreign_groups_received`` and
                ``foreign_bytes_received`` in the round's metrics (the asynchronous schedule's
                staleness and server time).

        Returns:
            The ``train`` message: the foreign groups under their stamped keys and the round's
                settings (``protocol.ROUND``).
        """
        content, foreign, groups, nbytes = RecordDict(), {}, 0, 0
        if self.cfg.advantage.mode != AdvantageMode.ALONE:
            for src, (arr, meta, indices) in self.budget.select(self.roster.name(nid), rnd, others).items():
                arrays_key, meta_key = protocol.foreign_keys(src)
                content[arrays_key], content[meta_key] = arr, meta
                foreign[src] = indices
                groups += group_count(arr, meta)
                nbytes += payload_bytes(arr, meta)
        self._assigned[nid] = prompts
        self._forwarded[nid] = list(foreign)
        self._received[nid] = {"foreign_groups_received": float(groups),
                               "foreign_bytes_received": float(nbytes), **received}
        content[protocol.ROUND] = ConfigRecord({
            "round": rnd, "num_rounds": self.cfg.rounds.num_rounds,
            "prompt_indices": json.dumps(prompts), "group_size": self._group_size(),
            "evaluate": self.cfg.rounds.evaluates(rnd) if evaluate is None else evaluate,
            "experiment": self._experiment_json,
            "run_name": self.run_name, "foreign": json.dumps(foreign),
            "send_text": self.peers.send_text(self.roster.name(nid)),
            "next_within": next_within(self._round_limit if limit is None else limit),
        })
        return Message(content=content, dst_node_id=nid, message_type=MessageType.TRAIN)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Keep each node's new groups for the next round; collect metrics; log failures.

        Never raises because of what a node sent: a bad reply becomes that node's failure. The
        round's outcome (per-node metrics, failures, server metrics) is appended to ``history``.

        Args:
            server_round: The round the replies answer.
            replies: The nodes' replies to :meth:`configure_train`'s messages.

        Returns:
            ``(None, server metrics)``: no weights, and the server's finite metrics
                (``nodes_replied``, ``nodes_failed``, ``bytes_per_token``).
        """
        outcome = RoundOutcome(failures=dict(self._lost))
        self._lost = {}
        good: dict[int, TrainReply] = {}
        rejected: set[str] = set()
        for reply in replies:
            nid = self._reply_node(reply, server_round, set(good) | set(outcome.failures))
            if nid is None:
                continue
            if reply.has_error():
                outcome.failures[nid] = f"code {reply.error.code}: {short_reason(reply.error.reason)}"
                continue
            try:
                good[nid] = read_train_reply(reply.content, self.cfg.wire)
            except RejectedPayload as exc:  # counted against its source, as a receiver counts it
                outcome.failures[nid] = str(exc)
                self.on_event("payload_rejected", round=server_round, node="server",
                              source=self.roster.name(nid), groups=exc.groups, samples=exc.samples,
                              reason=exc.reason)
                rejected.add(self.roster.name(nid))
            except Exception as exc:  # whatever a node sent, it must not stop the federation
                why = str(exc) if isinstance(exc, BadReply) else f"{type(exc).__name__}: {exc}"
                outcome.failures[nid] = f"malformed reply: {why}"
        groups: dict[str, tuple[ArrayRecord, ConfigRecord, list[int]]] = {}
        total_bytes, total_tokens = 0, 0
        live = set(self._sent.values())
        # node ids bound in earlier rounds first: the order replies arrive in cannot steal a card
        for nid in sorted(good, key=lambda n: n not in self.roster.names):
            r = good[nid]
            self.roster.claimed[nid] = r.name
            reason = self.roster.bind(nid, r.name, live)
            if reason is not None:
                outcome.failures[nid] = reason
                continue
            groups[r.name] = (r.arrays, r.meta, list(self._assigned.get(nid, [])))
            total_bytes += r.nbytes
            total_tokens += r.ntokens
            outcome.node_metrics[r.name] = {**r.metrics, "payload_bytes": float(r.nbytes),
                                            **self._received.get(nid, {})}
            self.budget.note(r.name, r.metrics)
            self.peers.note(r.name, r.tokenizer_fp, r.align_fault, r.text_limits)
            self.tasks.note(r.name, r.task_parts)
            if r.samples and self.on_samples is not None:
                self.on_samples(server_round, r.name, r.samples)
            rejected |= self.rejections.note(server_round, r, self._forwarded.get(nid, []))
        named = self.roster.by_card(outcome.failures)
        outcome.stop = reward_stop(server_round, named, self.step_word) or \
            environment_stop(server_round, named, self.step_word)
        stops = outcome.stop or (self.step_word == "round" and len(outcome.node_metrics) < self.cfg.rounds.min_nodes)
        for nid, reason in outcome.failures.items():
            name = self.roster.name(nid)
            if not stops:  # else the one line that stops the run says it, once
                log.warning("%s %d: node %s failed: %s", self.step_word, server_round, name, reason)
            self.on_event("node_failed", round=server_round, node=name, reason=reason)
        self.rejections.end_round(server_round, rejected)
        self._groups = groups  # a node that failed contributes nothing stale
        outcome.server_metrics = {
            "nodes_replied": float(len(outcome.node_metrics)),
            "nodes_failed": float(len(outcome.failures)),
            "bytes_per_token": total_bytes / total_tokens if total_tokens else float("nan"),
        }
        self.history.append(outcome)
        return None, MetricRecord({k: v for k, v in outcome.server_metrics.items() if math.isfinite(v)})

    def _reply_node(self, reply: Message, rnd: int | str, done: set[int]) -> int | None:
        """The node id a reply answers for (from the message it replies to), or None to discard it."""
        nid = self._sent.get(reply.metadata.reply_to_message_id)
        if nid is None:
            log.warning("round %s: discarded a reply to message %r (from node id %s): not a message "
                        "of this round", rnd, reply.metadata.reply_to_message_id, reply.metadata.src_node_id)
        elif nid in done:
            log.warning("round %s: discarded a second reply from node id %d", rnd, nid)
            return None
        return nid

    def configure_evaluate(self, server_round, arrays, config, grid) -> Iterable[Message]:
        """No evaluation messages: a node evaluates in its round message (its ``evaluate`` flag).

        Returns:
            An empty list.
        """
        return []  # evaluation rides on the round message (``evaluate`` flag)

    def aggregate_evaluate(self, server_round, replies) -> MetricRecord | None:
        """Nothing to aggregate: evaluation metrics come with the round's replies.

        Returns:
            None.
        """
        return None

    def summary(self) -> None:
        """Log the run's settings in one line: mode, loss, G, prompts, rounds, schedule, nodes."""
        c = self.cfg
        log.info("FTISStrategy: %s, loss %s (C=%s, g=%s, rule %s, scope %s), G=%d, %d prompts/node, "
                 "%d rounds (%s), nodes: %s; final models in %s", c.advantage.mode, c.loss.method,
                 c.loss.trunc_c, c.loss.kl_threshold, c.loss.filter_rule, c.loss.filter_scope, c.rollout.group_size,
                 c.rounds.prompts_per_node, c.rounds.num_rounds,
                 "synchronous" if c.exchange.schedule == Schedule.SYNC else
                 f"asynchronous, max staleness {c.exchange.max_staleness}", ", ".join(n.name for n in c.nodes),
                 self.out_dir)

    # --------------------------------------------------------------- loop
    def _send(self, grid: Grid, messages: list[Message], timeout: float, what: str = "") -> list[Message]:
        """:func:`ftis_flwr.server.grid_io.exchange`; what was not delivered or answered goes to ``_lost``."""
        out = exchange(grid, messages, timeout, what=what, name_of=self.roster.name)
        self._sent, self._lost = out.sent, out.lost
        return out.replies

    def start(self, grid: Grid, initial_arrays: ArrayRecord | None = None, num_rounds: int | None = None,
              timeout: float | None = None, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None, evaluate_fn: Callable | None = None) -> Result:
        """Run rounds 0..R, then ask every node to save its model. If a round fails (or anything
        raises), every node is told to stop its worker.

        F-TIS ships no weights and evaluates on the nodes, so ``initial_arrays``,
        ``train_config``, ``evaluate_config`` and ``evaluate_fn`` are refused rather than
        ignored: put such settings in the experiment instead.

        Args:
            grid: Flower's grid (``@app.main()``'s).
            initial_arrays: Refused when not empty (no weights travel).
            num_rounds: Rounds R, overriding ``rounds.num_rounds`` (on this strategy's own copy,
                and in what the nodes are sent); None: the experiment's.
            timeout: Seconds to wait for a round's replies, overriding
                ``rounds.round_timeout``; None: the experiment's.
            train_config: Refused when not empty.
            evaluate_config: Refused when not empty.
            evaluate_fn: Refused when given.

        Returns:
            Flower's Result: ``train_metrics_clientapp[round]`` holds every node's round metrics
                as ``"<node>/<metric>"`` plus the server's as ``"server/<metric>"``;
                ``evaluate_metrics_clientapp[round]`` the evaluated rounds'
                ``"<node>/eval/<split>/accuracy"``.

        Raises:
            TypeError: One of the refused arguments was given.
            ValueError: ``num_rounds`` < 1, or a resumed run has no round left.
            FederationError: Too few nodes connected or replied (``rounds.min_nodes``), or the
                cards cannot train together (tokenizers, tasks).
            RunFailed: A node's reward failed: the run stops after that round
                (:func:`ftis_flwr.server.run_failure.reward_stop`).
        """
        unused = {"initial_arrays": initial_arrays is not None and len(initial_arrays) > 0,
                  "train_config": bool(train_config), "evaluate_config": bool(evaluate_config),
                  "evaluate_fn": evaluate_fn is not None}
        refused = [name for name, given in unused.items() if given]
        if refused:
            raise TypeError(f"FTISStrategy.start does not take {', '.join(refused)}: F-TIS nodes exchange "
                            "groups, not weights, and evaluate themselves (rounds.eval_every, "
                            "rounds.eval_size); configure them in the ExperimentConfig")
        if num_rounds is not None:
            if num_rounds < 1:
                raise ValueError(f"num_rounds={num_rounds} must be >= 1")
            self.cfg.rounds.num_rounds = int(num_rounds)
            self._experiment_json = json.dumps(to_dict(self.cfg))
        rounds = self.cfg.rounds.num_rounds
        timeout = self.cfg.rounds.round_timeout if timeout is None else timeout
        self.summary()
        self._result = Result()
        if self._first_round > rounds and self._async_state is None:
            raise ValueError(f"nothing to resume: round {self._first_round - 1} of {rounds} is done")
        node_ids = self._wait_for_nodes(grid)
        log.info("%d node(s) connected: %s", len(node_ids), node_ids)
        hello_timeout = min(timeout, HELLO_TIMEOUT)
        # a fresh run needs every card served; a resumed one goes on without a card whose SuperNode
        # is away, which joins when it comes back (its worker state is on disk)
        self.introduce(grid, hello_timeout, first=self._first_round == 0 and self._async_state is None)
        try:
            self.await_builds(grid, max(timeout, self.cfg.rounds.startup_timeout))
            if self.cfg.exchange.schedule == Schedule.ASYNC:
                from ftis_flwr.server.async_rounds import AsyncRounds
                AsyncRounds(self, grid, timeout).run()
            else:
                self._rounds(grid, rounds, timeout, hello_timeout)
        except BaseException:
            self._stop_workers(grid)
            raise
        self.finish(grid, timeout)
        return self._result

    def _rounds(self, grid: Grid, rounds: int, timeout: float, hello_timeout: float) -> None:
        result = self._result
        for rnd in range(self._first_round, rounds + 1):
            t0 = time.perf_counter()
            if rnd > self._first_round:
                self.introduce(grid, hello_timeout, first=False)  # SuperNodes that joined since
            # the first round of a run builds (or restores) every node: its own, longer deadline
            limit = max(timeout, self.cfg.rounds.startup_timeout) if rnd == self._first_round else timeout
            self._round_limit = limit
            replies = self._send(grid, list(self.configure_train(rnd, ArrayRecord(), ConfigRecord(), grid)),
                                 limit, what=f"round {rnd}")
            self._lost.update(self._unsent)
            self.aggregate_train(rnd, replies)
            self.peers.check()
            self.tasks.check()
            outcome = self.history[-1]
            outcome.server_metrics["round_seconds"] = time.perf_counter() - t0
            add_idle(outcome.node_metrics, outcome.server_metrics["round_seconds"])
            train, evals = flatten(outcome)
            result.train_metrics_clientapp[rnd] = MetricRecord(train)
            if evals:
                result.evaluate_metrics_clientapp[rnd] = MetricRecord(evals)
            if self.on_round is not None:
                self.on_round(rnd, outcome.node_metrics, outcome.server_metrics)
            self._save_state(rnd)
            if outcome.stop:
                raise RunFailed(outcome.stop)
            if len(outcome.node_metrics) < self.cfg.rounds.min_nodes:
                reasons = by_reason(self.roster.by_card(outcome.failures))
                raise FederationError(f"round {rnd}: {len(outcome.node_metrics)} node(s) replied, fewer than "
                                      f"rounds.min_nodes={self.cfg.rounds.min_nodes} ({reasons})")

