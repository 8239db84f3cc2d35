"""Procedural problems from reasoning-gym (``task.name: reasoning-gym:<generator>``).

`reasoning-gym <https://github.com/open-thought/reasoning-gym>`_ (Apache-2.0, pure Python,
offline; ``pip install -e ".[tasks]"``) has about a hundred generators (``chain_sum``,
``spell_backward``, ``word_sequence_reversal``, ...), each with its own checker. It is imported
when problems are first loaded, never when the task is registered or built. The generators are
used with their default settings. Splits, all from ``TaskConfig.seed``:

- ``train``: ``task.size`` problems (0: ``DEFAULT_SIZE``) from the generator at seed ``task.seed``
  (a question may repeat: generators draw with replacement).
- ``test``: held out: ``TEST_SIZE`` problems from another seed derived from ``task.seed``, same
  settings. A question also in ``train`` (or shown as a worked example, or met earlier in the
  split) is dropped and the next index taken, so no test question is a train question; a small
  generator may run out and give fewer (logged).
- ``ood``: ``OOD_SIZE`` problems, deduplicated the same way against ``train`` and ``test``. For
  the generators in ``HARDER`` a harder setting (e.g. ``chain_sum``: 7-9 terms, train has 2-6);
  for every other generator only another seed with the same settings, so ``ood`` is then
  **in-distribution** (a second test split), and the log says so.

Seeds are derived with SHA-256, far apart: reasoning-gym seeds item ``i`` with ``seed + i``, so
nearby seeds would share items. Problem ids are ``"<split>:<index>"``; each problem keeps its
entry (``question``, ``answer``, ``metadata``) in ``Problem.columns``.

Reward: the paper's strict ``<think>…</think><answer>…</answer>`` format is required (0.0
without it); the ``<answer>`` text is scored by the generator's own ``score_answer(answer,
entry)``, a float in [0, 1]: many generators give partial credit (``spell_backward`` per letter
in place, ``word_sorting`` per word in place), so ``eval/<split>/accuracy`` is a mean score.
Any exception there scores 0.0 (model output is arbitrary). Partial credit can pay for answers
that are no attempt at all (``spell_backward``: the word's last letter repeated earns ~0.18,
above what trained small models earned, #55), so ``task.partial_credit: false`` keeps only full
credit: 1.0 when the checker returns exactly 1.0, else 0.0 (an exact answer, case as the checker
reads it). ``ftis-flwr check`` probes the reward either way (:mod:`ftis_flwr.tasks.reward_probe`).

Worked examples (``task.shots``, 0..2): problems of the same generator from a third seed,
answered ``<think> DEMO_THINK </think><answer> gold </answer>``: they show the format and the
generator's answer form (a comma-separated list, a number), not its reasoning.
"""

from __future__ import annotations

import difflib
import hashlib
import logging
import math
import re
import threading
from collections.abc import Mapping
from typing import Any

from ftis_flwr.tasks.base import Problem, Task
from ftis_flwr.tasks.chat_prompt import chat_prompt
from ftis_flwr.tasks.registry import TaskError

log = logging.getLogger(__name__)

DEFAULT_SIZE = 2000
TEST_SIZE = 256
OOD_SIZE = 256
MAX_SHOTS = 2
CANDIDATES = 8
"""An eval split looks at most ``CANDIDATES`` times its size of items for unseen questions."""
DEMO_THINK = "I read the task and work out the answer."
INSTALL = 'pip install -e ".[tasks]"  (or: pip install reasoning-gym)'
LIST_ALL = "python -c \"import reasoning_gym.factory as f; print(*sorted(f.DATASETS))\""
HARDER: dict[str, dict[str, Any]] = {
    "chain_sum": {"min_terms": 7, "max_terms": 9},                # train: 2-6 terms
    "basic_arithmetic": {"min_terms": 7, "max_terms": 9},         # train: 2-6 terms
    "word_sequence_reversal": {"min_words": 9, "max_words": 12},  # train: 3-8 words
    "word_sorting": {"min_words": 11, "max_words": 15},           # train: 3-10 words
    "letter_counting": {"min_words": 16, "max_words": 25},        # train: 5-15 words
    "letter_jumble": {"min_words": 21, "max_words": 30},          # train: 3-20 words
    "number_sorting": {"min_numbers": 11, "max_numbers": 20},     # train: 3-10 numbers
    "spell_backward": {"min_word_len": 9, "max_word_len": 10},    # train: 3-10 letters (a subset)
}
"""``ood`` settings harder than the defaults; other generators' ``ood`` is in-distribution."""
_GENERATOR = re.compile(r"[A-Za-z0-9_]+")


