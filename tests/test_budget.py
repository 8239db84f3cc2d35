"""The per-node budget of foreign groups (exchange.*), the payload cutter, and per-node idle time.

Strategy tests use test_strategy's fake Grid with hand-built replies (real Flower Messages and
records, payloads from ``encode_groups``); the cutter is checked against the real decoder, and a
real tiny Node checks that a cut payload passes every receiver check.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord
from test_strategy import (  # noqa: F401
    FP,
    VOCAB,
    FakeGrid,
    experiment,
    finish_reply,
    foreign,
    groups_for,
    honest,
    indices,
    real_nodes,
    run,
    task_identity,
    tiny_nodes,
    train_reply,
)

from ftis_flwr.config.schema import ConfigError, ExchangeConfig
from ftis_flwr.server.budget import ForeignBudget, add_idle, compute_seconds
from ftis_flwr.wire import protocol
from ftis_flwr.wire.rollouts import decode_groups, encode_groups, payload_bytes
from ftis_flwr.wire.selection import WireSelectError, group_rewards, subset_payload

THREE = {1: "a", 2: "b", 3: "c"}
YAML3 = """
rounds: {num_rounds: 2, prompts_per_node: 3, eval_every: 0, round_timeout: 0.3, startup_timeout: 0.3}
rollout: {group_size: 4, max_new_tokens: 8}
nodes: [{name: a}, {name: b}, {name: c}]
"""


def budget(n: int, select: str, **more):
    return experiment(YAML3, **{"exchange.max_foreign_groups": n, "exchange.select": select, **more})


def varied_groups(name: str, idx: list[int], size: int) -> list:
    """Groups whose claimed rewards have a known variance: group j has j of ``size`` rewards 1
    (prompt index i -> j = i % (size + 1)), and completions of different lengths."""
    out = groups_for(name, idx, size)
    for g, i in zip(out, idx):
        j = i % (size + 1)
        g.rewards = np.array([1.0] * j + [0.0] * (size - j), np.float32)
        g.completions = [np.full(1 + (k + i) % 3, 5 + k) for k in range(size)]
        g.logprobs = [np.full(len(c), -0.25 * (k + 1), np.float32) for k, c in enumerate(g.completions)]
    return out


def ids_of(msg, src) -> list[int]:
    """The train indices of the groups actually carried for ``src`` (hand-built ids are
    train:<i>), decoded as a receiver would (any wire format)."""
    from ftis_flwr.config.schema import WireConfig

    arrays_key, meta_key = protocol.foreign_keys(src)
    groups = decode_groups(msg.content[arrays_key], msg.content[meta_key], expected_fp=FP,
                           vocab_size=VOCAB, wire=WireConfig())
    return [int(g.prompt_id.split(":")[1]) for g in groups]


def forwarded(msg) -> dict[str, list[int]]:
    return {src: ids_of(msg, src) for src in foreign(msg)}


# ------------------------------------------------------------------------- the cutter


@pytest.mark.parametrize("fmt", ["arrays", "compact"])
@pytest.mark.parametrize("lp", ["fp32", "fp16", "bf16"])
def test_a_cut_payload_decodes_to_exactly_the_kept_groups(lp, fmt):
    from ftis_flwr.config.schema import WireConfig

    groups = varied_groups("b", [0, 1, 2, 3, 4], 4)
    arrays, meta = encode_groups(groups, logprob_dtype=lp, vocab_size=VOCAB, format=fmt,
                                 compress="zlib")
    whole = decode_groups(arrays, meta, expected_fp=FP, vocab_size=VOCAB, wire=WireConfig())
    sub_arrays, sub_meta = subset_payload(arrays, meta, [3, 0, 4])
    got = decode_groups(sub_arrays, sub_meta, expected_fp=FP, vocab_size=VOCAB, wire=WireConfig())
    assert [g.prompt_id for g in got] == ["train:0", "train:3", "train:4"]  # payload order kept
    for g, want in zip(got, [whole[0], whole[3], whole[4]]):
        assert g.node == want.node and g.model_id == want.model_id and g.tokenizer_fp == want.tokenizer_fp
        np.testing.assert_array_equal(g.prompt_tokens, want.prompt_tokens)
        np.testing.assert_array_equal(g.rewards, want.rewards)
        for c, w in zip(g.completions, want.completions):
            np.testing.assert_array_equal(c, w)
        for c, w in zip(g.logprobs, want.logprobs):
            np.testing.assert_array_equal(c, w)  # bit for bit: nothing re-encoded
    assert {k: v.dtype for k, v in sub_arrays.items()} == {k: v.dtype for k, v in arrays.items()}
    assert payload_bytes(sub_arrays, sub_meta) < payload_bytes(arrays, meta)


@pytest.mark.parametrize("fmt", ["arrays", "compact"])
def test_group_rewards_are_the_claimed_ones_per_group(fmt):
    from ftis_flwr.wire.selection import group_count

    groups = varied_groups("b", [0, 1, 2], 4)
    arrays, meta = encode_groups(groups, vocab_size=VOCAB, format=fmt)
    got = group_rewards(arrays, meta)
    assert [r.tolist() for r in got] == [g.rewards.tolist() for g in groups]
    assert group_count(arrays, meta) == 3


def test_the_cutter_refuses_other_formats_and_bad_input():
    arrays, meta = encode_groups(groups_for("b", [0, 1], 2), vocab_size=VOCAB, format="arrays")
    v3 = ConfigRecord({**dict(meta.items()), "format_version": 3})
    with pytest.raises(WireSelectError, match="format_version 3 cannot be cut"):
        subset_payload(arrays, v3, [0])
    with pytest.raises(WireSelectError, match="format_version 3"):
        group_rewards(arrays, v3)
    compact, cmeta = encode_groups(groups_for("b", [0, 1], 2), vocab_size=VOCAB, format="compact")
    blob = compact["wire"].numpy().copy()
    blob[-3:] = 255  # the container's last bytes: a body that no longer adds up
    broken = ArrayRecord({"wire": Array.from_numpy_ndarray(blob[:-1])})
    with pytest.raises(WireSelectError, match="compact payload cannot be read"):
        subset_payload(broken, cmeta, [0])
    with pytest.raises(ValueError, match=r"distinct group positions in \[0, 2\)"):
        subset_payload(arrays, meta, [2])
    with pytest.raises(ValueError, match="distinct"):
        subset_payload(arrays, meta, [0, 0])
    bad = ArrayRecord(dict(arrays.items()))
    bad["group_offsets"] = Array.from_numpy_ndarray(np.array([0, 3, 1], np.int64))
    with pytest.raises(WireSelectError, match="format 1 payload rejected: .*group_offsets not strictly increasing"):
        subset_payload(bad, meta, [0])


# ----------------------------------------------------------------- the rules, in a round


def test_no_budget_forwards_everything_as_before():
    grid = FakeGrid(honest(names=THREE), node_ids=(1, 2, 3))
    strategy, _ = run(experiment(YAML3), grid)
    r0, r1 = grid.train_messages(0), grid.train_messages(1)
    for me in (1, 2, 3):
        want = {THREE[o]: indices(r0[o]) for o in (1, 2, 3) if o != me}
        assert foreign(r1[me]) == want and forwarded(r1[me]) == want
        assert strategy.history[1].node_metrics[THREE[me]]["foreign_groups_received"] == 6


@pytest.mark.parametrize("select", ["random", "reward_variance", "low_kl"])
@pytest.mark.parametrize("n", [1, 4, 6, 9])
def test_the_budget_is_respected_and_provenance_lists_only_what_is_forwarded(select, n):
    grid = FakeGrid(honest(names=THREE), node_ids=(1, 2, 3))
    strategy, _ = run(budget(n, select), grid)
    r0 = grid.train_messages(0)
    for rnd in (1, 2):
        for me, msg in grid.train_messages(rnd).items():
            fwd = forwarded(msg)
            assert sum(len(v) for v in fwd.values()) == min(n, 6)
            assert foreign(msg) == fwd  # the stamp names exactly the groups carried
            for src, got in fwd.items():
                assert src != THREE[me]
                if rnd == 1:  # a subset of what the source was assigned, in its order
                    src_id = next(i for i, nm in THREE.items() if nm == src)
                    assert set(got) <= set(indices(r0[src_id])) and got == sorted(got)
            m = strategy.history[rnd].node_metrics[THREE[me]]
            assert m["foreign_groups_received"] == min(n, 6)
            assert m["foreign_bytes_received"] == sum(
                payload_bytes(msg.content[protocol.foreign_keys(s)[0]], msg.content[protocol.foreign_keys(s)[1]])
                for s in fwd)


def test_random_is_seeded_by_run_seed_round_and_receiver():
    def picks(seed):
        grid = FakeGrid(honest(names=THREE), node_ids=(1, 2, 3))
        run(budget(3, "random", **{"rounds.seed": seed}), grid)
        return [{THREE[me]: forwarded(m) for me, m in grid.train_messages(r).items()} for r in (1, 2)]

    first = picks(0)
    assert picks(0) == first  # deterministic
    # which of the 6 pooled groups (first or second source, position in it) each draw took:
    # the receivers and rounds do not all draw alike
    patterns = {tuple(sorted((k, i % 3) for k, v in enumerate(f.values()) for i in v))
                for r in first for f in r.values()}
    assert len(patterns) > 1


def test_reward_variance_picks_the_groups_with_the_widest_rewards():
    """Prompt i's group has i % 5 of 4 rewards 1: variance 0, .1875, .25, .1875, 0 for j=0..4."""
    def varied(msg, name):
        if msg.metadata.message_type != "train":
            return finish_reply(msg, name)
        return train_reply(msg, name, groups=varied_groups(name, indices(msg), 4))

    grid = FakeGrid(honest(names=THREE, special={i: varied for i in THREE}), node_ids=(1, 2, 3))
    run(budget(2, "reward_variance"), grid)
    for me, msg in grid.train_messages(1).items():
        pool = [i for o in THREE if o != me for i in indices(grid.train_messages(0)[o])]
        var = {i: np.var([1.0] * (i % 5) + [0.0] * (4 - i % 5)) for i in pool}
        got = [i for v in forwarded(msg).values() for i in v]
        best = sorted(var.values(), reverse=True)[:2]
        assert sorted((var[i] for i in got), reverse=True) == best, (me, got, var)


