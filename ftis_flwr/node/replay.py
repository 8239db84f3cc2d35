"""Replaying a peer's episodes before training on them (algorithm §13, issue #57).

An episode's reward comes from its environment's state after the tools ran (``get_reward``) or
from its last turn, and its tool turns are the environment's output: a receiver can trust neither
as sent (a node never trusts a reward it did not compute, algorithm §8). So it replays each
episode through its own instance of the environment and keeps the group only if everything
matches:

1. the environment declares itself deterministic (a class attribute ``deterministic = True``:
   the same row, seed and tool calls give the same observations and reward). Without it the
   group is refused as ``episode_no_replay``: nothing can be checked;
2. every instance is reset from the row with the row's reset seed
   (:func:`~ftis_flwr.tasks.environment.reset_seed`: the run's seed and the prompt id, derived by
   the receiver itself, so a sender cannot pick an easy start), and the prompt the sender trained
   on is this node's rendering of it;
3. each sampled turn but the last must call a tool (else nothing would follow it), the calls are
   read from its text with this node's tool-call format and run through the instance, and the
   tool turn that follows on the wire must be exactly this node's tokens of the results (an
   altered observation fails here); the last turn's calls are run too (they may change the state
   ``get_reward`` reads), as the sender ran them. The episode must also have ended where the loop
   ends one (:mod:`ftis_flwr.node.episodes`): after a turn without a call, at the turn limit or the
   token budget, never earlier (a cut episode is refused);
4. the reward is this node's: ``get_reward()``, else the task's reward over the final answer text.

A mismatch refuses the whole group (its advantages need all G episodes) with the first reason,
counted in ``<source>/env_replay_refused``. The token path; episodes of another tokenizer are
replayed from their text (:mod:`ftis_flwr.node.replay_text`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from ftis_flwr.node.episodes import LiveEpisode, take_turn
from ftis_flwr.tasks.base import Problem
from ftis_flwr.tasks.environment import Environment, EnvironmentFault, reset_seed, scored
from ftis_flwr.tasks.episode_prompt import prompt_ids, prompt_messages, with_reset_text
from ftis_flwr.wire.groups import Group

REFUSED = "env_replay_refused"
"""The reason's prefix (and, as ``<source>/env_replay_refused``, the count) of a group that did not replay."""


class ReplayMismatch(ValueError):
    """An episode that does not replay here; the message says where it parted."""


def spans(mask: np.ndarray) -> list[tuple[int, int, bool]]:
    """``(start, end, sampled)`` runs of a sampled mask, in order."""
    edges = np.flatnonzero(np.diff(mask.astype(np.int8))) + 1
    bounds = [0, *edges.tolist(), len(mask)]
    return [(a, b, bool(mask[a])) for a, b in zip(bounds[:-1], bounds[1:])]


@contextmanager
def reset_instances(node: Any, n: int, problem: Problem
                    ) -> Iterator[tuple[list[Environment], list[int], list[dict]]]:
    """``n`` instances of this node's environment, each reset from ``problem``'s row with the row's
    seed, and this node's prompt of the row after reset, as tokens and as messages; the instances
    go back to the pool after.
    :class:`ReplayMismatch` when the reset fails or gives different texts."""
    spec = node.env.spec
    envs = [spec.acquire() for _ in range(n)]
    try:
        try:
            extras = {env.reset(dict(problem.columns), reset_seed(node.cfg.rounds.seed, problem.id)) for env in envs}
        except EnvironmentFault as exc:
            raise ReplayMismatch(f"this node's environment failed to reset the row: {exc}") from None
        if len(extras) > 1:
            raise ReplayMismatch(f"{spec.name}.reset(**row) returned different texts for one row and seed: "
                                 "the environment is not deterministic, though it says so")
        messages = with_reset_text(prompt_messages(problem, node.env.chat), extras.pop())
        yield envs, prompt_ids(node.tokenizer, messages, spec.schemas), messages
    finally:
        for env in envs:
            spec.release(env)


def each_episode(replay: Callable[..., Any], envs: list[Environment], *columns: Any) -> list[Any]:
    """``replay(env, *column values)`` for each episode, a mismatch named with the episode's index."""
    out = []
    for i, (env, *values) in enumerate(zip(envs, *columns)):
        try:
            out.append(replay(env, *values))
        except ReplayMismatch as exc:
            raise ReplayMismatch(f"episode {i}: {exc}") from None
    return out