def derived_seed(seed: int, what: str) -> int:
    """A seed for ``what`` (``"test"``, ``"ood"``, ``"demo"``) derived from ``seed``."""
    digest = hashlib.sha256(f"ftis-flwr:reasoning-gym:{int(seed)}:{what}".encode()).digest()
    return int.from_bytes(digest[:4], "big") >> 1


def _reasoning_gym():
    try:
        import reasoning_gym
        import reasoning_gym.factory
    except ImportError as exc:
        raise ImportError(f"task.name='reasoning-gym:<generator>' needs the reasoning-gym package "
                          f"({exc}): {INSTALL}") from None
    return reasoning_gym


class ReasoningGymTask(Task):
    """One reasoning-gym generator's problems, splits and checker; see the module docstring."""

    eval_splits = ("test", "ood")
    max_new_tokens = 256

    def __init__(self, generator: str, seed: int = 1234, size: int = 0, shots: int = 0,
                 partial_credit: bool = True) -> None:
        super().__init__()
        self.name = f"reasoning-gym:{generator}"
        if not _GENERATOR.fullmatch(generator or ""):
            raise TaskError(f"task.name={self.name!r}: a generator name is letters, digits and "
                            f"'_' (e.g. reasoning-gym:chain_sum); list them: {LIST_ALL}")
        if int(size) < 0:
            raise TaskError(f"task {self.name!r}: task.size={size} must be >= 0 (0: {DEFAULT_SIZE})")
        if not 0 <= int(shots) <= MAX_SHOTS:
            raise TaskError(f"task {self.name!r}: task.shots={shots} must be in 0..{MAX_SHOTS}")
        self.generator, self.seed, self.shots = generator, int(seed), int(shots)
        self.partial_credit = bool(partial_credit)
        self.size = int(size) or DEFAULT_SIZE
        self.shuffle_seed = self.seed + 1
        self.ood_config: dict[str, Any] = dict(HARDER.get(generator, {}))
        """The generator settings ``ood`` changes; empty: ``ood`` is in-distribution."""
        self._datasets: dict[str, Any] = {}
        self._demos: tuple[tuple[str, str], ...] | None = None
        self._lock = threading.RLock()

    # -- generator ------------------------------------------------------------------------------

    def dataset(self, split: str) -> Any:
        """The reasoning-gym dataset ``split`` draws from (built on first use)."""
        with self._lock:
            if split not in self._datasets:
                rg = _reasoning_gym()
                known = rg.factory.DATASETS
                if self.generator not in known:
                    names = sorted(known)
                    close = difflib.get_close_matches(self.generator, names, n=3)
                    hint = f"did you mean {', '.join(close)}? " if close else ""
                    some = [n for n in HARDER if n in known] or names[:8]
                    raise TaskError(
                        f"task.name={self.name!r}: reasoning-gym has no generator {self.generator!r}; "
                        f"{hint}valid ones include {', '.join(some)} ({len(names)} in all; "
                        f"list them: {LIST_ALL})")
                seed, size, extra = {
                    "train": (self.seed, self.size, {}),
                    "test": (derived_seed(self.seed, "test"), TEST_SIZE * CANDIDATES, {}),
                    "ood": (derived_seed(self.seed, "ood"), OOD_SIZE * CANDIDATES, self.ood_config),
                    "demo": (derived_seed(self.seed, "demo"), MAX_SHOTS * CANDIDATES, {}),
                }[split]
                try:
                    self._datasets[split] = rg.create_dataset(self.generator, seed=seed, size=size, **extra)
                except Exception as exc:
                    raise TaskError(f"task {self.name!r}: reasoning-gym cannot build generator "
                                    f"{self.generator!r} ({split} settings {extra or 'default'}): "
                                    f"{type(exc).__name__}: {exc}") from exc
            return self._datasets[split]

    def _entries(self, split: str, want: int, seen: set[str]) -> list[dict[str, Any]]:
        """Up to ``want`` entries of ``split`` whose questions are not in ``seen`` (nor repeated)."""
        ds, out, dropped = self.dataset(split), [], 0
        for i in range(len(ds)):
            if len(out) == want:
                break
            entry = self._entry(ds, split, i)
            if entry["question"] in seen:
                dropped += 1
                continue
            seen.add(entry["question"])
            out.append(entry)
        if dropped or len(out) < want:
            log.info("task %s: split %r: %d problems, %d dropped as already seen (train, test, "
                     "worked examples or earlier in the split)", self.name, split, len(out), dropped)
        return out

    def _entry(self, ds: Any, split: str, i: int) -> dict[str, Any]:
        try:
            entry = ds[i]
        except Exception as exc:
            raise TaskError(f"task {self.name!r}: generating {split} item {i} failed: "
                            f"{type(exc).__name__}: {exc}") from exc
        if not isinstance(entry.get("question"), str) or not entry["question"].strip():
            raise TaskError(f"task {self.name!r}: {split} item {i} has no question text")
        return {"question": entry["question"], "answer": entry.get("answer"),
                "metadata": entry.get("metadata", {})}

    # -- Task -----------------------------------------------------------------------------------

    def source_parts(self) -> dict[str, str]:
        """The installed reasoning-gym release: another one may generate other problems at the
        same seeds, or check answers otherwise."""
        from importlib.metadata import PackageNotFoundError, version

        try:
            return {"reasoning-gym": version("reasoning-gym")}
        except PackageNotFoundError:
            return {"reasoning-gym": "not installed"}

    def demos(self) -> tuple[tuple[str, str], ...]:
        """The ``MAX_SHOTS`` worked examples (question, strict-format answer), always the same."""
        with self._lock:
            if self._demos is None:
                entries = self._entries("demo", MAX_SHOTS, set())
                if any(e["answer"] in (None, "") for e in entries):
                    raise TaskError(f"task {self.name!r}: the generator gives no gold answer to "
                                    "show as a worked example; use task.shots=0")
                self._demos = tuple((e["question"], f"<think> {DEMO_THINK} </think><answer> "
                                     f"{e['answer']} </answer>") for e in entries)
            return self._demos

    def _load_split(self, split: str) -> list[Problem]:
        if split == self.train_split:
            ds = self.dataset(split)
            entries = [self._entry(ds, split, i) for i in range(self.size)]
        else:
            seen = {p.question for p in self.problems(self.train_split)}
            seen |= {q for q, _ in self.demos()}
            if split == "ood":
                seen |= {p.question for p in self.problems("test")}
                if not self.ood_config:
                    log.info("task %s: ood is in-distribution (another seed, default settings): "
                             "no harder setting is known for this generator", self.name)
            entries = self._entries(split, TEST_SIZE if split == "test" else OOD_SIZE, seen)
        return [Problem(id=f"{split}:{i}", question=e["question"],
                        gold="" if e["answer"] is None else str(e["answer"]), columns=e)
                for i, e in enumerate(entries)]

    def prompt_text(self, problem: Problem, tokenizer: Any) -> str:
        demos = self.demos()[:self.shots] if self.shots else ()
        return chat_prompt(problem.question.strip(), tokenizer, tuple((q.strip(), a) for q, a in demos))

    def reward(self, completion_text: str, problem: Problem) -> float:
        """The generator's ``score_answer`` of the ``<answer>`` text (in [0, 1]) under the strict
        format, 0.0 without it or when the checker raises; without ``partial_credit``, 1.0 only
        for the checker's full credit, exactly 1.0 (``spell_backward``'s per-letter sum for the
        word with junk after it is 0.9999999999999998 for seven letters and 1.0000000000000002
        for nine, which the clip below would round to full credit), else 0.0."""
        from ftis_flwr.tasks.rewards import parse_strict_answer

        answer = parse_strict_answer(completion_text)
        if answer is None:
            return 0.0
        entry: Mapping[str, Any] = problem.columns or self.problem(problem.id).columns
        checker = self.dataset(problem.id.rpartition(":")[0]).score_answer
        try:
            score = float(checker(answer, dict(entry)))
        except Exception:  # noqa: BLE001 - a checker failing on arbitrary model output scores 0
            log.debug("task %s: score_answer failed on %r", self.name, answer[:80], exc_info=True)
            return 0.0
        if not math.isfinite(score):
            return 0.0
        return min(1.0, max(0.0, score)) if self.partial_credit else float(score == 1.0)


def reasoning_gym_task(cfg: Any, generator: str) -> Task:
    """``task.name=reasoning-gym:<generator>``: the factory registered for the prefix."""
    return ReasoningGymTask(generator, seed=cfg.seed, size=cfg.size, shots=cfg.shots,
                            partial_credit=cfg.partial_credit)
