"""Reward functions with TRL's signature, by name or import path (``task.reward``, ``task.rewards``).

Why TRL's form: a lab that wrote ``reward_funcs`` for TRL's ``GRPOTrainer`` drops them in
unchanged: ``f(completions: list[str], **kwargs) -> list[float | None]``, where ``kwargs`` holds
``prompts`` and every column of the data set's rows, each as a list aligned with ``completions``.
When the task has an environment, TRL's conversational form: each completion is the episode's
messages after the prompt (``assistant`` turns, ``tool`` results), each prompt its messages, and
``environments`` holds each episode's instance after it ended, so a reward may read the
environment's state. The built-in rewards score an episode's final answer (its last model turn).
``None`` means "no opinion" (counted, scored 0). Several functions are summed with weights, as TRL
sums ``reward_funcs`` with ``reward_weights``. Every node runs the same code on the decoded text
(a node never trusts a reward it did not compute). A reward that raises, or returns a wrong length
or a non-finite value, fails the node's round with the reason: a silent 0 for a whole batch would
train on nothing and say nothing.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ftis_flwr.config.imports import ImportPathError, import_object, is_import_path
from ftis_flwr.tasks.base import Problem


class RewardError(ValueError):
    """A reward function that cannot be used or misbehaved; the message names it and why."""


def answer_text(completion: str | Sequence[dict]) -> str:
    """A completion's text; for an episode (its messages), the text of its last model turn."""
    if isinstance(completion, str):
        return completion
    said = [m.get("content") for m in completion if isinstance(m, dict) and m.get("role") == "assistant"]
    return str(said[-1]) if said else ""


def exact(completions: list, answer: list[Any], **kwargs) -> list[float]:
    """1.0 when the completion, stripped, is the answer's text (the arithmetic task's reward)."""
    return [1.0 if answer_text(c).strip() == str(a).strip() else 0.0 for c, a in zip(completions, answer)]


def math_verify(completions: list, answer: list[Any], **kwargs) -> list[float]:
    """1.0 when the whole completion equals the answer under math-verify (no format asked)."""
    from ftis_flwr.tasks.rewards import math_equal

    return [1.0 if math_equal(answer_text(c), str(a)) else 0.0 for c, a in zip(completions, answer)]


def strict_math(completions: list, answer: list[Any], **kwargs) -> list[float]:
    """The paper's reward: strict <think>/<answer> format and math-verify on the answer (§8)."""
    from ftis_flwr.tasks.rewards import math_reward

    return [float(math_reward(answer_text(c), str(a))) for c, a in zip(completions, answer)]


BUILTIN_REWARDS: dict[str, Callable[..., list]] = {
    "exact": exact, "math-verify": math_verify, "strict-math": strict_math}
"""Built-in reward names; each receives the gold answer as ``answer`` (``task.answer_field``)."""


def resolve_reward(name: str) -> Callable[..., list]:
    """The function ``name`` names: a built-in, or ``"<module>:<function>"`` / ``"<file.py>:<function>"``."""
    if name in BUILTIN_REWARDS:
        return BUILTIN_REWARDS[name]
    if not is_import_path(name):
        raise RewardError(f"reward {name!r} is not one of {', '.join(BUILTIN_REWARDS)}, nor an import path "
                          "'<module>:<function>' or '<file.py>:<function>'")
    try:
        return import_object(name)
    except ImportPathError as exc:
        raise RewardError(f"reward {name!r}: {exc}") from None


def signature_fault(fn: Callable, columns: Sequence[str], extra: Sequence[str] = ()) -> str:
    """Why ``fn`` cannot be called as ``fn(completions=..., prompts=..., **columns)`` (and the
    ``extra`` arguments, such as ``environments``), or ""."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return ""
    given = {"completions", "prompts", *columns, *extra}
    takes_rest = any(p.kind is p.VAR_KEYWORD for p in params.values())
    missing = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
               and p.default is p.empty and n not in given]
    if missing:
        return (f"it requires {', '.join(map(repr, missing))}, which the rows do not have (columns: "
                f"{', '.join(columns) or 'none'})")
    if not takes_rest:
        first = next(iter(params), None)
        if first != "completions" and "completions" not in params:
            return "it takes no 'completions' argument (TRL's signature: f(completions, **kwargs))"
    return ""


@dataclass
class RewardSet:
    """The run's reward functions and their weights, called on a batch of completions."""

    names: list[str]
    weights: list[float]
    fns: list[Callable[..., list]]
    nones: int = 0
    """``None`` answers so far (each counted as 0); the node reports them per round."""

    @classmethod
    def build(cls, names: Sequence[str], weights: Sequence[float] = ()) -> RewardSet:
        names = list(names)
        weights = [float(w) for w in weights] or [1.0] * len(names)
        if len(weights) != len(names):
            raise RewardError(f"task.reward_weights has {len(weights)} weights for {len(names)} rewards")
        return cls(names, weights, [resolve_reward(n) for n in names])

    def __call__(self, completions: list, problems: Sequence[Problem],
                 prompts: list | None = None, environments: Sequence[Any] | None = None) -> list[float]:
        """The weighted sum of the functions' rewards of ``completions`` (texts, or episodes'
        message lists) of ``problems``; ``prompts`` default to the problems' questions."""
        columns: dict[str, list] = {}
        for p in problems:
            for key in p.columns:
                columns.setdefault(key, [])
        for key in columns:
            columns[key] = [p.columns.get(key) for p in problems]
        columns.setdefault("answer", [p.gold for p in problems])
        if environments is not None:
            columns["environments"] = list(environments)
        total = [0.0] * len(completions)
        for name, w, fn in zip(self.names, self.weights, self.fns):
            try:
                out = fn(completions=list(completions), prompts=prompts or [p.question for p in problems], **columns)
            except Exception as exc:
                raise RewardError(f"reward {name!r} raised {type(exc).__name__}: {exc}") from exc
            out = list(out) if out is not None else []
            if len(out) != len(completions):
                raise RewardError(f"reward {name!r} returned {len(out)} values for {len(completions)} completions")
            for i, v in enumerate(out):
                if v is None:
                    self.nones += 1
                    continue
                try:
                    v = float(v)
                except (TypeError, ValueError):
                    raise RewardError(f"reward {name!r} returned {v!r} for completion {i}: not a number") from None
                if not math.isfinite(v):
                    raise RewardError(f"reward {name!r} returned {v} for completion {i}: not finite")
                total[i] += w * v
        return total
