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

**The ``arithmetic-heldout`` variant** (``ArithmeticTask(heldout=True)``): an OOD split that
carries signal. No change of shape tried (3-digit operands, leading zeros, spaces, negative
results, ...) scores above ~8% with the warm-started models (``benchmarks/ood_probe.py``): they
know one shape only. So the variant holds a *kind* of problem out of RL training instead, as
GSM8K-trained RL relates to MATH-500 (the base models saw such problems in pre-training, the RL
never does): additions with a units carry (``37+48=``).

- ``warmstart``: the base task's ``train`` list, unchanged, so the warm-starts (their cache keys
  hold no problem list) are exactly the base task's models, shipped ones included;
- ``train`` (the RL prompts): the base ``train`` without units-carry additions (6002);
- ``test``: the base ``test`` without them (389); ``ood``: the base ``test``'s units-carry
  additions (111): never seen as problems in warm-start or RL, of a kind the RL never trains;
- ``ood-lead0``: the base task's ``ood`` (leading zeros), kept under its own name.

Chosen from the STARTING models only, before any method result (``benchmarks/ood_probe.py``):
the shipped small and large models and a cached small one score 0.51 / 0.24 / 0.44 on ``ood``
against 0.59 / 0.64 / 0.64 on ``test`` (every shape change: 0.00-0.08).
"""

from __future__ import annotations

import random
from typing import Any

from ftis_flwr.tasks.base import Problem, Task

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


def op_weights(ops: str) -> dict[str, int] | None:
    """Weighted warm-start mixes: a repeated sign is a weight (``"+++-"`` = 3 additions per
    subtraction); None for a plain mix ("+", "-", "+-", or equal weights such as "++--"), whose
    data and cache keys are unchanged.
    Lets two models be experts in different operations that still overlap (algorithm §11: disjoint
    specialists do not teach each other)."""
    parse_ops(ops)
    counts = {op: ops.count(op) for op in OPS if op in ops}
    return counts if len(set(counts.values())) > 1 else None


def carry_add(a: int, op: str, b: int) -> bool:
    """An addition whose units digits carry (``37+48``): the kind ``arithmetic-heldout`` holds out."""
    return op == "+" and a % 10 + b % 10 >= 10


class ArithmeticTask(Task):
    """Generated 2-digit addition/subtraction; see the module docstring for the splits."""

    name = "arithmetic"
    eval_splits = ("test", "ood")
    max_new_tokens = 8
    """Answers have at most 3 digits + EOS; a few spare tokens let a bad model ramble visibly."""

    def __init__(self, seed: int = 1234, heldout: bool = False) -> None:
        super().__init__()
        self.heldout = bool(heldout)
        if self.heldout:
            self.name = "arithmetic-heldout"
            self.extra_splits = ("ood-lead0", "warmstart")  # readable, not evaluated
        self.seed = int(seed)
        self.shuffle_seed = self.seed + 1
        self._splits: dict[str, list[tuple[int, str, int]]] | None = None

    extra_splits: tuple[str, ...] = ()

    @property
    def splits(self) -> tuple[str, ...]:
        """The train and evaluation splits, then the readable extras of the heldout variant."""
        return (*super().splits, *self.extra_splits)

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
        out = {name: shuffled(items, name) for name, items in splits.items()}
        if self.heldout:  # filters keep the base lists' order: the base splits are untouched
            out = {"warmstart": out["train"], "ood-lead0": out["ood"],
                   "train": [x for x in out["train"] if not carry_add(*x)],
                   "test": [x for x in out["test"] if not carry_add(*x)],
                   "ood": [x for x in out["test"] if carry_add(*x)]}
        return out

    def _load_split(self, split: str) -> list[Problem]:
        if self._splits is None:
            self._splits = self._generate()
        return [Problem(id=f"{split}:{i}", question=f"{a:02d}{op}{b:02d}=", gold=str(_answer(a, op, b)))
                for i, (a, op, b) in enumerate(self._splits[split])]

    def warmstart_problems(self, ops: str = "+-") -> list[Problem]:
        """Supervised warm-start data: the train problems whose operation is in ``ops`` (the
        base task's train list in the heldout variant too). A weighted mix (:func:`op_weights`)
        keeps every problem of its heaviest operation and the first ``n * w / w_max`` of each
        other one."""
        keep = parse_ops(ops)
        pool = self.problems("warmstart" if self.heldout else "train")
        chosen = [p for p in pool if op_of(p) in keep]
        weights = op_weights(ops)
        if weights is None:
            return chosen
        top = max(weights.values())
        quota = {op: round(sum(op_of(p) == op for p in chosen) * w / top) for op, w in weights.items()}
        out = []
        for p in chosen:
            if quota[op_of(p)] > 0:
                quota[op_of(p)] -= 1
                out.append(p)
        return out

    def prompt_text(self, problem: Problem, tokenizer: Any = None) -> str:
        """The raw question, for every tokenizer (no chat template: the answer is the digits)."""
        return problem.question

    def reward(self, completion_text: str, problem: Problem) -> float:
        from ftis_flwr.tasks.rewards import arithmetic_reward

        return float(arithmetic_reward(completion_text, problem.gold))
