"""FTISStrategy without a Flower simulation: a fake Grid (the seam) answers with hand-built replies.

Everything else is real: Flower Messages and records, payloads from ``encode_groups``, and, for
the node-side checks, tiny Nodes served through the ClientApp's request builder and the worker's
``step_from_payloads``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import uuid

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict

from clients.client_app import step_payload
from ftis_flwr.config.schema import ConfigError
from ftis_flwr.experiment import load_experiment
from ftis_flwr.node.host.payload_step import step_from_payloads
from ftis_flwr.server.strategy import PROMPT_STRIDE, FederationError, FTISStrategy
from ftis_flwr.wire import protocol
from ftis_flwr.wire.groups import Group
from ftis_flwr.wire.rollouts import encode_groups

VOCAB, FP = 50, "0123456789abcdef"
NAMES = {1: "a", 2: "b"}
YAML = """
rounds: {num_rounds: 2, prompts_per_node: 3, eval_every: 0, round_timeout: 0.3, startup_timeout: 0.3}
rollout: {group_size: 4, max_new_tokens: 8}
nodes: [{name: a}, {name: b}]
"""


@pytest.fixture(autouse=True)
def task_identity(monkeypatch):
    """Flower stamps new Messages with the running app's ids; outside an app, set them."""
    from flwr.supercore.task_identity import TaskIdentity

    for attr, value in (("_run_id", 1), ("_node_id", 1), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, attr, value)


@pytest.fixture
def strategy_log(caplog):
    """The strategy's warnings, even when a ServerApp test stopped ``ftis_flwr`` propagating."""
    logger = logging.getLogger("ftis_flwr.server.strategy")
    logger.addHandler(caplog.handler)
    with caplog.at_level(logging.WARNING, logger="ftis_flwr.server.strategy"):
        yield caplog
    logger.removeHandler(caplog.handler)


class FakeGrid:
    """The seam: nodes answer at once through ``respond(message) -> reply | None`` (None: never).

    ``undeliverable`` node ids get no message id from push_messages ("" like the SuperLink's grid,
    or no entry like the in-memory one); replies put in ``late`` come back with the next pull.
    The build query (protocol.BUILD) is answered by ``build(message)``: by default every node
    says its model is built, as a node whose worker built it at once would.
    """

    def __init__(self, respond, node_ids=(1, 2), undeliverable=(), omit_failed=False, alternate=False,
                 hello_undeliverable=False, build=None):
        self.respond, self.node_ids = respond, list(node_ids)
        self.build = build or build_reply
        self.hello_undeliverable = hello_undeliverable
        self.undeliverable, self.omit_failed, self.alternate = set(undeliverable), omit_failed, alternate
        self.pushed: list[Message] = []
        self.late: list[Message] = []
        self._replies: dict[str, Message] = {}
        self._pulls = 0

    def get_node_ids(self):
        return list(self.node_ids)

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = uuid.uuid4().hex  # as Flower's grids do
            hello = protocol.HELLO in msg.content
            if msg.metadata.dst_node_id in self.undeliverable and (self.hello_undeliverable or not hello):
                if not self.omit_failed:
                    ids.append("")
                continue
            self.pushed.append(msg)
            ids.append(msg.metadata.message_id)
            reply = self.build(msg) if protocol.BUILD in msg.content else self.respond(msg)
            if reply is not None:
                self._replies[msg.metadata.message_id] = reply
        return ids

    def pull_messages(self, message_ids):
        self._pulls += 1
        out = [self._replies.pop(i) for i in message_ids if i in self._replies] + self.late
        self.late = []
        return out[::-1] if self.alternate and self._pulls % 2 else out

    def train_messages(self, rnd: int) -> dict[int, Message]:
        return {m.metadata.dst_node_id: m for m in self.pushed
                if m.metadata.message_type == "train" and m.content[protocol.ROUND]["round"] == rnd}


def experiment(yaml=YAML, **overrides):
    return load_experiment(yaml_text=yaml, overrides=overrides)


def groups_for(name: str, indices, size: int, tokens: int = 3) -> list[Group]:
    return [Group(prompt_id=f"train:{i}", prompt_tokens=np.arange(1, 4),
                  completions=[np.full(tokens, 5 + k) for k in range(size)],
                  logprobs=[np.full(tokens, -0.5, np.float32) for _ in range(size)],
                  rewards=np.zeros(size, np.float32), node=name, model_id=f"m-{name}", tokenizer_fp=FP)
            for i in indices]


def train_reply(msg: Message, name: str, groups=None, metrics=None, rejections=()) -> Message:
    cfg = msg.content[protocol.ROUND]
    if groups is None:
        groups = groups_for(name, json.loads(cfg["prompt_indices"]), int(cfg["group_size"]))
    arrays, meta = encode_groups(groups, vocab_size=VOCAB)
    return Message(content=RecordDict({
        protocol.GROUPS: arrays, protocol.GROUPS_META: meta,
        protocol.METRICS: MetricRecord({"round": float(cfg["round"]), **(metrics or {})}),
        protocol.INFO: ConfigRecord({"node": name, "model_id": f"m-{name}", "worker_pid": 1,
                                     "worker_starts": 1, "rejections": list(rejections) or [""]}),
    }), reply_to=msg)