def _reporting_kl(kl_of: dict[str, dict[str, float]]):
    """Nodes whose round-1 replies report ``<source>/kl_mean`` as given per receiver."""
    def respond(msg, name):
        if msg.metadata.message_type != "train":
            return finish_reply(msg, name)
        rnd = msg.content[protocol.ROUND]["round"]
        metrics = {f"{s}/kl_mean": v for s, v in kl_of.get(name, {}).items()} if rnd == 1 else {}
        return train_reply(msg, name, metrics=metrics)
    return respond


def test_low_kl_prefers_the_source_the_receiver_measured_closest():
    kl = {"a": {"b": 5.0, "c": 0.1}, "b": {"a": 0.2, "c": 3.0}, "c": {"a": 9.0, "b": 1.0}}
    grid = FakeGrid(honest(names=THREE, special={i: _reporting_kl(kl) for i in THREE}), node_ids=(1, 2, 3))
    run(budget(3, "low_kl"), grid)
    got = {THREE[me]: forwarded(m) for me, m in grid.train_messages(2).items()}
    assert {me: list(f) for me, f in got.items()} == {"a": ["c"], "b": ["a"], "c": ["b"]}
    assert all(len(v) == 3 for f in got.values() for v in f.values())


def test_low_kl_tries_a_source_never_measured_first():
    kl = {"a": {"b": 0.01}}  # a has measured b only (tiny KL); c is still unknown to a
    grid = FakeGrid(honest(names=THREE, special={i: _reporting_kl(kl) for i in THREE}), node_ids=(1, 2, 3))
    run(budget(4, "low_kl"), grid)
    to_a = forwarded(grid.train_messages(2)[1])
    assert len(to_a["c"]) == 3 and len(to_a["b"]) == 1


