"""Fuzzing everything that reads a peer's bytes: thousands of seeded mutations of valid payloads.

Readers: the receiver's decoder (both wire formats), the server's reply reader and payload
check, the budget's cutter (read, claimed rewards, cuts) and the counters used on rejected
payloads. Mutations: bit flips, truncation, appended bytes, header counts set to extremes,
dtype swaps, arrays cut or grown, extreme values (int64 limits, NaN, inf), and meta entries
dropped, retyped or resized. The only acceptable outcomes are a correct decode or a counted
rejection (PayloadError / BadReply / WireSelectError): any other exception is a crash a peer
could cause, and anything the server accepts must be cut and decoded without one.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from ftis_flwr.config.schema import ExchangeConfig, WireConfig
from ftis_flwr.server.budget import ForeignBudget
from ftis_flwr.server.replies import BadReply, read_train_reply
from ftis_flwr.wire import protocol
from ftis_flwr.wire.groups import Group, PayloadError
from ftis_flwr.wire.rollouts import (
    completion_tokens,
    decode_groups,
    encode_groups,
    payload_bytes,
    payload_size,
    read_payload,
)
from ftis_flwr.wire.selection import Cuttable, WireSelectError, group_count

VOCAB, FP = 300, "0123456789abcdef"
WIRE = WireConfig(max_completions_per_group=8, max_tokens_per_completion=12, max_groups=16,
                  max_tokens_per_payload=400, max_payload_bytes=20_000)
EXTREMES = (0, 1, -1, 2**31 - 1, 2**32 - 1, 2**63 - 1, -(2**63), float("nan"), float("inf"), -float("inf"), 1e30)
MUTATIONS_PER_PAYLOAD = 60


TEXT_CHARS = "ab 1+=é€😀\n"


def _text(rng: np.random.Generator, n_tokens: int) -> tuple[bytes, np.ndarray]:
    """A UTF-8 text tiled into ``n_tokens`` byte lengths (whole characters; a final 0 at times,
    a completion that ended its turn)."""
    eot = n_tokens > 1 and rng.random() < 0.5
    chars = [str(rng.choice(list(TEXT_CHARS))).encode() for _ in range(n_tokens - eot)]
    return b"".join(chars), np.asarray([len(c) for c in chars] + [0] * eot, np.int64)


def groups(rng: np.random.Generator, text: bool = False) -> list[Group]:
    out = []
    for g in range(int(rng.integers(0, 4))):
        size = int(rng.integers(1, 5))
        comps = [rng.integers(0, VOCAB, int(rng.integers(1, 9))) for _ in range(size)]
        out.append(Group(prompt_id=f"train:{g}", prompt_tokens=rng.integers(0, VOCAB, int(rng.integers(1, 6))),
                         completions=comps, logprobs=[-rng.exponential(1.0, len(c)).astype(np.float32) for c in comps],
                         rewards=rng.choice([0.0, 0.5, 1.0], size).astype(np.float32), node="src",
                         model_id="m-src", tokenizer_fp=FP))
        if text:
            tiles = [_text(rng, len(c)) for c in comps]
            out[-1].texts, out[-1].byte_lengths = [t for t, _ in tiles], [b for _, b in tiles]
    return out


def payloads(seed: int):
    rng = np.random.default_rng(seed)
    for fmt in ("compact", "arrays"):
        for codec in ("fp16", "fp32", "bf16"):
            yield encode_groups(groups(rng, text=codec != "fp32"), vocab_size=VOCAB, format=fmt, logprob_dtype=codec,
                                compress=str(rng.choice(["zlib", "none"])))


def _array(values: np.ndarray) -> Array:
    return Array.from_numpy_ndarray(np.ascontiguousarray(values))


def mutate(arrays: ArrayRecord, meta: ConfigRecord, rng: np.random.Generator) -> tuple[ArrayRecord, ConfigRecord]:
    """One random mutation of a copy of (arrays, meta)."""
    arrays, meta = ArrayRecord(dict(arrays.items())), ConfigRecord(dict(meta.items()))
    key = str(rng.choice(list(arrays.keys())))
    raw = bytearray(arrays[key].data)
    kind = int(rng.integers(0, 9))
    if kind == 0 and raw:  # bit flips anywhere (npy header included)
        for _ in range(int(rng.integers(1, 4))):
            pos = int(rng.integers(0, len(raw)))
            raw[pos] ^= 1 << int(rng.integers(0, 8))
        arrays[key] = Array(dtype=arrays[key].dtype, shape=arrays[key].shape, stype=arrays[key].stype, data=bytes(raw))
    elif kind == 1:  # truncated, or trailing bytes
        cut = int(rng.integers(0, len(raw) + 1))
        data = bytes(raw[:cut]) if rng.random() < 0.5 else bytes(raw) + rng.bytes(int(rng.integers(1, 64)))
        arrays[key] = Array(dtype=arrays[key].dtype, shape=arrays[key].shape, stype=arrays[key].stype, data=data)
    elif kind == 2 and key == "wire":  # a header count of the container set to an extreme
        values = arrays[key].numpy().copy()
        field = 128 + 8 + 4 * int(rng.integers(0, 9))  # past numpy's 128-byte npy header
        pos = field - 128
        if pos + 4 <= len(values):
            values[pos:pos + 4] = np.frombuffer(np.uint32(rng.choice([0, 1, 2**31 - 1, 2**32 - 1,
                                                                      int(rng.integers(0, 5000))])).tobytes(), np.uint8)
        arrays[key] = _array(values)
    elif kind == 3:  # dtype swap
        values = arrays[key].numpy()
        dtype = rng.choice([np.float64, np.float32, np.float16, np.int32, np.int64, np.uint8, np.uint16, np.int8])
        with np.errstate(all="ignore"):
            arrays[key] = _array(values.astype(dtype))
    elif kind == 4:  # an array cut or grown
        values = arrays[key].numpy()
        if rng.random() < 0.5:
            values = values[: int(rng.integers(0, len(values) + 1))]
        else:
            values = np.concatenate([values, values[: int(rng.integers(1, 4))]])
        arrays[key] = _array(values)
    elif kind == 5:  # an extreme value in place
        values = arrays[key].numpy().astype(np.float64 if rng.random() < 0.5 else arrays[key].numpy().dtype)
        if len(values):
            with np.errstate(all="ignore"):
                try:
                    values[int(rng.integers(0, len(values)))] = rng.choice(EXTREMES)
                except (OverflowError, ValueError):
                    values[int(rng.integers(0, len(values)))] = 0
        arrays[key] = _array(values)
    elif kind == 6:  # a shape or 2-D lie
        values = arrays[key].numpy()
        arrays[key] = _array(np.stack([values, values])) if len(values) else _array(values.reshape(0, 1))
    elif kind == 7 and len(meta):  # a meta entry dropped, retyped or resized
        mkey = str(rng.choice(list(meta.keys())))
        choice = int(rng.integers(0, 4))
        if choice == 0:
            del meta[mkey]
        elif choice == 1:
            meta[mkey] = rng.choice([3, "x", 2.5, True])
        elif choice == 2 and isinstance(meta[mkey], list):
            meta[mkey] = meta[mkey][:-1] or ["", "x"]
        else:
            meta[mkey] = [1, 2] if rng.random() < 0.5 else ["a" * 200]
    else:  # an extra or a missing array
        if rng.random() < 0.5:
            arrays["extra"] = _array(np.zeros(3))
        else:
            del arrays[key]
    return arrays, meta


def read_all(arrays: ArrayRecord, meta: ConfigRecord, rng: np.random.Generator) -> str:
    """Every reader on one payload; returns the outcome ("decoded" / "rejected"), raises on a crash."""
    payload_size(arrays, meta), group_count(arrays, meta), completion_tokens(arrays), payload_bytes(arrays, meta)
    try:
        decoded = decode_groups(arrays, meta, expected_fp=FP, vocab_size=VOCAB, wire=WIRE)
    except PayloadError:
        decoded = None
    for g in decoded or []:
        g.validate(VOCAB)  # a decode is a correct one: every group meets the rules
    try:  # a receiver of another tokenizer reads the same bytes through the texts
        other = decode_groups(arrays, meta, expected_fp="f" * 16, vocab_size=VOCAB, wire=WIRE,
                              cross_tokenizer="auto")
    except PayloadError:
        other = None
    for g in other or []:
        g.validate(None)
        assert g.texts is not None
        for t in g.texts:
            t.decode("utf-8")  # a text a receiver accepted is valid UTF-8
    try:
        read_payload(arrays, meta, WIRE)
        server_ok = True
    except PayloadError:
        server_ok = False
    assert decoded is None or server_ok, "the server refused what a receiver accepts"
    content = RecordDict({protocol.GROUPS: arrays, protocol.GROUPS_META: meta,
                          protocol.METRICS: MetricRecord({}), protocol.INFO: ConfigRecord({"node": "src"})})
    try:
        read_train_reply(content, WIRE)
        assert server_ok
    except BadReply:
        assert not server_ok or payload_bytes(arrays, meta) > WIRE.max_payload_bytes
    try:
        cut = Cuttable(arrays, meta, WIRE)
    except WireSelectError:
        assert not server_ok or meta.get("format_version") not in (1, 2, None)
        return "decoded" if decoded is not None else "rejected"
    cut.rewards()
    keep = sorted(set(rng.integers(0, max(cut.n, 1), int(rng.integers(0, cut.n + 1))).tolist())) if cut.n else []
    sub = cut.subset(keep)
    if decoded is not None:  # a cut of a good payload decodes to exactly the kept groups
        again = decode_groups(*sub, expected_fp=FP, vocab_size=VOCAB, wire=WIRE)
        assert [g.prompt_id for g in again] == [decoded[k].prompt_id for k in keep]
        for a, b in zip(again, [decoded[k] for k in keep]):
            assert all(np.array_equal(x, y) for x, y in zip(a.completions, b.completions))
            assert a.texts == b.texts
    budget = ForeignBudget(ExchangeConfig(max_foreign_groups=1, select="reward_variance"), wire=WIRE)
    budget.select("dst", 1, {"src": (arrays, meta, list(range(cut.n)))})
    return "decoded" if decoded is not None else "rejected"


@pytest.mark.parametrize("seed", range(6))
def test_every_mutation_decodes_correctly_or_is_a_counted_rejection(seed):
    rng = np.random.default_rng(1000 + seed)
    outcomes = {"decoded": 0, "rejected": 0}
    for arrays, meta in payloads(seed):
        assert read_all(arrays, meta, rng) == "decoded"  # the unmutated payload is good
        for _ in range(MUTATIONS_PER_PAYLOAD):
            outcomes[read_all(*mutate(arrays, meta, rng), rng)] += 1
    # the mutations are not all caught by one early check, nor all harmless
    assert outcomes["rejected"] > 100 and outcomes["decoded"] > 5, outcomes
