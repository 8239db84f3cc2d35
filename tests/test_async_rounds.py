"""The asynchronous schedule (exchange.schedule=async): a node's next round goes out as soon as it
replies, with the groups that arrived since, older than ``exchange.max_staleness`` dropped.

The strategy tests use test_strategy's fake Grid (the seam) with node b made ``lag`` times slower
than a by holding its replies; the last test runs two real tiny nodes through a Flower simulation.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import simulate
from test_strategy import (  # noqa: F401
    FP,
    VOCAB,
    FakeGrid,
    experiment,
    foreign,
    groups_for,
    honest,
    indices,
    labels,
    run,
    task_identity,
)

from ftis_flwr.config.schema import ConfigError, WireConfig
from ftis_flwr.experiment import load_experiment
from ftis_flwr.server.async_store import Store, join
from ftis_flwr.server.reporting.summary import load_metrics
from ftis_flwr.wire import protocol
from ftis_flwr.wire.rollouts import decode_groups, encode_groups
from ftis_flwr.wire.selection import Cuttable, WireSelectError, merge

ASYNC = """
rounds: {num_rounds: 4, prompts_per_node: 3, eval_every: 0, round_timeout: 5, startup_timeout: 5}
rollout: {group_size: 4, max_new_tokens: 8}
exchange: {schedule: async, max_staleness: 1}
nodes: [{name: a}, {name: b}]
"""


class SlowB(FakeGrid):
    """Node b (id 2) answers a round only once a (id 1) has been sent ``lag`` more rounds, or when
    nothing else is left to answer: b is about ``lag`` times slower than a."""

    def __init__(self, respond, lag: int):
        super().__init__(respond)
        self.lag, self.held = lag, []  # [a messages still to come, message id, reply]

    def push_messages(self, messages):
        ids = super().push_messages(messages)
        for msg in messages:
            if msg.metadata.message_type != "train":
                continue
            if msg.metadata.dst_node_id == 2:
                mid = msg.metadata.message_id
                self.held.append([self.lag, mid, self._replies.pop(mid)])
            else:
                for h in self.held:
                    h[0] -= 1
        return ids

    def pull_messages(self, message_ids):
        ready = [h for h in self.held if h[0] <= 0]
        if not ready and self.held and not any(i in self._replies for i in message_ids):
            ready = self.held[:1]  # a is done (or waits): b's round ends
        for h in ready:
            self.held.remove(h)
            self._replies[h[1]] = h[2]
        return super().pull_messages(message_ids)

    def train_message(self, nid: int, rnd: int):
        return next(m for m in self.pushed if m.metadata.dst_node_id == nid
                    and m.metadata.message_type == "train" and m.content[protocol.ROUND]["round"] == rnd)


def node_rounds(strategy) -> dict[str, list[tuple[int, int]]]:
    """node -> [(step, its own round)] in the order logged."""
    out: dict[str, list[tuple[int, int]]] = {}
    for step, outcome in enumerate(strategy.history):
        for name, m in outcome.node_metrics.items():
            out.setdefault(name, []).append((step, int(m["round"])))
    return out


def test_the_fast_node_never_waits_and_the_slow_one_gets_what_arrived_meanwhile():
    grid = SlowB(honest(), lag=3)
    strategy, events = run(experiment(ASYNC), grid)
    assert not [e for e in events if e[0] == "node_failed"]
    seen = node_rounds(strategy)
    # b (slow) takes the schedule's rounds 0..4; a keeps going while b runs, then one final round
    assert [r for _, r in seen["b"]] == [0, 1, 2, 3, 4]
    assert [r for _, r in seen["a"]] == list(range(17))
    step_of = {(n, r): s for n, rows in seen.items() for s, r in rows}
    assert step_of[("a", 4)] < step_of[("b", 1)]  # no barrier: a was past round 4 before b's round 1 ended
    assert step_of[("a", 16)] > step_of[("b", 4)]
    sent = {(nid, r): grid.train_message(nid, r) for nid, last in ((1, 16), (2, 4)) for r in range(last + 1)}
    cfg = {k: m.content[protocol.ROUND] for k, m in sent.items()}
    # every round but each node's last generates for fresh prompts; the last ones evaluate
    for (nid, r), c in cfg.items():
        final = (nid, r) in ((1, 16), (2, 4))
        assert len(indices(sent[(nid, r)])) == (0 if final else 3), (nid, r)
        assert c["evaluate"] == (final or r in (0, 4)), (nid, r)  # eval_every 0: round 0 and num_rounds
    every = [i for m in sent.values() for i in indices(m)]
    assert len(every) == len(set(every)) == 3 * (16 + 4)
    # a's rounds 1-3 went out while b had sent nothing: no foreign groups, nothing waited for
    for rnd in (1, 2, 3):
        assert foreign(sent[(1, rnd)]) == {}
    # b's round 1: a had ended rounds 0-3; with max_staleness 1 only a's rounds 2 and 3 are young
    # enough (staleness 1 and 0), joined into one payload; rounds 0 and 1 are dropped and counted
    assert foreign(sent[(2, 1)]) == {"a": indices(sent[(1, 2)]) + indices(sent[(1, 3)])}
    assert labels(sent[(2, 1)], "a") == ["a"] * 6
    m = strategy.history[step_of[("b", 1)]].node_metrics["b"]
    assert m["foreign_groups_received"] == 6 and m["foreign_groups_stale_dropped"] == 6
    assert m["foreign_staleness_mean"] == 0.5 and m["foreign_staleness_max"] == 1
    # a's next round after b's round 0 ended got b's round-0 groups, fresh (b had taken no update)
    assert foreign(sent[(1, 4)]) == {"b": indices(sent[(2, 0)])}
    m = strategy.history[step_of[("a", 4)]].node_metrics["a"]
    assert m["foreign_staleness_max"] == 0 and m["foreign_groups_stale_dropped"] == 0
    # each of b's groups reaches a once; b's last round generated none
    got = [i for r in range(17) for i in foreign(sent[(1, r)]).get("b", [])]
    assert sorted(got) == sorted(i for r in range(4) for i in indices(sent[(2, r)]))
    assert strategy.checkpoints == {"a": "/ckpt/a", "b": "/ckpt/b"}


def test_a_node_that_fails_a_round_gets_its_next_one_and_min_nodes_still_holds():
    def flaky(msg, name):
        from test_strategy import finish_reply, train_reply
        if msg.metadata.message_type != "train":
            return finish_reply(msg, name)
        if msg.content[protocol.ROUND]["round"] == 1:
            from flwr.app import Error, Message
            return Message(Error(code=7, reason="boom"), reply_to=msg)
        return train_reply(msg, name)

    strategy, events = run(experiment(ASYNC), SlowB(honest(special={2: flaky}), lag=1))
    failed = [f for k, f in events if k == "node_failed"]
    assert [(f["node"], "boom" in f["reason"]) for f in failed] == [("b", True)]
    b_rounds = [r for _, r in node_rounds(strategy)["b"]]  # round 1 failed; the next one went out
    assert b_rounds[:4] == [0, 2, 3, 4] and b_rounds == sorted(set(b_rounds)), b_rounds
    exp = experiment(ASYNC, **{"rounds.min_nodes": 2})
    run(exp, SlowB(honest(special={2: flaky}), lag=1), raises=(Exception, "fewer than rounds.min_nodes=2"))


class Crash(RuntimeError):
    pass


class Replaced(FakeGrid):
    """b's SuperNode (id 2) dies when sent its round 2: no reply, its id leaves the grid, and a
    new SuperNode (id 3) serving b connects."""

    def __init__(self, silent_joiner: bool = False):
        super().__init__(honest(names={1: "a", 2: "b", 3: "b", 4: "?"}, special={2: self._dies},
                                hellos={4: lambda msg, name: None}))
        self.joiners = [3, 4] if silent_joiner else [3]

    def _dies(self, msg, name):
        from test_strategy import train_reply
        if msg.metadata.message_type == "train" and msg.content[protocol.ROUND]["round"] == 2:
            self.node_ids = [1, *self.joiners]
            return None
        return train_reply(msg, name)


def test_a_card_whose_supernode_comes_back_under_a_new_id_continues_there():
    """The lost round goes to the new node id with the groups it carried, b's rounds stay
    contiguous, and the old id is sent nothing more (nor waited for: no round timeout passes)."""
    grid = Replaced()
    strategy, events = run(experiment(ASYNC), grid)
    moved = [f for k, f in events if k == "node_rebound"]
    assert moved == [{"node": "b", "old_node_id": 2, "node_id": 3, "after_round": 1}]
    b_rounds = [r for _, r in node_rounds(strategy)["b"]]
    assert b_rounds == list(range(len(b_rounds))) and len(b_rounds) >= 5  # contiguous, every round
    to = {nid: [m for m in grid.pushed if m.metadata.dst_node_id == nid and m.metadata.message_type == "train"]
          for nid in (2, 3)}
    assert [m.content[protocol.ROUND]["round"] for m in to[2]] == [0, 1, 2]
    assert [m.content[protocol.ROUND]["round"] for m in to[3]] == b_rounds[2:]
    lost, again = to[2][-1], to[3][0]
    assert foreign(lost)["a"] and set(foreign(lost)["a"]) <= set(foreign(again)["a"])  # its groups again
    assert not [k for k, _ in events if k == "node_failed"]
    assert strategy.checkpoints == {"a": "/ckpt/a", "b": "/ckpt/b"}


def test_a_node_id_that_never_answers_its_hello_is_not_asked_every_step():
    """Asked once (the others wait for it at most the round timeout here), then left alone for
    REHELLO_AFTER seconds: the run goes on and b still moves to its new node id."""
    grid = Replaced(silent_joiner=True)
    strategy, events = run(experiment(ASYNC), grid)
    hellos = [m for m in grid.pushed if protocol.HELLO in m.content and m.metadata.dst_node_id == 4]
    assert len(hellos) == 1
    assert [f["node_id"] for k, f in events if k == "node_rebound"] == [3]
    assert strategy.checkpoints == {"a": "/ckpt/a", "b": "/ckpt/b"}


def test_a_stopped_async_server_resumes_where_each_node_was(tmp_path):
    """The ServerApp (``server_app.run`` on the fake grid) dies after step 6, whose state is never
    saved; resumed from the run folder, every node continues after its last logged round (b's
    round in flight at step 5's save is sent again, with the groups its lost message carried),
    each step is logged once, and no prompt is drawn twice."""
    from ftis_flwr.server.state import load_server_state
    from server_app.server_app import run as server_run

    exp = experiment(ASYNC, run_dir=str(tmp_path), **{"exchange.max_staleness": 20})

    def crash(step, node_metrics):
        if step == 6:
            raise Crash("the ServerApp dies here")

    first = SlowB(honest(), lag=3)
    with pytest.raises(Crash):
        server_run(first, exp, after_round=crash, name="async-run")
    run_dir = tmp_path / "async-run"
    state = load_server_state(run_dir)
    assert state.round == 5 and set(state.schedule["done"]) == {"a", "b"}
    done = state.schedule["done"]
    second = SlowB(honest(), lag=3)
    assert server_run(second, None, resume=run_dir) == run_dir

    rows = load_metrics(run_dir)
    assert [r["round"] for r in rows] == list(range(len(rows)))  # steps, each once
    rounds = {n: [int(r["nodes"][n]["round"]) for r in rows if n in r["nodes"]] for n in ("a", "b")}
    assert rounds["b"] == [0, 1, 2, 3, 4] and rounds["a"] == list(range(len(rounds["a"])))
    # session 2 starts each node right after its last logged round of session 1
    for nid, name in ((1, "a"), (2, "b")):
        resumed = [m for m in second.pushed if m.metadata.dst_node_id == nid and m.metadata.message_type == "train"]
        assert resumed[0].content[protocol.ROUND]["round"] == done[name] + 1, name
    # b's message in flight at the save went out again with (at least) every group it carried
    lost = first.train_message(2, done["b"] + 1)
    again = second.train_message(2, done["b"] + 1)
    assert set(foreign(lost).get("a", [])) <= set(foreign(again).get("a", [])) and foreign(lost).get("a")
    # the prompts of every logged round (the last message sent for it) are distinct; lost messages'
    # prompts may be drawn again (the cursor is the saved one: a replayed round is the lost one's)
    sent = {}
    for g in (first, second):
        for m in g.pushed:
            if m.metadata.message_type == "train":
                sent[(m.metadata.dst_node_id, m.content[protocol.ROUND]["round"])] = m
    drawn = [i for nid, name in ((1, "a"), (2, "b")) for r in rounds[name] for i in indices(sent[(nid, r)])]
    assert len(drawn) == len(set(drawn)) == 3 * (len(rounds["a"]) - 1 + len(rounds["b"]) - 1)
    with pytest.raises(ValueError, match="nothing to resume"):
        server_run(SlowB(honest(), lag=3), None, resume=run_dir)


def _payload(name, idx, fmt):
    return encode_groups(groups_for(name, idx, 4), vocab_size=VOCAB, format=fmt)


@pytest.mark.parametrize("fmt", ["arrays", "compact"])
def test_payloads_of_one_source_join_into_one_that_decodes_to_all_their_groups(fmt):
    parts = [_payload("a", [1, 2], fmt), _payload("a", [7], fmt), _payload("a", [], fmt)]
    arrays, meta = merge([Cuttable(a, m) for a, m in parts])
    got = decode_groups(arrays, meta, expected_fp=FP, vocab_size=VOCAB, wire=WireConfig())
    assert [g.prompt_id for g in got] == ["train:1", "train:2", "train:7"]
    want = [g for a, m in parts for g in decode_groups(a, m, expected_fp=FP, vocab_size=VOCAB, wire=WireConfig())]
    for g, w in zip(got, want):
        assert all(np.array_equal(x, y) for x, y in zip(g.completions, w.completions))
        assert all(np.array_equal(x, y) for x, y in zip(g.logprobs, w.logprobs))
    (_, _, idx), staleness = join([(2, (*parts[0], [1, 2])), (0, (*parts[1], [7]))])
    assert idx == [1, 2, 7] and staleness == [2, 2, 0]


def test_payloads_packed_differently_are_not_joined():
    with pytest.raises(WireSelectError, match="packed differently"):
        merge([Cuttable(*_payload("a", [1], "arrays")), Cuttable(*_payload("a", [2], "compact"))])


def test_the_store_forwards_each_version_once_and_counts_what_went_stale():
    store, names = Store(max_staleness=1), ["a", "b", "c"]
    for v in range(3):  # a's rounds 0, 1, 2; round 0 is pruned when round 2 arrives
        store.add("a", v, _payload("a", [v], "compact") + ([v],), names)
    fresh, dropped = store.take("b", exclude={"b"})
    assert [s for s, _ in fresh["a"]] == [1, 0] and dropped == 1
    assert store.take("b", exclude={"b"}) == ({}, 0)  # nothing new since
    assert store.take("a", exclude={"a"}) == ({}, 0)  # never its own
    store.add("a", 3, _payload("a", [3], "compact") + ([3],), names)
    fresh, dropped = store.take("b", exclude={"b"})
    assert [s for s, _ in fresh["a"]] == [0] and dropped == 0
    fresh, dropped = store.take("c", exclude={"c"})  # c never took: 0 and 1 went stale before it did
    assert [s for s, _ in fresh["a"]] == [1, 0] and dropped == 2


@pytest.mark.parametrize("bad,match", [
    ({"exchange.schedule": "later"}, "exchange.schedule='later' is not one of sync, async"),
    ({"exchange.max_staleness": -1}, "exchange.max_staleness=-1 must be >= 0"),
    ({"exchange.schedule": "async", "advantage.mode": "horizontal"}, "every round waits for every node"),
])
def test_bad_async_settings_are_refused_with_the_key(bad, match):
    with pytest.raises(ConfigError, match=match):
        load_experiment("cpu-pair", bad)


ASYNC_FEDERATION = """
rounds: {num_rounds: 3, prompts_per_node: 8, eval_every: 0, eval_size: 16, round_timeout: 300}
rollout: {group_size: 4, max_new_tokens: 6, batch_size: 64}
train: {lr: 1e-3, micro_batch_size: 32}
exchange: {schedule: async, max_staleness: 3}
# the offline default's shipped models: nothing warm-starts
nodes:
  - {name: small, tiny_size: small, warmstart_target: 0.6, seed: 0}
  - {name: large, tiny_size: large, warmstart_target: 0.6, seed: 1}
"""


@pytest.mark.slow
def test_an_async_federation_runs_through_flower(tmp_path):
    """Real tiny nodes in a Flower simulation: every node takes its rounds 0..3 (the faster one
    more, until the other is done) and evaluates at its last, trains on the other's groups (each
    forwarded at most once, all used), and a metrics row holds only the nodes whose round ended."""
    exp = load_experiment(yaml_text=ASYNC_FEDERATION,
                          overrides={"cache_dir": str(tmp_path / "cache"), "run_dir": str(tmp_path / "runs")})
    rows = load_metrics(simulate(exp))
    per_node: dict[str, list[dict]] = {}
    for row in rows:
        assert row["missing_nodes"] == [] and row["nodes"]
        for name, m in row["nodes"].items():
            per_node.setdefault(name, []).append(m)
    assert set(per_node) == {"small", "large"}
    for name, ms in per_node.items():
        other = per_node["large" if name == "small" else "small"]
        assert [m["round"] for m in ms] == list(range(len(ms))) and len(ms) >= 4, (name, len(ms))
        assert "eval/test/accuracy" in ms[0] and "eval/test/accuracy" in ms[-1]
        assert all(0 <= m["idle_fraction"] <= 1 and m["wall_seconds"] > 0 for m in ms)
        assert not [k for m in ms for k in m if k.endswith("_rejected")]
        got = sum(m["foreign_groups_received"] for m in ms)
        assert 0 < got <= 8 * (len(other) - 1), (name, got)  # the other's last round generates nothing
        assert all(m.get("samples_foreign", 0) == 4 * m["foreign_groups_received"] for m in ms[1:])


class BBackLater(FakeGrid):
    """Only a (id 1) is connected at first; b's SuperNode comes back as id 3 once a has been sent
    ``after`` rounds (a restarted SuperNode gets a new node id)."""

    def __init__(self, after: int = 2):
        super().__init__(honest(names={1: "a", 3: "b"}), node_ids=(1,))
        self.after = after

    def push_messages(self, messages):
        ids = super().push_messages(messages)
        sent_a = [m for m in self.pushed if m.metadata.dst_node_id == 1 and m.metadata.message_type == "train"]
        if len(sent_a) >= self.after and 3 not in self.node_ids:
            self.node_ids.append(3)
        return ids


@pytest.mark.parametrize("schedule", ["sync", "async"])
def test_a_run_resumes_without_a_card_whose_supernode_is_away_and_takes_it_back(tmp_path, schedule):
    """The ServerApp dies; when it resumes, b's SuperNode is away (restarting). The run goes on
    with a alone, and b joins under its new node id as soon as it is back, continuing after its
    last logged round: nothing refuses the resumed run, and every step is logged once."""
    from ftis_flwr.server.state import load_server_state
    from server_app.server_app import run as server_run

    exp = experiment(ASYNC, run_dir=str(tmp_path), **{"exchange.schedule": schedule, "rounds.num_rounds": 6})

    def crash(step, node_metrics):
        if step == 3:
            raise Crash("the ServerApp dies here")

    with pytest.raises(Crash):
        server_run(FakeGrid(honest()), exp, after_round=crash, name="run")
    state = load_server_state(tmp_path / "run")
    b_done = state.schedule["done"]["b"] if schedule == "async" else state.round
    grid = BBackLater()
    assert server_run(grid, None, resume=tmp_path / "run", connect_timeout=0) == tmp_path / "run"
    rows = load_metrics(tmp_path / "run")
    assert [r["round"] for r in rows] == list(range(len(rows)))  # each step once
    to_b = [m.content[protocol.ROUND]["round"] for m in grid.pushed
            if m.metadata.dst_node_id == 3 and m.metadata.message_type == "train"]
    events = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    if schedule == "async":  # it continues right after its last logged round
        assert to_b[0] == b_done + 1, to_b
        assert [(e["old_node_id"], e["node_id"]) for e in events if e["event"] == "node_rebound"] == [(None, 3)]
    else:  # the round after it is back; the rounds without it are a's alone
        assert to_b[0] > b_done + 1, to_b
    assert to_b == sorted(set(to_b)) and to_b[-1] == 6
    assert not [e for e in events if e["event"] == "node_failed"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert set(summary["checkpoints"]) == {"a", "b"}


class Unroutable(FakeGrid):
    """b's SuperNode (id 2) is gone after its round 1: its messages find no route (no message id)
    while a (id 1) is sent ``away`` more rounds; then b's SuperNode is back as id 3."""

    def __init__(self, away: int = 4):
        super().__init__(honest(names={1: "a", 2: "b", 3: "b"}))
        self.away, self.gone_at = away, None

    def push_messages(self, messages):
        to_a = [m for m in self.pushed if m.metadata.dst_node_id == 1 and m.metadata.message_type == "train"]
        b_done = any(m.metadata.dst_node_id == 2 and m.metadata.message_type == "train"
                     and m.content[protocol.ROUND]["round"] == 1 for m in self.pushed)
        if b_done and self.gone_at is None:
            self.gone_at = len(to_a)
            self.undeliverable.add(2)
        if self.gone_at is not None and len(to_a) >= self.gone_at + self.away and 3 not in self.node_ids:
            self.node_ids = [1, 3]
        return super().push_messages(messages)