def labels(msg: Message, src: str) -> list[str]:
    """The generator labels of the groups forwarded from ``src`` (decoded: any wire format)."""
    from ftis_flwr.config.schema import WireConfig
    from ftis_flwr.wire.rollouts import decode_groups

    arrays_key, meta_key = protocol.foreign_keys(src)
    return [g.node for g in decode_groups(msg.content[arrays_key], msg.content[meta_key],
                                          expected_fp=FP, vocab_size=VOCAB, wire=WireConfig())]


def finish_reply(msg: Message, name: str) -> Message:
    return Message(content=RecordDict({protocol.CHECKPOINT: ConfigRecord(
        {"node": name, "path": f"/ckpt/{name}", "updates": 1})}), reply_to=msg)


def build_reply(msg: Message, state: str = "ready", seconds: float = 1.0, progress: str = "",
                error: str = "") -> Message:
    return Message(content=RecordDict({protocol.BUILD: ConfigRecord(
        {"node": "", "state": state, "seconds": seconds, "progress": progress, "error": error})}), reply_to=msg)


def hello_reply(msg: Message, name: str, reason: str = "", unknown: bool = False) -> Message:
    return Message(content=RecordDict({protocol.HELLO: ConfigRecord(
        {"node": name, "reason": reason, "unknown": unknown})}), reply_to=msg)


def honest(names=NAMES, special=None, hellos=None):
    """Every node answers well, except node ids in ``special`` (id -> respond(msg, name)) for
    rounds and finish, and in ``hellos`` (id -> respond(msg, name)) for the HELLO query."""
    special, hellos = special or {}, hellos or {}

    def respond(msg):
        nid = msg.metadata.dst_node_id
        if protocol.HELLO in msg.content:
            return (hellos.get(nid) or hello_reply)(msg, names[nid])
        if nid in special:
            return special[nid](msg, names[nid])
        if msg.metadata.message_type == "train":
            return train_reply(msg, names[nid])
        return finish_reply(msg, names[nid])
    return respond


def run(exp, grid, raises=None):
    events = []
    strategy = FTISStrategy(exp, on_event=lambda kind, **f: events.append((kind, f)), connect_timeout=0)
    if raises is None:
        strategy.start(grid)
    else:
        with pytest.raises(raises[0], match=raises[1]):
            strategy.start(grid)
    return strategy, events


def indices(msg: Message) -> list[int]:
    return json.loads(msg.content[protocol.ROUND]["prompt_indices"])


def foreign(msg: Message) -> dict[str, list[int]]:
    return json.loads(msg.content[protocol.ROUND]["foreign"])


# ----------------------------------------------------------------------------- schedule


@pytest.mark.parametrize("seed", [0, 2])
def test_vertical_prompts_are_disjoint_per_node_and_offset_by_the_run_seed(seed):
    grid = FakeGrid(honest())
    run(experiment(**{"rounds.seed": seed}), grid)
    seen = []
    for rnd in (0, 1):
        msgs = grid.train_messages(rnd)
        assert set(msgs) == {1, 2}
        for msg in msgs.values():
            assert len(indices(msg)) == 3 and msg.content[protocol.ROUND]["group_size"] == 4
            seen += indices(msg)
    assert sorted(seen) == list(range(PROMPT_STRIDE * seed, PROMPT_STRIDE * seed + 12))


@pytest.mark.parametrize("ids", [(1, 2), (2, 1)])
def test_each_card_gets_the_same_prompts_whatever_its_node_id(ids):
    """Flower node ids are random per run: prompts follow the card order, so a seed reproduces."""
    names = {ids[0]: "a", ids[1]: "b"}
    grid = FakeGrid(honest(names=names))
    run(experiment(), grid)
    by_card = {names[nid]: indices(msg) for nid, msg in grid.train_messages(0).items()}
    assert by_card == {"a": [0, 1, 2], "b": [3, 4, 5]}


def test_the_last_round_sends_no_prompts():
    grid = FakeGrid(honest())
    strategy, _ = run(experiment(), grid)
    assert [indices(m) for m in grid.train_messages(2).values()] == [[], []]
    assert len(strategy.history) == 3 and strategy.checkpoints == {"a": "/ckpt/a", "b": "/ckpt/b"}


def test_horizontal_shares_prompts_and_splits_the_group():
    grid = FakeGrid(honest())
    run(experiment(**{"advantage.mode": "horizontal"}), grid)
    r0, r1 = grid.train_messages(0), grid.train_messages(1)
    assert indices(r0[1]) == indices(r0[2]) == [0, 1, 2]
    assert indices(r1[1]) == indices(r1[2]) == [3, 4, 5]
    assert all(m.content[protocol.ROUND]["group_size"] == 2 for m in (*r0.values(), *r1.values()))


def test_vertical_forwards_the_other_nodes_groups_stamped_with_their_source():
    grid = FakeGrid(honest())
    run(experiment(), grid)
    r0, r1 = grid.train_messages(0), grid.train_messages(1)
    assert foreign(r0[1]) == {}
    for me, other in ((1, 2), (2, 1)):
        src = NAMES[other]
        assert foreign(r1[me]) == {src: indices(r0[other])}  # stamped with what src was given
        assert labels(r1[me], src) == [src] * 3
        assert protocol.foreign_keys(NAMES[me])[0] not in r1[me].content  # never its own


