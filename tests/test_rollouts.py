"""Wire codec: round trips through real Flower records (and their protobuf), and every rejection."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict
from flwr.common import serde
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Split
from transformers import PreTrainedTokenizerFast

from ftis_flwr.config.schema import WireConfig
from ftis_flwr.wire.groups import Group, PayloadError, groups_by_node, tokenizer_fingerprint
from ftis_flwr.wire.rollouts import (
    bytes_per_completion_token,
    decode_groups,
    encode_groups,
    payload_bytes,
    payload_size,
)

encode_groups = functools.partial(encode_groups, format="arrays", logprob_dtype="fp32")  # format 1

FP = "abcdef0123456789"
G0 = r"group 0 \(prompt_id 'train:1'\)"
G2 = r"group 2 \(prompt_id 'train:3'\)"
WIRE = WireConfig()


def make_group(rng, vocab, n, pid, node="a", max_len=9, fp=FP) -> Group:
    comps = [rng.integers(0, vocab, size=rng.integers(1, max_len + 1)) for _ in range(n)]
    return Group(
        prompt_id=pid,
        prompt_tokens=rng.integers(0, vocab, size=rng.integers(1, 6)).astype(np.int64),
        completions=[c.astype(np.int64) for c in comps],
        logprobs=[(-rng.exponential(2.0, size=len(c))).astype(np.float32) for c in comps],
        rewards=rng.integers(0, 2, size=n).astype(np.float32),
        node=node,
        model_id=f"model-{node}",
        tokenizer_fp=fp,
    )


def wire_trip(arrays: ArrayRecord, meta: ConfigRecord) -> tuple[ArrayRecord, ConfigRecord]:
    """Through Flower's protobuf, as a message would travel."""
    rd = serde.recorddict_from_proto(
        serde.recorddict_to_proto(RecordDict({"groups": arrays, "meta": meta}))
    )
    return rd["groups"], rd["meta"]


def sample_groups(vocab=1000, seed=0):
    rng = np.random.default_rng(seed)
    return [
        make_group(rng, vocab, 3, "train:1", "a"),
        make_group(rng, vocab, 1, "train:2", "b"),
        make_group(rng, vocab, 5, "train:3", "a", max_len=20),
    ]


def decode(arrays, meta, vocab=1000, wire=WIRE, fp=FP):
    return decode_groups(arrays, meta, expected_fp=fp, vocab_size=vocab, wire=wire)


@pytest.mark.parametrize("vocab,tok_dtype", [(200, "uint8"), (256, "uint8"), (257, "uint16"),
                                             (65536, "uint16"), (151936, "int32")])
@pytest.mark.parametrize("lp_dtype", ["fp32", "fp16", "bf16"])
def test_round_trip(vocab, tok_dtype, lp_dtype):
    groups = sample_groups(vocab, seed=vocab)
    groups[0].completions[0][-1] = vocab - 1  # the largest id must survive the narrow dtype
    arrays, meta = wire_trip(*encode_groups(groups, logprob_dtype=lp_dtype, vocab_size=vocab))
    assert meta["token_dtype"] == tok_dtype
    assert arrays["completion_ids"].dtype == tok_dtype
    out = decode(arrays, meta, vocab)
    assert len(out) == len(groups)
    tol = {"fp32": 0.0, "fp16": 2**-10, "bf16": 2**-8}[lp_dtype]
    for g, h in zip(groups, out):
        for field in ("prompt_id", "node", "model_id", "tokenizer_fp"):
            assert getattr(h, field) == getattr(g, field)
        assert h.prompt_tokens.dtype == np.int64
        np.testing.assert_array_equal(h.prompt_tokens, g.prompt_tokens)
        assert h.size == g.size and h.num_tokens == g.num_tokens
        np.testing.assert_array_equal(h.rewards, g.rewards)
        for c, d, lc, ld in zip(g.completions, h.completions, g.logprobs, h.logprobs):
            assert d.dtype == np.int64 and ld.dtype == np.float32
            np.testing.assert_array_equal(d, c)
            np.testing.assert_allclose(ld, lc, rtol=tol, atol=0)
            assert np.all(ld <= 0)


