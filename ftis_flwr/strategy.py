"""FTISStrategy: the Flower strategy that schedules prompts and redistributes groups.

It never sees a model, a tokenizer or a gradient: it hands prompt indices out, forwards each
node's groups (tokens + generator log-probs, as the node encoded them) to the others the next
round, and collects metrics. Flower 1.42's built-in ``Strategy.start`` loop is train -> evaluate;
F-TIS needs one message per node per round (train on last round's groups, then generate), so
``start`` is overridden. Use it from any ServerApp::

    strategy = FTISStrategy(load_experiment("cpu-pair"), on_round=my_callback)
    result = strategy.start(grid)          # inside @app.main()

Rounds: round 0 only generates (and evaluates the starting models); rounds 1..R each take one
update per node on the groups of the round before, then generate again (not after the last).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy
from flwr.serverapp.strategy.result import Result

from . import protocol
from .config import ExperimentConfig, to_dict
from .rollouts import completion_tokens, payload_bytes

log = logging.getLogger(__name__)

PROMPT_STRIDE = 1_009
"""Train-index offset per unit of ``rounds.seed`` (indices wrap modulo the train split)."""
RoundCallback = Callable[[int, dict[str, dict[str, float]], dict[str, float]], None]


class FederationError(RuntimeError):
    """The federation cannot go on (too few nodes connected or replying)."""


@dataclass
class RoundOutcome:
    node_metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    server_metrics: dict[str, float] = field(default_factory=dict)
    failures: dict[int, str] = field(default_factory=dict)


class FTISStrategy(Strategy):
    """Collaborative GRPO rounds: vertical (default), horizontal or alone (SPEC §2)."""

    def __init__(self, experiment: ExperimentConfig, *, run_name: str = "", out_dir: str = "",
                 on_round: RoundCallback | None = None, on_event: Callable[..., None] | None = None,
                 connect_timeout: float = 120.0):
        self.cfg = experiment
        self.run_name = run_name or f"run-{int(time.time())}"
        self.out_dir = out_dir
        self.on_round = on_round
        self.on_event = on_event or (lambda kind, **fields: None)
        self.connect_timeout = connect_timeout
        self._experiment_json = json.dumps(to_dict(experiment))
        self._next_prompt = PROMPT_STRIDE * experiment.rounds.seed  # rounds.seed offsets the schedule
        self._names: dict[int, str] = {}          # Flower node id -> node name (from replies)
        self._groups: dict[str, tuple[ArrayRecord, ConfigRecord]] = {}  # last round's, by name
        self._sent: dict[str, int] = {}           # message id -> destination node id
        self._timed_out: dict[int, str] = {}      # node id -> reason, for the round in flight
        self.history: list[RoundOutcome] = []
        self.checkpoints: dict[str, str] = {}

    # ------------------------------------------------------------ schedule
    def _evaluate_now(self, rnd: int) -> bool:
        every = self.cfg.rounds.eval_every
        return rnd == 0 or rnd == self.cfg.rounds.num_rounds or (every > 0 and rnd % every == 0)

    def _prompts(self, node_ids: list[int], rnd: int) -> dict[int, list[int]]:
        if rnd == self.cfg.rounds.num_rounds:
            return {nid: [] for nid in node_ids}
        b = self.cfg.rounds.prompts_per_node
        if self.cfg.advantage.mode == "horizontal":
            shared = list(range(self._next_prompt, self._next_prompt + b))
            self._next_prompt += b
            return {nid: shared for nid in node_ids}
        out = {}
        for nid in node_ids:
            out[nid] = list(range(self._next_prompt, self._next_prompt + b))
            self._next_prompt += b
        return out

    def _group_size(self) -> int:
        g = self.cfg.rollout.group_size
        return g // len(self.cfg.nodes) if self.cfg.advantage.mode == "horizontal" else g

    # ------------------------------------------------- Strategy interface
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """One message per node: prompt indices + the other nodes' groups of last round."""
        node_ids = sorted(grid.get_node_ids())
        prompts = self._prompts(node_ids, server_round)
        messages = []
        for nid in node_ids:
            content = RecordDict({protocol.ROUND: ConfigRecord({
                "round": server_round, "num_rounds": self.cfg.rounds.num_rounds,
                "prompt_indices": json.dumps(prompts[nid]), "group_size": self._group_size(),
                "evaluate": self._evaluate_now(server_round), "experiment": self._experiment_json,
                "run_name": self.run_name,
            })})
            if self.cfg.advantage.mode != "alone":
                me = self._names.get(nid)
                for src, (arr, meta) in self._groups.items():
                    if src != me:
                        arrays_key, meta_key = protocol.foreign_keys(src)
                        content[arrays_key] = arr
                        content[meta_key] = meta
            messages.append(Message(content=content, dst_node_id=nid, message_type="train"))
        return messages

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Keep each node's new groups for the next round; collect metrics; log failures."""
        outcome = RoundOutcome(failures=dict(self._timed_out))
        self._timed_out = {}
        groups: dict[str, tuple[ArrayRecord, ConfigRecord]] = {}
        total_bytes, total_tokens = 0, 0
        for reply in replies:
            nid = self._sent.get(reply.metadata.reply_to_message_id, reply.metadata.src_node_id)
            if reply.has_error():
                outcome.failures[nid] = f"code {reply.error.code}: {reply.error.reason}"
                continue
            c = reply.content
            name = str(c[protocol.INFO]["node"])
            if name in groups:  # two SuperNodes claim one model card: keep the first, fail the other
                outcome.failures[nid] = (f"model card {name!r} is already served by another node this "
                                         "round; give each SuperNode its own card")
                continue
            self._names[nid] = name
            arr, meta = c[protocol.GROUPS], c[protocol.GROUPS_META]
            groups[name] = (arr, meta)
            nbytes = payload_bytes(arr, meta)
            ntok = completion_tokens(arr)
            total_bytes += nbytes
            total_tokens += ntok
            metrics = dict(c[protocol.METRICS])
            metrics["payload_bytes"] = float(nbytes)
            metrics["worker_starts"] = float(c[protocol.INFO]["worker_starts"])
            outcome.node_metrics[name] = metrics
            for reason in c[protocol.INFO]["rejections"]:
                if reason:
                    log.warning("node %s: %s", name, reason)
                    self.on_event("payload_rejected", round=server_round, node=name, reason=str(reason))
        for nid, reason in outcome.failures.items():
            name = self._names.get(nid, f"node-{nid}")
            log.warning("round %d: node %s failed: %s", server_round, name, reason)
            self.on_event("node_failed", round=server_round, node=name, reason=reason)
        self._groups = groups  # a node that failed contributes nothing stale
        outcome.server_metrics = {
            "nodes_replied": float(len(outcome.node_metrics)),
            "nodes_failed": float(len(outcome.failures)),
            "bytes_per_token": total_bytes / total_tokens if total_tokens else float("nan"),
        }
        self.history.append(outcome)
        return None, MetricRecord({k: v for k, v in outcome.server_metrics.items() if math.isfinite(v)})

    def configure_evaluate(self, server_round, arrays, config, grid) -> Iterable[Message]:
        return []  # evaluation rides on the round message (``evaluate`` flag)

    def aggregate_evaluate(self, server_round, replies) -> MetricRecord | None:
        return None

    def summary(self) -> None:
        c = self.cfg
        log.info("FTISStrategy: %s, loss %s (C=%s, g=%s, rule %s, scope %s), G=%d, %d prompts/node, "
                 "%d rounds, nodes: %s", c.advantage.mode, c.loss.method, c.loss.trunc_c,
                 c.loss.kl_threshold, c.loss.filter_rule, c.loss.filter_scope, c.rollout.group_size,
                 c.rounds.prompts_per_node, c.rounds.num_rounds, ", ".join(n.name for n in c.nodes))

    # --------------------------------------------------------------- loop
    def _wait_for_nodes(self, grid: Grid) -> list[int]:
        want = len(self.cfg.nodes)
        deadline = time.monotonic() + self.connect_timeout
        while True:
            ids = sorted(grid.get_node_ids())
            if len(ids) >= want or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        if len(ids) < self.cfg.rounds.min_nodes:
            raise FederationError(f"only {len(ids)} node(s) connected within {self.connect_timeout:.0f} s; "
                                  f"rounds.min_nodes={self.cfg.rounds.min_nodes}")
        if len(ids) != want:
            log.warning("%d node(s) connected but the experiment defines %d model cards", len(ids), want)
        return ids

    def _send(self, grid: Grid, messages: list[Message], timeout: float) -> list[Message]:
        self._sent = {}
        ids = list(grid.push_messages(messages))
        for mid, msg in zip(ids, messages):
            self._sent[mid] = msg.metadata.dst_node_id
        replies: list[Message] = []
        pending = set(i for i in ids if i)
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for reply in grid.pull_messages(list(pending)):
                replies.append(reply)
                pending.discard(reply.metadata.reply_to_message_id)
            if pending:
                time.sleep(0.2)
        # A node that missed the deadline is reported as failed by aggregate_train.
        self._timed_out = {self._sent[mid]: f"no reply within the {timeout:.0f} s round timeout"
                           for mid in pending}
        return replies

    def start(self, grid: Grid, initial_arrays: ArrayRecord | None = None, num_rounds: int | None = None,
              timeout: float | None = None, **_: object) -> Result:
        """Run rounds 0..R, then ask every node to save its model. Returns Flower's Result."""
        rounds = self.cfg.rounds.num_rounds if num_rounds is None else num_rounds
        self.cfg.rounds.num_rounds = rounds
        timeout = self.cfg.rounds.round_timeout if timeout is None else timeout
        self.summary()
        result = Result()
        node_ids = self._wait_for_nodes(grid)
        log.info("%d node(s) connected: %s", len(node_ids), node_ids)
        for rnd in range(0, rounds + 1):
            t0 = time.perf_counter()
            replies = self._send(grid, list(self.configure_train(rnd, ArrayRecord(), ConfigRecord(), grid)), timeout)
            _, metrics = self.aggregate_train(rnd, replies)
            outcome = self.history[-1]
            outcome.server_metrics["round_seconds"] = time.perf_counter() - t0
            if metrics is not None:
                result.train_metrics_clientapp[rnd] = metrics
            if self.on_round is not None:
                self.on_round(rnd, outcome.node_metrics, outcome.server_metrics)
            if len(outcome.node_metrics) < self.cfg.rounds.min_nodes:
                reasons = "; ".join(f"{self._names.get(n, n)}: {r}" for n, r in outcome.failures.items())
                raise FederationError(f"round {rnd}: {len(outcome.node_metrics)} node(s) replied, fewer than "
                                      f"rounds.min_nodes={self.cfg.rounds.min_nodes} ({reasons})")
        self.finish(grid, timeout)
        return result

    def finish(self, grid: Grid, timeout: float) -> dict[str, str]:
        """Ask each node to save its final model (and stop its worker); returns name -> path."""
        messages = [Message(content=RecordDict({protocol.FINISH: ConfigRecord({
            "out_dir": self.out_dir or "checkpoints", "experiment": self._experiment_json,
            "run_name": self.run_name})}), dst_node_id=nid, message_type="query")
            for nid in sorted(grid.get_node_ids())]
        for reply in self._send(grid, messages, timeout):
            nid = self._sent.get(reply.metadata.reply_to_message_id)
            if reply.has_error():
                name = self._names.get(nid, f"node-{nid}")
                log.warning("node %s could not save its model: %s", name, reply.error.reason)
                self.on_event("checkpoint_failed", node=name, reason=reply.error.reason)
                continue
            rec = reply.content[protocol.CHECKPOINT]
            self.checkpoints[str(rec["node"])] = str(rec["path"])
            self.on_event("checkpoint", node=str(rec["node"]), path=str(rec["path"]))
        return self.checkpoints
