"""An OpenEnv environment as a task's environment (issue #57): a text environment written for
OpenEnv (``openenv-core``: a subclass of ``openenv.core.env_server.interfaces.Environment`` with
``reset`` / ``step`` / ``state``) driven through TRL's ``environment_factory`` contract, which the
episode loop speaks (:mod:`ftis_flwr.tasks.environment`).

Why an adapter and not a second loop: TRL, prime-rl and verl each wrap an OpenEnv environment in
their own tool contract; here the wrapper is built from the class itself, so
``task.environment='<file.py>:<OpenEnvClass>'`` needs no glue code:

- **one tool**, the environment's action: named after the action class (``EchoAction`` -> ``echo``,
  else ``step``), one argument per field of the action (``metadata`` aside) with the field's type
  and ``description``; calling it runs ``step(Action(**arguments))`` and returns the observation's
  text. The action class is the type hint of ``step``'s ``action`` argument, else the first
  argument of the class's ``Environment[Action, Observation, State]`` base;
- **reset** passes the row's columns that ``reset`` names (every column when it takes
  ``**kwargs``) and a ``seed`` drawn from the generator the episode loop seeded, so the G episodes
  of a group and a peer's replay start from the same state; the observation's text is appended to
  the prompt;
- **the reward** is the sum of the rewards the observations carried (None when none did: the
  task's reward functions then score the final answer);
- after an observation says ``done``, a further call is an error observation the model reads;
- ``deterministic = True`` on the OpenEnv class lets peers replay its episodes, as for a TRL class.

An observation's text: its one field besides ``done``, ``reward`` and ``metadata``, else
``name: value`` lines of its fields.

An **MCP environment** (a subclass of OpenEnv's ``MCPEnvironment``, its tools served by a FastMCP
server) exposes **each MCP tool** instead: the tools its ``ListToolsAction`` lists, each described
to the model by the JSON schema the MCP server declares (no docstring needed), called through
``CallToolAction``; the tool's text content is what the model reads, and an MCP error (the tool
raised, bad arguments, a timeout) is an error observation, counted as one. Reset, reward, ``done``
and ``deterministic`` work as above. Remote OpenEnv clients (a Space over HTTP) are not driven
here: wrap one in a TRL-style class as TRL's OpenEnv guide shows.
"""

from __future__ import annotations

import inspect
import logging
import random
import re
import typing
import warnings
from typing import Any

BASE_FIELDS = ("done", "reward", "metadata")
"""Fields every OpenEnv observation has (``Observation``): not the observation's text."""


def _derives(obj: Any, base_name: str) -> bool:
    """``obj`` (a class or an instance) has OpenEnv's class ``base_name`` among its bases, found by
    the bases' module so that checking a TRL class never imports ``openenv``."""
    cls = obj if isinstance(obj, type) else type(obj)
    return any(base.__name__ == base_name and base.__module__.startswith("openenv.") for base in inspect.getmro(cls))


def is_openenv(obj: Any) -> bool:
    """``obj`` is an OpenEnv ``Environment``."""
    return _derives(obj, "Environment")


def is_mcp(obj: Any) -> bool:
    """``obj`` is an OpenEnv ``MCPEnvironment`` (its tools over MCP)."""
    return _derives(obj, "MCPEnvironment")


def action_class(env_cls: type) -> type:
    """The environment's action class (module docstring); ValueError saying where to declare it."""
    try:
        hint = typing.get_type_hints(env_cls.step).get("action")
    except Exception:  # noqa: BLE001 - a hint that does not resolve: try the generic base
        hint = None
    if isinstance(hint, type) and hasattr(hint, "model_fields"):
        return hint
    for base in getattr(env_cls, "__orig_bases__", ()):
        args = typing.get_args(base)
        if args and isinstance(args[0], type) and hasattr(args[0], "model_fields"):
            return args[0]
    raise ValueError(f"OpenEnv environment {env_cls.__name__}: its action class is not declared; annotate "
                     f"step(self, action: MyAction, ...) or subclass Environment[MyAction, MyObservation, MyState]")


def tool_name(action_cls: type) -> str:
    """``EchoAction`` -> ``echo``, ``MoveAction`` -> ``move``; ``step`` for a bare ``Action``."""
    stem = re.sub(r"Action$", "", action_cls.__name__)
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", stem).lower()
    return snake if snake.isidentifier() else "step"


