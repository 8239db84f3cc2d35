"""Episodes on the wire (algorithm §13, issue #57): groups with sampled masks (``Group.sampled_masks``)
through both formats, the server's cuts, and every rule a mask must meet.

What is checked: episodes round trip through real Flower records (compact and arrays formats,
every log-prob codec, with and without zlib) with their masks, beside single-turn groups, which
decode with no mask; the compact container carries no log-prob for a context token, so an episode
costs less than the same tokens all sampled; the server's cut and merge keep the masks; a mask
that lies is refused by the sender's ``Group.validate`` and by the receiver in either format, with
the group and completion named: wrong length, a value other than 0/1, a first or last token not
sampled, a nonzero log-prob on a context token, a forged sampled count, a mask with texts.
"""

from __future__ import annotations

import dataclasses
import functools
import struct

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord
from test_rollouts import FP, WIRE, decode, make_group, wire_trip

from ftis_flwr.config.schema import WireConfig
from ftis_flwr.wire import compact as wc
from ftis_flwr.wire.groups import Group, PayloadError, span_ends
from ftis_flwr.wire.rollouts import encode_groups
from ftis_flwr.wire.selection import Cuttable, merge, subset_payload

VOCAB = 1000


def episode_group(rng, pid: str, n: int = 3) -> Group:
    """``n`` episodes: model turns of 1..6 tokens, 1..3 of them, tool turns of 1..8 tokens between."""
    g = make_group(rng, VOCAB, n, pid)
    comps, lps, masks = [], [], []
    for _ in range(n):
        spans = [1]
        for _ in range(int(rng.integers(0, 3))):
            spans += [0, 1]
        mask = np.concatenate([np.full(int(rng.integers(1, 9 if m == 0 else 7)), m, np.uint8) for m in spans])
        comps.append(rng.integers(0, VOCAB, len(mask)).astype(np.int64))
        lps.append(np.where(mask == 1, -rng.exponential(2.0, len(mask)), 0.0).astype(np.float32))
        masks.append(mask)
    masks[0] = np.array([1, 0, 0, 0, 0, 1, 1], np.uint8)  # one episode with a tool turn, always
    comps[0], lps[0] = rng.integers(0, VOCAB, 7).astype(np.int64), np.array([-1, 0, 0, 0, 0, -.5, -2], np.float32)
    return dataclasses.replace(g, completions=comps, logprobs=lps, sampled_masks=masks)


def payload(seed=0):
    rng = np.random.default_rng(seed)
    return [episode_group(rng, "train:1"), make_group(rng, VOCAB, 2, "train:2"), episode_group(rng, "train:3", 4)]


def same(a: list[Group], b: list[Group], tol=0.0):
    assert len(a) == len(b)
    for g, h in zip(a, b):
        assert g.prompt_id == h.prompt_id and g.prompt_tokens.tolist() == h.prompt_tokens.tolist()
        assert [c.tolist() for c in g.completions] == [c.tolist() for c in h.completions]
        assert (g.sampled_masks is None) == (h.sampled_masks is None)
        if g.sampled_masks is not None:
            assert [m.tolist() for m in g.sampled_masks] == [m.tolist() for m in h.sampled_masks]
            for lp, m in zip(h.logprobs, h.sampled_masks):
                assert (lp[m == 0] == 0).all()
        for x, y in zip(g.logprobs, h.logprobs):
            np.testing.assert_allclose(x, y, atol=tol)


@pytest.mark.parametrize("fmt", ["compact", "arrays"])
@pytest.mark.parametrize("codec,compress", [("fp32", "none"), ("bf16", "zlib"), ("fp16", "none")])
def test_episodes_round_trip_beside_single_turn_groups(fmt, codec, compress):
    groups = payload()
    arrays, meta = wire_trip(*encode_groups(groups, vocab_size=VOCAB, format=fmt, logprob_dtype=codec,
                                            compress=compress))
    out = decode(arrays, meta, VOCAB)
    same(groups, out, tol={"fp32": 0.0, "fp16": 2e-3 * 20, "bf16": 2**-8 * 20}[codec])
    assert out[1].sampled_masks is None  # a single-turn group stays one
    for g in out:
        g.validate(VOCAB)


