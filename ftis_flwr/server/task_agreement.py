"""Whether every node computes its rewards from the same task: same settings, same task and
reward code, same data (:mod:`ftis_flwr.tasks.fingerprint` makes each node's parts).

Why the server checks it: every receiver recomputes the rewards of what it trains on, so a node
whose reward function or data differs would train its peers' samples on other numbers, and
nothing in the losses would show it. The nodes report their parts with every reply; after the
first round's replies, before any node trains on another's samples, a disagreement stops the run
with the parts that differ and who holds which.
"""

from __future__ import annotations

from ftis_flwr.server.roster import FederationError


class TaskAgreement:
    """Card -> its task parts, as its node reported them."""

    def __init__(self) -> None:
        self.parts: dict[str, dict[str, str]] = {}

    def note(self, name: str, parts: dict[str, str]) -> None:
        if parts:  # a node that did not say (an older worker) is not compared
            self.parts[name] = parts

    def check(self) -> None:
        """FederationError naming each part on which the nodes disagree, and each node's value."""
        if len(self.parts) < 2:
            return
        keys = sorted({k for p in self.parts.values() for k in p})
        differ = []
        for key in keys:
            values = {name: p.get(key, "missing") for name, p in sorted(self.parts.items())}
            if len(set(values.values())) > 1:
                differ.append(f"{key} ({', '.join(f'{n}: {v}' for n, v in values.items())})")
        if differ:
            raise FederationError("the nodes do not compute rewards from the same task, so their peers "
                                  "would train on other numbers: " + "; ".join(differ) + ". Give every "
                                  "node the same task settings, reward code and data files")
