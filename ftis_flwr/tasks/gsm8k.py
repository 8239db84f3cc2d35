"""GSM8K and MATH-500 problems from local JSONL files or the Hugging Face hub.

Each source is either a JSONL path or a hub spec ``"<repo_id>[@<config>]:<split>"`` (e.g.
``"openai/gsm8k@main:test"``; needs the optional ``datasets`` package, imported only when a hub
source is read). The row format is recognised per row: GSM8K rows have ``question`` and
``answer`` (gold = the number after ``####``), MATH rows ``problem`` and ``answer`` (gold = the
answer field). So any split may hold either kind: the paper trains on GSM8K and evaluates on
GSM8K test (in-distribution) and MATH-500 (out-of-distribution).

Task names: ``gsm8k`` (eval splits ``test``, ``math500``) and ``math500`` (eval splits
``math500``, ``test``). MATH-500 has no train split, so both train on GSM8K train by default.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ftis_flwr.tasks.base import Problem
from ftis_flwr.tasks.chat_prompt import chat_prompt, check_shots
from ftis_flwr.tasks.dataset import DatasetTask, datasets_module

ROW_SOURCES = "gsm8k-or-math-rows"
"""MathTask's ``task.dataset``: each split's source is a JSONL file or a hub spec of its own."""

GSM8K_TRAIN = "openai/gsm8k@main:train"
GSM8K_TEST = "openai/gsm8k@main:test"
MATH500_TEST = "HuggingFaceH4/MATH-500:test"


def _row_problem(row: Any, pid: str, where: str) -> Problem:
    if not isinstance(row, Mapping):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    answer = row.get("answer")
    if "question" in row and isinstance(answer, str):
        from ftis_flwr.tasks.rewards import gsm8k_gold

        try:
            gold = gsm8k_gold(answer)
        except Exception as exc:
            raise ValueError(f"{where}: GSM8K answer has no usable '#### N' gold: {exc}") from None
        question = row["question"]
    elif "problem" in row and answer is not None:
        question, gold = row["problem"], str(answer)
    else:
        raise ValueError(f"{where}: a row needs 'question'+'answer' (GSM8K) or 'problem'+'answer' "
                         f"(MATH); got keys {sorted(row)}")
    if not isinstance(question, str) or not question.strip() or not str(gold).strip():
        raise ValueError(f"{where}: empty or non-text question or gold answer")
    return Problem(id=pid, question=question, gold=str(gold).strip(), columns=dict(row))


def problems_from_rows(rows: Iterable[Any], split: str, source: str) -> list[Problem]:
    """Rows (dicts) -> problems with ids ``split:i``; errors name ``source`` and the row number."""
    return [_row_problem(row, f"{split}:{i}", f"{source}: row {i + 1}") for i, row in enumerate(rows)]


def load_jsonl(path: str | Path, split: str) -> list[Problem]:
    """Read a local JSONL file of GSM8K or MATH rows through ``datasets`` (the loader a lab
    uses for the hub), with errors that name the file and the line."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"problem file {str(path)!r} (split {split!r}) does not exist")
    rows = 0
    with path.open(encoding="utf-8") as fh:  # checked first: datasets' errors name no line
        for lineno, line in enumerate(fh, start=1):
            if line.strip():
                where = f"{path}: line {lineno}"
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{where}: invalid JSON ({exc.msg})") from None
                _row_problem(row, f"{split}:{rows}", where)
                rows += 1
    if not rows:
        raise ValueError(f"problem file {str(path)!r} (split {split!r}) has no rows")
    datasets = datasets_module(f"reading {path}")
    data = datasets.load_dataset("json", data_files=str(path.resolve()), split="train")
    return problems_from_rows(data, split, str(path))


