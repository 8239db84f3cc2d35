"""The shipped environment (issue #57): a calculator, written to TRL's ``environment_factory``
contract, so it is also the smallest complete example of one.

Used with the ``arithmetic-chain`` task (preset ``cpu-pair-calc``): the model may call ``calc`` on
the question's chain and answer with its result. It has no ``get_reward``: the task's reward scores
the episode's final answer (the text of its last model turn).
"""

from __future__ import annotations

import re

_CHAIN = re.compile(r"\d{1,6}([+-]\d{1,6}){0,7}")


class Calculator:
    """A calculator for sums and differences of integers."""

    deterministic = True  # the same row and calls give the same results: peers may replay its episodes

    def __init__(self) -> None:
        self.calls = 0

    def reset(self, **row) -> None:
        self.calls = 0

    def calc(self, expression: str) -> str:
        """Evaluate a sum or difference of integers.

        Args:
            expression: Integers joined by + or -, e.g. 12+34-56.

        Returns:
            The value, as text.
        """
        self.calls += 1
        text = expression.replace(" ", "")
        if not _CHAIN.fullmatch(text):
            raise ValueError(f"cannot read {expression!r}")  # short: the tiny models read it in 64 positions
        return str(sum(int(term) for term in re.findall(r"[+-]?\d+", text)))