def test_a_payload_without_masks_decodes_as_before():
    rng = np.random.default_rng(1)
    groups = [make_group(rng, VOCAB, 2, "train:1")]
    for fmt in ("compact", "arrays"):
        out = decode(*encode_groups(groups, vocab_size=VOCAB, format=fmt, compress="none"), VOCAB)
        assert out[0].sampled_masks is None
    blob = encode_groups(groups, vocab_size=VOCAB, compress="none")[0]["wire"].numpy().tobytes()
    assert not wc.read_header(blob)["mask"]


def test_context_tokens_cost_no_log_prob_in_the_compact_format():
    rng = np.random.default_rng(2)
    g = episode_group(rng, "train:1", 4)
    context = int(sum((m == 0).sum() for m in g.sampled_masks))
    as_sampled = dataclasses.replace(g, sampled_masks=None)  # the same tokens, log-prob 0 on the context
    sizes = [len(encode_groups([x], vocab_size=VOCAB, compress="none", logprob_dtype="fp32")[0]["wire"].numpy())
             for x in (g, as_sampled)]
    tokens = g.num_tokens
    bits = (tokens + 7) // 8
    assert sizes[0] == sizes[1] - 4 * context + wc.MASK_EXT.size + bits


@pytest.mark.parametrize("fmt", ["compact", "arrays"])
def test_the_servers_cut_and_merge_keep_the_masks(fmt):
    groups = payload(3)
    enc = functools.partial(encode_groups, vocab_size=VOCAB, format=fmt, compress="none", logprob_dtype="fp32")
    arrays, meta = enc(groups)
    same([groups[2], groups[0]], decode(*subset_payload(arrays, meta, [2, 0]), VOCAB)[::-1])
    more = payload(4)
    joined = merge([Cuttable(arrays, meta), Cuttable(*enc(more))])
    same(groups + more, decode(*joined, VOCAB))


@pytest.mark.parametrize("edit,message", [
    (lambda g: g.sampled_masks.pop(), r"sampled_masks must be a list of one array per completion \(3\)"),
    (lambda g: g.sampled_masks.__setitem__(0, np.ones(3, np.uint8)), r"completion 0: sampled mask must be a 1-D 0/1"),
    (lambda g: g.sampled_masks[0].__setitem__(1, 2), r"completion 0: sampled mask holds 2"),
    (lambda g: g.sampled_masks[0].__setitem__(0, 0), r"completion 0: its first and last tokens must be sampled"),
    (lambda g: g.sampled_masks[0].__setitem__(6, 0), r"completion 0: its first and last tokens must be sampled"),
    (lambda g: g.logprobs[0].__setitem__(2, -0.5), r"completion 0: token 2 is not sampled but has log-prob -0.5"),
    (lambda g: setattr(g, "texts", [b""] * 3), r"completion 0: token \d+ covers 0 bytes \(only a model turn's end"),
])
def test_a_mask_that_lies_is_refused_by_the_sender(edit, message):
    g = episode_group(np.random.default_rng(5), "train:1")
    g.byte_lengths = None
    edit(g)
    if g.texts is not None:  # every token but each model turn's last covers no byte: only those may
        g.byte_lengths = [np.zeros(len(c), np.int64) for c in g.completions]
    with pytest.raises(PayloadError, match=message):
        g.validate(VOCAB)
    with pytest.raises(PayloadError, match=message):
        encode_groups([g], vocab_size=VOCAB)


def _arrays_with(edit):
    arrays, meta = encode_groups(payload(), vocab_size=VOCAB, format="arrays", logprob_dtype="fp32")
    a = {k: arrays[k].numpy().copy() for k in arrays.keys()}
    edit(a)
    return ArrayRecord({k: Array.from_numpy_ndarray(v) for k, v in a.items()}), meta


G0C0 = r"group 0 \(prompt_id 'train:1'\): completion 0"


