"""Wire format 2 (compact): exact round trips, bounded 16-bit error, sizes, and every rejection.

Payloads go through Flower's protobuf as a message would; forged containers are built with the
format's own packer (what a forger's code would do), so each check is reached by a real payload.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import struct
import zlib

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord
from test_rollouts import FP, G0, G2, decode, make_group, sample_groups, wire_trip

from ftis_flwr.config.schema import WireConfig
from ftis_flwr.wire import compact as wc
from ftis_flwr.wire.groups import PayloadError
from ftis_flwr.wire.rollouts import (
    bytes_per_completion_token,
    completion_tokens,
    decode_groups,
    encode_groups,
    payload_bytes,
    payload_size,
)

WIRE = WireConfig()


encode_groups = functools.partial(encode_groups, compress="none", logprob_dtype="fp32")  # exact


def fields_of(groups, vocab=1000):
    """The sample groups as unchecked Fields (a forger edits these, then packs them)."""
    arrays, meta = encode_groups(groups, vocab_size=vocab)
    return wc.unpack(_blob(arrays), WIRE)


def _blob(arrays) -> bytes:
    return arrays["wire"].numpy().tobytes()


def record(blob: bytes) -> tuple[ArrayRecord, ConfigRecord]:
    return ArrayRecord({"wire": Array.from_numpy_ndarray(np.frombuffer(blob, np.uint8))}), ConfigRecord()


def forged(edit, vocab=1000, id_bits=10, **kw):
    f = fields_of(sample_groups(vocab), vocab)
    edit(f)
    return record(wc.pack(f, id_bits=id_bits, **kw))


def same_groups(a, b, exact=True, tol=0.0):
    assert len(a) == len(b)
    for g, h in zip(a, b):
        for field in ("prompt_id", "node", "model_id", "tokenizer_fp"):
            assert getattr(h, field) == getattr(g, field)
        assert h.prompt_tokens.dtype == np.int64
        np.testing.assert_array_equal(h.prompt_tokens, g.prompt_tokens)
        np.testing.assert_array_equal(h.rewards, np.asarray(g.rewards, np.float32))
        assert h.size == g.size
        for c, d, lc, ld in zip(g.completions, h.completions, g.logprobs, h.logprobs):
            assert d.dtype == np.int64 and ld.dtype == np.float32
            np.testing.assert_array_equal(d, c)
            if exact:  # bit-identical, not merely equal (-0.0, subnormals)
                np.testing.assert_array_equal(ld.view(np.uint32),
                                              np.asarray(lc, np.float32).view(np.uint32))
            else:
                np.testing.assert_allclose(ld, lc, rtol=tol, atol=2**-24)


@pytest.mark.parametrize("vocab", [1, 2, 64, 256, 257, 65536, 65537, 151_665])
@pytest.mark.parametrize("compress", ["none", "zlib"])
def test_random_payloads_round_trip_bit_identical_at_fp32(vocab, compress):
    rng = np.random.default_rng(vocab)
    for trial in range(4):
        groups = [make_group(rng, vocab, int(rng.integers(1, 9)), f"train:{trial}.{i}",
                             node=str(rng.choice(["a", "b"])), max_len=int(rng.integers(1, 40)))
                  for i in range(int(rng.integers(0, 7)))]
        for g in groups[:1]:
            g.completions[0][0] = vocab - 1  # the largest id must survive the packing
            g.logprobs[0][-1] = -0.0
            g.rewards[:] = rng.normal(size=g.size)  # non-binary rewards: no palette
        arrays, meta = wire_trip(*encode_groups(groups, vocab_size=vocab, compress=compress))
        assert list(arrays.keys()) == ["wire"] and len(meta) == 0
        assert completion_tokens(arrays) == sum(g.num_tokens for g in groups)
        assert payload_size(arrays, meta) == (len(groups), sum(g.size for g in groups))
        same_groups(groups, decode(arrays, meta, vocab=vocab))


@pytest.mark.parametrize("codec,tol", [("fp16", 2**-11), ("bf16", 2**-8)])
def test_16_bit_logprobs_within_half_an_ulp(codec, tol):
    groups = sample_groups(151_665, seed=3)
    groups[0].logprobs[0] = np.array([-70.0, -1e-7, -3e-5, -0.5, -12.3], np.float32)
    groups[0].completions[0] = np.arange(5, dtype=np.int64)
    arrays, meta = wire_trip(*encode_groups(groups, vocab_size=151_665, logprob_dtype=codec))
    out = decode(arrays, meta, vocab=151_665)
    same_groups(groups, out, exact=False, tol=tol)
    assert all(np.all(lp <= 0) for g in out for lp in g.logprobs)


def test_ids_take_ceil_log2_vocab_bits():
    groups = sample_groups(1000)
    tokens = sum(g.num_tokens for g in groups)
    prompt = sum(len(g.prompt_tokens) for g in groups)
    blob = _blob(encode_groups(groups, vocab_size=1000, logprob_dtype="fp16")[0])
    h = wc.read_header(blob)
    assert h["id_bits"] == 10 and h["tokens"] == tokens and h["prompt_tokens"] == prompt
    sections = dict(wc._section_sizes(h))
    assert sections["completion ids"] == (10 * tokens + 7) // 8
    assert sections["log-probs"] == 2 * tokens
    assert sections["rewards"] == 4 * 2 + 2  # palette {0, 1} + 9 one-bit indices
    assert sections["string table"] == len("train:1train:2train:3abmodel-amodel-b" + FP)
    assert len(blob) == wc.HEADER.size + sum(sections.values())


def test_empty_payload():
    arrays, meta = wire_trip(*encode_groups([], vocab_size=1000))
    assert decode(arrays, meta) == []
    assert np.isnan(bytes_per_completion_token(arrays, meta))
    assert payload_size(arrays, meta) == (0, 0)


def _paper_like(n, g, length, vocab, prompt_len, seed=0):
    """Groups shaped as benchmarks/wire_bytes.py makes them (random ids: no compressor help)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        comps = [rng.integers(0, vocab, size=int(rng.integers(length // 2, length + 1)))
                 for _ in range(g)]
        out.append(dataclasses.replace(
            make_group(rng, vocab, g, f"train:{i}"), prompt_tokens=rng.integers(0, vocab, prompt_len),
            completions=comps, logprobs=[-rng.exponential(1.0, len(c)).astype(np.float32) for c in comps],
            model_id="a:model"))
    return out


@pytest.mark.parametrize("case", [(12, 12, 640, 151_665, 150), (16, 8, 3, 64, 6), (64, 8, 6, 62, 6)])
def test_sixteen_bit_compact_is_at_most_five_bytes_per_token(case):
    n, g, length, vocab, prompt_len = case
    groups = _paper_like(n, g, length, vocab, prompt_len)
    for codec in ("fp16", "bf16"):
        arrays, meta = encode_groups(groups, vocab_size=vocab, logprob_dtype=codec)
        assert bytes_per_completion_token(arrays, meta) <= 5.0
    a1, m1 = encode_groups(groups, vocab_size=vocab, format="arrays", logprob_dtype="fp16")
    assert bytes_per_completion_token(arrays, meta) < bytes_per_completion_token(a1, m1)


def test_payload_bytes_counts_the_one_array():
    arrays, meta = encode_groups(sample_groups(), vocab_size=1000)
    assert payload_bytes(arrays, meta) == len("wire") + len(arrays["wire"].data)


# ---- rejections: each check of format 1 has its counterpart here ------------------------------

def _set(name, index, value):
    def edit(f):
        getattr(f, name)[index] = value
    return edit


def _pos(k=0):
    """Flat position of token k of completion 1 of group 2 ('train:3')."""
    comps = [c for g in sample_groups() for c in g.completions]
    return sum(len(c) for c in comps[:5]) + k


def _lengths(name, change):
    """Edit one offsets array through its lengths (the wire carries lengths)."""
    def edit(f):
        lengths = list(np.diff(getattr(f, name)))
        change(lengths)
        off = np.zeros(len(lengths) + 1, np.int64)
        off[1:] = np.cumsum(lengths)
        setattr(f, name, off)
    return edit


def _drop_last_completion(f):
    """One completion fewer than the group sizes say, its reward and tokens gone too: a
    self-consistent container, so the offsets check is what catches it."""
    last = f.completion_offsets[-2]
    f.completion_offsets = f.completion_offsets[:-1]
    f.rewards = f.rewards[:-1]
    f.completion_ids, f.logprobs = f.completion_ids[:last], f.logprobs[:last]


@pytest.mark.parametrize(
    "edit,message",
    [
        (_set("logprobs", _pos(1), np.nan), G2 + r": completion 1 token 1: log-prob nan is non-finite"),
        (_set("logprobs", _pos(0), -np.inf), G2 + r": completion 1 token 0: .*non-finite"),
        (_set("logprobs", _pos(0), 0.5), G2 + r": completion 1 token 0: log-prob 0.5 is positive"),
        (_set("completion_ids", _pos(0), 1000),
         G2 + r": completion 1 token 0: token id 1000 outside \[0, 1000\)"),
        (_set("prompt_ids", 0, 1023), G0 + r": prompt token 0: token id 1023 outside"),
        (_drop_last_completion, r"completion_offsets has 9 entries, expected 10"),
        (_lengths("completion_offsets", lambda v: v.__setitem__(-1, v[-1] + 1)),
         r"completion_offsets ends at \d+ but the data holds \d+"),
        (_lengths("completion_offsets", lambda v: v.__setitem__(4, 0)),
         G2 + r": completion 0: completion_offsets not strictly increasing"),
        (_lengths("group_offsets", lambda v: v.__setitem__(0, 0)), G0 + r": group_offsets not strictly"),
        (_lengths("prompt_offsets", lambda v: v.__setitem__(2, 0)),
         G2 + r": prompt_offsets not strictly increasing"),
        (_lengths("prompt_offsets", lambda v: v.__setitem__(2, v[2] + 5)),
         r"prompt_offsets ends at \d+ but the data holds \d+"),
        (_set("rewards", 0, np.inf), G0 + r": non-finite reward"),
        (lambda f: f.strings["tokenizer_fp"].__setitem__(2, "mixed"),
         G2 + r": tokenizer fingerprint 'mixed' differs"),
    ],
)
def test_forged_fields_rejected(edit, message):
    arrays, meta = forged(edit)
    with pytest.raises(PayloadError, match=message):
        decode(arrays, meta)


@pytest.mark.parametrize("cut", ["logprobs", "rewards"])
def test_lengths_that_one_count_sizes_cannot_disagree(cut):
    """Format 1's 'logprobs length != completion_ids length' and 'rewards length != completions':
    here one header count sizes both sections, so a forger who drops an element leaves a body
    whose size disagrees with the counts."""
    f = fields_of(sample_groups())
    setattr(f, cut, getattr(f, cut)[:-1])
    blob = wc.pack(f, id_bits=10)
    with pytest.raises(PayloadError, match=r"header declares a \d+-byte body, its counts need \d+"):
        decode(*record(blob))


def test_bf16_and_fp16_positive_and_nan_logprobs_rejected():
    for codec in ("fp16", "bf16"):
        arrays, meta = forged(_set("logprobs", _pos(0), 0.5), codec=codec)
        with pytest.raises(PayloadError, match=G2 + r": completion 1 token 0: log-prob 0.5 is pos"):
            decode(arrays, meta)
        arrays, meta = forged(_set("logprobs", _pos(1), np.nan), codec=codec)  # the packer casts it
        with pytest.raises(PayloadError, match=G2 + r": completion 1 token 1: log-prob nan is non-finite"):
            decode(arrays, meta)
        arrays, meta = forged(_set("logprobs", _pos(1), -1e6), codec=codec)
        if codec == "fp16":  # -1e6 is -inf in fp16: non-finite once decoded
            with pytest.raises(PayloadError, match=r"completion 1 token 1: log-prob -inf is non-finite"):
                decode(arrays, meta)


def test_caps_enforced_from_the_header():
    arrays, meta = encode_groups(sample_groups(), vocab_size=1000)
    tokens = sum(g.num_tokens for g in sample_groups())
    longest = max(len(c) for g in sample_groups() for c in g.completions)
    for wire, message in [
        (WireConfig(max_groups=2), r"^3 groups exceed wire.max_groups=2$"),
        (WireConfig(max_tokens_per_payload=tokens - 1),
         rf"^{tokens} completion tokens exceed wire.max_tokens_per_payload={tokens - 1}$"),
        (WireConfig(max_completions_per_group=4), G2 + r": 5 completions exceed "
                                                  r"wire.max_completions_per_group=4"),
        (WireConfig(max_completions_per_group=2), r"9 completions in 3 groups exceed "
                                                  r"wire.max_completions_per_group=2 per group"),
        (WireConfig(max_tokens_per_completion=longest - 1),
         rf"has {longest} tokens, over wire.max_tokens_per_completion={longest - 1}"),
        (WireConfig(max_payload_bytes=100), r"bytes exceed wire.max_payload_bytes=100"),
    ]:
        with pytest.raises(PayloadError, match=message):
            decode(arrays, meta, wire=wire)
    assert len(decode(arrays, meta, wire=WireConfig(max_groups=3, max_tokens_per_payload=tokens))) == 3


def _header(blob: bytes, **changes) -> bytes:
    """The container with header fields replaced (by name, as read_header names them)."""
    names = ["magic", "version", "flags", "id_bits", "zero", "groups", "completions", "tokens",
             "prompt_tokens", "strings", "string_bytes", "palette", "body_bytes", "widths"]
    values = dict(zip(names, wc.HEADER.unpack_from(blob)))
    values.update(changes)
    return wc.HEADER.pack(*[values[k] for k in names]) + blob[wc.HEADER.size:]


def test_forged_container_rejected():
    blob = _blob(encode_groups(sample_groups(), vocab_size=1000)[0])
    h = wc.read_header(blob)
    cases = [
        (blob[:20], r"20 bytes, shorter than its 44-byte header"),
        (blob[:-1], r"body is \d+ bytes, the header's counts need \d+ \(truncated\)"),
        (blob + b"\0", r"\(trailing bytes\)"),
        (_header(blob, magic=b"XXXX"), r"magic b'XXXX'"),
        (_header(blob, version=3), r"version 3, this receiver reads 2"),
        (_header(blob, flags=0x40), r"unknown flags 0x40"),
        (_header(blob, flags=3), r"unknown flags 0x03"),
        (_header(blob, id_bits=40), r"bit widths 40 \(ids\)"),
        (_header(blob, tokens=h["tokens"] + 1), r"declares a \d+-byte body, its counts need"),
        (_header(blob, body_bytes=h["body_bytes"] + 1), r"declares a \d+-byte body"),
        (_header(blob, strings=13), r"13 strings for 3 groups"),
        (_header(blob, palette=10), r"reward palette of 10 values for 9 completions"),
        (_header(blob, tokens=2**31), r"^2147483648 completion tokens exceed wire.max_tokens_per"),
    ]
    for bad, message in cases:
        with pytest.raises(PayloadError, match=message):
            decode(*record(bad))


def _edit_section(blob: bytes, name: str, change) -> bytes:
    h = wc.read_header(blob)
    at = wc.HEADER.size
    for section, size in wc._section_sizes(h):
        if section == name:
            part = bytearray(blob[at : at + size])
            change(part)
            return blob[:at] + bytes(part) + blob[at + size :]
        at += size
    raise KeyError(name)


def test_forged_sections_rejected():
    groups = sample_groups()
    groups[1].node, groups[1].model_id = "a", "model-a"  # 6 strings: 3-bit indices can say 7
    blob = _blob(encode_groups(groups, vocab_size=1000)[0])
    cases = [
        ("completion ids", lambda b: b.__setitem__(-1, b[-1] | 1), r"'completion ids' has non-zero padding"),
        ("string table", lambda b: b.__setitem__(0, 0xFF), r"string 0 is not UTF-8"),
        ("string indices", lambda b: b.__setitem__(0, 0xFF), r"group 0 names string 7, the table has 6"),
    ]
    for name, change, message in cases:
        with pytest.raises(PayloadError, match=message):
            decode(*record(_edit_section(blob, name, change)))
    f = fields_of(sample_groups())
    f.strings["model_id"][1] = ""
    with pytest.raises(PayloadError, match=r"string \d+ is empty"):
        decode(*record(wc.pack(f, id_bits=10)))


def test_palette_index_past_the_palette_rejected():
    f = fields_of(sample_groups())
    f.rewards = np.array([0, 1, 2, 0, 1, 2, 0, 1, 2], np.float32)  # palette of 3: 2-bit indices
    blob = wc.pack(f, id_bits=10)
    bad = _edit_section(blob, "rewards", lambda b: b.__setitem__(12, 0xC0))  # index 3
    with pytest.raises(PayloadError, match=r"completion 0 names reward 3, the palette has 3"):
        decode(*record(bad))


def test_zlib_only_where_it_pays():
    groups = sample_groups()  # random ids and log-probs: the stream would be larger
    assert not wc.read_header(_blob(encode_groups(groups, vocab_size=1000, compress="zlib")[0]))["zlib"]
    for g in groups:
        g.logprobs = [np.full(len(c), -0.25, np.float32) for c in g.completions]
    plain = encode_groups(groups, vocab_size=1000)
    packed = encode_groups(groups, vocab_size=1000, compress="zlib")
    assert wc.read_header(_blob(packed[0]))["zlib"]
    assert payload_bytes(*packed) < payload_bytes(*plain)


def test_zlib_body_checked_before_and_after_inflating():
    groups = sample_groups()
    for g in groups:  # compressible log-probs, so that the sender uses zlib
        g.logprobs = [np.full(len(c), -0.25, np.float32) for c in g.completions]
    blob = _blob(encode_groups(groups, vocab_size=1000, compress="zlib")[0])
    h = wc.read_header(blob)
    assert h["zlib"]
    body = zlib.decompress(blob[wc.HEADER.size:])
    head = blob[: wc.HEADER.size]
    cases = [
        (head + zlib.compress(body)[:-3], r"not a complete stream"),
        (head + zlib.compress(body) + b"junk", r"4 trailing bytes after the zlib body"),
        (head + zlib.compress(body + b"\0"), r"inflates to \d+\+ bytes"),
        (head + b"not zlib at all", r"zlib body is corrupt"),
        # a bomb: the header's counts bound what is inflated, whatever the stream holds
        (head + zlib.compress(body + bytes(50_000_000)), r"inflates to \d+\+ bytes"),
    ]
    for bad, message in cases:
        with pytest.raises(PayloadError, match=message):
            decode(*record(bad))
    with pytest.raises(PayloadError, match=r"bytes exceed wire.max_payload_bytes=200"):
        decode(*record(_header(blob, body_bytes=10**6)), wire=WireConfig(max_payload_bytes=200))
    same_groups(groups, decode(*record(blob)))


def test_record_shape_rejected():
    arrays, meta = encode_groups(sample_groups(), vocab_size=1000)
    meta["format_version"] = 2
    with pytest.raises(PayloadError, match=r"compact payload: meta must be empty, has keys \['format_version'\]"):
        decode(arrays, meta)
    arrays, meta = encode_groups(sample_groups(), vocab_size=1000)
    arrays["extra"] = Array.from_numpy_ndarray(np.zeros(1))
    with pytest.raises(PayloadError, match=r"unexpected keys \['extra'\]"):
        decode(arrays, meta)
    blob = _blob(arrays)
    for arr, message in [
        (Array.from_numpy_ndarray(np.frombuffer(blob, np.uint8).astype(np.int16)), r"1-D uint8"),
        (Array.from_numpy_ndarray(np.frombuffer(blob, np.uint8).reshape(1, -1)), r"must be a 1-D"),
        (Array(dtype="uint8", shape=(len(blob),), stype="raw", data=blob), r"\(raw\)"),
        (Array(dtype="uint8", shape=(len(blob),), stype="numpy.ndarray", data=blob),
         r"no valid npy header"),
    ]:
        with pytest.raises(PayloadError, match=message):
            decode(ArrayRecord({"wire": arr}), ConfigRecord())
    # an npy header that declares more than its data holds: caught before numpy allocates it
    bio = io.BytesIO()
    np.lib.format.write_array_header_1_0(bio, {"descr": "|u1", "fortran_order": False,
                                               "shape": (10**12,)})
    lying = bio.getvalue() + blob
    with pytest.raises(PayloadError, match=r"declares \(\d+,\) uint8, its data holds"):
        decode(ArrayRecord({"wire": Array(dtype="uint8", shape=(len(blob),),
                                          stype="numpy.ndarray", data=lying)}), ConfigRecord())


def test_unreadable_compact_payload_counts_zero():
    arrays, meta = record(b"junk")
    assert payload_size(arrays, meta) == (0, 0) and completion_tokens(arrays) == 0


def test_both_formats_decode_to_the_same_groups():
    groups = sample_groups(151_665, seed=9)
    for codec in ("fp32", "fp16", "bf16"):
        v1 = decode(*wire_trip(*encode_groups(groups, vocab_size=151_665, format="arrays",
                                              logprob_dtype=codec)), vocab=151_665)
        v2 = decode(*wire_trip(*encode_groups(groups, vocab_size=151_665, logprob_dtype=codec)),
                    vocab=151_665)
        same_groups(v1, v2)


def test_encoder_refuses_unknown_choices_and_bad_groups():
    with pytest.raises(ValueError, match=r"wire.format must be one of \('compact', 'arrays'\)"):
        encode_groups(sample_groups(), vocab_size=1000, format="json")
    with pytest.raises(ValueError, match=r"wire.compress must be one of"):
        encode_groups(sample_groups(), vocab_size=1000, compress="lzma")
    g = sample_groups()[0]
    g.logprobs[0][0] = np.float32(-1e6)
    with pytest.raises(PayloadError, match=r"log-probs overflow fp16"):
        encode_groups([g], vocab_size=1000, logprob_dtype="fp16")
    with pytest.raises(PayloadError, match="out of range"):
        encode_groups(sample_groups(), vocab_size=10)


def test_unpacking_never_reads_past_declared_counts():
    """A header whose counts fit the caps but need more bytes than sent is refused by length."""
    blob = _blob(encode_groups(sample_groups(), vocab_size=1000)[0])
    h = wc.read_header(blob)
    bigger = _header(blob, prompt_tokens=h["prompt_tokens"] + 1000,
                     body_bytes=h["body_bytes"] + (1000 * 10 + 7) // 8)
    with pytest.raises(PayloadError, match=r"\(truncated\)"):
        decode(*record(bigger))
    struct.unpack_from("<4s", blob)  # the header stays readable on its own
    assert decode_groups(*record(blob), expected_fp=FP, vocab_size=1000, wire=WIRE)


def test_config_chooses_the_format_and_checks_the_byte_cap():
    from ftis_flwr.config.schema import ConfigError
    from ftis_flwr.experiment import load_experiment

    exp = load_experiment("cpu-pair")
    assert (exp.wire.format, exp.wire.compress, exp.wire.logprob_dtype) == ("compact", "zlib", "fp16")
    assert load_experiment("cpu-pair", {"wire.format": "arrays"}).wire.format == "arrays"
    with pytest.raises(ConfigError, match=r"wire.format.*'json'"):
        load_experiment("cpu-pair", {"wire.format": "json"})
    with pytest.raises(ConfigError, match=r"wire.compress.*'lzma'"):
        load_experiment("cpu-pair", {"wire.compress": "lzma"})
    with pytest.raises(ConfigError, match=r"wire.max_payload_bytes=1000 is under 8 bytes per token"):
        load_experiment("cpu-pair", {"wire.max_payload_bytes": 1000})