def observation_text(obs: Any) -> str:
    """What the model reads of an observation (module docstring)."""
    data = obs.model_dump() if hasattr(obs, "model_dump") else dict(vars(obs))
    fields = {k: v for k, v in data.items() if k not in BASE_FIELDS}
    if len(fields) == 1:
        return str(next(iter(fields.values())))
    return "\n".join(f"{k}: {v}" for k, v in fields.items())


def _tool(env_cls: type, action_cls: type):
    """The tool function (``self`` first) whose signature and docstring describe ``action_cls``'s
    fields, for :func:`ftis_flwr.tasks.tool_schema.tool_schema`."""
    fields = {k: f for k, f in action_cls.model_fields.items() if k != "metadata"}
    name = tool_name(action_cls)

    def tool(self, **arguments: Any) -> str:
        return self._act(arguments)

    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    hints: dict[str, Any] = {"return": str}
    lines = []
    for key, f in fields.items():
        default = inspect.Parameter.empty if f.is_required() else f.get_default(call_default_factory=True)
        params.append(inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=f.annotation))
        hints[key] = f.annotation
        lines.append(f"    {key}: {(f.description or f'the action field {key!r}').strip()}")
    description = inspect.cleandoc(action_cls.__doc__ or "") or f"Take one action in {env_cls.__name__}."
    tool.__name__ = tool.__qualname__ = name
    tool.__doc__ = (f"{description.splitlines()[0]}\n\nArgs:\n" + "\n".join(lines) +
                    "\n\nReturns:\n    The environment's observation.") if lines else description
    tool.__signature__ = inspect.Signature(params, return_annotation=str)
    tool.__annotations__ = hints
    return name, tool


class _OpenEnvAdapter:
    """TRL's contract over one OpenEnv environment instance (module docstring)."""

    _action_cls: type
    _named: frozenset[str]
    _any_column: bool

    def __init__(self, env: Any):
        self._env = env
        self._rewards: list[float] = []
        self._done = False

    def reset(self, **row: Any) -> str | None:
        columns = {k: v for k, v in row.items() if (self._any_column or k in self._named)
                   and k not in ("seed", "episode_id")}  # the loop's seed, never a column's
        obs = self._env.reset(seed=random.getrandbits(31), **columns)
        self._rewards, self._done = [], bool(getattr(obs, "done", False))
        self._note(obs)
        return observation_text(obs) or None

    def get_reward(self) -> float | None:
        return float(sum(self._rewards)) if self._rewards else None

    def _note(self, obs: Any) -> None:
        reward = getattr(obs, "reward", None)
        if reward is not None:
            self._rewards.append(float(reward))

    def _act(self, arguments: dict[str, Any]) -> str:
        return self._stepped(self._action_cls(**arguments), observation_text)

    def _mcp(self, name: str, arguments: dict[str, Any]) -> str:
        from openenv.core.env_server.mcp_types import CallToolAction

        return self._stepped(CallToolAction(tool_name=name, arguments=arguments), mcp_result_text)

    def _stepped(self, action: Any, text: Any) -> str:
        if self._done:
            raise RuntimeError("the episode is over (the environment said done): give your final answer")
        obs = self._env.step(action)
        self._done = bool(getattr(obs, "done", False))
        self._note(obs)
        return text(obs)


def mcp_result_text(obs: Any) -> str:
    """What the model reads of an MCP tool's observation: the result's text content (its
    structured data when it has none); RuntimeError with MCP's message when the call failed."""
    error = getattr(obs, "error", None)
    if error is not None:
        raise RuntimeError(getattr(error, "message", None) or str(error))
    result = getattr(obs, "result", None)
    texts = [getattr(c, "text", None) for c in getattr(result, "content", None) or []]
    text = "\n".join(t for t in texts if isinstance(t, str))
    if getattr(result, "is_error", False):
        raise RuntimeError(text or "the tool reported an error")
    if text or result is None:
        return text
    data = getattr(result, "data", result)
    return str(data)


def _mcp_tool(name: str, description: str, schema: dict[str, Any]):
    """The tool function (``self`` first) calling the MCP tool ``name`` with whatever arguments the
    model gave (the MCP server checks them); its schema is the one the server declares
    (``_ftis_tool_schema``, read by :func:`ftis_flwr.tasks.environment.load_environment` as is)."""
    def tool(self, **arguments: Any) -> str:
        return self._mcp(name, arguments)

    tool.__name__ = tool.__qualname__ = name
    tool.__doc__ = description = description or f"The MCP tool {name}."
    parameters = dict(schema) if isinstance(schema, dict) and schema else {"type": "object", "properties": {}}
    tool._ftis_tool_schema = {"type": "function", "function": {
        "name": name, "description": description, "parameters": parameters}}
    return tool


