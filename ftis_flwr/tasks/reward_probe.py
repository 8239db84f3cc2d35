"""The reward probe: before a run, score cheap answers with the task's own reward and warn when
one earns a real share of what the gold answer earns (``ftis-flwr check``, #55).

Why: GRPO pushes a model toward whatever its reward pays for, and a reward that pays for an answer
that is no attempt at all gets learnt instead of the task. This project found two such holes only
after the runs: the paper's math-verify reward took ``43+29``, basic-math's question written as a
sum, as 72, and reasoning-gym's ``spell_backward`` checker pays per letter in place, so the word's
last letter alone earns ~0.13 and that letter repeated to the word's length ~0.18, above every
trained model's score. The probe takes milliseconds on such a task and flags the second; the first
it flags where the prompt is the expression (a data set's ``27+82=``): a question in words it
cannot turn into a sum.

What it tries (:func:`cheap_answers`), on ``SAMPLE`` train problems: the empty answer, the prompt
(the problem's question) copied, as it is and without a final ``=`` or ``?`` (``27+82`` is 109 to
math-verify, ``27+82=`` is not), the prompt repeated to the token budget, the gold's first
character repeated to the gold's length, the gold's first character, the gold's first half, each
digit 0-9 as a constant answer (the best one is reported), the gold followed by junk, and a long
run of filler. A cheap answer that happens to equal the gold on a problem is not counted there (a
constant ``5`` is right where the gold is 5): the probe measures what the reward pays for answers
that are wrong. A strategy whose answers repeat another's (a prompt with no final ``=``) is
skipped. Each strategy's mean score is compared with the gold's mean score on the same problems.

The form: a chat task's reward asks for ``<think> … </think><answer> … </answer>``, a bare task's
(arithmetic, ``exact``) for the answer alone. The probe puts every cheap answer in the form in
which the gold itself scores best (bare, or after ``THINK`` inside ``<answer>`` tags), so what it
probes is how the answer's content is scored, not the format check. Anything else that scores
final answers calls :func:`probe_answers` with its own scorer (final answers in, scores out) and
no wrapping at all; with ``task.environment`` the check does so with :func:`environment_scorer`:
each cheap answer is the final answer of an episode that called no tool, scored as a node scores
it (``get_reward()`` after ``reset``, else the task's rewards), so a reward that pays for doing
nothing is named.

The threshold, ``THRESHOLD`` = 10% of the gold's score: a GRPO group compares a sample with its
group's others, so a cheap answer pays off once it earns about what the model earns honestly. The
two small models of ``cpu-xfamily-rg`` started ``spell_backward`` at 0.045 and 0.106 (docs/your-own-
task.md), so holes of 13% and 18% out-earn them and must be flagged. Up to 10% a reward may pay a
little for a well-formed wrong answer on purpose (``math_reward``'s ``format_credit`` of 0.1 is not
flagged). An exact reward pays 0 for every cheap answer, so any threshold separates it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ftis_flwr.tasks.base import Problem, Task

THRESHOLD = 0.10
"""A cheap answer whose mean score is above this share of the gold's mean score is reported."""
SAMPLE = 32
"""Train problems probed: the issue's weakest hole, ``spell_backward``'s gold first character,
scores 12.8-14.5% of the gold over ``task.seed`` 0-9 at this size, clear of the 10% threshold."""
CHARS_PER_TOKEN = 4
"""The token budget in characters: about four characters per token of English for a byte-pair
tokenizer, so the repeated prompt and the filler are as long as a completion may be."""
THINK = "<think> I work out the answer. </think>"
JUNK = " qz qz qz qz"
FILLER = "lorem ipsum "
DEADLINE_S = 8.0
"""A slow reward (a math-verify judge) stops the probe between strategies after this long; the
strategies not tried are named."""
SILENCE = "--no-reward-probe"

Scorer = Callable[[list[str], list[Problem]], list[float]]
"""Final answers and their problems in, one score per answer out."""


@dataclass(frozen=True)
class Finding:
    """One strategy's mean score and the gold's mean on the same problems."""

    strategy: str
    score: float
    gold: float
    problems: int

    @property
    def share(self) -> float:
        """The strategy's score as a share of the gold's (infinite when the gold earns nothing)."""
        return self.score / self.gold if self.gold > 0 else (float("inf") if self.score > 0 else 0.0)


