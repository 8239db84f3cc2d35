"""What every task offers the rest of the system: problems by split, by id and by train index.

The strategy only ever sends integers (train indices) or problem ids over the wire, so every
node must map an index to the *same* problem: :meth:`Task.train_problem` reads the train split
through a fixed, seeded permutation built with Python's ``random`` (identical on every machine).
Problems are loaded lazily on first use, so constructing a task never reads a file or the hub.

:class:`Task` is an abstract base class, as Flower's ``Strategy`` is: a subclass that leaves out
one of the three methods it must provide fails when it is built, naming the method, instead of in
a node's first round.
"""

from __future__ import annotations

import abc
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Problem:
    """One verifiable problem: ``id`` is ``"<split>:<index>"``, ``gold`` the reference answer."""

    id: str
    question: str
    gold: str
    columns: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)
    """Everything else the problem's source row holds (a data set's columns, a generator's
    metadata): what a reward function receives as keyword arguments. Empty for built-in tasks."""


class Task(abc.ABC):
    """Base class of the prompt sources; subclasses implement :meth:`_load_split`, :meth:`reward`
    and :meth:`prompt_text`.

    Class attributes a subclass sets: ``name``, ``eval_splits`` (the splits evaluated, in
    reporting order), ``max_new_tokens`` (a completion-length hint for the engines) and, where
    the reward reads letter case, ``answer_case_matters``.
    """

    name: str = "task"
    train_split: str = "train"
    eval_splits: tuple[str, ...] = ()
    max_new_tokens: int = 640
    shuffle_seed: int = 0
    """Seed of the train-index permutation (subclasses derive it from their config)."""
    answer_case_matters: bool = False
    """Whether the reward tells ``FROCK`` from ``frock``. Analysis tools read it: an answer counts
    as copied from the prompt only letter case included where it does (``ftis-flwr answers``)."""

    def __init__(self) -> None:
        self._cache: dict[str, list[Problem]] = {}
        self._order: list[int] | None = None

    # -- to implement -------------------------------------------------------------------------

    @abc.abstractmethod
    def _load_split(self, split: str) -> list[Problem]:
        """Every problem of ``split`` (one of :attr:`splits`), ids ``"<split>:<index>"`` in order.

        Called once per split, on first use (:meth:`problems` caches the list); it may read
        files or the hub. An empty list is refused by :meth:`problems`.
        """

    @abc.abstractmethod
    def reward(self, completion_text: str, problem: Problem) -> float:
        """Verifiable reward of a decoded completion (1.0 correct, 0.0 otherwise).

        Parameters
        ----------
        completion_text : the completion, decoded without special tokens.
        problem : the problem it answers (its ``gold`` is the reference answer).
        """

    @abc.abstractmethod
    def prompt_text(self, problem: Problem, tokenizer: Any) -> str:
        """The text a model is conditioned on (before tokenisation).

        Parameters
        ----------
        problem : the problem to pose.
        tokenizer : the node's tokenizer (a task may apply its chat template; arithmetic ignores it).
        """

    reward_set: Any = None
    """``task.reward`` / ``task.rewards`` when set (a :class:`ftis_flwr.tasks.reward_funcs.RewardSet`):
    it replaces :meth:`reward` in :meth:`rewards`."""

    def rewards(self, completions: list[str], problems: list[Problem],
                environments: list[Any] | None = None) -> list[float]:
        """The rewards of decoded completions, one per (completion, problem): the configured
        reward functions, batched (TRL's form), or the task's own :meth:`reward` one at a time.
        ``environments``: each episode's environment instance, for reward functions that read it
        (TRL's ``environments`` argument); only with ``task.environment``."""
        if self.reward_set is not None:
            return self.reward_set(completions, problems, environments=environments)
        return [float(self.reward(c, p)) for c, p in zip(completions, problems)]

    def source_parts(self) -> dict[str, str]:
        """What the problems come from beyond this task's code and settings (a package's data
        files, a generator's version), part name -> short hash or version, for the server's check
        that every node computes its rewards from the same problems
        (:func:`ftis_flwr.tasks.fingerprint.task_parts`). Default: nothing beyond them."""
        return {}

    # -- shared -------------------------------------------------------------------------------

    def prompt_ids(self, problem: Problem, tokenizer: Any) -> list[int]:
        """:meth:`prompt_text` in ``tokenizer``'s ids. A chat template writes its own special
        tokens, so its text is encoded as it is; a plain-text prompt (a tokenizer without a
        template: a base model) gets the tokenizer's own, e.g. Gemma's ``<bos>``: base Gemma 3 270M
        answered 0 of 32 basic-math test problems greedily without it, 10 of 32 with it
        (``python -m benchmarks.gemma_bos``)."""
        plain = not getattr(tokenizer, "chat_template", None)
        return list(tokenizer(self.prompt_text(problem, tokenizer), add_special_tokens=plain)["input_ids"])

    @property
    def splits(self) -> tuple[str, ...]:
        """The train split followed by the evaluation splits."""
        return (self.train_split, *[s for s in self.eval_splits if s != self.train_split])

    def problems(self, split: str) -> list[Problem]:
        """All problems of ``split`` (a list you must not mutate: it is cached)."""
        if split not in self.splits:
            raise KeyError(f"task {self.name!r} has no split {split!r}; "
                           f"splits are: {', '.join(self.splits)}")
        if split not in self._cache:
            problems = self._load_split(split)
            if not problems:
                raise ValueError(f"task {self.name!r}: split {split!r} is empty")
            self._cache[split] = problems
        return self._cache[split]

    def problem(self, problem_id: str) -> Problem:
        """The problem with id ``"<split>:<index>"``; KeyError naming the id otherwise."""
        split, sep, index = str(problem_id).rpartition(":")
        if not sep or split not in self.splits:
            raise KeyError(f"task {self.name!r}: bad problem id {problem_id!r}; ids look like "
                           f"'<split>:<index>' with split one of {', '.join(self.splits)}")
        problems = self.problems(split)
        try:
            i = int(index)
        except ValueError:
            i = -1
        if not 0 <= i < len(problems) or index != str(i):
            raise KeyError(f"task {self.name!r}: no problem {problem_id!r}; split {split!r} has "
                           f"indices 0..{len(problems) - 1}")
        return problems[i]

    def train_problem(self, index: int) -> Problem:
        """Train problem number ``index`` (taken modulo the train size) of a fixed shuffle."""
        train = self.problems(self.train_split)
        if self._order is None:
            order = list(range(len(train)))
            random.Random(self.shuffle_seed).shuffle(order)
            self._order = order
        return train[self._order[int(index) % len(train)]]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, splits={self.splits})"
