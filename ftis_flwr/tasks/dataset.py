"""A lab's own data set as a task (``task.name: dataset``), read with ``datasets.load_dataset``.

Why ``datasets``: it is what a TRL user already feeds ``GRPOTrainer``, and it reads JSON Lines,
CSV, Parquet, a local folder or a hub id alike. ``task.dataset`` is what ``load_dataset`` takes
first; ``task.data_files`` maps split names to files (``train`` is trained on, every other split
is evaluated and reported under its name). For a folder or hub id without files, a split's value
is that source's split name (default: the same name). Every row keeps all its columns in
:attr:`Problem.columns`, which a reward function receives as keyword arguments (TRL's form).
The prompt is the ``task.prompt_field`` column, or ``task.prompt_template`` formatted with the
row; ``task.chat`` renders it through the model's chat template with the paper's system prompt.
The reward: ``task.reward`` / ``task.rewards``, by default ``strict-math`` for chat prompts and
``exact`` for plain text. Rows are read on first use, so building the task reads nothing.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ftis_flwr.tasks.base import Problem, Task
from ftis_flwr.tasks.data_faults import did_you_mean, hub_fault, innermost, json_fault

if TYPE_CHECKING:
    from ftis_flwr.config.schema import TaskConfig

BUILDERS = ("json", "csv", "parquet", "text", "arrow")
"""``load_dataset`` builders that read files: their splits come from ``task.data_files``."""


class DatasetError(ValueError):
    """A data set, file, split or column that cannot be used; the message names the key."""


def template_fields(template: str) -> list[str]:
    """The column names a format string uses (``"{question}"`` -> ``["question"]``)."""
    try:
        return [f for _, f, _, _ in string.Formatter().parse(template) if f]
    except ValueError as exc:
        raise DatasetError(f"task.prompt_template={template!r} is not a format string: {exc}") from None


class DatasetTask(Task):
    """Rows of a ``datasets`` data set as problems; see the module docstring."""

    name = "dataset"
    max_new_tokens = 256

    def __init__(self, cfg: TaskConfig) -> None:
        super().__init__()
        if not cfg.dataset:
            raise DatasetError("task.name=dataset needs task.dataset (e.g. 'json' with task.data_files)")
        self.source, self.files = cfg.dataset, dict(cfg.data_files)
        if self.source in BUILDERS and "train" not in self.files:
            raise DatasetError(f"task.dataset={self.source!r} reads files: task.data_files.train must name "
                               f"the training file (got splits: {', '.join(self.files) or 'none'})")
        self.eval_splits = tuple(s for s in self.files if s != "train")
        self.prompt_field, self.template = cfg.prompt_field, cfg.prompt_template
        self.answer_field, self.chat = cfg.answer_field, bool(cfg.chat)
        self.seed = self.shuffle_seed = int(cfg.seed)
        template_fields(self.template)
        if not (cfg.reward or cfg.rewards):
            from ftis_flwr.tasks.reward_funcs import RewardSet

            self.reward_set = RewardSet.build(["strict-math" if self.chat else "exact"])

    def _rows(self, split: str):
        datasets = datasets_module(f"task.name=dataset ({self.source!r})")
        if self.source in BUILDERS:
            file = Path(self.files[split]).expanduser()
            if not file.is_file():
                raise DatasetError(f"task.data_files.{split}={self.files[split]!r} does not exist "
                                   f"(relative to {Path.cwd()})")
            if not file.read_bytes().strip():
                raise DatasetError(f"task.data_files.{split}={self.files[split]!r} has no rows")
            args, kwargs, key = (self.source,), {"data_files": {split: str(file.resolve())}, "split": split}, \
                f"task.data_files.{split}={self.files[split]!r}"
        else:
            if not Path(self.source).expanduser().exists():  # a hub id: told at once when it cannot be read
                fault = hub_fault(self.source, BUILDERS)
                if fault:
                    raise DatasetError(fault)
            args, kwargs, key = (self.source,), {"split": self.files.get(split) or split}, \
                f"task.dataset={self.source!r}"
        verbosity = datasets.logging.get_verbosity()
        datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its stray log line: the error says it all
        try:
            return datasets.load_dataset(*args, **kwargs)
        except Exception as exc:  # datasets' own error (a bad file, an unknown split), named by key
            raise DatasetError(self._load_error(key, split, exc)) from None
        finally:
            datasets.logging.set_verbosity(verbosity)

    def _load_error(self, key: str, split: str, exc: Exception) -> str:
        """``load_dataset``'s failure named by key: a JSON file's first bad line (1-based, the
        parser's message), else the innermost error's words, with a builder it resembles."""
        if self.source == "json" and split in self.files:
            where = json_fault(Path(self.files[split]).expanduser())
            if where:
                return f"{key}: {where} (the file does not parse as JSON Lines, one object per line)"
        inner = innermost(exc)
        why = f"{type(exc).__name__}: {exc}" + (f"; {type(inner).__name__}: {inner}" if inner is not exc else "")
        hint = did_you_mean(self.source, BUILDERS) if self.source not in BUILDERS else ""
        return f"{key}: datasets.load_dataset failed ({why}){hint}"

    def _load_split(self, split: str) -> list[Problem]:
        rows = self._rows(split)
        where = f"task.data_files.{split}" if split in self.files else f"split {split!r} of {self.source!r}"
        return self._problems(rows, split, where)

    def _problems(self, rows, split: str, where: str) -> list[Problem]:
        """The rows of one split as problems ``<split>:<i>`` (a subclass reads its own row kind)."""
        columns = list(rows.column_names)
        need = template_fields(self.template) if self.template else [self.prompt_field]
        missing = [c for c in need if c not in columns]
        if missing:
            key = "task.prompt_template" if self.template else "task.prompt_field"
            raise DatasetError(f"{key}: {where} has no column {', '.join(map(repr, missing))}; its columns: "
                               f"{', '.join(columns)}")
        from ftis_flwr.tasks.reward_funcs import BUILTIN_REWARDS

        set_here = self.answer_field != "answer"  # the default: read only by a reward that compares golds
        if self.answer_field and self.answer_field not in columns and (set_here or self.reward_set is not None
                                                                       and any(n in BUILTIN_REWARDS
                                                                               for n in self.reward_set.names)):
            raise DatasetError(f"task.answer_field={self.answer_field!r}: {where} has no such column; its "
                               f"columns: {', '.join(columns)}")
        out = []
        for i, row in enumerate(rows):
            question = self.template.format(**row) if self.template else str(row[self.prompt_field])
            gold = row.get(self.answer_field, "")
            out.append(Problem(id=f"{split}:{i}", question=question, gold="" if gold is None else str(gold),
                               columns=dict(row)))
        if not out:
            raise DatasetError(f"{where} has no rows")
        return out

    def prompt_text(self, problem: Problem, tokenizer: Any) -> str:
        if self.chat:
            from ftis_flwr.tasks.chat_prompt import chat_prompt

            return chat_prompt(problem.question, tokenizer)
        return problem.question

    def reward(self, completion_text: str, problem: Problem) -> float:
        return self.rewards([completion_text], [problem])[0]


def datasets_module(why: str):
    """The ``datasets`` package, its progress bars off; ImportError saying what needs it otherwise."""
    try:
        import datasets
    except ImportError:
        raise ImportError(f"{why} needs the 'datasets' package: pip install datasets") from None
    datasets.utils.logging.disable_progress_bar()
    return datasets