def test_bf16_is_upper_half_of_fp32_rounded():
    g = sample_groups()[0]
    g.logprobs[0][:] = -1.0  # exactly representable: bit pattern 0xBF80
    arrays, _ = encode_groups([g], logprob_dtype="bf16", vocab_size=1000)
    wire = arrays["logprobs"].numpy()
    assert wire.dtype == np.uint16
    assert np.all(wire[: len(g.logprobs[0])] == 0xBF80)


def test_empty_payload_round_trips():
    arrays, meta = wire_trip(*encode_groups([], vocab_size=1000))
    assert decode(arrays, meta) == []
    assert np.isnan(bytes_per_completion_token(arrays, meta))


def test_encoder_refuses_malformed_group():
    g = sample_groups()[0]
    g.logprobs[1] = g.logprobs[1][:-1]
    with pytest.raises(PayloadError, match=r"group 0: group 'train:1': completion 1: .* log-probs"):
        encode_groups([g], vocab_size=1000)
    g = sample_groups()[0]
    g.completions[2] = np.zeros(0, np.int64)
    g.logprobs[2] = np.zeros(0, np.float32)
    with pytest.raises(PayloadError, match="completion 2: has no tokens"):
        encode_groups([g], vocab_size=1000)
    g = sample_groups()[0]
    with pytest.raises(PayloadError, match="out of range"):
        encode_groups([g], vocab_size=10)


def tamper(key, fn, lp_dtype="fp32"):
    """Encode the sample groups, apply fn to one array, rebuild the record."""
    arrays, meta = encode_groups(sample_groups(), logprob_dtype=lp_dtype, vocab_size=1000)
    arr = arrays[key].numpy().copy()
    arr = fn(arr)
    arrays[key] = Array.from_numpy_ndarray(arr)
    return arrays, meta


def group2_pos(k=0):
    """Flat completion position of token k of completion 1 in group 2 ('train:3')."""
    groups = sample_groups()
    comps = [c for g in groups for c in g.completions]
    return sum(len(c) for c in comps[:5]) + k


def setv(i, v):
    def fn(a):
        a[i] = v
        return a
    return fn


@pytest.mark.parametrize(
    "key,fn,message",
    [
        ("logprobs", setv(group2_pos(1), np.nan),
         G2 + r": completion 1 token 1: log-prob nan is non-finite"),
        ("logprobs", setv(group2_pos(0), -np.inf), r"group 2 .*completion 1 token 0: .*non-finite"),
        ("logprobs", setv(group2_pos(0), 0.5),
         G2 + r": completion 1 token 0: log-prob 0.5 is positive"),
        ("completion_ids", setv(group2_pos(0), 1000),
         G2 + r": completion 1 token 0: token id 1000 outside \[0, 1000\)"),
        ("prompt_ids", setv(0, 5000), G0 + r": prompt token 0: token id 5000"),
        ("completion_offsets", lambda a: a[:-1], r"completion_offsets has 9 entries, expected 10"),
        ("completion_offsets", setv(-1, 10**6),
         r"completion_offsets ends at 1000000 but the data holds"),
        ("completion_offsets", setv(5, 0),
         G2 + r": completion 0: completion_offsets not strictly increasing"),
        ("group_offsets", setv(1, 0), G0 + r": group_offsets not strictly"),
        ("group_offsets", setv(0, 1), r"group_offsets starts at 1, expected 0"),
        ("prompt_offsets", setv(-1, 1),
         G2 + r": prompt_offsets not strictly increasing at 2 \(\d+ -> 1\)"),
        ("prompt_offsets", setv(-1, 999), r"prompt_offsets ends at 999 but the data holds \d+"),
        ("logprobs", lambda a: a[:-1], r"logprobs length \d+ != completion_ids length"),
        ("rewards", lambda a: a[:-1], r"rewards length 8 != 9 completions"),
        ("rewards", setv(0, np.inf), G0 + r": non-finite reward"),
        ("logprobs", lambda a: a.astype(np.float64), r"array 'logprobs' must be 1-D float32"),
        ("completion_ids", lambda a: a.reshape(1, -1), r"array 'completion_ids' must be 1-D"),
    ],
)
def test_tampered_arrays_rejected(key, fn, message):
    arrays, meta = tamper(key, fn)
    with pytest.raises(PayloadError, match=message):
        decode(arrays, meta)


def test_bf16_positive_logprob_rejected():
    pos = group2_pos(0)
    arrays, meta = tamper("logprobs", setv(pos, 0x3F00), lp_dtype="bf16")  # +0.5 in bf16
    with pytest.raises(PayloadError, match=G2 + r": completion 1 token 0: log-prob 0.5 is pos"):
        decode(arrays, meta)


