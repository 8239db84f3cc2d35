"""What the strategy accepts from a node: each reply's records, checked before anything is used.

Why apart: a node's reply is untrusted input. Reading it is pure (no grid, no state), so every
malformed shape becomes one ``BadReply`` with a message naming the record, testable by hand.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from ftis_flwr.config.schema import WireConfig
from ftis_flwr.wire import protocol
from ftis_flwr.wire.arrays import NPY_HEADER_MAX
from ftis_flwr.wire.groups import PayloadError
from ftis_flwr.wire.rollouts import completion_tokens, payload_bytes, payload_size, read_payload

NODE_NAME = re.compile(r"[A-Za-z0-9_.+-]{1,64}")
"""A node name as it may appear in record keys and metric names ("/" separates metric parts)."""


class BadReply(ValueError):
    """A node's reply lacks a record or has one of the wrong type; the message says which."""


class RejectedPayload(BadReply):
    """A reply's groups break a wire rule (a cap, an offset, a value): the server neither keeps
    nor forwards them. ``groups``/``samples``: what the payload claims (0 when unreadable)."""

    def __init__(self, reason: str, groups: int, samples: int):
        super().__init__(f"payload rejected by the server: {reason}")
        self.reason, self.groups, self.samples = reason, groups, samples


@dataclass
class TrainReply:
    """The parts of a well-formed train reply the strategy uses."""

    name: str
    arrays: ArrayRecord
    meta: ConfigRecord
    metrics: dict[str, float]
    rejections: list[str]
    nbytes: int
    ntokens: int
    tokenizer_fp: str = ""
    """The node's tokenizer fingerprint as it reports it ("" if it does not)."""
    align_fault: str = ""
    """Why the node's tokenizer cannot be aligned with another ("" when it can or did not say)."""
    samples: list[dict] = field(default_factory=list)
    """A few of the node's new completions (prompt, completion, reward) for the trackers' tables."""
    task_parts: dict[str, str] = field(default_factory=dict)
    """What the node's rewards are computed from ({} when it did not say): part -> hash."""
    text_limits: str = ""
    """What texts the node's tokens cannot stand for, which it refuses from peers of another
    tokenizer ("" when none or it did not say)."""


@dataclass
class RoundOutcome:
    node_metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    server_metrics: dict[str, float] = field(default_factory=dict)
    failures: dict[int, str] = field(default_factory=dict)
    stop: str = ""
    """Why the run stops after this round ("" when it goes on): a node's reward failed
    (:func:`ftis_flwr.server.run_failure.reward_stop`)."""


def flatten(outcome: RoundOutcome) -> tuple[dict[str, float], dict[str, float]]:
    """(train, evaluation) metrics of one round as flat ``"<node>/<metric>"`` dicts, finite only."""
    train = {f"server/{k}": v for k, v in outcome.server_metrics.items() if math.isfinite(v)}
    evals = {}
    for node, metrics in outcome.node_metrics.items():
        for k, v in metrics.items():
            if math.isfinite(v):
                (evals if k.startswith("eval/") else train)[f"{node}/{k}"] = float(v)
    return train, evals


_RAY_MESSAGE = "Message: "
"""Where Flower's simulation puts the ClientApp exception's own text in an error reply's reason."""
_WRAPPED = re.compile(r"^<class '[^']*'>:<'(?P<text>.*)'>\)?$", re.DOTALL)
"""Flower's ``"<class 'X'>:<'text'>"`` form of an exception a ClientApp raised."""
_CODE = re.compile(r"(code -?\d+: )?(.*)", re.DOTALL)
"""The strategy's ``code <n>: `` before an error reply's reason."""
_WORKER = re.compile(r"node worker failed '\w+': ")
"""The ClientApp's words before the worker's own error (``ftis_flwr.node.host.handle``): left out."""


def short_reason(reason: object, limit: int = 500) -> str:
    """A node's failure reason cut to the words that say it: the text inside Flower's and Ray's
    wrapping of a raised exception, and of a traceback only its first and last lines.

    Args:
        reason: The reason as the reply or the strategy put it.
        limit: Characters kept at most.

    Returns:
        One line.
    """
    code, text = _CODE.match(str(reason).strip()).groups()
    if text.startswith("<class '") and _RAY_MESSAGE in text:
        text = text.rsplit(_RAY_MESSAGE, 1)[1].strip()
        text = text[:-2] if text.endswith("'>") else text[:-3] if text.endswith("'>)") else text
    wrapped = _WRAPPED.match(text)
    if wrapped:
        text = wrapped.group("text").strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) > 1:
        text = lines[0] if lines[0].endswith(lines[-1]) else f"{lines[0].rstrip(':')}: {lines[-1]}"
    text = (code or "") + _WORKER.sub("", text)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def record(content: RecordDict, key: str, kind: type):
    """content[key], checked to be a ``kind``; BadReply naming the key otherwise."""
    rec = content.get(key)
    if rec is None:
        raise BadReply(f"record {key!r} is missing")
    if not isinstance(rec, kind):
        raise BadReply(f"record {key!r} is a {type(rec).__name__}, expected a {kind.__name__}")
    return rec


