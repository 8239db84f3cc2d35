"""Offline one-step questions in words for small real chat models (``task.name: basic-math``).

GSM8K is out of reach of a 135M-parameter model (SmolLM2-135M-Instruct: 0/32 greedy), so a
GRPO run on it sees all-zero rewards and no advantage. These questions keep the paper's whole
pipeline — its system prompt through the model's chat template, the strict
``<think>…</think><answer>…</answer>`` format — on problems such a model sometimes solves:
``What is 7 plus 5?``, ``What is 9 minus 4?``. The answer must be the number itself: the paper's
math-verify check would also take ``7+5``, the question copied, and a model learns that
(``numeric_answer``).

Splits, generated from ``TaskConfig.seed`` (no files): ``train`` and ``test`` (64 held out) from
operands 1..12 (sums, and differences with a >= b); ``ood``: 64 questions with operands 13..40.
``basic-math-20`` (#24: claims judged over seeds) draws from operands 1..20 and holds out 256
test problems, so one seed's accuracy has a standard error of ~2.9 points at 30% (64 problems:
~5.7), leaving ~350 to train on; its ``ood`` questions have operands 21..48.
Measured on SmolLM2-135M-Instruct with one worked example (``shots: 1``): 12/64 correct
samples at temperature 0.7 (10 of 16 groups with reward variance), 6/16 greedy, on single-digit
sums; without the example the strict format appears in ~1 of 64 samples.
"""

from __future__ import annotations

import random
import re
from typing import Any

from ftis_flwr.tasks.base import Problem, Task
from ftis_flwr.tasks.chat_prompt import chat_prompt, check_shots

DEMOS = (
    ("What is 2 plus 3?", "<think> 2 plus 3 is 5. </think><answer> 5 </answer>"),
    ("What is 7 minus 4?", "<think> 7 minus 4 is 3. </think><answer> 3 </answer>"),
)
TEST_SIZE = 64
OOD_SIZE = 64
_NUMBER = re.compile(r"[+-]?\d+")
"""What an answer must be: a whole number. math-verify evaluates an expression, so ``43+29`` in
``<answer>`` would equal 72, and a model learns to copy the question's operands there instead of
adding them (Gemma 3 270M did, alone, in one of #24's seeds: 100% on every split)."""


def numeric_answer(answer: str) -> int | None:
    """The whole number an answer states (``72``, ``$72$``, ``\\boxed{72}``, ``72.``), None for
    anything else, an expression such as ``43+29`` included."""
    text = answer.strip().rstrip(".").strip()
    if len(text) >= 2 and text[0] == text[-1] == "$":
        text = text[1:-1].strip()
    if text.startswith("\\boxed{") and text.endswith("}"):
        text = text[len("\\boxed{"):-1].strip()
    return int(text) if _NUMBER.fullmatch(text) else None


def _question(a: int, op: str, b: int) -> Problem:
    word, value = ("plus", a + b) if op == "+" else ("minus", a - b)
    return Problem(id="", question=f"What is {a} {word} {b}?", gold=str(value))


class BasicMathTask(Task):
    """Generated one-step sums and differences in words; see the module docstring."""

    name = "basic-math"
    eval_splits = ("test", "ood")
    max_new_tokens = 48

    def __init__(self, seed: int = 1234, shots: int = 0, max_operand: int = 12, test_size: int = TEST_SIZE) -> None:
        super().__init__()
        if max_operand != 12:
            self.name = f"basic-math-{max_operand}"
        self.max_operand, self.test_size = int(max_operand), int(test_size)
        self.seed = int(seed)
        self.shuffle_seed = self.seed + 1
        self.shots = check_shots(shots, DEMOS, self.name)

    def _pairs(self, lo: int, hi: int) -> list[tuple[int, str, int]]:
        demo_questions = {q for q, _ in DEMOS}
        pairs = [(a, op, b) for a in range(lo, hi + 1) for b in range(lo, hi + 1) for op in "+-"
                 if (op == "+" or a >= b)]
        pairs = [p for p in pairs if _question(*p).question not in demo_questions]
        random.Random(f"{self.seed}:{lo}-{hi}").shuffle(pairs)
        return pairs

    def _load_split(self, split: str) -> list[Problem]:
        top = self.max_operand
        if split == "ood":
            chosen = self._pairs(top + 1, top + 28)[:OOD_SIZE]
        else:
            pairs = self._pairs(1, top)
            chosen = pairs[:self.test_size] if split == "test" else pairs[self.test_size:]
        return [Problem(id=f"{split}:{i}", question=p.question, gold=p.gold)
                for i, p in enumerate(_question(*c) for c in chosen)]

    def prompt_text(self, problem: Problem, tokenizer: Any) -> str:
        return chat_prompt(problem.question, tokenizer, DEMOS[:self.shots])

    def reward(self, completion_text: str, problem: Problem) -> float:
        """1 for the paper's strict format with the gold number in ``<answer>``, else 0; an
        expression there scores 0 (``numeric_answer``), unlike the paper's math-verify reward."""
        from ftis_flwr.tasks.rewards import parse_strict_answer

        answer = parse_strict_answer(completion_text)
        value = None if answer is None else numeric_answer(answer)
        return float(value is not None and value == int(problem.gold))