def test_the_receivers_kl_memory_ignores_its_own_and_non_finite_entries():
    b = ForeignBudget(ExchangeConfig(max_foreign_groups=2, select="low_kl"))
    b.note("a", {"b/kl_mean": 2.0, "a/kl_mean": 0.0, "c/kl_mean": float("nan"), "kl_mean_foreign": 1.0})
    assert b.kl == {"a": {"b": 2.0}}


# ------------------------------------------------------------------------ idle time


def test_idle_fraction_is_the_share_of_the_round_a_node_did_not_compute():
    nodes = {"fast": {"seconds_train": 1.0, "seconds_generate": 0.5, "state_save_seconds": 0.5},
             "slow": {"seconds_train": 6.0, "seconds_generate": 1.0, "seconds_eval": 1.0}}
    add_idle(nodes, 10.0)
    assert nodes["fast"]["compute_seconds"] == 2.0 and nodes["fast"]["idle_fraction"] == pytest.approx(0.8)
    assert nodes["slow"]["compute_seconds"] == 8.0 and nodes["slow"]["idle_fraction"] == pytest.approx(0.2)
    assert compute_seconds({"loss": 3.0}) == 0.0


def test_the_strategy_records_idle_fraction_per_node_per_round():
    def timed(msg, name):
        if msg.metadata.message_type != "train":
            return finish_reply(msg, name)
        return train_reply(msg, name, metrics={"seconds_train": 0.0, "seconds_generate": 0.0})

    grid = FakeGrid(honest(special={1: timed, 2: timed}))
    strategy, _ = run(experiment(), grid)
    for outcome in strategy.history:
        for m in outcome.node_metrics.values():
            assert m["compute_seconds"] == 0.0 and m["idle_fraction"] == 1.0


