"""OpenEnv MCP environments (tools served by a FastMCP server), for the tests of the OpenEnv
source (issue #57). Apart from tests/toy_openenv.py: importing fastmcp takes seconds.

Nothing here imports ftis_flwr: these are what a user writes for OpenEnv, loaded by import path.
"""

from __future__ import annotations

from fastmcp import FastMCP
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.types import Observation, State


class _Base(MCPEnvironment):
    def reset(self, seed=None, episode_id=None, **kwargs):
        return Observation(reward=0.5)  # a reward on reset: the episode's reward sums the observations'

    def _step_impl(self, action, timeout_s=None, **kwargs):
        return Observation()

    @property
    def state(self) -> State:
        return State()


class Shelf(_Base):
    """Two tools: ``look`` (described by its docstring) and ``shout`` (no argument description,
    a default, and a refusal it raises)."""

    def __init__(self):
        mcp = FastMCP("shelf")
        books = {"a": "Dune", "b": "Emma"}

        @mcp.tool
        def look(slot: str) -> str:
            """The book on a shelf slot.

            Args:
                slot: a slot's letter
            """
            return books[slot]

        @mcp.tool
        def shout(text: str, times: int = 1) -> str:
            """Shout a text."""
            if times > 3:
                raise ValueError("too loud")
            return text.upper() * times

        super().__init__(mcp)


class Empty(_Base):
    """An MCP server with no tool."""

    def __init__(self):
        super().__init__(FastMCP("empty"))


class Scorer(_Base):
    """A tool named like the episode's reward call."""

    def __init__(self):
        mcp = FastMCP("scorer")

        @mcp.tool
        def get_reward() -> float:
            """The score."""
            return 1.0

        super().__init__(mcp)