def test_the_stamp_is_the_transport_name_not_the_payload_label():
    """Node b labels its groups as a's: a still receives them stamped 'b' (and rejects them)."""
    def relabel(msg, name):
        if msg.metadata.message_type != "train":
            return finish_reply(msg, name)
        return train_reply(msg, name, groups=groups_for("a", indices(msg), 4))

    grid = FakeGrid(honest(special={2: relabel}))
    run(experiment(), grid)
    to_a = grid.train_messages(1)[1]
    assert list(foreign(to_a)) == ["b"]
    assert labels(to_a, "b") == ["a"] * 3


def test_alone_sends_no_foreign_groups():
    grid = FakeGrid(honest())
    run(experiment(**{"advantage.mode": "alone"}), grid)
    for msg in grid.train_messages(1).values():
        assert foreign(msg) == {}
        assert not [k for k in msg.content.keys() if k.startswith("groups.")]


def test_eval_schedule():
    grid = FakeGrid(honest())
    run(experiment(**{"rounds.num_rounds": 5, "rounds.eval_every": 2}), grid)
    flags = [grid.train_messages(r)[1].content[protocol.ROUND]["evaluate"] for r in range(6)]
    assert flags == [True, False, True, False, True, True]


# ----------------------------------------------------------------------------- failures


def failures(strategy, nid):
    return [h.failures.get(nid, "") for h in strategy.history]


def test_a_node_that_does_not_reply_in_time_fails_and_the_others_go_on():
    grid = FakeGrid(honest(special={2: lambda msg, name: None}))
    strategy, events = run(experiment(), grid)
    assert all("no reply within" in f for f in failures(strategy, 2))
    assert [set(h.node_metrics) for h in strategy.history] == [{"a"}] * 3
    assert foreign(grid.train_messages(1)[1]) == {}
    assert [f["node"] for k, f in events if k == "node_failed"] == ["b"] * 3  # bound by HELLO
    assert [f["node"] for k, f in events if k == "checkpoint_failed"] == ["b"]


def test_a_card_whose_supernode_comes_back_under_a_new_id_takes_the_next_round_there():
    """b's SuperNode (id 2) dies in round 1 (no reply; its id leaves the grid) and comes back as
    id 3: round 1 is b's failure, round 2 and the final save go to id 3, never to id 2 again."""
    grid = FakeGrid(None)

    def dies(msg, name):
        if msg.metadata.message_type == "train" and msg.content[protocol.ROUND]["round"] == 1:
            grid.node_ids = [1, 3]
            return None
        return train_reply(msg, name)

    grid.respond = honest(names={1: "a", 2: "b", 3: "b"}, special={2: dies})
    strategy, events = run(experiment(), grid)
    assert [set(h.node_metrics) for h in strategy.history] == [{"a", "b"}, {"a"}, {"a", "b"}]
    assert sorted(grid.train_messages(2)) == [1, 3]
    assert max(m.metadata.dst_node_id == 2 and i for i, m in enumerate(grid.pushed)) < \
        min(i for i, m in enumerate(grid.pushed) if m.metadata.dst_node_id == 3)
    assert strategy.checkpoints == {"a": "/ckpt/a", "b": "/ckpt/b"}


@pytest.mark.parametrize("alternate", [False, True])
def test_a_second_node_id_claiming_a_bound_card_is_left_out_and_the_run_goes_on(alternate):
    grid = FakeGrid(honest(names={1: "a", 2: "a", 3: "b"}), node_ids=(1, 2, 3), alternate=alternate)
    strategy, events = run(experiment(), grid)
    first = strategy.roster.owners["a"]  # whichever answered HELLO first keeps the card
    second = ({1, 2} - {first}).pop()
    assert [set(h.node_metrics) for h in strategy.history] == [{"a", "b"}] * 3
    assert all(not h.failures for h in strategy.history)
    assert second not in [m.metadata.dst_node_id for m in grid.pushed if m.metadata.message_type == "train"]
    (left,) = [f for k, f in events if k == "node_left_out"]
    assert left["node_id"] == second and f"which node id {first} already serves" in left["reason"]


def test_a_duplicate_claim_does_not_hide_a_card_nobody_serves():
    grid = FakeGrid(honest(names={1: "a", 2: "a"}))
    strategy, _ = run(experiment(), grid, raises=(FederationError, r"(?s)cannot start:.*'b' has no SuperNode"
                                                  r".*node id [12] is left out: it claims model card 'a', "
                                                  r"which node id [12] already"))
    assert not grid.train_messages(0), "no round may start"


def test_an_unknown_card_and_a_missing_node_are_refused_before_round_0():
    def huge(msg, name):
        return hello_reply(msg, "", "node config card='huge' is neither a model card ...", unknown=True)

    grid = FakeGrid(honest(hellos={2: huge}))
    run(experiment(), grid, raises=(FederationError, r"(?s)node id 2: node config card='huge'.*"
                                    r"model card 'b' has no SuperNode: start one with --node-config"))
    assert not grid.train_messages(0)


def test_a_supernode_without_a_card_is_left_out_once_and_never_sent_a_round():
    def cardless(msg, name):
        return hello_reply(msg, "", "this SuperNode has neither a 'card' nor a 'partition-id'")

    grid = FakeGrid(honest(names={**NAMES, 3: "?"}, hellos={3: cardless}), node_ids=(1, 2, 3))
    strategy, events = run(experiment(), grid)
    assert [set(h.node_metrics) for h in strategy.history] == [{"a", "b"}] * 3
    assert all(not h.failures for h in strategy.history)
    assert [m.metadata.dst_node_id for m in grid.pushed if m.metadata.message_type == "train"
            ] == [1, 2] * 3
    assert [(k, f["node_id"]) for k, f in events if k == "node_left_out"] == [("node_left_out", 3)]
    assert sum(protocol.HELLO in m.content for m in grid.pushed) == 3  # one HELLO per node id, ever


