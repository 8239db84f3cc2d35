"""Three-term sums (``12+34-56=``): the offline task of the calculator environment (issue #57).

The tiny models were warm-started on two terms (``12+34=``) and answer three-term chains only by
chance, but a calculator answers them exactly: a model that learns to call it (``#calc(12+34-56)``)
and copy its result earns the reward. That is the choice reinforcement learning has to make here,
between the two paths the tool warm start (:mod:`ftis_flwr.node.tiny.tools`) leaves open.

Problems are generated from ``TaskConfig.seed`` (no files): ``a+b-c`` with 2-digit terms and a
result of 0 or more (at most 3 digits), in three disjoint lists: ``train`` (4000), ``test`` (256)
and ``warmstart`` (the tool warm start's rows, never an RL prompt or an evaluation). Each problem
carries its row (``question``, ``answer``), which an environment's ``reset(**row)`` receives.
"""

from __future__ import annotations

import random
from typing import Any

from ftis_flwr.tasks.base import Problem, Task

SIZES = {"train": 4000, "test": 256, "warmstart": 2000}


class ArithmeticChainTask(Task):
    """Generated ``a+b-c`` problems; see the module docstring."""

    name = "arithmetic-chain"
    eval_splits = ("test",)
    extra_splits = ("warmstart",)
    max_new_tokens = 16
    """A calculator call on a chain (``#calc(12+34-56)``) is 15 characters, then the end token."""

    def __init__(self, seed: int = 1234) -> None:
        super().__init__()
        self.seed = int(seed)
        self.shuffle_seed = self.seed + 1
        self._chains: dict[str, list[tuple[int, int, int]]] | None = None

    @property
    def splits(self) -> tuple[str, ...]:
        return (*super().splits, *self.extra_splits)

    def _generate(self) -> dict[str, list[tuple[int, int, int]]]:
        rng, seen = random.Random(f"{self.seed}:chain"), set()
        out: dict[str, list[tuple[int, int, int]]] = {}
        for split, size in SIZES.items():
            items: list[tuple[int, int, int]] = []
            while len(items) < size:
                a, b, c = rng.randint(10, 99), rng.randint(10, 99), rng.randint(10, 99)
                if a + b - c >= 0 and (a, b, c) not in seen:
                    seen.add((a, b, c))
                    items.append((a, b, c))
            out[split] = items
        return out

    def _load_split(self, split: str) -> list[Problem]:
        if self._chains is None:
            self._chains = self._generate()
        problems = []
        for i, (a, b, c) in enumerate(self._chains[split]):
            question, gold = f"{a}+{b}-{c}=", str(a + b - c)
            problems.append(Problem(id=f"{split}:{i}", question=question, gold=gold,
                                    columns={"question": question, "answer": gold}))
        return problems

    def prompt_text(self, problem: Problem, tokenizer: Any = None) -> str:
        """The raw question, as :class:`~ftis_flwr.tasks.arithmetic.ArithmeticTask` gives it."""
        return problem.question

    def reward(self, completion_text: str, problem: Problem) -> float:
        from ftis_flwr.tasks.rewards import arithmetic_reward

        return float(arithmetic_reward(completion_text, problem.gold))
