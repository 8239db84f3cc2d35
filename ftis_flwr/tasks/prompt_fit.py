"""Each node's model against the task's prompts, before a run (``ftis-flwr check``): every prompt,
rendered as that node renders it (:meth:`~ftis_flwr.tasks.base.Task.prompt_ids` with its
tokenizer), must leave its model a position to answer in, and be made of characters its tokenizer
represents.

Why: the default tiny models have a character vocabulary without capitals and 64 positions. A
natural prompt (``What is the product of 12 and 7?``) passed the check, ran to exit 0 and learnt
nothing: its capitals became ``<unk>`` and its tail ran past the positions the model knows; the only
trace was a transformers warning in a worker's log.

What is compared, per node (nodes that share a model are named together):

- **positions**: the prompt's tokens plus what the completion needs (one token; with a reward that
  compares the gold answer, the gold's tokens and the end token) against the model's positions
  (``max_position_embeddings``; a vLLM card's ``vllm_max_model_len`` when set);
- **characters**: the text the prompt's tokens stand for (decoded, special tokens kept) against
  the prompt (FACTS: offsets alone do not show an ``<unk>`` or a dropped character); the
  characters under an unknown token are named; with a gold-comparing reward, the gold's too;
- **answer budget**: with a gold-comparing reward, the gold's tokens against
  ``rollout.max_new_tokens`` (an answer the budget cannot hold never scores).

Each node's model is found on this machine, never downloaded nor loaded
(:mod:`ftis_flwr.tasks.node_models`): a tiny card's tokenizer in milliseconds; a real model whose
tokenizer has a token for every byte is settled by a bound on the prompts' bytes (:func:`_settled`)
and tokenised only where the bound does not settle it. A model whose files are not here cannot be
checked: a warning (:func:`prompt_notes`) says so, never an error. Rows: every split read so far
(a data set's all, a generated task's train split), at most :data:`SAMPLE_ROWS` per split, evenly
spread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ftis_flwr.config.choices import TinyTokenizer as TinyKind
from ftis_flwr.config.schema import ExperimentConfig
from ftis_flwr.config.tiny_models import char_set_words
from ftis_flwr.tasks.base import Problem, Task
from ftis_flwr.tasks.node_models import NodeModel, TinyTokenizer, node_models

SAMPLE_ROWS = 2000
"""Prompts checked per split: a larger split is sampled evenly (its first and last row included)."""
CHAT_MARKUP = 1024
"""Bytes a chat template may add to the plain rendering of a prompt (role markers, turn ends, a
date line): what the bound of a real model's check allows for (:func:`_settled`)."""
REAL_MODEL = "a real model's preset, e.g. preset='cpu-smollm2' (docs/your-own-task.md)"
_NOTES: list[str] = []


def _sample(problems: list[Problem], limit: int = SAMPLE_ROWS) -> list[tuple[int, Problem]]:
    """(index, problem) of every problem, or of ``limit`` evenly spread ones (first and last kept)."""
    n = len(problems)
    if n <= limit:
        return list(enumerate(problems))
    return [(i, problems[i]) for i in sorted({round(k * (n - 1) / (limit - 1)) for k in range(limit)})]


def _where(task: Task, split: str, i: int, problem: Problem) -> str:
    """A row as the user knows it: ``row 3 of task.data_files.train`` (1-based), else the problem id."""
    from ftis_flwr.tasks.dataset import BUILDERS

    files = getattr(task, "files", None)
    if isinstance(files, dict) and split in files and getattr(task, "source", "") in BUILDERS:
        return f"row {i + 1} of task.data_files.{split}"
    return f"problem {problem.id}"