def test_what_a_node_says_before_it_builds_reaches_the_servers_log_at_the_start(strategy_log):
    """A node's build-time notes (slow dtype, memory) ride its HELLO answer to the server's
    stream; a malformed notes field is said and ignored, never a reason to leave the node out."""
    def noted(msg, name):
        reply = hello_reply(msg, name)
        reply.content[protocol.HELLO]["notes"] = f"node {name}: needs about 30.0 GiB and cpu has 20.0 GiB free\n"
        return reply

    def odd(msg, name):
        reply = hello_reply(msg, name)
        reply.content[protocol.HELLO]["notes"] = 7
        return reply

    strategy, events = run(experiment(), FakeGrid(honest(hellos={1: noted, 2: odd})))
    assert "node a: needs about 30.0 GiB and cpu has 20.0 GiB free" in strategy_log.text
    assert "node id 2: its HELLO notes are not text (int); ignored" in strategy_log.text
    assert [set(h.node_metrics) for h in strategy.history] == [{"a", "b"}] * 3
    assert not [k for k, _ in events if k == "node_left_out"]


def test_build_notes_name_a_slow_dtype_and_a_card_too_big_for_the_machine(monkeypatch):
    """Said on the node's machine before it builds (ftis_flwr.config.plan.build_notes): the CPU's
    bfloat16 support and the free memory are read from the machine; both are pinned here."""
    import dataclasses

    from ftis_flwr.config import dtypes, plan
    from ftis_flwr.config.schema import ModelCard

    monkeypatch.setattr(dtypes, "cpu_has_native_bf16", lambda: False)
    monkeypatch.setattr(plan, "available_bytes", lambda device: 4 * plan.GIB)
    exp = experiment()
    big = ModelCard(name="big", source="Qwen/Qwen2.5-7B", dtype="bfloat16")
    notes = plan.build_notes(big, dataclasses.replace(exp, nodes=[big]))
    assert any("without native bfloat16" in n and "40-60x slower" in n for n in notes), notes
    assert any(n.startswith("node big: needs about") and "4.0 GiB free" in n for n in notes), notes
    auto = ModelCard(name="a", dtype="auto")
    assert [n for n in plan.build_notes(auto, exp) if "auto -> float32" in n]  # the choice is said too


def test_a_hello_that_cannot_be_delivered_refuses_the_start():
    grid = FakeGrid(honest(), undeliverable={2}, hello_undeliverable=True)
    run(experiment(), grid, raises=(FederationError, r"node id 2: the message could not be delivered"))


def test_a_node_changing_its_name_fails():
    def flip(msg, name):
        if msg.metadata.message_type != "train":
            return finish_reply(msg, name)
        return train_reply(msg, "c" if msg.content[protocol.ROUND]["round"] else name)

    strategy, _ = run(experiment(), FakeGrid(honest(special={2: flip})))
    assert failures(strategy, 2)[0] == ""
    assert all("served model card 'b' and now claims 'c'" in f for f in failures(strategy, 2)[1:])


def test_fewer_nodes_than_min_nodes_aborts():
    def broken(msg, name):
        return Message(Error(code=2, reason="ClientApp raised"), reply_to=msg)

    strategy, events = run(experiment(**{"rounds.min_nodes": 2}), FakeGrid(honest(special={2: broken})),
                           raises=(FederationError, r"round 0: 1 node\(s\) replied, fewer than "
                                                    r"rounds.min_nodes=2 \(b: code 2: ClientApp raised\)"))
    assert [k for k, _ in events if k != "node_built"] == ["node_failed"]


def test_every_node_builds_before_the_first_round_and_its_progress_is_logged(strategy_log, monkeypatch):
    """a builds for two polls and says what it does, then is ready; b's build fails (the first
    round tries again: here it answers); c never answers the build query. The rounds start when
    nothing is left to wait for, each built node is a node_built event, and the log names them."""
    from ftis_flwr.server import lifecycle

    monkeypatch.setattr(lifecycle, "BUILD_POLL", 0.0)
    monkeypatch.setattr(lifecycle, "BUILD_ANSWER_TIMEOUT", 0.5)
    strategy_log.set_level(logging.INFO, logger="ftis_flwr.server.strategy")
    names = {1: "a", 2: "b", 3: "c"}
    polls = {1: 0}

    def build(msg):
        nid = msg.metadata.dst_node_id
        if nid == 1:
            polls[1] += 1
            if polls[1] < 3:
                return build_reply(msg, "building", seconds=polls[1], progress=f"converting step {polls[1]}")
            return build_reply(msg, "ready", seconds=7.0)
        if nid == 2:
            return build_reply(msg, "failed", error="FileNotFoundError: no such model")
        return None

    yaml = YAML.replace("nodes: [{name: a}, {name: b}]", "nodes: [{name: a}, {name: b}, {name: c}]")
    grid = FakeGrid(honest(names=names), node_ids=(1, 2, 3), build=build)
    strategy, events = run(experiment(yaml, **{"rounds.round_timeout": 2.0}), grid)
    builds = [m for m in grid.pushed if protocol.BUILD in m.content]
    first_round = min(i for i, m in enumerate(grid.pushed) if m.metadata.message_type == "train")
    assert all(grid.pushed.index(m) < first_round for m in builds)
    assert sorted(m.metadata.dst_node_id for m in builds) == [1, 1, 1, 2, 3]  # a until ready; b, c once
    assert [f for k, f in events if k == "node_built"] == [{"node": "a", "seconds": 7.0}]
    text = strategy_log.text
    for line in ("node a building (1 s): converting step 1", "node a building (2 s): converting step 2",
                 "node a ready: built in 7 s", "node b could not build its model (FileNotFoundError: no such "
                 "model); the first round tries again", "node c did not answer while building"):
        assert line in text, (line, text[-3000:])
    assert [set(h.node_metrics) for h in strategy.history] == [{"a", "b", "c"}] * 3