@pytest.mark.parametrize("edit,message", [
    (lambda a: a.__setitem__("sampled", a["sampled"][:-1]), r"sampled-mask entries for \d+ completion tokens"),
    (lambda a: a["sampled"].__setitem__(1, 3), rf"{G0C0}: sampled mask holds 3"),
    (lambda a: a["sampled"].__setitem__(0, 0), rf"{G0C0}: its first and last tokens must be sampled"),
    (lambda a: a["logprobs"].__setitem__(1, -1.0), rf"{G0C0}: token 1 is not sampled but has log-prob -1.0"),
    (lambda a: a.__setitem__("sampled", a["sampled"].astype(np.int32)), r"array 'sampled' must be 1-D uint8"),
])
def test_a_mask_that_lies_is_refused_by_the_receiver_in_format_1(edit, message):
    with pytest.raises(PayloadError, match=message):
        decode(*wire_trip(*_arrays_with(edit)), VOCAB)


def _compact(edit=None, raw=None):
    arrays, _ = encode_groups(payload(), vocab_size=VOCAB, compress="none", logprob_dtype="fp32")
    blob = arrays["wire"].numpy().tobytes()
    if edit is not None:
        f = wc.unpack(blob, WIRE)
        edit(f)
        blob = wc.pack(f, id_bits=wc.bits_for(VOCAB - 1))
    if raw is not None:
        blob = raw(blob)
    return ArrayRecord({"wire": Array.from_numpy_ndarray(np.frombuffer(blob, np.uint8))}), ConfigRecord()


def _count(blob: bytes, value: int) -> bytes:
    at = wc.read_header(blob)["header_bytes"] - wc.MASK_EXT.size
    return blob[:at] + struct.pack("<I", value) + blob[at + 4:]


@pytest.mark.parametrize("edit,raw,message", [
    (lambda f: f.sampled.__setitem__(0, 0), None, rf"{G0C0}: its first and last tokens must be sampled"),
    (None, lambda b: _count(b, wc.read_header(b)["sampled"] - 1), r"declares a \d+-byte body, its counts need"),
    (None, lambda b: _count(b, wc.read_header(b)["tokens"] + 1), r"compact payload: \d+ sampled tokens of \d+"),
    (lambda f: setattr(f, "sampled", np.concatenate([f.sampled[:-1], [1 - f.sampled[-1]]]).astype(np.uint8)),
     None, r"group 2 \(prompt_id 'train:3'\): completion 3: its first and last tokens must be sampled"),
    (lambda f: (setattr(f, "text", np.zeros(0, np.uint8)),
                setattr(f, "byte_lengths", np.zeros(len(f.completion_ids), np.int64))), None,
     r"token \d+ covers 0 bytes \(only a model turn's end-of-turn token covers none\)"),
])
def test_a_mask_that_lies_is_refused_by_the_receiver_in_the_compact_format(edit, raw, message):
    with pytest.raises(PayloadError, match=message):
        decode(*_compact(edit, raw), VOCAB, fp=FP, wire=WireConfig())


def test_an_episodes_text_may_leave_only_each_model_turns_last_token_empty():
    """An episode's text (for peers of another tokenizer) covers its model and tool turns; each model
    turn's end-of-turn token covers no byte, every other token at least one."""
    g = episode_group(np.random.default_rng(5), "train:1")
    g.texts, g.byte_lengths = [], []
    for m in g.sampled_masks:
        lengths = np.where(span_ends(m), 0, 1).astype(np.int64)
        g.texts.append(b"x" * int(lengths.sum()))
        g.byte_lengths.append(lengths)
    g.validate(VOCAB)
    for fmt in ("compact", "arrays"):
        (back,) = decode(*encode_groups([g], vocab_size=VOCAB, format=fmt, compress="none", logprob_dtype="fp32"),
                         VOCAB)
        same([g], [back])
        assert [bytes(t) for t in back.texts] == g.texts
        assert all(np.array_equal(a, b) for a, b in zip(back.byte_lengths, g.byte_lengths))
    inner = next(k for k, e in enumerate(span_ends(g.sampled_masks[0])) if not e)
    g.byte_lengths[0] = g.byte_lengths[0].copy()
    g.byte_lengths[0][inner] = 0
    g.texts[0] = g.texts[0][1:]
    with pytest.raises(PayloadError, match=f"completion 0: token {inner} covers 0 bytes"):
        g.validate(VOCAB)
    with pytest.raises(PayloadError, match=f"token {inner} covers 0 bytes"):
        encode_groups([g], vocab_size=VOCAB)


def _with_texts(g: Group) -> Group:
    g.texts, g.byte_lengths = [], []
    for m in g.sampled_masks:
        lengths = np.where(span_ends(m), 0, 1).astype(np.int64)
        g.texts.append(b"x" * int(lengths.sum()))
        g.byte_lengths.append(lengths)
    return g


