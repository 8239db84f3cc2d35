"""A calculator written as an OpenEnv MCP environment (``pip install openenv-core``, which brings
``fastmcp``; docs/your-own-environment.md): its tool is served by a FastMCP server.

Its rows are docs/own-task's; it carries no reward, so the task's reward functions score the
episode's final answer.
"""

from __future__ import annotations

from typing import Any

from fastmcp import FastMCP
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.types import Observation, State


class CalcMCPEnvironment(MCPEnvironment):
    """A calculator whose one tool, calc, is served over MCP."""

    deterministic = True  # the same row and calls give the same results: peers may replay its episodes

    def __init__(self):
        mcp = FastMCP("calculator")

        @mcp.tool
        def calc(expression: str) -> str:
            """Evaluate a sum or difference of integers.

            Args:
                expression: Integers joined by + or -, e.g. 12+34.
            """
            total, sign, digits = 0, 1, ""
            for ch in expression + "+":
                if ch.isdigit():
                    digits += ch
                elif ch in "+-" and digits:
                    total, digits, sign = total + sign * int(digits), "", 1 if ch == "+" else -1
                else:
                    raise ValueError(f"cannot read {expression!r}")
            return str(total)

        super().__init__(mcp)
        self._state = State(episode_id=None, step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Observation:
        self._state = State(episode_id=episode_id, step_count=0)
        return Observation()

    def _step_impl(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        raise ValueError(f"{type(action).__name__}: this environment takes MCP tool calls only")

    @property
    def state(self) -> State:
        return self._state