def test_finish_failures_are_recorded_as_events():
    names = {1: "a", 2: "b", 3: "c", 4: "d"}

    def on_finish(make):
        def respond(msg, name):
            return train_reply(msg, name) if msg.metadata.message_type == "train" else make(msg, name)
        return respond

    respond = honest(names, special={
        1: on_finish(lambda msg, name: Message(Error(code=2, reason="disk full"), reply_to=msg)),
        2: on_finish(lambda msg, name: Message(content=RecordDict(), reply_to=msg)),
        3: on_finish(lambda msg, name: None),
        4: on_finish(lambda msg, name: finish_reply(msg, "a")),  # claims a's checkpoint
    })
    exp = experiment(yaml=YAML.replace("{name: b}]", "{name: b}, {name: c}, {name: d}]"))
    strategy, events = run(exp, FakeGrid(respond, node_ids=(1, 2, 3, 4)))
    failed = {f["node"]: f["reason"] for k, f in events if k == "checkpoint_failed"}
    assert set(failed) == {"a", "b", "c", "d"} and strategy.checkpoints == {}
    assert "code 2: disk full" in failed["a"]
    assert "record 'checkpoint' is missing" in failed["b"]
    assert "no reply within" in failed["c"]
    assert "claims the checkpoint of model card 'a'" in failed["d"]


def _without(key):
    def edit(content):
        del content[key]
    return edit


def _replace(key, record):
    def edit(content):
        content[key] = record
    return edit


def _info(**fields):
    def edit(content):
        for k, v in fields.items():
            content[protocol.INFO][k] = v
    return edit


@pytest.mark.parametrize("edit,reason", [
    (_without(protocol.GROUPS), "record 'groups' is missing"),
    (_without(protocol.GROUPS_META), "record 'groups.meta' is missing"),
    (_without(protocol.METRICS), "record 'metrics' is missing"),
    (_without(protocol.INFO), "record 'info' is missing"),
    (_replace(protocol.GROUPS_META, ArrayRecord()),
     "record 'groups.meta' is a ArrayRecord, expected a ConfigRecord"),
    (_replace(protocol.GROUPS, ConfigRecord({"x": 1})),
     "record 'groups' is a ConfigRecord, expected a ArrayRecord"),
    (_replace(protocol.INFO, MetricRecord({"node": 1})), "record 'info' is a MetricRecord"),
    (_info(node=""), "info 'node' must be a node name"),
    (_info(node="b/samples"), "info 'node' must be a node name"),
    (_info(node=7), "info 'node' must be a node name"),
    (_info(rejections=[1, 2]), "info 'rejections' must be a list of str"),
])
def test_a_malformed_reply_is_that_nodes_failure_never_an_exception(edit, reason):
    def bad(msg, name):
        if msg.metadata.message_type != "train":
            return finish_reply(msg, name)
        reply = train_reply(msg, name)
        edit(reply.content)
        return reply

    grid = FakeGrid(honest(special={2: bad}))
    strategy, _ = run(experiment(), grid)
    assert all(f.startswith("malformed reply: ") and reason in f for f in failures(strategy, 2))
    assert [set(h.node_metrics) for h in strategy.history] == [{"a"}] * 3
    assert foreign(grid.train_messages(1)[1]) == {}


@pytest.mark.parametrize("omit_failed", [False, True])
def test_a_failed_push_is_that_nodes_failure(omit_failed):
    grid = FakeGrid(honest(), undeliverable={2}, omit_failed=omit_failed)
    strategy, events = run(experiment(), grid)
    assert all("could not be delivered" in f for f in failures(strategy, 2))
    assert [set(h.node_metrics) for h in strategy.history] == [{"a"}] * 3
    assert [f["node"] for k, f in events if k == "checkpoint_failed"] == ["b"]
    assert strategy.checkpoints == {"a": "/ckpt/a"}


def test_late_and_duplicate_replies_are_discarded(strategy_log):
    grid = FakeGrid(None)
    first: dict[int, Message] = {}

    def respond(msg):
        nid, rnd = msg.metadata.dst_node_id, msg.content.get(protocol.ROUND, {}).get("round")
        if protocol.HELLO in msg.content:
            return hello_reply(msg, NAMES[nid])
        if msg.metadata.message_type != "train":
            return finish_reply(msg, NAMES[nid])
        first.setdefault(nid, msg)
        if rnd == 1 and nid == 1:  # a stale answer to last round, and a second answer to this one
            grid.late += [train_reply(first[2], "b", metrics={"stale": 1.0}),
                          train_reply(msg, "a", metrics={"second": 1.0})]
        return train_reply(msg, NAMES[nid])

    grid.respond = respond
    strategy, _ = run(experiment(), grid)
    assert not any(h.failures for h in strategy.history)
    assert "stale" not in strategy.history[1].node_metrics["b"]
    assert "second" not in strategy.history[1].node_metrics["a"]
    assert "not a message of this round" in strategy_log.text
    assert "discarded a second reply" in strategy_log.text


