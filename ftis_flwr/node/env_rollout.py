"""A node's rollouts when the task has an environment (``task.environment``, issue #57, algorithm
§13): each prompt's group is G multi-turn episodes (:func:`ftis_flwr.node.episodes.run_group`)
instead of G completions.

Why apart from the node: the node's ``generate`` stays one call; what an episode group needs (the
environment loaded once, the prompt as messages, the row and seed of each group, its rewards and
the ``env/*`` metrics) lives here.

- **row**: the problem's data-set row, every column (:attr:`ftis_flwr.tasks.base.Problem.columns`),
  goes to ``reset(**row)`` (TRL's contract);
- **prompt**: the problem's question as the user message (after the paper's system prompt when
  ``task.chat``), rendered with the tools' schemas by :func:`ftis_flwr.tasks.episode_prompt.prompt_ids`;
- **seeds**: ``reset`` runs with the row's seed (:func:`ftis_flwr.tasks.environment.reset_seed`: the
  run's seed and the prompt id), so the G episodes of a group start from the same state and a
  receiver can replay them from it; every episode of the round samples its turns together
  (:func:`ftis_flwr.node.episodes.run_groups`, ``rollout.batch_size`` sequences an engine call),
  seeded by the node's seed of the round;
- **reward**: ``get_reward()`` of the episode's environment instance where the class has one and
  it gives a number; otherwise (no ``get_reward``, or it returned None) the task's reward
  functions over the episode as TRL passes a tool rollout (its messages after the prompt, and
  the prompt's), the built-in ones over its **final answer text**: the decoded text of its last
  model turn (without its end-of-turn token), the answer the model gave after its tools ran.

An :class:`~ftis_flwr.tasks.environment.EnvironmentFault` (``reset`` or ``get_reward`` raised,
hung or broke the contract) is not caught: it stops the node's round with its reason, and the
server reports it (an environment that cannot start or score episodes has nothing to train; the
node does not retry).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from ftis_flwr.node.episodes import Episode, Sampling, Score, run_groups
from ftis_flwr.node.turns import tool_turn_layout
from ftis_flwr.tasks.base import Problem
from ftis_flwr.tasks.environment import EnvironmentSpec, load_environment, reset_seed, scored
from ftis_flwr.tasks.episode_prompt import prompt_messages
from ftis_flwr.tasks.reward_funcs import answer_text
from ftis_flwr.tasks.tool_calls import tool_format_for
from ftis_flwr.wire.groups import Group, PayloadError
from ftis_flwr.wire.tool_turns import NO_LAYOUT

log = logging.getLogger(__name__)

METRICS = ("env/episodes", "env/turns_mean", "env/tool_calls", "env/tool_errors")
"""The round metrics of a node's episodes (summed over its ranks but ``env/turns_mean``)."""


class EnvironmentRollout:
    """The node's environment, loaded once, and how its episodes are sampled."""

    def __init__(self, cfg: Any, tokenizer: Any, stop_ids: list[int], name: str = ""):
        """``cfg``: the experiment; ``tokenizer`` and ``stop_ids``: the model's; ``name``: the node's
        (for the log)."""
        self.spec: EnvironmentSpec = load_environment(cfg.task.environment, tool_timeout=cfg.task.tool_timeout)
        self.format = tool_format_for(tokenizer, cfg.task.tool_format or "auto")
        self.seed = int(cfg.rounds.seed)
        r = cfg.rollout
        self.sampling = Sampling(max_turns=cfg.task.max_turns, max_tokens=cfg.episode_budget(),
                                 max_turn_tokens=r.max_new_tokens, temperature=r.temperature, top_k=r.top_k,
                                 top_p=r.top_p, batch_size=r.batch_size)
        self.chat = bool(cfg.task.chat)
        try:  # what this node's template writes around tool results, for peers of another template
            self.layout: str = tool_turn_layout(tokenizer, stop_ids).wire()
        except ValueError as exc:
            log.info("node %s: its tool turns go without a layout (%s): peers of another chat template refuse "
                     "its episodes", name, exc)
            self.layout = NO_LAYOUT

    def groups(self, node: Any, indices: list[int], n: int, round_seed: int) -> tuple[list[Group], dict[str, float]]:
        """``n`` episodes per train index in ``indices`` as wire groups with their sampled masks
        and rewards (module docstring), and this rank's ``env/*`` metrics."""
        out, episodes, turns, calls, errors = [], 0, 0, 0, 0
        problems = [node.task.train_problem(index) for index in indices]
        rows = [(dict(p.columns), prompt_messages(p, self.chat), reset_seed(self.seed, p.id))
                for p in problems]
        made = run_groups(node.engine, node.tokenizer, self.spec, rows=rows, n=n, sample_seed=round_seed,
                          stop_ids=node.stop_ids, sampling=self.sampling, tool_format=self.format,
                          score=scorer(node.task, problems)) if rows else []
        for problem, eg in zip(problems, made):
            g = eg.group(problem.id, node=node.card.name, model_id=node.policy.model_id,
                         tokenizer_fp=node.fingerprint, rewards=[e.score for e in eg.episodes])
            out.append(g)
            episodes += len(eg.episodes)
            turns += sum(e.turns for e in eg.episodes)
            calls += sum(e.tool_calls for e in eg.episodes)
            errors += sum(e.tool_errors for e in eg.episodes)
        metrics = {"env/episodes": float(episodes), "env/turns": float(turns), "env/tool_calls": float(calls),
                   "env/tool_errors": float(errors)}
        return out, metrics