@pytest.mark.parametrize("fmt", ["compact", "arrays"])
def test_an_episode_groups_tool_format_and_layout_cross_the_wire_and_are_checked(fmt):
    """A sender of episodes with texts names its tool-call format and tool-turn layout (what its
    template writes around results; ``"null"``: none) per group, for receivers of another template;
    they round trip in either format, and a receiver refuses a name or layout that breaks the rules,
    a payload where only some groups carry them, and either without the texts."""
    rng = np.random.default_rng(7)
    a, b = _with_texts(episode_group(rng, "train:1")), _with_texts(episode_group(rng, "train:2"))
    a.tool_format, a.tool_layout = "tiny", '["=", "\\n=", "\\n"]'
    b.tool_format, b.tool_layout = "hermes", "null"
    back = decode(*wire_trip(*encode_groups([a, b], vocab_size=VOCAB, format=fmt)), VOCAB)
    assert [(g.tool_format, g.tool_layout) for g in back] == [("tiny", a.tool_layout), ("hermes", "null")]
    single = decode(*encode_groups([_with_texts(episode_group(rng, "train:3"))], vocab_size=VOCAB, format=fmt), VOCAB)
    assert single[0].tool_format is None and single[0].tool_layout is None
    for edit, message in [({"tool_format": "Hermes!"}, "is not a format name"),
                          ({"tool_layout": '["=", "\\n="]'}, "a JSON list of three strings"),
                          ({"tool_layout": json_list("x" * 5000)}, "more than 4096"),
                          ({"tool_layout": None}, "come together or not at all"),
                          ({"texts": None, "byte_lengths": None}, "come only with the episodes' texts")]:
        bad = dataclasses.replace(a, **edit)
        with pytest.raises(PayloadError, match=message):
            bad.validate(VOCAB)
    with pytest.raises(PayloadError, match="some groups carry their tool format"):
        encode_groups([a, dataclasses.replace(b, tool_format=None, tool_layout=None)], vocab_size=VOCAB, format=fmt)


def json_list(head: str) -> str:
    return f'["{head}", "", ""]'


@pytest.mark.parametrize("fmt", ["compact", "arrays"])
def test_a_receiver_refuses_a_forged_tool_format_or_layout(fmt):
    """What the sender's check would refuse, packed by hand, is refused by the receiver too."""
    from ftis_flwr.wire import arrays as wire_arrays
    from ftis_flwr.wire.rollouts import _flat

    g = _with_texts(episode_group(np.random.default_rng(8), "train:1"))
    g.tool_format, g.tool_layout = "tiny", "not json"
    completions = list(g.completions)
    flat_lp = _flat([np.asarray(lp, np.float32) for lp in g.logprobs], np.float32)
    text = (np.frombuffer(b"".join(g.texts), np.uint8), _flat([np.asarray(b) for b in g.byte_lengths], np.int64))
    sampled = _flat([np.asarray(m, np.uint8) for m in g.sampled_masks], np.uint8)
    if fmt == "arrays":
        arrays, meta = wire_arrays.encode([g], completions, flat_lp, "fp32", "uint16", text, sampled, True)
    else:
        fields = wc.Fields(strings={k: [getattr(g, k)] for k in wc.str_keys(True)},
                           prompt_ids=np.asarray(g.prompt_tokens, np.int64),
                           prompt_offsets=np.array([0, len(g.prompt_tokens)]),
                           completion_ids=_flat(completions, np.int64),
                           completion_offsets=np.cumsum([0] + [len(c) for c in completions]),
                           group_offsets=np.array([0, g.size]), logprobs=flat_lp,
                           rewards=np.asarray(g.rewards, np.float32), text=text[0], byte_lengths=text[1],
                           sampled=sampled)
        blob = wc.pack(fields, id_bits=wc.bits_for(VOCAB - 1))
        arrays, meta = ArrayRecord({"wire": Array.from_numpy_ndarray(np.frombuffer(blob, np.uint8))}), ConfigRecord()
    with pytest.raises(PayloadError, match="tool_layout: a tool-turn layout is a JSON list of three strings"):
        decode(arrays, meta, VOCAB)