@pytest.mark.parametrize("pattern,warned", [((1, 2, 3, 4, 5), [3, 4, 5]), ((1, 2, 4, 5), [])])
def test_rejections_are_events_and_a_repeat_offender_is_named(pattern, warned, strategy_log):
    def receiver(msg, name):
        if msg.metadata.message_type != "train":
            return finish_reply(msg, name)
        if msg.content[protocol.ROUND]["round"] not in pattern:
            return train_reply(msg, name)
        return train_reply(msg, name, rejections=["b: 2 group(s), 8 sample(s) rejected: bad labels"],
                           metrics={"b/groups_rejected": 2, "b/samples_rejected": 8,
                                    "zzz/groups_rejected": 5})  # zzz was never sent: ignored

    _, events = run(experiment(**{"rounds.num_rounds": 5}), FakeGrid(honest(special={1: receiver})))
    rejected = [f for k, f in events if k == "payload_rejected"]
    assert [f["round"] for f in rejected] == list(pattern)
    assert all(f["node"] == "a" and f["source"] == "b" and f["groups"] == 2 and f["samples"] == 8
               and "bad labels" in f["reason"] for f in rejected)
    assert [f["round"] for k, f in events if k == "payload_rejected_repeatedly"] == warned
    assert ("node b keeps sending bad data" in strategy_log.text) == bool(warned)


# --------------------------------------------------------------------- node-side checks

NODE_YAML = """
rounds: {num_rounds: 1, prompts_per_node: 2, eval_every: 0, eval_size: 4, round_timeout: 30}
rollout: {group_size: 2, max_new_tokens: 4}
wire: {max_tokens_per_payload: 16, format: arrays}  # the on-wire forgeries below edit format 1 arrays
train: {lr: 1e-3}
nodes:
  - {name: a, tiny_size: small, warmstart_steps: 1, warmstart_target: 0, seed: 1}
  - {name: b, tiny_size: small, warmstart_steps: 1, warmstart_target: 0, seed: 1}
"""


@pytest.fixture(scope="module")
def tiny_nodes(tmp_path_factory):
    from ftis_flwr.node.node import Node

    cache = tmp_path_factory.mktemp("strategy-nodes")
    exp = load_experiment(yaml_text=NODE_YAML, overrides={"cache_dir": str(cache)})
    return exp, {1: Node(exp.nodes[0], exp, cache_dir=cache), 2: Node(exp.nodes[1], exp, cache_dir=cache)}


def serve(node, msg: Message, tamper=None) -> Message:
    """What the ClientApp + worker do with a round message, with b's groups optionally tampered."""
    out = step_from_payloads(node, step_payload(msg))
    arrays, meta = out["arrays"], out["meta"]
    if getattr(tamper, "on_wire", False):  # the encoded payload itself is forged
        arrays, meta = tamper(node, ArrayRecord(dict(arrays.items())), ConfigRecord(dict(meta.items())))
    elif tamper is not None:
        groups = tamper(node, indices(msg))
        arrays, meta = encode_groups(groups, vocab_size=node.vocab_size)
    return Message(content=RecordDict({
        protocol.GROUPS: arrays, protocol.GROUPS_META: meta,
        protocol.METRICS: MetricRecord({k: float(v) for k, v in out["metrics"].items()}),
        protocol.INFO: ConfigRecord({"node": out["node"], "model_id": out["model_id"], "worker_pid": 1,
                                     "worker_starts": 1, "rejections": list(out["rejections"]) or [""]}),
    }), reply_to=msg)


def real_nodes(nodes, tamper=None):
    """A Grid responder backed by real tiny Nodes (node id -> Node): HELLO, finish, and rounds
    through :func:`serve`, with ``tamper`` applied to b's round-0 groups."""
    def respond(msg):
        node = nodes[msg.metadata.dst_node_id]
        if protocol.HELLO in msg.content:
            return hello_reply(msg, node.card.name)
        if msg.metadata.message_type != "train":
            return finish_reply(msg, node.card.name)
        rnd = msg.content[protocol.ROUND]["round"]
        return serve(node, msg, tamper if node.card.name == "b" and rnd == 0 else None)
    return respond


def _relabel(node, idx):
    return [dataclasses.replace(g, node="a") for g in node.pending]  # passes itself off as a's own


def _unassigned(node, idx):
    return node.generate([i + 100 for i in idx], 2, 0)


def _duplicated(node, idx):
    return [node.pending[0], node.pending[0]]  # within the token cap: the duplicate is the fault


def _oversized(node, idx):
    tok = node.tokenizer("1", add_special_tokens=False)["input_ids"][0]
    return [dataclasses.replace(g, completions=[np.full(4, tok)] * 3, rewards=np.zeros(3, np.float32),
                                logprobs=[np.full(4, -0.5, np.float32)] * 3, texts=None, byte_lengths=None)
            for g in node.pending]


