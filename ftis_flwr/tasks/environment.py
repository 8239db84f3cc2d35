"""Bring your own environment (issue #57): a class written for TRL's ``environment_factory``, loaded
by import path and driven one episode at a time.

The contract is TRL's (``GRPOTrainer(environment_factory=...)``), unchanged, so such a class drops
in: ``factory()`` (the class itself, or any callable without arguments) returns an instance with

- ``reset(**row)``: the data set's row as keyword arguments (every column); it returns None, or a
  string appended to the last user message of the prompt;
- tools: every public method (a name without a leading ``_``) but ``reset`` and ``get_reward``,
  each described to the model by its type hints and Google-style docstring
  (:mod:`ftis_flwr.tasks.tool_schema`);
- optionally ``get_reward()`` (no argument, sync or async): the finished episode's reward, read
  from the environment's state (else the task's reward functions score the episode);
- optionally ``deterministic = True`` (a class attribute, this project's, which TRL ignores): the
  same row, seed and tool calls give the same observations and reward, so a peer may replay
  this node's episodes and train on them (:mod:`ftis_flwr.node.replay`).

What this project adds, and why:

- the contract is checked when the environment is loaded (:func:`load_environment` builds one
  instance, as TRL does), so a broken class is refused with its name and what is missing
  (:class:`EnvironmentContractError`), never in a node's first round;
- every call into the user's code is bounded in time: a tool that raises or runs past
  ``tool_timeout`` seconds becomes an error observation the model reads (TRL's
  ``str({"error": ...})``) and is counted (:class:`ToolResult`); ``reset`` or ``get_reward`` that
  raises, hangs or breaks the contract raises :class:`EnvironmentFault`, which stops the node's
  round with the reason (an environment that cannot start or score episodes has nothing to train);
- ``reset`` runs with Python's ``random`` and numpy's global generator seeded (and restored
  after), so the G episodes of a group start from the same state (algorithm §13);
- an instance whose tool timed out may still be running it: it takes no further call and is
  never reused (:meth:`EnvironmentSpec.release`).

A timed-out call's thread cannot be stopped (Python has no way to kill a thread): it is left to
finish in the background, as a daemon that never holds the process open.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
import random
import threading
import types
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ftis_flwr.config.imports import ImportPathError, import_object, source_of
from ftis_flwr.tasks.openenv_source import adapt
from ftis_flwr.tasks.reward_funcs import answer_text
from ftis_flwr.tasks.tool_schema import ToolSchemaError, tool_schema

RESERVED = ("reset", "get_reward")
"""Public methods that are not tools (TRL's contract)."""
TOOL_TIMEOUT = 10.0
"""Seconds a tool call may take by default before it becomes an error observation."""
CALL_TIMEOUT = 60.0
"""Seconds ``reset`` and ``get_reward`` may take by default before the round stops."""


class EnvironmentContractError(ValueError):
    """An environment that breaks TRL's ``environment_factory`` contract; the message names the
    class (or import path) and what is missing."""


class EnvironmentFault(RuntimeError):
    """The environment failed while running (``reset`` or ``get_reward`` raised, hung or returned
    what the contract does not allow): the node stops its round with this reason."""


@dataclass
class ToolResult:
    """One tool call's outcome, as the model reads it."""

    name: str
    content: str
    """The tool message's text: ``str(result)``, or ``str({"error": why})`` when it failed."""
    error: str = ""
    """"" when the tool ran and returned; else why not (counted as a tool error)."""
    timed_out: bool = False


def reset_seed(run_seed: int, prompt_id: str) -> int:
    """The seed ``reset`` runs with for a row: the run's seed and the prompt id, the same on every
    node and round, so a receiver derives it itself."""
    return (int(run_seed) * 1_000_003 + zlib.crc32(prompt_id.encode()) * 7_919 + 17) % (2**63)


def scored(rewards: Sequence[float | None], episodes: Sequence[Sequence[dict]], task: Any, problems: Sequence[Any],
           environments: Sequence[Any], prompts: Sequence[Sequence[dict]] | None = None) -> list[float]:
    """Each episode's reward: its environment's (``get_reward()``) where it gave one, else the
    task's, scored together. ``episodes``: each episode's messages after the prompt (its model
    turns as ``assistant`` messages, its tool results as ``tool`` messages); ``prompts``: each
    episode's prompt messages. Reward functions (``task.reward`` / ``task.rewards``) receive them as
    TRL passes a conversational rollout's, ``completions`` and ``prompts`` as message lists, with
    each episode's ``environments`` instance as the episode left it (called before the instance
    goes back to the pool); a task's own reward scores the final answer text
    (:func:`~ftis_flwr.tasks.reward_funcs.answer_text`)."""
    out = list(rewards)
    missing = [i for i, r in enumerate(out) if r is None]
    if missing:
        probs, envs = [problems[i] for i in missing], [environments[i] for i in missing]
        if task.reward_set is not None:
            values = task.reward_set([list(episodes[i]) for i in missing], probs, environments=envs,
                                     prompts=None if prompts is None else [list(prompts[i]) for i in missing])
        else:
            values = task.rewards([answer_text(episodes[i]) for i in missing], probs, environments=envs)
        for i, value in zip(missing, values):
            out[i] = float(value)
    return [float(r) for r in out]


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Python's ``random`` and numpy's global generator seeded with ``seed``, restored after."""
    state, np_state = random.getstate(), np.random.get_state()
    random.seed(int(seed))
    np.random.seed(int(seed) % 2**32)
    try:
        yield
    finally:
        random.setstate(state)
        np.random.set_state(np_state)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def bounded(fn: Callable[..., Any], kwargs: Mapping[str, Any], timeout: float | None,
            label: str) -> tuple[Any, BaseException | None, bool]:
    """``fn(**kwargs)`` (awaited when it returns an awaitable) in a daemon thread for at most
    ``timeout`` seconds (None: no bound): (value, exception it raised or None, timed out)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            out = fn(**kwargs)
            box["value"] = asyncio.run(_awaited(out)) if inspect.isawaitable(out) else out
        except BaseException as exc:  # the user's code: whatever it raises is reported, never re-raised here
            box["error"] = exc

    thread = threading.Thread(target=run, name=f"ftis-env-{label}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return None, None, True
    return box.get("value"), box.get("error"), False


def _methods(instance: Any) -> dict[str, Callable]:
    """The instance's public bound methods (TRL: ``inspect.getmembers(instance, ismethod)``), found
    without evaluating properties."""
    out = {}
    for name in dir(instance):
        if name.startswith("_"):
            continue
        raw = inspect.getattr_static(instance, name, None)
        if isinstance(raw, (types.FunctionType, classmethod, types.MethodType)):
            bound = getattr(instance, name)
            if inspect.ismethod(bound):
                out[name] = bound
    return out


class Environment:
    """One instance of the user's environment, driven by the episode loop."""

    def __init__(self, spec: EnvironmentSpec, instance: Any):
        self.spec = spec
        self.instance = instance
        self.busy = ""
        """Why this instance takes no more calls ("" while it does): a tool call that timed out
        may still be running in its thread."""
        self.tools = {name: m for name, m in _methods(instance).items() if name in spec.tools}

    def reset(self, row: Mapping[str, Any], seed: int) -> str | None:
        """``reset(**row)`` with the global generators seeded: None, or the text to append to the
        last user message; EnvironmentFault when it raises, hangs or returns something else."""
        where = f"{self.spec.name}.reset(**row)"
        with seeded(seed):
            value, error, timed_out = bounded(self.instance.reset, dict(row), self.spec.call_timeout, "reset")
        if timed_out:
            raise EnvironmentFault(f"{where} did not return within {self.spec.call_timeout} s")
        if error is not None:
            hint = " (reset receives every column of the row: accept **kwargs)" if isinstance(error, TypeError) else ""
            raise EnvironmentFault(f"{where} raised {type(error).__name__}: {error}{hint}") from error
        if value is not None and not isinstance(value, str):
            raise EnvironmentFault(f"{where} returned {value!r} ({type(value).__name__}); TRL's contract: None, "
                                   "or a string appended to the last user message")
        return value

    def call(self, name: str, arguments: Any) -> ToolResult:
        """Run one tool call; whatever goes wrong becomes an error observation (never raises)."""
        if self.busy:
            return _failed(name, f"not run: {self.busy}")
        if name not in self.tools:
            return _failed(name, f"Tool {name} not found. Tools: {', '.join(self.tools) or 'none'}")
        if not isinstance(arguments, Mapping) or not all(isinstance(k, str) for k in arguments):
            return _failed(name, f"arguments must be an object of named values, got {type(arguments).__name__}")
        timeout = self.spec.tool_timeout
        value, error, timed_out = bounded(self.tools[name], arguments, timeout, name)
        if timed_out:
            self.busy = f"tool {name} timed out after {timeout} s and may still be running"
            why = f"timed out after {timeout} s"
            return ToolResult(name, str({"error": why}), error=why, timed_out=True)
        if error is not None:
            return _failed(name, str(error) or type(error).__name__)
        return ToolResult(name, str(value))

    def run(self, calls: Sequence[Any]) -> list[ToolResult]:
        """Run the calls read from one model turn (:class:`ftis_flwr.tasks.tool_calls.ToolCall`), in
        order; a call that could not be read becomes its error observation, never run."""
        return [self.call(c.name, c.arguments) if not c.error else _failed(c.name, c.error) for c in calls]

    def reward(self) -> float | None:
        """``get_reward()`` (sync or async) as a float; None when the class has none or returned
        None (no opinion). EnvironmentFault when it raises, hangs or returns a non-number."""
        if not self.spec.has_reward:
            return None
        where = f"{self.spec.name}.get_reward()"
        value, error, timed_out = bounded(self.instance.get_reward, {}, self.spec.call_timeout, "get_reward")
        if timed_out:
            raise EnvironmentFault(f"{where} did not return within {self.spec.call_timeout} s")
        if error is not None:
            raise EnvironmentFault(f"{where} raised {type(error).__name__}: {error}") from error
        if value is None:
            return None
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise EnvironmentFault(f"{where} returned {value!r}, not a number") from None
        if not math.isfinite(number):
            raise EnvironmentFault(f"{where} returned {number}, not a finite number")
        return number


def _failed(name: str, why: str) -> ToolResult:
    return ToolResult(name, str({"error": why}), error=why)


@dataclass
class EnvironmentSpec:
    """A loaded environment: its factory, tools (name -> JSON schema) and time bounds, with a pool
    of instances ("construct once, reset often", as TRL)."""

    path: str
    factory: Callable[[], Any]
    name: str
    """The class of the instances (for messages and metrics)."""
    tools: dict[str, dict]
    has_reward: bool
    deterministic: bool = False
    """The class says ``deterministic = True``: peers replay its episodes (else they refuse them)."""
    tool_timeout: float = TOOL_TIMEOUT
    call_timeout: float = CALL_TIMEOUT
    _pool: list[Any] = field(default_factory=list, repr=False)

    @property
    def schemas(self) -> list[dict]:
        """The tools' JSON schemas, for the chat template (``apply_chat_template(tools=...)``)."""
        return list(self.tools.values())

    def source(self) -> Path | None:
        """The file the environment's code lives in (for the task fingerprint), or None."""
        return source_of(self.path)

    def acquire(self) -> Environment:
        """An instance to run one episode with: a pooled one, else a new one from the factory
        (checked to be of the same class)."""
        if self._pool:
            return Environment(self, self._pool.pop())
        instance = _build(self.factory, self.path)
        if type(instance).__name__ != self.name:
            raise EnvironmentFault(f"environment {self.path!r}: the factory returned a {type(instance).__name__}, "
                                   f"the first one a {self.name}")
        return Environment(self, instance)

    def release(self, env: Environment) -> None:
        """Give an instance back to the pool, unless a call of its may still be running."""
        if not env.busy:
            self._pool.append(env.instance)


def _build(factory: Callable[[], Any], path: str) -> Any:
    try:
        return factory()
    except Exception as exc:  # the user's constructor: named with its own error
        raise EnvironmentContractError(f"environment {path!r}: calling its factory raised {type(exc).__name__}: "
                                       f"{exc} (TRL's contract: factory() takes no argument)") from None


def load_environment(path: str, *, tool_timeout: float = TOOL_TIMEOUT,
                     call_timeout: float = CALL_TIMEOUT) -> EnvironmentSpec:
    """The environment ``path`` names (``"<module>:<factory>"`` or ``"<file.py>:<factory>"``),
    with one instance built to check TRL's contract (it joins the pool); EnvironmentContractError
    naming the class and what is missing otherwise."""
    try:
        factory = import_object(path)
    except ImportPathError as exc:
        raise EnvironmentContractError(f"environment {path!r}: {exc}") from None
    for what, value in (("tool_timeout", tool_timeout), ("call_timeout", call_timeout)):
        if not (isinstance(value, (int, float)) and value > 0):
            raise ValueError(f"{what} must be a positive number of seconds, got {value!r}")
    instance = _build(factory, path)
    try:  # an OpenEnv class: driven through TRL's contract by an adapter built from it
        factory, instance = adapt(factory, instance)
    except ValueError as exc:
        raise EnvironmentContractError(f"environment {path!r}: {exc}") from None
    cls = type(instance).__name__
    if not callable(getattr(instance, "reset", None)):
        raise EnvironmentContractError(f"environment {path!r}: {cls} has no callable reset(**row) (TRL's "
                                       "environment_factory contract: reset returns None or a string)")
    reward = getattr(instance, "get_reward", None)
    if reward is not None and not callable(reward):
        raise EnvironmentContractError(f"environment {path!r}: {cls}.get_reward is a {type(reward).__name__}, "
                                       "not a method")
    deterministic = getattr(instance, "deterministic", False)
    if not isinstance(deterministic, bool):
        raise EnvironmentContractError(f"environment {path!r}: {cls}.deterministic is {deterministic!r}; it says "
                                       "whether peers may replay its episodes: True or False")
    tools = {}
    for name, method in sorted(_methods(instance).items()):
        if name in RESERVED:
            continue
        try:  # an MCP tool's schema is the one its server declares (tasks.openenv_source)
            tools[name] = getattr(method, "_ftis_tool_schema", None) or tool_schema(method, cls)
        except ToolSchemaError as exc:
            raise EnvironmentContractError(f"environment {path!r}: {exc} (every public method but "
                                           f"{' and '.join(RESERVED)} is a tool; prefix a helper with '_')") from None
    spec = EnvironmentSpec(path=path, factory=factory, name=cls, tools=tools, has_reward=reward is not None,
                           deterministic=deterministic, tool_timeout=float(tool_timeout),
                           call_timeout=float(call_timeout))
    spec._pool.append(instance)
    return spec