def load_hub(spec: str, split: str) -> list[Problem]:
    """Read ``"<repo_id>[@<config>]:<hf_split>"`` with ``datasets`` (downloads; never in tests)."""
    repo, sep, hf_split = spec.rpartition(":")
    if not sep or not repo or not hf_split:
        raise ValueError(f"hub source {spec!r} must look like '<repo_id>[@<config>]:<split>'")
    repo, _, hf_config = repo.partition("@")
    data = datasets_module(f"reading {spec!r} from the hub").load_dataset(repo, hf_config or None,
                                                                     split=hf_split)
    return problems_from_rows(data, split, spec)


def load_source(source: str, split: str) -> list[Problem]:
    """A JSONL path (anything ending in .jsonl/.json or an existing file) or a hub spec."""
    path = Path(source).expanduser()
    if path.suffix in (".jsonl", ".json") or path.is_file() or source.startswith(("/", ".", "~")):
        return load_jsonl(path, split)
    return load_hub(source, split)


GSM8K_DEMOS = (
    ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in "
     "May. How many clips did Natalia sell altogether in April and May?",
     "<think> In May she sold 48 / 2 = 24 clips. Altogether 48 + 24 = 72. </think>"
     "<answer> 72 </answer>"),
    ("Weng earns $12 an hour for babysitting. Yesterday, she did 50 minutes of babysitting. "
     "How much did she earn?",
     "<think> 50 minutes is 50 / 60 of an hour, so she earned 12 * 50 / 60 = 10 dollars. "
     "</think><answer> 10 </answer>"),
)
"""Worked examples for ``TaskConfig.shots`` (GSM8K train rows 1-2, answers in the strict format)."""


class MathTask(DatasetTask):
    """GSM8K-style training with GSM8K / MATH-500 evaluation (algorithm §8-9): a data set task
    whose splits each have their own source (a JSONL file or a hub spec), whose rows are read as
    GSM8K or MATH rows, and whose reward is the paper's strict format with math-verify."""

    max_new_tokens = 640
    demos: tuple[tuple[str, str], ...] = GSM8K_DEMOS

    def __init__(self, name: str, train_source: str, eval_sources: Mapping[str, str],
                 seed: int = 1234, shots: int = 0) -> None:
        from ftis_flwr.config.schema import TaskConfig

        if not eval_sources:
            raise ValueError(f"task {name!r} needs at least one evaluation split")
        if "train" in eval_sources:
            raise ValueError(f"task {name!r}: 'train' is reserved for the training split; "
                             "name the evaluation split differently")
        super().__init__(TaskConfig(name=name, dataset=ROW_SOURCES, chat=True, reward="strict-math", seed=seed,
                                    data_files={"train": train_source, **dict(eval_sources)}))
        self.reward_set = None  # its own reward: the same strict-math, one completion at a time
        self.name = name
        self.train_source = train_source
        self.eval_sources = dict(eval_sources)
        self.shots = check_shots(shots, self.demos, name)

    def _rows(self, split: str):
        return self.files[split]

    def _problems(self, source, split: str, where: str) -> list[Problem]:
        return load_source(source, split)

    def prompt_text(self, problem: Problem, tokenizer: Any) -> str:
        return chat_prompt(problem.question, tokenizer, self.demos[:self.shots])

    def reward(self, completion_text: str, problem: Problem) -> float:
        from ftis_flwr.tasks.rewards import math_reward

        return float(math_reward(completion_text, problem.gold))


def gsm8k_task(train_path: str = "", eval_paths: Mapping[str, str] | None = None,
               seed: int = 1234, shots: int = 0) -> MathTask:
    """GSM8K train; eval on GSM8K test (``test``) and MATH-500 (``math500``) unless given."""
    return MathTask("gsm8k", train_path or GSM8K_TRAIN,
                    eval_paths or {"test": GSM8K_TEST, "math500": MATH500_TEST}, seed, shots)


def math500_task(train_path: str = "", eval_paths: Mapping[str, str] | None = None,
                 seed: int = 1234, shots: int = 0) -> MathTask:
    """MATH-500 first: same data as gsm8k by default, MATH-500 reported as the main split."""
    return MathTask("math500", train_path or GSM8K_TRAIN,
                    eval_paths or {"math500": MATH500_TEST, "test": GSM8K_TEST}, seed, shots)
