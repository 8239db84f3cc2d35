"""A peer that lies: forgeries of a node's honest reply, and a ClientApp that sends them.

Each forgery takes the (real) groups a node generated in its round, as they leave the ClientApp
(``ArrayRecord`` + ``ConfigRecord`` in the compact wire format), and returns a forged pair. It
edits at the wire level, with the container's own packer and no semantic check (what a forger's
code can do), or decodes, edits and re-encodes the groups. Used by ``tests/test_attacker.py``
(each forgery rejected with its reason) and ``simulations/attack_study.py`` (the honest nodes'
accuracy with a forger in the federation against without).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord

from ftis_flwr.wire import protocol

Forgery = Callable[[ArrayRecord, ConfigRecord], "tuple[ArrayRecord, ConfigRecord]"]


def _wire():
    from ftis_flwr.config.schema import WireConfig

    return WireConfig()


def container(edit: Callable) -> Forgery:
    """Unpack the compact container without checks, ``edit(fields)`` in place, pack it again."""
    def forge(arrays, meta):
        from ftis_flwr.wire import compact as wc
        from ftis_flwr.wire.rollouts import WIRE_KEY, _compact_bytes

        blob = _compact_bytes(arrays, meta, _wire())
        h = wc.read_header(blob)
        fields = wc.unpack(blob, _wire())
        edit(fields)
        id_bits = max(h["id_bits"], wc.bits_for(int(max(fields.completion_ids.max(), fields.prompt_ids.max()))))
        forged = wc.pack(fields, id_bits=id_bits, codec=h["codec"], compress="zlib" if h["zlib"] else "none")
        return ArrayRecord({WIRE_KEY: Array.from_numpy_ndarray(np.frombuffer(forged, np.uint8))}), meta
    return forge


def set_at(key: str, index: int, value) -> Callable:
    def edit(fields):
        getattr(fields, key)[index] = value
    return edit


def cut(key: str) -> Callable:
    """The field one element short (ragged lengths)."""
    def edit(fields):
        setattr(fields, key, getattr(fields, key)[:-1])
    return edit


def strings(key: str, make: Callable) -> Callable:
    """Every string of ``key`` replaced by ``make(index, value, all_values)``."""
    def edit(fields):
        fields.strings[key] = [make(i, v, fields.strings[key]) for i, v in enumerate(fields.strings[key])]
    return edit


def fingerprint(arrays: ArrayRecord, meta: ConfigRecord) -> str:
    """The tokenizer fingerprint the sender wrote."""
    from ftis_flwr.wire import compact as wc
    from ftis_flwr.wire.rollouts import _compact_bytes

    return wc.unpack(_compact_bytes(arrays, meta, _wire()), _wire()).strings["tokenizer_fp"][0]


def regroup(edit: Callable, vocab_size: int) -> Forgery:
    """Decode the sender's groups (with the default caps), ``edit(groups)``, encode them again."""
    def forge(arrays, meta):
        from ftis_flwr.wire.rollouts import decode_groups, encode_groups

        groups = decode_groups(arrays, meta, expected_fp=fingerprint(arrays, meta), vocab_size=vocab_size,
                               wire=_wire())
        return encode_groups(edit(groups), vocab_size=vocab_size)
    return forge


def stretch(length: int | Callable) -> Callable:
    """Every completion made ``length`` tokens long (its own tokens repeated); ``length`` may be a
    function of the groups."""
    def edit(groups):
        n = length(groups) if callable(length) else length
        return [dataclasses.replace(g, completions=[np.resize(c, n) for c in g.completions],
                                    logprobs=[np.resize(lp, n) for lp in g.logprobs]) for g in groups]
    return edit


def past_payload_cap(cap: int) -> Callable:
    """The completion length at which the payload holds more than ``cap`` tokens in all."""
    def length(groups):
        return cap // sum(len(g.completions) for g in groups) + 1
    return length


def forgeries(*, vocab_size: int, max_new_tokens: int, max_tokens_per_payload: int,
              relabel_as: str) -> dict[str, Forgery]:
    """Every forgery, by name, for receivers with these limits (all rejected but
    ``inflated_rewards``, which the receivers rescore); ``relabelled`` claims the groups are
    node ``relabel_as``'s."""
    return {
        "nan_logprob": container(set_at("logprobs", 1, np.nan)),
        "positive_logprob": container(set_at("logprobs", 0, 0.5)),
        "id_outside_vocab": container(set_at("completion_ids", 0, vocab_size + 8)),
        "ragged": container(cut("logprobs")),
        "tokenizer_fp": container(strings("tokenizer_fp", lambda i, v, all_: "f" * 16)),
        "oversized": regroup(stretch(past_payload_cap(max_tokens_per_payload)), vocab_size),
        "relabelled": container(strings("node", lambda i, v, all_: relabel_as)),
        "unassigned_prompt": container(strings("prompt_id", lambda i, v, all_: f"train:{900_000 + i}")),
        "duplicate_prompt": container(strings("prompt_id", lambda i, v, all_: all_[0])),
        "inflated_rewards": container(lambda f: setattr(f, "rewards", np.ones_like(f.rewards))),
        "overlong": regroup(stretch(max_new_tokens + 1), vocab_size),
    }


def forging_app(attacker: str, plan: Callable[[int], Forgery | None]):
    """This project's ClientApp, except that the node serving card ``attacker`` replaces its
    round-``r`` groups with ``plan(r)``'s forgery of them (None: the honest reply)."""
    from flwr.clientapp import ClientApp

    from clients.client_app import serve_queries, train

    app = ClientApp()

    @app.train()
    def forged_train(msg, context):
        reply = train(msg, context)
        if reply.has_error() or reply.content[protocol.INFO]["node"] != attacker:
            return reply  # a failed worker answers with an error message, which has no content
        forge = plan(int(msg.content[protocol.ROUND]["round"]))
        if forge is not None:
            arrays, meta = forge(reply.content[protocol.GROUPS], reply.content[protocol.GROUPS_META])
            reply.content[protocol.GROUPS], reply.content[protocol.GROUPS_META] = arrays, meta
        return reply

    serve_queries(app)
    return app