def replayed_scores(node: Any, envs: list[Environment], episodes: list[list[dict]], problem: Problem,
                    prompt: list[dict]) -> list[float]:
    """The replayed episodes' rewards as this node computes them, before the instances go back to
    the pool: each instance's ``get_reward()``, else the task's over the replayed messages, given
    the instance and the prompt (:func:`~ftis_flwr.tasks.environment.scored`)."""
    return scored(env_rewards(envs), episodes, node.task, [problem] * len(episodes),
                  environments=[env.instance for env in envs], prompts=[prompt] * len(episodes))


def env_rewards(envs: list[Environment]) -> list[float | None]:
    """Each replayed instance's ``get_reward()`` (None: no opinion); a failure is a mismatch."""
    rewards: list[float | None] = []
    for env in envs:
        try:
            rewards.append(env.reward())
        except EnvironmentFault as exc:
            raise ReplayMismatch(f"this node's get_reward failed after the replay: {exc}") from None
    return rewards


def replay_group(node: Any, g: Group, problem: Problem) -> np.ndarray:
    """The rewards of ``g``'s episodes as this node computes them by replay (module docstring);
    :class:`ReplayMismatch` naming the first difference otherwise. ``node`` gives the environment
    (``node.env``), tokenizer, stop ids, task and run seed."""
    with reset_instances(node, g.size, problem) as (envs, prompt, messages):
        if not np.array_equal(np.asarray(prompt, np.int64), np.asarray(g.prompt_tokens, np.int64)):
            raise ReplayMismatch("its prompt is not this node's rendering of the row after reset")
        masks = g.sampled_masks or [np.ones(len(c), np.uint8) for c in g.completions]
        episodes = each_episode(lambda env, tokens, mask: replay_episode(node, env, np.asarray(tokens),
                                                                         np.asarray(mask)), envs, g.completions, masks)
        return np.asarray(replayed_scores(node, envs, episodes, problem, messages), np.float32)


def replay_episode(node: Any, env: Environment, tokens: np.ndarray, mask: np.ndarray) -> list[dict]:
    """Drive the episode loop's own step (:func:`ftis_flwr.node.episodes.take_turn`) through ``env``
    (already reset) with the sender's sampled turns: everything it appends must be what was sent,
    and it must end the episode exactly where the sent one ends; returns the replayed messages."""
    rollout, stops = node.env, {int(t) for t in node.stop_ids}
    runs = spans(mask)
    turns = [(a, b) for a, b, sampled in runs if sampled]
    if not runs or not runs[0][2] or not runs[-1][2]:
        raise ReplayMismatch("it does not start and end with a sampled turn")
    limit = node.cfg.task.max_turns
    if len(turns) > limit:
        raise ReplayMismatch(f"{len(turns)} model turns, more than task.max_turns={limit}")
    live = LiveEpisode(env, [])
    for k, (a, b) in enumerate(turns):
        if live.done:
            raise ReplayMismatch(f"turn {k} calls no tool, yet a tool turn follows it" if live.ep.stop == "answer"
                                 else f"the episode ended after turn {k} ({live.ep.stop}), yet it goes on")
        if k and live.ids != tokens[:a].tolist():
            sent = turns[k - 1][1]
            raise ReplayMismatch(f"the tool turn after turn {k} is not this node's tokens of what its replayed calls "
                                 f"returned ({a - sent} tokens sent, {len(live.ids) - sent} replayed)")
        turn = tokens[a:b].tolist()
        finished = turn[-1] in stops
        if not finished and (k < len(turns) - 1 or len(turn) < live.cap(rollout.sampling)):
            raise ReplayMismatch(f"turn {k + 1} is not closed by an end-of-turn token, yet "
                                 + ("the episode goes on" if k < len(turns) - 1 else
                                    "it stops with tokens left to sample"))
        try:
            live.done = take_turn(live, turn, [0.0] * len(turn), finished, node.tokenizer, node.stop_ids,
                                  rollout.sampling, rollout.format)
        except ValueError as exc:  # the template cannot render the tool turn
            raise ReplayMismatch(f"the tool turn after turn {k + 1} cannot be rendered here: {exc}") from None
    if not live.done:
        raise ReplayMismatch(f"it ends on turn {len(turns)}, which called a tool, with turns and tokens left")
    return live.ep.messages