@dataclass
class Probe:
    """Every strategy measured, those over the threshold, and what could not be done."""

    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    threshold: float = THRESHOLD

    @property
    def flagged(self) -> list[Finding]:
        return [f for f in self.findings if f.share > self.threshold]


def cheap_answers(problem: Problem, budget_chars: int) -> list[tuple[str, str]]:
    """(strategy, answer) pairs for one problem, in the order they are reported."""
    gold, question = problem.gold.strip(), problem.question.strip()

    def fill(unit: str) -> str:
        return (unit * (budget_chars // max(1, len(unit)) + 1))[:budget_chars].strip()

    out = [("the empty answer", ""), ("the prompt copied", question),
           ("the prompt copied, a final '=' or '?' dropped", question.rstrip("=?").strip()),
           ("the prompt repeated to the token budget", fill(question + " ")),
           ("the gold's first character repeated to the gold's length", gold[:1] * len(gold)),
           ("the gold's first character", gold[:1]), ("the gold's first half", gold[:len(gold) // 2])]
    out += [(f"the constant answer {d}", str(d)) for d in range(10)]
    return out + [("the gold followed by junk", gold + JUNK), ("a long run of filler", fill(FILLER))]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def probe_answers(score: Scorer, problems: Sequence[Problem], *, budget_chars: int,
                  threshold: float = THRESHOLD, deadline_s: float = DEADLINE_S) -> Probe:
    """Score every cheap answer of every problem with ``score`` (final answers, no wrapping):
    the entry point for anything that scores final answers, a task (:func:`probe_task`) or an
    environment alike. Problems without a gold are left out."""
    problems = [p for p in problems if p.gold.strip()]
    result = Probe(threshold=threshold)
    if not problems:
        result.notes.append("no problem of the sample has a gold answer to compare with")
        return result
    gold = [float(s) for s in score([p.gold.strip() for p in problems], problems)]
    answers = [cheap_answers(p, budget_chars) for p in problems]
    names = [name for name, _ in answers[0]]
    start, digits, tried = time.monotonic(), [], set()
    for k, name in enumerate(names):
        if time.monotonic() - start > deadline_s:
            left = [n for n in names[k:] if not n.startswith("the constant answer")]
            result.notes.append(f"the probe stopped after {deadline_s:.0f} s (a slow reward); not tried: "
                                f"{', '.join(left) or 'the other constant digits'}")
            break
        keep = [i for i, p in enumerate(problems) if answers[i][k][1].strip() != p.gold.strip()]
        these = tuple(answers[i][k][1] for i in keep)
        if not keep or these in tried:
            continue
        tried.add(these)
        scores = score(list(these), [problems[i] for i in keep])
        finding = Finding(name, _mean([float(s) for s in scores]), _mean([gold[i] for i in keep]), len(keep))
        (digits if name.startswith("the constant answer") else result.findings).append(finding)
    if digits:  # one line for the ten constant digits: the best of them
        result.findings.append(max(digits, key=lambda f: (f.share, f.score)))
    return result


def wrap(answer: str) -> str:
    """A final answer in the paper's strict format (:data:`THINK`, then the answer in its tags)."""
    return f"{THINK}<answer> {answer} </answer>"


def task_scorer(task: Task, problems: Sequence[Problem]) -> tuple[Scorer, float]:
    """(a scorer of final answers through ``task``'s own rewards, the gold's mean score): the
    form, bare or :func:`wrap`-ped, is the one in which the gold answers of ``problems`` score best."""
    golds, probs = [p.gold.strip() for p in problems], list(problems)
    bare = _mean(task.rewards(golds, probs))  # a reward that fails on the bare gold fails the probe
    try:
        tagged = _mean(task.rewards([wrap(g) for g in golds], probs))
    except Exception:  # noqa: BLE001 - a reward that cannot read the tags asks for the bare form
        tagged = float("-inf")
    if tagged > bare:
        return (lambda a, p: task.rewards([wrap(x) for x in a], list(p))), tagged
    return (lambda a, p: task.rewards(list(a), list(p))), bare


def probe_task(task: Task, budget_chars: int, sample: int = SAMPLE, **kw: Any) -> Probe:
    """:func:`probe_answers` on the first ``sample`` train problems (``task.train_problem``, the
    order a run trains in), through the task's rewards in the form the gold scores best."""
    size = len(task.problems(task.train_split))
    problems = [p for p in (task.train_problem(i) for i in range(min(sample, size))) if p.gold.strip()]
    if not problems:
        return Probe(notes=["no train problem of the sample has a gold answer to compare with"])
    score, gold = task_scorer(task, problems)
    if gold <= 0:
        return Probe(notes=["the gold answers score 0 on average, bare and in <think>/<answer> tags: "
                            "nothing to compare with (does task.answer-field name the answer column?)"])
    return probe_answers(score, problems, budget_chars=budget_chars, **kw)


def advice(task: Task, cfg: Any) -> str:
    """What to do about a flagged reward, for this task's kind of reward."""
    if cfg.reward or cfg.rewards:
        key = "task.rewards" if cfg.rewards else "task.reward"
        return f"make {key} pay only for the answer"
    if getattr(task, "partial_credit", False):
        return "use task.partial-credit=false"
    return "use a task.reward that pays only for the answer"


def _local_file(path: str) -> bool:
    from pathlib import Path

    return bool(path) and Path(path).expanduser().is_file()


def environment_scorer(exp: Any, task: Task) -> Scorer:
    """Final answers scored as the episodes of ``exp``'s environment that call no tool and end with
    them: each instance reset from its row (seeded as a node seeds it), then ``get_reward()``,
    else the task's rewards over the answer (:mod:`ftis_flwr.node.env_rollout`)."""
    from ftis_flwr.tasks.checks import loaded_environment
    from ftis_flwr.tasks.environment import reset_seed, scored
    from ftis_flwr.tasks.episode_prompt import prompt_messages, with_reset_text

    spec = loaded_environment(exp.task)

    def score(answers: list[str], problems: list[Problem]) -> list[float]:
        out: list[float | None] = []
        envs, prompts = [], []
        try:  # every instance held until scored: a reward function may read it (``environments``)
            for problem in problems:
                envs.append(spec.acquire())
                extra = envs[-1].reset(dict(problem.columns), reset_seed(exp.rounds.seed, problem.id))
                prompts.append(with_reset_text(prompt_messages(problem, exp.task.chat), extra))
                out.append(envs[-1].reward())
            episodes = [[{"role": "assistant", "content": answer}] for answer in answers]
            return scored(out, episodes, task, problems, environments=[env.instance for env in envs], prompts=prompts)
        finally:
            for env in envs:
                spec.release(env)

    return score


def probe_lines(exp: Any) -> list[str]:
    """``ftis-flwr check``'s warnings for ``exp``'s task: one line per flagged cheap answer, or a
    note when the probe cannot run (problems from the hub, a reward that raises)."""
    cfg = exp.task
    if cfg.name in ("gsm8k", "math500") and not _local_file(cfg.train_path):
        return [f"note: the reward probe skipped task {cfg.name}: its train problems come from the hub "
                "(task.train-path=<a local JSONL file> lets it run)"]
    from ftis_flwr.tasks.checks import built_task

    try:
        task = built_task(cfg)
        budget = CHARS_PER_TOKEN * int(exp.rollout.max_new_tokens)
        if cfg.environment:  # an episode that calls no tool and answers cheaply
            problems = [task.train_problem(i) for i in range(min(SAMPLE, len(task.problems(task.train_split))))]
            probe = probe_answers(environment_scorer(exp, task), problems, budget_chars=budget)
        else:
            probe = probe_task(task, budget_chars=budget)
    except Exception as exc:  # a user's reward that fails on a cheap answer fails a node's round too
        return [f"warning: task {cfg.name}: the reward probe's cheap answers made the task or its reward "
                f"fail: {type(exc).__name__}: {exc} (a completion like them would fail a node's round)"]
    name = task.name if task.name != "task" else cfg.name
    if cfg.environment:
        name = f"{name} with task.environment={cfg.environment!r} (episodes that call no tool)"
    lines = [f"note: the reward probe on task {name}: {n}" for n in probe.notes]
    for f in probe.flagged:
        share = "all" if f.share == float("inf") else f"{f.share:.0%}"
        lines.append(f'warning: task {name}: the cheap answer "{f.strategy}" scores {f.score:.2f} on average '
                     f"against the gold's {f.gold:.2f} ({share} > {probe.threshold:.0%}, {f.problems} train "
                     f"problems): the reward pays for it; {advice(task, cfg)} (or {SILENCE})")
    return lines
