"""Offline arithmetic: the CPU-scale stand-in for GSM8K (in-distribution) and MATH-500 (OOD).

Problems are generated deterministically from ``TaskConfig.seed`` (no files, no network):

- ``train``: 2-digit ``a+b`` and ``a-b`` (a >= b, so no negative results), balanced by operation;
- ``test``: held-out problems of the same kind, disjoint from ``train`` (in-distribution);
- ``ood``: one operand below 10, written with a leading zero (``07+48=``, ``48+07=``, ``48-07=``):
  the same 6-character shape, but a leading 0 never occurs in warm-start or training. This is
  the role MATH-500 plays for GSM8K, at tiny scale: warm-started small models (~70% on ``test``)
  score 0-9% here depending on the seed (``benchmarks/warmstart.py``); it only moves through
  generalisation. Unpadded ``7+48=``, negative results and a held-out operand range scored ~0%
  in calibration runs, so they were not used.

Sizes: train 7690 (3845 per operation), test 500 and ood 500 (250 per operation).

The prompt is the raw question (``"37+48="``), the completion the answer then EOS (``"85"``), and
the reward exact match (``rewards.arithmetic_reward``).
"""

from __future__ import annotations

import random
from typing import Any

from .base import Problem, Task

OPS = ("+", "-")
TEST_PER_OP = 250
OOD_PER_OP = 250


def _answer(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b


def op_of(problem: Problem) -> str:
    """The operation of an arithmetic problem ("+" or "-")."""
    return "+" if "+" in problem.question else "-"


def parse_ops(ops: str) -> tuple[str, ...]:
    """``"+-"`` -> ``("+", "-")``; ValueError on anything but a non-empty mix of '+' and '-'."""
    if not ops or set(ops) - set(OPS):
        raise ValueError(f"ops={ops!r} must be a non-empty combination of '+' and '-'")
    return tuple(op for op in OPS if op in ops)


class ArithmeticTask(Task):
    """Generated 2-digit addition/subtraction; see the module docstring for the splits."""

    name = "arithmetic"
    eval_splits = ("test", "ood")
    max_new_tokens = 8
    """Answers have at most 3 digits + EOS; a few spare tokens let a bad model ramble visibly."""

    def __init__(self, seed: int = 1234) -> None:
        super().__init__()
        self.seed = int(seed)
        self.shuffle_seed = self.seed + 1
        self._splits: dict[str, list[tuple[int, str, int]]] | None = None

    def _generate(self) -> dict[str, list[tuple[int, str, int]]]:
        # One string-seeded RNG per list, so changing one split never reshuffles another.
        def shuffled(items: list, what: str) -> list:
            random.Random(f"{self.seed}:{what}").shuffle(items)
            return items

        two, one = range(10, 100), range(0, 10)
        in_dist = {
            "+": [(a, "+", b) for a in two for b in two],
            "-": [(a, "-", b) for a in two for b in two if a >= b],
        }
        ood = {  # one operand 0..9 written with a leading zero ("07"): never seen in train
            "+": [(a, "+", b) for a in one for b in two] + [(a, "+", b) for a in two for b in one],
            "-": [(a, "-", b) for a in two for b in one],
        }
        n_train = min(len(v) for v in in_dist.values()) - TEST_PER_OP
        splits: dict[str, list[tuple[int, str, int]]] = {"train": [], "test": [], "ood": []}
        for op in OPS:
            pool = shuffled(in_dist[op], f"in{op}")
            splits["test"] += pool[:TEST_PER_OP]
            splits["train"] += pool[TEST_PER_OP:TEST_PER_OP + n_train]
            splits["ood"] += shuffled(ood[op], f"ood{op}")[:OOD_PER_OP]
        return {name: shuffled(items, name) for name, items in splits.items()}

    def _load_split(self, split: str) -> list[Problem]:
        if self._splits is None:
            self._splits = self._generate()
        return [Problem(id=f"{split}:{i}", question=f"{a:02d}{op}{b:02d}=", gold=str(_answer(a, op, b)))
                for i, (a, op, b) in enumerate(self._splits[split])]

    def warmstart_problems(self, ops: str = "+-") -> list[Problem]:
        """Supervised warm-start data: the train problems whose operation is in ``ops``."""
        keep = parse_ops(ops)
        return [p for p in self.problems("train") if op_of(p) in keep]

    def prompt_text(self, problem: Problem, tokenizer: Any = None) -> str:
        """The raw question, for every tokenizer (no chat template: the answer is the digits)."""
        return problem.question

    def reward(self, completion_text: str, problem: Problem) -> float:
        from ftis_flwr.rewards import arithmetic_reward

        return float(arithmetic_reward(completion_text, problem.gold))
