"""A per-node budget of foreign groups, and the per-node cost figures the strategy records.

Why: with m nodes a node otherwise receives the groups of all m - 1 others every round, so its
bytes received and its update time grow with m. ``exchange.max_foreign_groups`` = N caps what
each receiver gets at N groups per round across all sources; ``exchange.select`` says which:

- ``random``: N groups drawn uniformly, seeded by (run seed, round, receiver): reproducible.
- ``reward_variance``: highest variance of the rewards first (a zero-variance group has no
  advantage and teaches nothing). These are the *source's claimed* rewards, used only to
  choose: every receiver still scores the text itself, so a source that inflates them gains
  forwarding slots, never a reward. Ties are broken by the same seeded draw.
- ``low_kl``: groups of the source with the lowest KL to the receiver first, from the
  receiver's own ``<source>/kl_mean`` of the last round it trained on that source's groups.
  Sources it has not measured yet come first (tied among themselves, seeded), so every source
  is tried once before the rule exploits; within a source, groups in the seeded order.

Each rule is a registered scorer (:func:`register_select_rule`, the shape of
:func:`ftis_flwr.maths.loss.register_loss`): it scores every group of one source, higher first, and
ties keep the seeded order; ``config.choices.SELECT_RULES`` lists the names (a test checks).

Cheap on the server: no model, no tokenizer; a source's payload is cut with
:meth:`ftis_flwr.wire.selection.Cuttable.subset`, and the provenance map then lists only the train
indices of the groups forwarded (see :meth:`ForeignBudget.select`).
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord

from ftis_flwr.config.choices import NO_SELECTION
from ftis_flwr.config.imports import register_unique, registered_or_imported
from ftis_flwr.config.schema import ExchangeConfig, WireConfig
from ftis_flwr.wire.selection import Cuttable, WireSelectError

log = logging.getLogger("ftis_flwr.server.strategy")

Payload = tuple[ArrayRecord, ConfigRecord, list[int]]
"""(arrays, meta, train indices the server assigned to the source) as the strategy keeps them."""
COMPUTE_KEYS = ("seconds_train", "seconds_generate", "seconds_eval", "state_save_seconds")
"""A node's in-worker compute of a round: the timings its reply carries (Node.step, worker)."""


