"""The server's view of each card's tokenizer (cross-tokenizer F-TIS, algorithm §4): which node must put
its completions' texts on the wire, and which federations cannot train together.

Why apart from the strategy: it is one question with its own state (each node reports its
tokenizer's fingerprint and whether it can be aligned, with every reply) and its own rules
(``exchange.cross_tokenizer``); the strategy asks it when it builds a round message and after
each round's replies.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ftis_flwr.config.choices import AdvantageMode, CrossTokenizerMode
from ftis_flwr.config.schema import ExperimentConfig
from ftis_flwr.server.roster import FederationError

log = logging.getLogger(__name__)


class PeerTokenizers:
    """Card -> tokenizer fingerprint and alignment fault, as the nodes report them."""

    def __init__(self, experiment: ExperimentConfig, on_event: Callable[..., None] | None = None):
        self.cfg = experiment
        self.on_event = on_event or (lambda kind, **fields: None)
        self.fingerprints: dict[str, str] = {}
        self.align_faults: dict[str, str] = {}
        """Card -> why its tokenizer cannot be aligned with another one ("" when it can)."""
        self.text_limits: dict[str, str] = {}
        """Card -> what texts its tokens cannot stand for ("" when none or not said)."""
        self.named: set[tuple[str, str]] = set()
        """(sender, receiver) pairings whose limits the log has named (once per run)."""

    def note(self, name: str, fingerprint: str, align_fault: str, text_limits: str = "") -> None:
        """What node ``name`` reported with its reply (an empty fingerprint: it did not say)."""
        if fingerprint:
            self.fingerprints[name] = fingerprint
        self.align_faults[name] = align_fault
        self.text_limits[name] = text_limits

    def name_limits(self) -> None:
        """Log, once per pairing, each receiver whose tokens cannot stand for every text a sender
        of another tokenizer may send, and what it will refuse (before any node trains on them)."""
        if (self.cfg.advantage.mode == AdvantageMode.ALONE
                or self.cfg.exchange.cross_tokenizer == CrossTokenizerMode.OFF):
            return
        for receiver, limits in sorted(self.text_limits.items()):
            mine = self.fingerprints.get(receiver)
            for sender in sorted(self.fingerprints):
                pair = (sender, receiver)
                if not limits or sender == receiver or pair in self.named or mine is None:
                    continue
                if (self.fingerprints[sender] == mine
                        and self.cfg.exchange.cross_tokenizer != CrossTokenizerMode.ALWAYS):
                    continue  # the token path: no text to represent
                self.named.add(pair)
                log.warning("pairing %s -> %s: %s's tokens cannot stand for every text %s may send, and "
                            "such completions are refused, never weighed (counted as text_refused): %s",
                            sender, receiver, receiver, sender, limits)
                self.on_event("text_limits", source=sender, node=receiver, limits=limits)

    def send_text(self, name: str) -> bool:
        """Whether node ``name`` puts its completions' texts on the wire (``exchange.cross_tokenizer``):
        "always"; never "off" or training alone; "auto" while some other card's tokenizer differs
        from its own or is not known yet (a first round, a card not seen yet)."""
        mode = self.cfg.exchange.cross_tokenizer
        if mode != CrossTokenizerMode.AUTO or self.cfg.advantage.mode == AdvantageMode.ALONE:
            return mode == CrossTokenizerMode.ALWAYS and self.cfg.advantage.mode != AdvantageMode.ALONE
        mine = self.fingerprints.get(name)
        return mine is None or any(self.fingerprints.get(c.name) != mine for c in self.cfg.nodes if c.name != name)

    def check(self) -> None:
        """FederationError once two cards report different tokenizers (after round 0's replies,
        before any node trains on another's samples) where they cannot train together:
        ``exchange.cross_tokenizer=off``, or a card whose tokenizer cannot be aligned (no offsets,
        tokens whose bytes cannot be read), named with the reason."""
        if self.cfg.advantage.mode == AdvantageMode.ALONE:
            return
        self.name_limits()
        by_fp: dict[str, list[str]] = {}
        for name, fp in sorted(self.fingerprints.items()):
            by_fp.setdefault(fp, []).append(name)
        if len(by_fp) > 1 and self.cfg.exchange.cross_tokenizer != CrossTokenizerMode.OFF:
            faults = {n: f for n, f in sorted(self.align_faults.items()) if f}
            if faults:
                raise FederationError("the nodes' tokenizers differ, and " + "; ".join(
                    f"card {n!r}'s tokenizer cannot be aligned with another: {f}" for n, f in faults.items())
                    + ". Give that card a fast tokenizer (tokenizer.json), or train only cards of one tokenizer")
            return
        if len(by_fp) > 1:
            kinds = "; ".join(f"{', '.join(names)} (tokenizer {fp})" for fp, names in by_fp.items())
            raise FederationError(f"the nodes' tokenizers differ: {kinds}. exchange.cross_tokenizer=off "
                                  "trains only between equal tokenizers; set it to 'auto' to train on "
                                  "the others' completions through their text (algorithm §4)")
