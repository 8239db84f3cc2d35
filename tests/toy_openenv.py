"""Environments written for OpenEnv (``openenv-core``), for the tests of its source (issue #57).

Nothing here imports ftis_flwr: these are what a user writes for OpenEnv, loaded by import path.
"""

from __future__ import annotations

import random

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class MoveAction(Action):
    """Move the counter."""

    steps: int = Field(description="How far to move, may be negative.")
    note: str = Field(default="", description="Ignored.")


class CounterObservation(Observation):
    position: int = 0
    target: int = 0


class Counter(Environment[MoveAction, CounterObservation, State]):
    """A counter started where its seed says, rewarded by nearness to a target; reset names no
    column and takes no ``**kwargs`` (so only ``target`` of a row reaches it)."""

    def __init__(self):
        super().__init__()
        self.position, self.target, self._state = 0, 0, State()

    def reset(self, seed=None, episode_id=None, target: int = 0) -> CounterObservation:
        self.position, self.target = random.Random(seed).randint(0, 99), int(target)
        return CounterObservation(position=self.position, target=self.target)

    def step(self, action, timeout_s=None, **kwargs) -> CounterObservation:  # no hint: the base names the action
        self.position += action.steps
        gap = abs(self.position - self.target)
        return CounterObservation(position=self.position, target=self.target, reward=-gap, done=gap == 0)

    @property
    def state(self) -> State:
        return self._state


class Silent(Environment):
    """No action class anywhere: an OpenEnv environment the adapter cannot describe to a model."""

    def reset(self, seed=None, episode_id=None, **kwargs):
        return Observation()

    def step(self, action, timeout_s=None, **kwargs):
        return Observation()

    @property
    def state(self) -> State:
        return State()


class Bare(Silent, Environment[Action, Observation, State]):
    """Silent, but declaring OpenEnv's bare ``Action``: nothing a model could fill (as an MCP
    environment's)."""