def _seed(*parts: object) -> int:
    """A stable 64-bit seed from parts (Python's hash() of a str changes per process)."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little")


GroupScores = Callable[[str, Cuttable, Mapping[str, float]], Sequence[float]]
"""A selection rule: ``rule(source, its payload, the receiver's last KL per source)`` -> one score
per group of the source; higher goes first, ties keep the seeded order. A rule that raises, or
returns the wrong number of scores, leaves that source out of the receiver's round."""
SELECT_RULE_REGISTRY: dict[str, GroupScores] = {}
"""``exchange.select`` name -> its rule (every name of ``SELECT_RULES`` but NO_SELECTION)."""


def register_select_rule(*names: str) -> Callable[[GroupScores], GroupScores]:
    """Register a selection rule under one or more names; a second, different one is refused."""
    if not names:
        raise ValueError("register_select_rule needs at least one rule name")

    def deco(rule: GroupScores) -> GroupScores:
        for name in names:
            register_unique(SELECT_RULE_REGISTRY, name, rule, "selection rule")
        return rule

    return deco


def get_select_rule(name: str) -> GroupScores:
    """The rule ``exchange.select`` names: a registered one, or the callable an import path
    (``"<module>:<rule>"`` / ``"<file.py>:<rule>"``) names; ValueError listing the registered ones otherwise."""
    return registered_or_imported(SELECT_RULE_REGISTRY, name, label=f"exchange.select={name!r}", unknown=(
        f"exchange.select={name!r} is not one of {', '.join(SELECT_RULE_REGISTRY)} (or {NO_SELECTION!r} without a "
        "budget), nor an import path '<module>:<rule>'"))


@register_select_rule("random")
def _random(source: str, read: Cuttable, kl: Mapping[str, float]) -> list[float]:
    """No preference: the seeded draw alone decides."""
    return [0.0] * read.n


@register_select_rule("reward_variance")
def _reward_variance(source: str, read: Cuttable, kl: Mapping[str, float]) -> list[float]:
    """The source's claimed rewards' variance per group (a zero-variance group teaches nothing)."""
    return [float(np.var(r)) if len(r) else 0.0 for r in read.rewards()]


@register_select_rule("low_kl")
def _low_kl(source: str, read: Cuttable, kl: Mapping[str, float]) -> list[float]:
    """The receiver's last KL to the source, lowest first; a source not measured yet first of all."""
    return [-kl.get(source, -math.inf)] * read.n


def _scores(rule: GroupScores, source: str, read: Cuttable, kl: Mapping[str, float]) -> list[float]:
    """``rule``'s scores of ``source``'s groups, checked to be one float per group."""
    scores = [float(x) for x in rule(source, read, kl)]
    if len(scores) != read.n:
        raise ValueError(f"the selection rule scored {len(scores)} groups of {read.n}")
    return scores


class ForeignBudget:
    """Chooses each receiver's foreign groups per round; remembers receivers' KL reports."""

    def __init__(self, cfg: ExchangeConfig, run_seed: int = 0, wire: WireConfig | None = None,
                 on_event: Callable[..., None] | None = None):
        self.cfg, self.run_seed = cfg, run_seed
        self.on_event = on_event or (lambda kind, **fields: None)
        """Where a source left out of a round is reported (``payload_rejected``, node "server")."""
        self.wire = wire or WireConfig()
        """The caps a compact payload is unpacked under before it is cut (the server's own)."""
        self.kl: dict[str, dict[str, float]] = {}
        """receiver -> source -> the receiver's last reported ``<source>/kl_mean``"""
        self._read: tuple[int, dict[str, tuple[ArrayRecord, Cuttable | WireSelectError]]] = (-1, {})
        """(round, source -> (its arrays, their read or why they cannot be read)): every receiver
        of a round is served from one read per source (unpacking is the server's main cost)."""

    @property
    def active(self) -> bool:
        return self.cfg.max_foreign_groups > 0

    def note(self, receiver: str, metrics: Mapping[str, float]) -> None:
        """Keep a receiver's per-source ``<source>/kl_mean`` of this round (finite ones only)."""
        seen = self.kl.setdefault(receiver, {})
        for key, value in metrics.items():
            src, sep, rest = key.partition("/")
            if sep and rest == "kl_mean" and src != receiver and math.isfinite(value):
                seen[src] = float(value)

    def select(self, receiver: str, rnd: int, payloads: Mapping[str, Payload]) -> dict[str, Payload]:
        """At most ``max_foreign_groups`` groups across ``payloads`` (source -> payload).

        A source whose payload cannot be cut (an unknown format, offsets that do not add up) is
        left out and logged: the server cannot tell which bytes are which group. Provenance: when a
        payload has one group per assigned index (an honest node drops none), group j is index j
        and the kept groups' indices are forwarded; otherwise the full assigned list is (still
        only what the server assigned to that source; the receiver's check accepts a subset).
        """
        if not self.active:
            return dict(payloads)
        rule, known = get_select_rule(self.cfg.select), self.kl.get(receiver, {})
        rng = np.random.default_rng(_seed(self.run_seed, rnd, receiver))
        readable: dict[str, Cuttable] = {}
        scores: dict[str, list[float]] = {}  # source -> the rule's score of each of its groups
        for src in sorted(payloads):
            read = self._payload(rnd, src, payloads[src])
            if not isinstance(read, Exception):
                try:
                    scores[src] = _scores(rule, src, read, known)
                except Exception as exc:  # the source's failure for this round, not the receiver's
                    read = exc
            if isinstance(read, Exception):
                self._left_out(rnd, src, receiver, read)
            else:
                readable[src] = read
        candidates = [(src, g) for src in sorted(readable) for g in range(readable[src].n)]
        ranked = [candidates[i] for i in rng.permutation(len(candidates))]  # also every tie-break
        ranked.sort(key=lambda c: -scores[c[0]][c[1]])  # stable: ties keep the seeded order
        chosen: dict[str, list[int]] = {}
        for src, g in ranked[: self.cfg.max_foreign_groups]:
            chosen.setdefault(src, []).append(g)
        out = {}
        for src, keep in chosen.items():
            indices, n = payloads[src][2], readable[src].n
            keep.sort()
            if len(keep) == n:  # all of it: forwarded as received
                out[src] = payloads[src]
                continue
            try:
                sub_arrays, sub_meta = readable[src].subset(keep)
            except Exception as exc:  # this source is left out of this message, nothing more
                self._left_out(rnd, src, receiver, exc)
                continue
            out[src] = (sub_arrays, sub_meta, [indices[g] for g in keep] if n == len(indices) else list(indices))
        return out

    def _left_out(self, rnd: int, src: str, receiver: str, exc: Exception) -> None:
        why = str(exc) if isinstance(exc, WireSelectError) else f"{type(exc).__name__}: {exc}"
        log.warning("round %d: groups of %s not forwarded to %s: %s", rnd, src, receiver, why)
        self.on_event("payload_rejected", round=rnd, node="server", source=src, receiver=receiver,
                      groups=0, samples=0, reason=f"not forwarded to {receiver}: {why}")

    def _payload(self, rnd: int, src: str, payload: Payload) -> Cuttable | Exception:
        """``src``'s payload of round ``rnd``, read on its first receiver and kept for the rest."""
        if self._read[0] != rnd:
            self._read = (rnd, {})
        reads = self._read[1]
        if src not in reads or reads[src][0] is not payload[0]:
            try:
                reads[src] = (payload[0], Cuttable(payload[0], payload[1], self.wire))
            except Exception as exc:  # whatever the bytes are: that source is left out this round
                reads[src] = (payload[0], exc)
        return reads[src][1]


def compute_seconds(metrics: Mapping[str, float]) -> float:
    """A node's in-worker compute of one round (train, generate, evaluate, state save)."""
    return float(sum(metrics.get(k, 0.0) for k in COMPUTE_KEYS))


def add_idle(node_metrics: dict[str, dict[str, float]], round_seconds: float) -> None:
    """Per node: ``compute_seconds`` and ``idle_fraction`` = (round wall - compute) / round wall,
    the share of the round the node spent waiting (for the slowest node, or for Flower)."""
    for metrics in node_metrics.values():
        busy = compute_seconds(metrics)
        metrics["compute_seconds"] = busy
        if round_seconds > 0:
            metrics["idle_fraction"] = max(0.0, round_seconds - busy) / round_seconds