def scorer(task: Any, problems: list[Problem]) -> Score:
    """How :func:`~ftis_flwr.node.episodes.run_groups` scores the episodes of ``problems``' rows: the
    environment's reward, else the task's (:func:`~ftis_flwr.tasks.environment.scored`: reward
    functions get the episodes' messages and prompt, TRL's form), given the episode's instance."""
    def score(i: int, episodes: list[Episode], instances: list[Any], prompt: list[dict]) -> list[float]:
        return scored([e.reward for e in episodes], [e.messages for e in episodes], task,
                      [problems[i]] * len(episodes), environments=instances, prompts=[prompt] * len(episodes))
    return score


def round_metrics(parts: dict[str, float]) -> dict[str, float]:
    """The ``env/*`` round metrics from counts summed over ranks (``env/turns`` -> its mean)."""
    episodes = parts.get("env/episodes", 0.0)
    return {"env/episodes": episodes,
            "env/turns_mean": parts.get("env/turns", 0.0) / episodes if episodes else float("nan"),
            "env/tool_calls": parts.get("env/tool_calls", 0.0), "env/tool_errors": parts.get("env/tool_errors", 0.0)}


def generate(node: Any, indices: list[int], n: int, round_seed: int, *, send_text: bool = False) -> list[Group]:
    """The node's episode groups of one round (this rank's share of ``indices``, gathered), its
    ``generate_metrics`` set: the ``env/*`` metrics and ``groups_dropped_unencodable``. ``send_text``:
    each group also carries its episodes' texts, model and tool turns, with this node's tool-call
    format and tool-turn layout, for peers of another tokenizer (:mod:`ftis_flwr.node.replay_text`)."""
    with node.compute():
        groups, parts = node.env.groups(node, node.ranks.share(indices), n, round_seed + node.ranks.rank)
    kept = []
    for g in groups:
        try:  # a group that cannot go on the wire is dropped and counted, never the whole reply
            g.validate(node.vocab_size)
        except PayloadError as exc:
            log.warning("node %s drops its own episode group %s: %s", node.card.name, g.prompt_id, exc)
            continue
        if send_text:
            node._attach_texts(g)
            if g.texts is not None:  # how its calls and tool turns are written, for another template's replay
                g.tool_format, g.tool_layout = node.env.format.name, node.env.layout
        kept.append(g)
    parts = {k: node.ranks.all_sum(v) for k, v in parts.items()}
    node.generate_metrics = {"groups_dropped_unencodable": node.ranks.all_sum(float(len(groups) - len(kept))),
                             **round_metrics(parts)}
    return node.ranks.gather(kept)


def evaluate(node: Any, problems: list[Problem]) -> tuple[list[float], list[str]]:
    """The node's greedy episodes of ``problems`` (:func:`greedy_episodes`): their rewards and
    final answer texts."""
    made = greedy_episodes(node.env, node.engine, node.tokenizer, node.stop_ids, node.task, problems)
    return [float(e.score) for e in made], [answer_text(e.messages).strip() for e in made]


def greedy_episodes(env: EnvironmentRollout, engine: Any, tokenizer: Any, stop_ids: list[int], task: Any,
                    problems: list[Problem]) -> list[Episode]:
    """One greedy episode (``top_k=1``: the most likely token at every step) of each of ``problems``,
    scored as in training (the environment's reward, else the task's). Each problem's ``reset`` is
    seeded from ``rounds.seed`` and its id (:func:`~ftis_flwr.tasks.environment.reset_seed`), the
    same on every node and round, so the evaluation is the same test each time (and ``ftis-flwr
    answers`` repeats it from a checkpoint); the problems' episodes run together (greedy: no seed)."""
    greedy = dataclasses.replace(env.sampling, temperature=1.0, top_k=1, top_p=1.0)
    rows = [(dict(p.columns), prompt_messages(p, env.chat), reset_seed(env.seed, p.id)) for p in problems]
    made = run_groups(engine, tokenizer, env.spec, rows=rows, n=1, sample_seed=env.seed, stop_ids=stop_ids,
                      sampling=greedy, tool_format=env.format, score=scorer(task, problems)) if rows else []
    return [eg.episodes[0] for eg in made]
