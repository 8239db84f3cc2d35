"""Write a word in capital letters (``task.name: uppercase``): a task two tokenizer families cut
differently, that small real models solve sometimes, with no credit for copying.

Why it exists (#39): a cross-family study needs a task both models answer *exactly* right at
least sometimes at the start, with room to learn, whose completions the two tokenizers cut into
different pieces (where the chunk, word and sequence ratios differ). Lowercase English words are
common tokens that every tokenizer cuts alike; the same words in capitals are rare strings that
each byte-pair vocabulary splits its own way. ``python -m benchmarks.task_probe --tasks uppercase``
measures both: SmolLM2-135M-Instruct and Gemma 3 270M answer 38% and 62% of 16 test problems
right at the start, and 21% and 12% of their completions' tokens sit in multi-token chunks
(``spell_backward``: 5% and 3%).

Splits, from ``TaskConfig.seed`` (no files; the word lists come with reasoning-gym, the
``[tasks]`` extra, imported when problems are first loaded):

- ``train`` and ``test`` (``TEST_SIZE`` held out): reasoning-gym's common five-letter English
  words (its Wordle answer list, 2,315 words), shuffled with the seed.
- ``ood``: ``OOD_SIZE`` rarer and longer words (``OOD_LETTERS`` letters) from its
  ``words3to10.txt``, which split into even more pieces in capitals.

The worked examples' words appear in no split. Reward: 1.0 when the strict
``<think>…</think><answer>…</answer>`` format holds and the answer is the word in capitals
exactly (a final period aside), else 0.0: the word copied as it stands in the question scores 0,
and there is no partial credit.
"""

from __future__ import annotations

import functools
import hashlib
import random
from typing import Any

from ftis_flwr.tasks.base import Problem, Task
from ftis_flwr.tasks.chat_prompt import chat_prompt, check_shots
from ftis_flwr.tasks.reasoning_gym import INSTALL

TEST_SIZE = 256
OOD_SIZE = 256
OOD_LETTERS = (8, 10)
"""Length range (inclusive) of the ``ood`` words; ``train`` and ``test`` words have five letters."""
QUESTION = "Write the word {word} in capital letters."
DEMO_WORDS = ("apple", "garden")
DEMOS = tuple((QUESTION.format(word=w), f"<think> {w} in capital letters is {w.upper()}. </think>"
               f"<answer> {w.upper()} </answer>") for w in DEMO_WORDS)


@functools.lru_cache(maxsize=1)
def _word_lists() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(common five-letter words, longer rare words), sorted, from reasoning-gym's data files;
    read once per process (every split and the fingerprint take them)."""
    try:
        from reasoning_gym.data import read_data_file
        from reasoning_gym.data.wordle_words import wordle_words
    except ImportError as exc:
        raise ImportError(f"task.name='uppercase' takes its words from the reasoning-gym package "
                          f"({exc}): {INSTALL}") from None
    lo, hi = OOD_LETTERS
    common = sorted({w for w in wordle_words if w.isascii() and w.isalpha() and w.islower()} - set(DEMO_WORDS))
    rare = sorted({w.strip() for w in read_data_file("words3to10.txt").split()
                   if w.isascii() and w.isalpha() and w.islower() and lo <= len(w) <= hi} - set(DEMO_WORDS))
    return tuple(common), tuple(rare)


class UppercaseTask(Task):
    """Common words to capitals, rare long words held out as ``ood``; see the module docstring."""

    name = "uppercase"
    eval_splits = ("test", "ood")
    answer_case_matters = True  # the word as the question writes it is the copy that scores 0
    max_new_tokens = 64

    def __init__(self, seed: int = 1234, shots: int = 0) -> None:
        super().__init__()
        self.seed = int(seed)
        self.shuffle_seed = self.seed + 1
        self.shots = check_shots(shots, DEMOS, self.name)

    def _load_split(self, split: str) -> list[Problem]:
        common, rare = _word_lists()
        if split == "ood":
            words = random.Random(f"{self.seed}:ood").sample(rare, OOD_SIZE)
        else:
            words = list(common)
            random.Random(f"{self.seed}:common").shuffle(words)
            words = words[:TEST_SIZE] if split == "test" else words[TEST_SIZE:]
        return [Problem(id=f"{split}:{i}", question=QUESTION.format(word=w), gold=w.upper())
                for i, w in enumerate(words)]

    def source_parts(self) -> dict[str, str]:
        """The word lists' digest: another reasoning-gym release with other lists would give a
        node other words for the same problem ids, and so other rewards."""
        common, rare = _word_lists()
        return {"data words": hashlib.sha256("\n".join((*common, "--", *rare)).encode()).hexdigest()[:12]}

    def prompt_text(self, problem: Problem, tokenizer: Any) -> str:
        return chat_prompt(problem.question, tokenizer, DEMOS[:self.shots])

    def reward(self, completion_text: str, problem: Problem) -> float:
        """1 for the strict format with exactly the word in capitals in ``<answer>``, else 0."""
        from ftis_flwr.tasks.rewards import parse_strict_answer

        answer = parse_strict_answer(completion_text)
        return float(answer is not None and answer.strip().removesuffix(".").strip() == problem.gold)
