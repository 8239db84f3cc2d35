"""Environments written to TRL's ``environment_factory`` contract, for the tests of issue #57.

Nothing here imports ftis_flwr: these classes are what a user writes for TRL, loaded by the tests
through an import path (``toy_environments:CalcEnv``) as a configuration names them.
"""

from __future__ import annotations

import asyncio
import importlib.util
import random
import time
from pathlib import Path
from typing import Literal

_DOCS = Path(__file__).resolve().parents[1] / "docs" / "own-environment" / "calc_env.py"
_spec = importlib.util.spec_from_file_location("calc_env", _DOCS)
_calc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_calc)
CalcEnv = _calc.CalcEnv
"""The docs' example (docs/own-environment/calc_env.py), so the page's class is the tested one."""


class UndeclaredCalcEnv(CalcEnv):
    """The docs' example as TRL would take it, without ``deterministic = True``: peers cannot replay it."""

    deterministic = False


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


class LenientCalcEnv(CalcEnv):
    """Pays half a point for an episode that never submitted: a reward that pays for doing nothing."""

    deterministic = True

    def get_reward(self) -> float:
        return 0.5 if self.submitted is None else super().get_reward()


class LongReset(CalcEnv):
    """``reset`` appends 80 characters to the prompt: more than the tiny models' 64 positions."""

    def reset(self, **row) -> str:
        super().reset(**row)
        return " " + "1+1=" * 20


class Ledger:
    """A calculator without ``get_reward``: what it showed stays on the instance, for a reward
    function that reads it (TRL's ``environments`` argument, :func:`shown_the_answer`)."""

    deterministic = True

    def __init__(self):
        self.shown: list[str] = []

    def reset(self, **row) -> None:
        self.shown = []

    def calc(self, expression: str) -> str:
        """Evaluate a sum of integers.

        Args:
            expression: Integers joined by +, e.g. 12+34.
        """
        value = str(sum(int(part) for part in expression.split("+")))
        self.shown.append(value)
        return value


def shown_the_answer(completions, environments, answer, **kwargs):
    """1 when the episode's calculator showed the row's answer, read from its instance."""
    return [1.0 if str(a) in env.shown else 0.0 for env, a in zip(environments, answer)]


def read_the_answer_from_a_tool(completions, prompts, answer, **kwargs):
    """TRL's conversational form: each completion is the episode's messages after the prompt, each
    prompt its messages. 1 when a tool message showed the row's answer and the model then answered."""
    out = []
    for episode, prompt, a in zip(completions, prompts, answer):
        if prompt[-1]["role"] != "user" or episode[0]["role"] != "assistant":
            raise ValueError("expected TRL's conversational messages")
        shown = any(m["role"] == "tool" and m["content"] == str(a) for m in episode)
        out.append(1.0 if shown and episode[-1]["role"] == "assistant" else 0.0)
    return out
