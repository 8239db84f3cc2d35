"""A calculator written as an OpenEnv environment (``pip install openenv-core``; docs/your-own-environment.md).

Its rows are docs/own-task's: ``reset`` takes the row's ``answer`` column.
"""

from __future__ import annotations

from typing import Any

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class CalcAction(Action):
    """Evaluate a sum or difference of integers."""

    expression: str = Field(description="Integers joined by + or -, e.g. 12+34.")


class CalcObservation(Observation):
    value: str = Field(default="", description="The value, as text, or why it could not be read.")


class CalcEnvironment(Environment[CalcAction, CalcObservation, State]):
    """A calculator: reward 1 and done when it shows the row's answer."""

    deterministic = True  # the same row and calls give the same results: peers may replay its episodes

    def __init__(self):
        super().__init__()
        self._state = State(episode_id=None, step_count=0)
        self.answer = ""

    def reset(self, seed: int | None = None, episode_id: str | None = None, answer: str = "",
              **kwargs: Any) -> CalcObservation:
        self._state = State(episode_id=episode_id, step_count=0)
        self.answer = str(answer)
        return CalcObservation()

    def step(self, action: CalcAction, timeout_s: float | None = None, **kwargs: Any) -> CalcObservation:
        self._state.step_count += 1
        total, sign, digits = 0, 1, ""
        for ch in action.expression + "+":
            if ch.isdigit():
                digits += ch
            elif ch in "+-" and digits:
                total, digits, sign = total + sign * int(digits), "", 1 if ch == "+" else -1
            else:
                return CalcObservation(value=f"cannot read {action.expression!r}", reward=0.0)
        right = str(total) == self.answer
        return CalcObservation(value=str(total), reward=1.0 if right else 0.0, done=right)

    @property
    def state(self) -> State:
        return self._state