# ------------------------------------------------------------------ a real receiver


def test_a_real_node_accepts_a_cut_payload(tiny_nodes):  # noqa: F811 (the fixture imported above)
    """b's 2 groups, cut to 1 by the budget: a trains on it, rejects nothing."""
    exp, nodes = tiny_nodes
    import copy

    exp = copy.deepcopy(exp)
    exp.exchange.max_foreign_groups, exp.exchange.select = 1, "random"
    grid = FakeGrid(real_nodes(nodes))
    strategy, events = run(exp, grid)
    m = strategy.history[1].node_metrics["a"]
    assert len(foreign(grid.train_messages(1)[1])["b"]) == 1
    assert m["samples_foreign"] == 2 and m["samples_own"] == 4 and m["foreign_groups_received"] == 1
    assert "b/groups_rejected" not in m and not [e for e in events if e[0] == "payload_rejected"]


# ------------------------------------------------------------------------ validation


@pytest.mark.parametrize("sets,message", [
    ({"exchange.max_foreign_groups": 4}, "exchange.max_foreign_groups=4 needs exchange.select"),
    ({"exchange.select": "random"}, "exchange.select='random' chooses within a budget"),
    ({"exchange.max_foreign_groups": -1}, "exchange.max_foreign_groups=-1 must be >= 0"),
    ({"exchange.max_foreign_groups": 2, "exchange.select": "random", "advantage.mode": "horizontal"},
     "exchange.max_foreign_groups=2 must be 0 with advantage.mode=horizontal"),
])
def test_inconsistent_budget_settings_are_refused_by_name(sets, message):
    with pytest.raises(ConfigError, match=message):
        experiment(**sets)


def test_a_selection_rule_of_ones_own_by_import_path_passes_the_check_and_chooses(tmp_path):
    """``exchange.select='<file.py>:<rule>'``: the check imports it (a path that names nothing is
    refused by key), and the strategy ranks the groups by it: each receiver's budget of 3 is filled
    with c's 3 groups first (b's and a's for c itself)."""
    rule = tmp_path / "my_rule.py"
    rule.write_text("def prefer_c(source, read, kl):\n    return [1.0 if source == 'c' else 0.0] * read.n\n")
    with pytest.raises(ConfigError, match=r"exchange.select='.*my_rule.py:nope': .*has no 'nope'"):
        budget(3, f"{rule}:nope")
    with pytest.raises(ConfigError, match=r"exchange.select='best' is not one of all, random, reward_variance, "
                                          r"low_kl, nor an import path"):
        budget(3, "best")
    grid = FakeGrid(honest(names=THREE), node_ids=(1, 2, 3))
    run(budget(3, f"{rule}:prefer_c"), grid)
    for me, msg in grid.train_messages(1).items():
        fwd = forwarded(msg)
        assert sum(map(len, fwd.values())) == 3
        assert (list(fwd) == ["c"]) if THREE[me] != "c" else (set(fwd) <= {"a", "b"}), (THREE[me], fwd)


