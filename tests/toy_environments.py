"""Environments written to TRL's ``environment_factory`` contract, for the tests of issue #57.

Nothing here imports ftis_flwr: these classes are what a user writes for TRL, loaded by the tests
through an import path (``toy_environments:CalcEnv``) as a configuration names them.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Literal


class CalcEnv:
    """A calculator and an answer box: the reward is 1 when the submitted answer is the row's."""

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


class SeededEnv:
    """``reset`` returns a string drawn from ``random`` (seeded by the loop); async tools and reward."""

    def reset(self, **row) -> str:
        self.secret = random.randint(0, 10**9)
        self.guesses = []
        return f" secret {self.secret}"

    async def guess(self, value: int, mode: Literal["exact", "near"] = "exact", hints: list[str] | None = None) -> str:
        """Guess the secret.

        Args:
            value: The guess.
            mode (str): How a guess is judged:
                exactly, or within ten.
            hints: Unused notes.

        Returns:
            Whether the guess is right.
        """
        await asyncio.sleep(0)
        self.guesses.append(value)
        return "yes" if value == self.secret else "no"

    def boom(self) -> str:
        """Fail, always."""
        raise RuntimeError("kaboom")

    def nap(self, seconds: float) -> str:
        """Sleep.

        Args:
            seconds: How long to sleep.
        """
        time.sleep(seconds)
        return "awake"

    async def get_reward(self) -> float:
        await asyncio.sleep(0)
        return float(len(self.guesses))


class NoReset:
    """Breaks the contract: no reset."""

    def look(self) -> str:
        """Look around."""
        return "nothing"


class Undocumented:
    def reset(self, **row):
        return None

    def look(self, where: str) -> str:
        return where


class Unannotated:
    def reset(self, **row):
        return None

    def look(self, where) -> str:
        """Look.

        Args:
            where: Where to look.
        """
        return str(where)


class Undescribed:
    def reset(self, **row):
        return None

    def look(self, where: str, how: str) -> str:
        """Look somewhere.

        Args:
            where: Where to look.
        """
        return where


class BadReset:
    def reset(self, **row):
        return 42


class Unreproducible:
    _n = 0

    def reset(self, **row):
        Unreproducible._n += 1
        return f" round {Unreproducible._n}"


class StrictReset:
    """``reset`` takes one column only: a row with more fails it (TRL passes every column)."""

    def reset(self, answer: str):
        return None


class BrokenCalc(CalcEnv):
    """A calculator whose tool always raises."""

    def calc(self, expression: str) -> str:
        """Evaluate a sum (broken).

        Args:
            expression: Integers joined by + or -.
        """
        raise RuntimeError("calculator broken")


class SlowCalc(CalcEnv):
    """A calculator whose tool takes a second."""

    def calc(self, expression: str) -> str:
        """Evaluate a sum (slowly).

        Args:
            expression: Integers joined by + or -.
        """
        time.sleep(1.0)
        return "0"