def on_wire(edit):
    """A tamper that forges the encoded payload (what no honest encoder would produce)."""
    def tamper(node, arrays, meta):
        edit(node, arrays, meta)
        return arrays, meta
    tamper.on_wire, tamper.__name__ = True, edit.__name__
    return tamper


def _set(arrays, key, change):
    from flwr.app import Array

    values = arrays[key].numpy().copy()
    arrays[key] = Array.from_numpy_ndarray(change(values))


@on_wire
def _nan_logprob(node, arrays, meta):
    _set(arrays, "logprobs", lambda v: np.where(np.arange(len(v)) == 1, np.nan, v).astype(v.dtype))


@on_wire
def _positive_logprob(node, arrays, meta):
    _set(arrays, "logprobs", lambda v: np.where(np.arange(len(v)) == 0, 0.5, v).astype(v.dtype))


@on_wire
def _out_of_vocab(node, arrays, meta):
    def bump(v):
        v[0] = node.vocab_size + 3
        return v
    _set(arrays, "completion_ids", bump)


@on_wire
def _ragged(node, arrays, meta):
    _set(arrays, "logprobs", lambda v: v[:-1])  # one log-prob fewer than completion tokens


@on_wire
def _wrong_tokenizer(node, arrays, meta):
    """Another tokenizer and no texts (with texts, exchange.cross_tokenizer=auto trains on the
    groups through them: tests/test_cross_node.py)."""
    meta["tokenizer_fp"] = ["f" * 16] * len(meta["tokenizer_fp"])
    for key in ("text", "byte_lengths"):
        arrays.pop(key, None)


@pytest.mark.parametrize("tamper,groups,samples,used,reason", [
    (None, 0, 0, 4, None),
    (_out_of_vocab, 2, 4, 0, "outside [0, 62)"),
    (_wrong_tokenizer, 2, 4, 0, "tokenizer fingerprint 'ffffffffffffffff' differs"),
    (_relabel, 2, 4, 0, "labelled as made by 'a', but the server received it from 'b'"),
    (_unassigned, 2, 4, 0, "prompt id not assigned to b"),
    (_duplicated, 1, 2, 2, "prompt id used more than once"),
])
def test_receivers_reject_by_the_servers_stamp_and_count_groups_and_samples(
        tiny_nodes, tamper, groups, samples, used, reason):
    """What only a receiver can judge (its vocabulary and tokenizer, the stamp, the assignment)."""
    exp, nodes = tiny_nodes
    strategy, events = run(exp, FakeGrid(real_nodes(nodes, tamper)))
    m = strategy.history[1].node_metrics["a"]
    assert not any(h.failures for h in strategy.history)
    rejected = [f for k, f in events if k == "payload_rejected"]
    assert m["samples_own"] == 4 and m["samples_foreign"] == used
    if reason is None:
        assert not rejected and "b/groups_rejected" not in m
        return
    assert m["b/groups_rejected"] == groups and m["b/samples_rejected"] == samples
    assert len(rejected) == 1 and rejected[0]["source"] == "b" and reason in rejected[0]["reason"]
    assert rejected[0]["groups"] == groups and rejected[0]["samples"] == samples
    assert rejected[0]["node"] == "a"


@pytest.mark.parametrize("tamper,groups,samples,reason", [
    (_nan_logprob, 2, 4, "log-prob nan is non-finite"),
    (_positive_logprob, 2, 4, "log-prob 0.5 is positive"),
    (_ragged, 2, 4, "logprobs length 15 != completion_ids length 16"),
    (_oversized, 2, 6, "24 completion tokens exceed wire.max_tokens_per_payload=16"),
])
def test_the_server_rejects_what_breaks_a_wire_rule_before_it_is_kept_or_forwarded(
        tiny_nodes, tamper, groups, samples, reason):
    """A payload no receiver could read costs its sender that round at the server: nothing of it
    is kept or forwarded (no receiver spends bandwidth on it), and the event names the source."""
    exp, nodes = tiny_nodes
    strategy, events = run(exp, FakeGrid(real_nodes(nodes, tamper)))
    (why,) = strategy.history[0].failures.values()
    assert why.startswith("payload rejected by the server: ") and reason in why
    assert not strategy.history[1].failures
    m = strategy.history[1].node_metrics["a"]
    assert m["samples_own"] == 4 and m["samples_foreign"] == 0 and m["foreign_groups_received"] == 0
    assert "b/groups_rejected" not in m  # it never reached a
    rejected = [f for k, f in events if k == "payload_rejected"]
    assert len(rejected) == 1 and rejected[0]["node"] == "server" and rejected[0]["source"] == "b"
    assert rejected[0]["round"] == 0 and reason in rejected[0]["reason"]
    assert (rejected[0]["groups"], rejected[0]["samples"]) == (groups, samples)


def test_a_payload_stamped_with_the_receivers_own_name_is_rejected(tiny_nodes):
    _, nodes = tiny_nodes
    a = nodes[1]
    own = a.generate([0, 1], 2, 0)
    arrays, meta = encode_groups(own, vocab_size=a.vocab_size)
    out = step_from_payloads(a, {"round": 1, "num_rounds": 1, "prompt_indices": [], "group_size": 2,
                                 "evaluate": False, "foreign_payloads": {"a": (arrays, meta, [0, 1])}})
    assert out["metrics"]["a/groups_rejected"] == 2 and out["metrics"]["a/samples_rejected"] == 4
    assert any("stamped these groups with this node's own name" in r for r in out["rejections"])