def read_train_reply(content: RecordDict, wire: WireConfig | None = None) -> TrainReply:
    """Check a train reply's records (protocol.GROUPS, GROUPS_META, METRICS, INFO); BadReply if not.

    The groups are read here once with the receivers' own rules under ``wire``'s caps (and the
    whole payload's bytes under ``wire.max_payload_bytes``): what the server keeps, cuts and
    forwards is what every receiver would accept structurally (RejectedPayload otherwise)."""
    arrays = record(content, protocol.GROUPS, ArrayRecord)
    meta = record(content, protocol.GROUPS_META, ConfigRecord)
    metric_rec = record(content, protocol.METRICS, MetricRecord)
    info = record(content, protocol.INFO, ConfigRecord)
    name = info.get("node")
    if not isinstance(name, str) or not NODE_NAME.fullmatch(name):
        raise BadReply(f"info 'node' must be a node name (1-64 letters, digits, _ . + -), got {name!r}")
    rejections = info.get("rejections", [])
    if not isinstance(rejections, list) or not all(isinstance(x, str) for x in rejections):
        raise BadReply(f"info 'rejections' must be a list of str, got {rejections!r}")
    metrics = {k: float(v) for k, v in metric_rec.items() if isinstance(v, (int, float))}
    starts = info.get("worker_starts")
    if isinstance(starts, (int, float)) and not isinstance(starts, bool):
        metrics["worker_starts"] = float(starts)
    nbytes = check_payload(arrays, meta, wire or WireConfig())
    fp, fault, limits = info.get("tokenizer_fp", ""), info.get("align_fault", ""), info.get("text_limits", "")
    return TrainReply(name=name, arrays=arrays, meta=meta, metrics=metrics,
                      rejections=[x for x in rejections if x], nbytes=nbytes,
                      ntokens=completion_tokens(arrays), tokenizer_fp=fp if isinstance(fp, str) else "",
                      align_fault=fault[:300] if isinstance(fault, str) else "",
                      text_limits=limits[:600] if isinstance(limits, str) else "",
                      task_parts=read_parts(info.get("task_parts", "")),
                      samples=read_samples(info.get("samples", "")))


def _json(text: object) -> object:
    """An optional JSON field of a reply, None when absent or malformed (never a failed round)."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def read_parts(text: object) -> dict[str, str]:
    """A reply's ``task_parts`` (JSON of str -> str), {} when absent or malformed."""
    parts = _json(text)
    return {str(k): str(v) for k, v in parts.items()} if isinstance(parts, dict) else {}


MAX_SAMPLES = 16
"""Sample rows a reply may carry (more are cut): they are for a table, not for training."""


def read_samples(text: object) -> list[dict]:
    """A reply's ``samples`` (JSON list of {prompt, completion, reward}), cut to :data:`MAX_SAMPLES`
    rows of 2,000 characters; [] when absent or malformed (a table row is never worth a failed round)."""
    rows, out = _json(text), []
    for row in rows[:MAX_SAMPLES] if isinstance(rows, list) else []:
        if isinstance(row, dict) and isinstance(row.get("reward"), (int, float)):
            out.append({"prompt": str(row.get("prompt", ""))[:200], "completion": str(row.get("completion", ""))[:2000],
                        "reward": float(row["reward"])})
    return out


def check_payload(arrays: ArrayRecord, meta: ConfigRecord, wire: WireConfig) -> int:
    """A node's own payload as the server receives it: its bytes (returned) within
    ``wire.max_payload_bytes`` (plus the npy headers), then every structural rule
    (:func:`ftis_flwr.wire.rollouts.read_payload`); RejectedPayload naming the first fault."""
    try:
        nbytes = payload_bytes(arrays, meta)
        limit = wire.max_payload_bytes + len(arrays) * NPY_HEADER_MAX
        if nbytes > limit:
            raise PayloadError(f"{nbytes} bytes exceed wire.max_payload_bytes={wire.max_payload_bytes}")
        read_payload(arrays, meta, wire)
    except Exception as exc:  # whatever the bytes are, they cost their sender its round, nothing more
        why = str(exc) if isinstance(exc, PayloadError) else f"{type(exc).__name__}: {exc}"
        try:
            groups, samples = payload_size(arrays, meta)
        except Exception:
            groups, samples = 0, 0
        raise RejectedPayload(why, groups, samples) from None
    return nbytes