def test_tiny_positive_logprob_within_tolerance_accepted():
    arrays, meta = tamper("logprobs", setv(0, 5e-5))
    assert decode(arrays, meta)[0].logprobs[0][0] == pytest.approx(5e-5)


def test_fingerprint_mismatch_rejected():
    arrays, meta = encode_groups(sample_groups(), vocab_size=1000)
    with pytest.raises(PayloadError, match=G0 + r": tokenizer fingerprint "
                                           r"'abcdef0123456789' differs from this node's 'other'"):
        decode(arrays, meta, fp="other")
    meta["tokenizer_fp"] = [FP, FP, "mixed"]
    with pytest.raises(PayloadError, match=G2 + r": tokenizer fingerprint"):
        decode(arrays, meta)


def test_caps_enforced():
    arrays, meta = encode_groups(sample_groups(), vocab_size=1000)
    with pytest.raises(PayloadError, match=G2 + r": 5 completions exceed "
                                           r"wire.max_completions_per_group=4"):
        decode(arrays, meta, wire=WireConfig(max_completions_per_group=4))
    longest = max(len(c) for g in sample_groups() for c in g.completions)
    with pytest.raises(PayloadError, match=rf"has {longest} tokens, over wire."
                                           rf"max_tokens_per_completion={longest - 1}"):
        decode(arrays, meta, wire=WireConfig(max_tokens_per_completion=longest - 1))
    with pytest.raises(PayloadError, match=r"3 groups exceed wire.max_groups=2"):
        decode(arrays, meta, wire=WireConfig(max_groups=2))
    assert len(decode(arrays, meta, wire=WireConfig(max_groups=3, max_completions_per_group=5,
                                                    max_tokens_per_completion=longest))) == 3


def test_token_cap_per_payload():
    arrays, meta = encode_groups(sample_groups(), vocab_size=1000)
    tokens = sum(g.num_tokens for g in sample_groups())
    with pytest.raises(PayloadError, match=rf"^{tokens} completion tokens exceed "
                                           rf"wire.max_tokens_per_payload={tokens - 1}$"):
        decode(arrays, meta, wire=WireConfig(max_tokens_per_payload=tokens - 1))
    assert len(decode(arrays, meta, wire=WireConfig(max_tokens_per_payload=tokens))) == 3
    # a declared shape that hides the real length is caught once the data is read
    real = arrays["completion_ids"]
    arrays["completion_ids"] = Array(dtype=real.dtype, shape=(1,), stype=real.stype, data=real.data)
    with pytest.raises(PayloadError, match=rf"^{tokens} completion tokens exceed"):
        decode(arrays, meta, wire=WireConfig(max_tokens_per_payload=tokens - 1))


def test_token_cap_is_checked_against_the_rollout_settings():
    from ftis_flwr.config.schema import ConfigError
    from ftis_flwr.experiment import load_experiment

    load_experiment("paper-size-base")  # the paper presets fit the default cap
    with pytest.raises(ConfigError, match=r"wire.max_tokens_per_payload=1000 must be >= rounds.prompts_per_node x "
                                          r"rollout.group_size x rollout.max_new_tokens = 12 x 12 x 640 = 92160"):
        load_experiment(overrides={"wire.max_tokens_per_payload": 1000, "rounds.prompts_per_node": 12,
                                   "rollout.group_size": 12, "rollout.max_new_tokens": 640})


def test_payload_size_counts_what_a_rejected_payload_claims():
    arrays, meta = encode_groups(sample_groups(), vocab_size=1000)
    assert payload_size(arrays, meta) == (3, 9)
    del meta["prompt_id"]  # unreadable meta: the group count comes from the offsets' shape
    assert payload_size(arrays, meta) == (3, 9)
    assert payload_size(ArrayRecord(), ConfigRecord()) == (0, 0)


