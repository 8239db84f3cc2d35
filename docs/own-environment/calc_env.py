"""A calculator and an answer box, written to TRL's ``environment_factory`` contract (docs/your-own-environment.md).

Its rows are docs/own-task's: ``reset`` takes each row's columns (``prompt``, ``answer``).
"""

from __future__ import annotations


class CalcEnv:
    """A calculator and an answer box: the reward is 1 when the submitted answer is the row's."""

    deterministic = True  # the same row and calls give the same results: peers may replay its episodes

    def __init__(self):
        self.answer = None
        self.submitted = None
        self.calls = 0

    def reset(self, answer: str = "", **row) -> str | None:
        self.answer, self.submitted, self.calls = str(answer), None, 0
        return None

    def calc(self, expression: str) -> str:
        """Evaluate a sum or difference of integers.

        Args:
            expression: Integers joined by + or -, e.g. 12+34.

        Returns:
            The value, as text.
        """
        self.calls += 1
        total, sign, digits = 0, 1, ""
        for ch in expression + "+":
            if ch.isdigit():
                digits += ch
            elif ch in "+-" and digits:
                total, digits, sign = total + sign * int(digits), "", 1 if ch == "+" else -1
            else:
                raise ValueError(f"cannot read {expression!r}")
        return str(total)

    def submit(self, answer: int) -> str:
        """Submit the final answer.

        Args:
            answer: The answer, an integer.
        """
        self.submitted = str(answer)
        return "ok"

    def get_reward(self) -> float:
        return 1.0 if self.submitted == self.answer else 0.0
