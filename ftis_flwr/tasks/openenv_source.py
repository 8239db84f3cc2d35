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
``name: value`` lines of its fields. Remote OpenEnv clients (a Space over HTTP) are not driven here:
wrap one in a TRL-style class as TRL's OpenEnv guide shows.
"""

from __future__ import annotations

import inspect
import random
import re
import typing
from typing import Any

BASE_FIELDS = ("done", "reward", "metadata")
"""Fields every OpenEnv observation has (``Observation``): not the observation's text."""


def is_openenv(obj: Any) -> bool:
    """``obj`` (a class or an instance) is an OpenEnv ``Environment``, found by its bases' module
    so that checking a TRL class never imports ``openenv``."""
    cls = obj if isinstance(obj, type) else type(obj)
    return any(base.__name__ == "Environment" and base.__module__.startswith("openenv.")
               for base in inspect.getmro(cls))


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
        if self._done:
            raise RuntimeError("the episode is over (the environment said done): give your final answer")
        obs = self._env.step(self._action_cls(**arguments))
        self._done = bool(getattr(obs, "done", False))
        self._note(obs)
        return observation_text(obs)


def adapter_class(env_cls: type) -> type:
    """A TRL-contract class wrapping instances of the OpenEnv class ``env_cls``, named as it (so
    messages and metrics name the user's class); ValueError when its action cannot be found."""
    action_cls = action_class(env_cls)
    if not set(action_cls.model_fields) - {"metadata"}:
        mcp = any(base.__name__ == "MCPEnvironment" for base in inspect.getmro(env_cls))
        raise ValueError(f"OpenEnv environment {env_cls.__name__}: its action {action_cls.__name__} has no field a "
                         "model could fill" + ("; an MCP environment (tools called through CallToolAction) is not "
                                               "driven here yet: wrap it in a TRL-style class whose methods call "
                                               "its tools" if mcp else ""))
    name, tool = _tool(env_cls, action_cls)
    if name in ("reset", "get_reward") or name.startswith("_"):
        name, tool.__name__ = "step", "step"
    reset = inspect.signature(env_cls.reset).parameters
    attrs = {name: tool, "_action_cls": action_cls, "__doc__": env_cls.__doc__,
             "_named": frozenset(k for k in reset if k not in ("self", "seed", "episode_id")),
             "_any_column": any(p.kind is p.VAR_KEYWORD for p in reset.values()),
             "deterministic": getattr(env_cls, "deterministic", False), "__module__": env_cls.__module__}
    return type(env_cls.__name__, (_OpenEnvAdapter,), attrs)


def adapt(factory: Any, first: Any) -> tuple[Any, Any]:
    """``(factory, instance)`` for TRL's contract: unchanged for a TRL class; for an OpenEnv one
    (``first``, the instance the factory built), a factory of adapters and ``first`` wrapped."""
    if not is_openenv(first):
        return factory, first
    cls = adapter_class(type(first))
    return (lambda: cls(factory())), cls(first)