def test_a_node_without_a_route_waits_at_its_round_instead_of_burning_rounds():
    """Found by benchmarks/chaos.py: a SuperNode away made each step count an undeliverable
    message as an ended round, so the node raced through hundreds of failed rounds (and prompts)
    in seconds and came back far past the schedule, with the others waiting on it. Now it fails
    once, waits at its last ended round, and continues from there under its new node id."""
    grid = Unroutable()
    strategy, events = run(experiment(ASYNC, **{"rounds.num_rounds": 6}), grid)
    failed = [f for k, f in events if k == "node_failed" and f["node"] == "b"]
    assert len(failed) == 1 and "waits for a route" in failed[0]["reason"], failed
    b_rounds = [r for _, r in node_rounds(strategy)["b"]]
    assert b_rounds == list(range(len(b_rounds))) and b_rounds[-1] <= 7, b_rounds  # no round skipped or burned
    to_3 = [m.content[protocol.ROUND]["round"] for m in grid.pushed
            if m.metadata.dst_node_id == 3 and m.metadata.message_type == "train"]
    assert to_3[0] == 2, to_3  # right after its round 1, the last it ended
    assert strategy.checkpoints == {"a": "/ckpt/a", "b": "/ckpt/b"}


def test_the_strategy_meets_what_the_async_rounds_declare_they_need():
    """AsyncRounds keeps its schedule in the strategy's fields: the contract is declared
    (ftis_flwr.server.async_host.AsyncHost) and the strategy meets it."""
    from ftis_flwr.experiment import load_experiment
    from ftis_flwr.server.async_host import AsyncHost
    from ftis_flwr.server.strategy import FTISStrategy

    assert isinstance(FTISStrategy(load_experiment("cpu-pair")), AsyncHost)