def test_missing_keys_and_version_rejected():
    arrays, meta = encode_groups(sample_groups(), vocab_size=1000)
    del arrays["rewards"]
    with pytest.raises(PayloadError, match=r"arrays missing keys \['rewards'\]"):
        decode(arrays, meta)
    arrays, meta = encode_groups(sample_groups(), vocab_size=1000)
    arrays["extra"] = Array.from_numpy_ndarray(np.zeros(1))
    with pytest.raises(PayloadError, match=r"unexpected keys \['extra'\]"):
        decode(arrays, meta)
    for key, value, message in [
        ("format_version", 2, "format_version is 2, this receiver reads 1 .arrays. or a compact"),
        ("logprob_dtype", "fp8", "logprob_dtype 'fp8' is not one of"),
        ("token_dtype", "int64", "token_dtype 'int64' is not one of"),
        ("node", ["a", "b"], r"meta lists differ in length"),
        ("model_id", ["x", "", "y"], r"meta 'model_id' is missing or not a list of non-empty str"),
    ]:
        arrays, meta = encode_groups(sample_groups(), vocab_size=1000)
        meta[key] = value
        with pytest.raises(PayloadError, match=message):
            decode(arrays, meta)
    arrays, meta = encode_groups(sample_groups(), vocab_size=1000)
    del meta["format_version"]
    with pytest.raises(PayloadError, match="format_version is None"):
        decode(arrays, meta)
    arrays, meta = encode_groups(sample_groups(), vocab_size=1000)
    del meta["prompt_id"]
    with pytest.raises(PayloadError, match="meta 'prompt_id' is missing"):
        decode(arrays, meta)


def test_token_dtype_must_match_declared():
    arrays, meta = encode_groups(sample_groups(), vocab_size=1000)  # uint16 on the wire
    meta["token_dtype"] = "int32"
    with pytest.raises(PayloadError, match=r"array 'prompt_ids' must be 1-D int32, got 1-D uint16"):
        decode(arrays, meta)


def test_bytes_per_token_from_records():
    groups = sample_groups(vocab=151936)
    tokens = sum(g.num_tokens for g in groups)
    a32, m32 = encode_groups(groups, logprob_dtype="fp32", vocab_size=151936)
    a16, m16 = encode_groups(groups, logprob_dtype="fp16", vocab_size=151936)
    expected = sum(len(k) + len(v.data) for k, v in a32.items())
    for k, v in m32.items():
        values = v if isinstance(v, list) else [v]
        expected += len(k) + sum(len(x) if isinstance(x, str) else 8 for x in values)
    assert payload_bytes(a32, m32) == expected
    assert bytes_per_completion_token(a32, m32) == pytest.approx(expected / tokens)
    # the id + log-prob data alone is 8 bytes per completion token; the rest is overhead
    assert bytes_per_completion_token(a32, m32) > 8.0
    assert bytes_per_completion_token(a16, m16) < bytes_per_completion_token(a32, m32)
    diff = payload_bytes(a32, m32) - payload_bytes(a16, m16)
    assert diff == 2 * tokens + len("fp32") - len("fp16")


def test_bytes_per_token_approaches_eight_for_long_completions():
    rng = np.random.default_rng(1)
    groups = [make_group(rng, 151936, 12, f"train:{i}", max_len=600) for i in range(8)]
    arrays, meta = encode_groups(groups, vocab_size=151936)
    bpt = bytes_per_completion_token(arrays, meta)
    assert 8.0 < bpt < 8.5


def test_groups_by_node_keeps_order():
    groups = sample_groups()
    by = groups_by_node(groups)
    assert list(by) == ["a", "b"]
    assert [g.prompt_id for g in by["a"]] == ["train:1", "train:3"]


def char_tokenizer(chars="0123456789+-= ", eos_id=None):
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    vocab.update({c: i + 3 for i, c in enumerate(chars)})
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = Split("", behavior="isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>",
                                   unk_token="<unk>")
    if eos_id is not None:
        fast.eos_token = {v: k for k, v in vocab.items()}[eos_id]
    return fast


def test_tokenizer_fingerprint():
    a, b = char_tokenizer(), char_tokenizer()
    assert a("12+3")["input_ids"] == [4, 5, 13, 6]
    fp = tokenizer_fingerprint(a)
    assert isinstance(fp, str) and len(fp) == 16 and int(fp, 16) >= 0
    assert tokenizer_fingerprint(b) == fp
    assert tokenizer_fingerprint(char_tokenizer("0123456789+-=  x")) != fp  # vocab changed
    assert tokenizer_fingerprint(char_tokenizer("1023456789+-= ")) != fp  # same tokens, other ids
    assert tokenizer_fingerprint(char_tokenizer(eos_id=0)) != fp  # special token id changed