# ----------------------------------------------------------------- a peer cannot stop the server


def _float_offsets(msg, name):
    """A format 1 reply whose group offsets are float64: the cutter once sliced with them."""
    if msg.metadata.message_type != "train":
        return finish_reply(msg, name)
    reply = train_reply(msg, name)
    arrays = reply.content[protocol.GROUPS]
    if "group_offsets" in arrays:
        arrays["group_offsets"] = Array.from_numpy_ndarray(arrays["group_offsets"].numpy().astype(np.float64))
    return reply


def _inflated_group_sizes(msg, name):
    """A compact reply whose group sizes add up to more completions than it carries."""
    from ftis_flwr.config.schema import WireConfig
    from ftis_flwr.wire import compact as wc
    from ftis_flwr.wire.rollouts import WIRE_KEY, _compact_bytes

    if msg.metadata.message_type != "train":
        return finish_reply(msg, name)
    reply = train_reply(msg, name)
    arrays, meta = reply.content[protocol.GROUPS], reply.content[protocol.GROUPS_META]
    f = wc.unpack(_compact_bytes(arrays, meta, WireConfig()), WireConfig())
    f.group_offsets = f.group_offsets.copy()
    f.group_offsets[1:] += 2
    blob = wc.pack(f, id_bits=wc.bits_for(VOCAB - 1), codec="fp16", compress="none")
    arrays[WIRE_KEY] = Array.from_numpy_ndarray(np.frombuffer(blob, np.uint8))
    return reply


@pytest.mark.parametrize("forge,fmt", [(_float_offsets, "arrays"), (_inflated_group_sizes, "compact")])
@pytest.mark.parametrize("select", ["random", "reward_variance"])
def test_a_reply_the_cutter_cannot_use_costs_its_sender_the_round_not_the_run(forge, fmt, select):
    """The two replies that stopped the federation with a budget on (TypeError / IndexError in
    the next round's configure step) are now rejected when they arrive."""
    import ftis_flwr.wire.rollouts as rollouts

    grid = FakeGrid(honest(names=THREE, special={3: forge}), node_ids=(1, 2, 3))
    original = rollouts.encode_groups

    def encode(groups, **kw):
        return original(groups, **{**kw, "format": fmt})

    rollouts_encode = pytest.MonkeyPatch()
    rollouts_encode.setattr("test_strategy.encode_groups", encode)
    try:
        strategy, events = run(budget(2, select), grid)
    finally:
        rollouts_encode.undo()
    # rounds 0 and 1 carry groups (the last round generates none, which c cannot get wrong)
    assert [set(h.node_metrics) for h in strategy.history[:2]] == [{"a", "b"}] * 2
    assert len(strategy.history) == 3 and {"a", "b"} <= set(strategy.history[2].node_metrics)
    assert all(list(h.failures) == [3] and "payload rejected by the server" in h.failures[3]
               for h in strategy.history[:2])
    sources = [(f["round"], f["source"]) for k, f in events if k == "payload_rejected" and f["node"] == "server"]
    assert sources[:2] == [(0, "c"), (1, "c")]
    for h in strategy.history[1:]:
        assert all(m["foreign_groups_received"] <= 2 for m in h.node_metrics.values())


def test_any_error_building_one_nodes_message_fails_that_node_alone(monkeypatch):
    from ftis_flwr.server.budget import ForeignBudget

    real = ForeignBudget.select

    def select(self, receiver, rnd, payloads):
        if receiver == "b" and rnd == 1:
            raise RuntimeError("boom in the cutter")
        return real(self, receiver, rnd, payloads)

    monkeypatch.setattr(ForeignBudget, "select", select)
    grid = FakeGrid(honest(names=THREE), node_ids=(1, 2, 3))
    strategy, events = run(budget(2, "random"), grid)
    assert strategy.history[1].failures == {
        2: "the server could not build its message: RuntimeError: boom in the cutter"}
    assert set(strategy.history[1].node_metrics) == {"a", "c"}
    assert set(strategy.history[2].node_metrics) == {"a", "b", "c"} and not strategy.history[2].failures
    assert sorted(grid.train_messages(1)) == [1, 3]