def _offsets(tokenizer: Any, text: str) -> list[tuple[int, int]]:
    if isinstance(tokenizer, TinyTokenizer):
        return tokenizer.offsets(text)
    try:
        return list(tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"])
    except Exception:  # a slow tokenizer has no offsets: the characters are then told by the text
        return []


def lost_characters(tokenizer: Any, text: str) -> tuple[str, list[str]]:
    """(the text ``text``'s tokens stand for, the characters lost on the way) where they differ,
    else ("", []). A leading space (a Metaspace tokenizer's) and Unicode normal form are not a loss."""
    import unicodedata

    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    back = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    same = (lambda s: unicodedata.normalize("NFC", s).lstrip(" "))  # noqa: E731
    if same(back) == same(text):
        return "", []
    unk = getattr(tokenizer, "unk_token_id", None)
    lost = [c for (a, b), t in zip(_offsets(tokenizer, text), ids) if unk is not None and t == unk
            for c in text[a:b]]
    lost = lost or sorted(set(text) - set(back)) or [next((a for a, b in zip(text, back) if a != b), text[-1:])]
    return back, list(dict.fromkeys(lost))


@dataclass
class _Found:
    """The rows of one kind of problem on one model: the first, how many, of how many checked."""

    first: str = ""
    detail: str = ""
    count: int = 0
    worst: int = 0


class _Plain:
    """A tokenizer without a chat template: a task renders its plain prompt with it."""

    chat_template = None


def _rows(task: Task) -> list[tuple[str, int, Problem]]:
    """(split, index, problem) of the sampled rows of every split read so far."""
    return [(split, i, p) for split in task.splits if split in task._cache for i, p in _sample(task.problems(split))]


def _settled(task: Task, model: NodeModel, rows: list, gold_based: bool, budget: int) -> bool:
    """Whether a real model whose tokenizer has every byte holds every row without tokenising it:
    a token stands for at least one byte, so a prompt's plain rendering in UTF-8 bytes, plus
    :data:`CHAT_MARKUP` for a chat template and the answer's bytes, bounds its tokens."""
    if model.tiny or not model.every_byte:
        return False
    plain, need = _Plain(), 0
    try:
        for _, _, p in rows:
            gold = len(p.gold.encode()) if gold_based else 0
            if gold > budget:
                return False
            need = max(need, len(task.prompt_text(p, plain).encode()) + gold + 1)
    except Exception:  # a task that needs more of a tokenizer: tokenise
        return False
    return need + CHAT_MARKUP <= model.positions


def _scan(task: Task, model: NodeModel, rows: list, gold_based: bool, budget: int) -> dict[str, _Found]:
    """Each kind of problem ("positions", "characters", "answers", "budget") ``rows`` have on
    ``model``, tokenised as the node tokenises them."""
    tok, found = model.tokenizer(), {k: _Found() for k in ("positions", "characters", "answers", "budget")}
    for split, i, problem in rows:
        where = _where(task, split, i, problem)
        text = task.prompt_text(problem, tok)
        ids = task.prompt_ids(problem, tok)
        gold = problem.gold if gold_based else ""
        answer = len(tok(gold, add_special_tokens=False)["input_ids"]) + 1 if gold else 1
        need = len(ids) + answer
        if need > model.positions:
            f = found["positions"]
            f.count, f.worst = f.count + 1, max(f.worst, len(ids))
            if not f.first:
                f.first = where
                f.detail = (f"is {len(ids)} tokens as the node renders it" + (
                    f" and its answer {gold!r} {answer} with the end token" if gold else
                    ", and an answer needs one more") + f": {need} positions, more than the model's "
                    f"{model.positions}")
        if not model.every_byte:
            back, lost = lost_characters(tok, text)
            if lost:
                f = found["characters"]
                f.count += 1
                if not f.first:
                    f.first, f.detail = where, (f"has characters the tokenizer cannot represent: "
                                                f"{', '.join(map(repr, lost[:12]))} (its tokens stand for "
                                                f"{back[:60]!r}{'...' if len(back) > 60 else ''})")
            gold_lost = lost_characters(tok, gold)[1] if gold else []
            if gold_lost:
                f = found["answers"]
                f.count += 1
                if not f.first:
                    f.first, f.detail = where, (f"has the answer {gold!r}, with characters the tokenizer "
                                                f"cannot represent: {', '.join(map(repr, gold_lost))}")
        if gold and answer - 1 > budget:
            f = found["budget"]
            f.count, f.worst = f.count + 1, max(f.worst, answer - 1)
            if not f.first:
                f.first, f.detail = where, f"has the answer {gold!r}, {answer - 1} tokens"
    return found


def _fix(kind: str, model: NodeModel, exp: ExperimentConfig, found: _Found, gold_based: bool) -> str:
    char = " (one per character)" if model.tiny == TinyKind.CHAR else ""
    if kind == "positions":
        room = f"so that each, with its answer and the end token, takes at most {model.positions} tokens" \
            if gold_based else f"to at most {model.positions - 1} tokens"
        if model.tiny:
            return f"shorten the prompts {room}{char}, or use {REAL_MODEL}"
        return "shorten the prompts, or use a model with more positions (on vLLM: a larger vllm_max_model_len)"
    if kind in ("characters", "answers"):
        what = "prompts" if kind == "characters" else "answers"
        if model.tiny == TinyKind.CHAR:
            return f"the char tokenizer has {char_set_words()}: write the {what} with these only, or use {REAL_MODEL}"
        if model.tiny:
            return f"write the {what} with the arithmetic task's characters, or use {REAL_MODEL}"
        return f"change the {what}, or use a model whose tokenizer has these characters"
    return (f"raise rollout.max_new_tokens (now {exp.rollout.max_new_tokens}) to at least {found.worst}: a "
            "completion is cut there, so a longer answer never scores")


WHAT = {"positions": "the prompt of {where} {detail}", "characters": "the prompt of {where} {detail}",
        "answers": "{where} {detail}", "budget": "{where} {detail}, more than rollout.max_new_tokens="}


def prompt_errors(exp: ExperimentConfig) -> list[str]:
    """Every prompt (and, with a gold-comparing reward, every answer) that a node's model cannot
    read, one message per model and kind, naming the first row, the nodes and the limit; the
    warnings go to :func:`prompt_notes`."""
    from ftis_flwr.tasks.checks import built_task
    from ftis_flwr.tasks.reward_funcs import BUILTIN_REWARDS

    _NOTES.clear()
    task = built_task(exp.task)
    rows = _rows(task)
    if not rows:  # a built-in generated task: nothing read, and its prompts are the models' own
        return []
    gold_based = task.reward_set is not None and all(n in BUILTIN_REWARDS for n in task.reward_set.names)
    budget = int(exp.rollout.max_new_tokens)
    models, notes = node_models(exp)
    _NOTES.extend(notes)
    errors = []
    for model in models:
        if _settled(task, model, rows, gold_based, budget):
            continue
        try:
            found = _scan(task, model, rows, gold_based, budget)
        except Exception as exc:  # a tokenizer that does not load here, a task that needs more of one
            _NOTES.append(f"warning: {model.names}: the prompts were not checked against {model.what} "
                          f"({type(exc).__name__}: {exc})")
            continue
        for kind, f in found.items():
            if not f.count:
                continue
            head = WHAT[kind].format(where=f.first, detail=f.detail)
            if kind == "budget":
                head += str(exp.rollout.max_new_tokens)
            longest = f" (the longest: {f.worst} tokens)" if kind == "positions" else ""
            sampled = " (a sample)" if any(len(task.problems(s)) > SAMPLE_ROWS for s in task._cache) else ""
            errors.append(f"{model.names} ({model.what}): {head}; {f.count} of the {len(rows)} rows checked"
                          f"{sampled}{longest}: {_fix(kind, model, exp, f, gold_based)}")
    return errors


def prompt_notes() -> list[str]:
    """The warnings of the last :func:`prompt_errors`: models whose tokenizer is not on this machine."""
    return list(_NOTES)