def test_start_keeps_the_callers_config_and_refuses_what_it_cannot_use():
    from flwr.app import ArrayRecord, ConfigRecord

    from ftis_flwr.experiment import load_experiment
    from ftis_flwr.server.strategy import FTISStrategy

    exp = load_experiment("cpu-pair")
    strategy = FTISStrategy(exp)
    strategy.cfg.rounds.num_rounds = 3
    assert exp.rounds.num_rounds == 40  # the caller's object is not the strategy's
    for kwargs in ({"train_config": ConfigRecord({"lr": 0.1})}, {"evaluate_fn": lambda *a: None},
                   {"initial_arrays": ArrayRecord({"w": __import__("flwr").app.Array.from_numpy_ndarray(
                       __import__("numpy").zeros(2))})}):
        with pytest.raises(TypeError, match="does not take"):
            strategy.start(grid=None, **kwargs)


# ------------------------------------------------------------------ cards pinned to a node's key


def _key_pair():
    from cryptography.hazmat.primitives import serialization as s
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1()).public_key()
    return (key.public_bytes(s.Encoding.OpenSSH, s.PublicFormat.OpenSSH).decode() + " small@host",
            key.public_bytes(s.Encoding.PEM, s.PublicFormat.SubjectPublicKeyInfo))


class KeyedGrid(FakeGrid):
    """A grid that reports each node's public key, as Flower 1.42's ``Grid.get_nodes()`` does."""

    def __init__(self, respond, keys: dict[int, bytes], **kw):
        super().__init__(respond, **kw)
        self.keys = keys

    def get_nodes(self):
        from flwr.proto.node_pb2 import NodeInfo

        return [NodeInfo(node_id=n, public_key=self.keys.get(n, b"")) for n in self.get_node_ids()]


@pytest.mark.parametrize("alternate", [False, True])
def test_a_card_pinned_to_a_key_is_bound_only_to_the_node_with_that_key(alternate):
    (a_ssh, a_pem), (_, b_pem), (_, c_pem) = _key_pair(), _key_pair(), _key_pair()
    grid = KeyedGrid(honest(names={1: "a", 2: "b", 3: "a"}), {1: a_pem, 2: b_pem, 3: c_pem},
                     node_ids=(1, 2, 3), alternate=alternate)
    strategy, events = run(experiment(**{"nodes.a.public_key": a_ssh}), grid)
    assert strategy.roster.owners == {"a": 1, "b": 2}  # whatever the order the answers came in
    assert [set(h.node_metrics) for h in strategy.history] == [{"a", "b"}] * 3
    assert 3 not in [m.metadata.dst_node_id for m in grid.pushed if m.metadata.message_type == "train"]
    (left,) = [f for k, f in events if k == "node_left_out"]
    assert left["node_id"] == 3 and "pinned to the SuperNode key SHA256:" in left["reason"]


def test_a_pinned_card_without_node_keys_refuses_the_run_and_says_why():
    a_ssh, _ = _key_pair()
    grid = FakeGrid(honest())  # a simulation's grid: no node keys
    run(experiment(**{"nodes.a.public_key": a_ssh}), grid,
        raises=(FederationError, r"(?s)model card 'a' has no SuperNode.*node id 1 is left out: .*pinned.*"
                                 r"no node keys: an authenticated deployment"))
    assert not grid.train_messages(0)


def test_a_public_key_that_cannot_be_read_is_a_config_error():
    with pytest.raises(ConfigError, match=r"nodes\[a\]\.public_key: not an OpenSSH public key line"):
        experiment(**{"nodes.a.public_key": "ssh-ed25519 not-base64"})


def test_every_round_message_promises_when_the_next_comes():
    """``next_within`` (#24): the round's wait (the first round's start-up deadline, then the round
    timeout) + a HELLO's + NEXT_MARGIN; a worker that hears nothing by then exits
    (tests/test_worker.py)."""
    from ftis_flwr.server.strategy import NEXT_MARGIN, next_within

    grid = FakeGrid(honest())
    run(experiment(**{"rounds.startup_timeout": 0.5}), grid)
    promised = {r: {m.content[protocol.ROUND]["next_within"] for m in grid.train_messages(r).values()}
                for r in (0, 1, 2)}
    assert promised == {0: {next_within(0.5)}, 1: {next_within(0.3)}, 2: {next_within(0.3)}}
    assert next_within(0.3) == 0.3 + 0.3 + NEXT_MARGIN and next_within(600) == 600 + 120 + NEXT_MARGIN


def test_every_query_is_typed_for_flowers_routing():
    """HELLO, BUILD and FINISH go out as "query.<action>" (the ClientApp's ``@app.query``
    functions), never as a bare "query" that the ClientApp would have to sort by record key."""
    from ftis_flwr.server.lifecycle import query_type

    grid = FakeGrid(honest())
    run(experiment(), grid)
    typed = {}
    for m in grid.pushed:
        if m.metadata.message_type != "train":
            (key,) = list(m.content.keys())
            typed[key] = m.metadata.message_type
    assert typed == {k: query_type(k) for k in (protocol.HELLO, protocol.BUILD, protocol.FINISH)}
    assert typed[protocol.HELLO] == "query.hello" and typed[protocol.FINISH] == "query.finish"