TOOL_CALL_LOGS = ("Error calling tool", "Invalid arguments for tool")
"""How FastMCP's server logs a tool that raised (with its traceback) or was called with bad
arguments: the episode loop already turns each into a counted error observation
(``env/tool_errors``), so these lines are left out of the node's log."""


class _ToolCallLogs(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(TOOL_CALL_LOGS)


def mute_tool_call_logs() -> None:
    """Leave FastMCP's per-call tool errors out of the log (:data:`TOOL_CALL_LOGS`), once."""
    logger = logging.getLogger("fastmcp.server.server")
    if not any(isinstance(f, _ToolCallLogs) for f in logger.filters):
        logger.addFilter(_ToolCallLogs())


def mcp_tools(env: Any) -> dict[str, Any]:
    """name -> tool function for each tool an MCP environment instance lists; ValueError when the
    listing fails or a tool's name cannot be a tool here."""
    from openenv.core.env_server.mcp_types import ListToolsAction

    mute_tool_call_logs()
    cls = type(env).__name__
    with warnings.catch_warnings():  # openenv-core 0.3 reads a field FastMCP renamed: its warning, not the user's
        warnings.filterwarnings("ignore", message="Accessing `Tool.inputSchema` is deprecated")
        obs = env.step(ListToolsAction())
    listed = getattr(obs, "tools", None)
    if listed is None:
        why = (getattr(obs, "metadata", None) or {}).get("error", "no tools in its ListToolsObservation")
        raise ValueError(f"OpenEnv MCP environment {cls}: listing its tools failed ({why})")
    if not listed:
        raise ValueError(f"OpenEnv MCP environment {cls}: its MCP server lists no tool; register one with "
                         "@mcp.tool before calling MCPEnvironment.__init__")
    out = {}
    for t in listed:
        if t.name in ("reset", "get_reward") or t.name.startswith("_"):
            raise ValueError(f"OpenEnv MCP environment {cls}: its MCP tool {t.name!r} cannot be a tool here "
                             "(reset and get_reward are the episode's calls, a leading '_' marks a helper); rename it")
        out[t.name] = _mcp_tool(t.name, (t.description or "").strip(), dict(t.input_schema or {}))
    return out


def adapter_class(env_cls: type, tools: dict[str, Any] | None = None) -> type:
    """A TRL-contract class wrapping instances of the OpenEnv class ``env_cls``, named as it (so
    messages and metrics name the user's class); its tools are ``tools`` (an MCP environment's,
    :func:`mcp_tools`) or else its action's one; ValueError when its action cannot be found."""
    action_cls = None
    if tools is None:
        action_cls = action_class(env_cls)
        if not set(action_cls.model_fields) - {"metadata"}:
            raise ValueError(f"OpenEnv environment {env_cls.__name__}: its action {action_cls.__name__} has no "
                             "field a model could fill; declare an action class with the fields the model sets "
                             "(or serve tools over MCP: subclass MCPEnvironment)")
        name, tool = _tool(env_cls, action_cls)
        if name in ("reset", "get_reward") or name.startswith("_"):
            name, tool.__name__ = "step", "step"
        tools = {name: tool}
    reset = inspect.signature(env_cls.reset).parameters
    attrs = {**tools, "_action_cls": action_cls, "__doc__": env_cls.__doc__,
             "_named": frozenset(k for k in reset if k not in ("self", "seed", "episode_id")),
             "_any_column": any(p.kind is p.VAR_KEYWORD for p in reset.values()),
             "deterministic": getattr(env_cls, "deterministic", False), "__module__": env_cls.__module__}
    return type(env_cls.__name__, (_OpenEnvAdapter,), attrs)


def adapt(factory: Any, first: Any) -> tuple[Any, Any]:
    """``(factory, instance)`` for TRL's contract: unchanged for a TRL class; for an OpenEnv one
    (``first``, the instance the factory built), a factory of adapters and ``first`` wrapped."""
    if not is_openenv(first):
        return factory, first
    cls = adapter_class(type(first), mcp_tools(first) if is_mcp(first) else None)
    return (lambda: cls(factory())), cls(first)
