"""The episode loop (algorithm §13, issue #57): G multi-turn, tool-using episodes of one row.

An episode is one token sequence after the prompt that interleaves what the model **sampled** (its
turns, each closed by one of the node's stop ids) with what it did **not** (each tool turn: the
chat template's markers and the tools' results). Per turn:

1. sample from the episode's tokens so far (the engine's ``sample`` on one context) until a stop
   id, the per-turn cap or what is left of the episode's token budget;
2. decode the turn and read its tool calls in the model family's format
   (:mod:`ftis_flwr.node.turns`); a turn without one ends the episode (the model answered), and so
   does a turn cut by the budget;
3. run each call through the episode's environment instance (an error, a timeout or a call that
   could not be read becomes an error observation, counted);
4. append the tool turn's tokens (never re-rendering the history) with log-prob 0 and mask 0,
   unless the turn limit is reached or they would leave no room for another model token: then the
   episode ends after the tools ran (their results are in the messages, for ``get_reward``), so
   an episode always starts and ends with a model token (:func:`ftis_flwr.wire.groups.mask_fault`).

The G episodes start from the same environment state: each instance's ``reset(**row)`` runs
seeded with the group's seed, and must return the same text for each (else the environment is not
reproducible and the group is refused with the reason). The loop never runs unbounded: at most
``max_turns`` model turns and ``max_tokens`` tokens per episode.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ftis_flwr.node import turns as turn_tokens
from ftis_flwr.tasks.environment import Environment, EnvironmentFault, EnvironmentSpec, ToolResult
from ftis_flwr.tasks.episode_prompt import prompt_ids, with_reset_text
from ftis_flwr.tasks.tool_calls import tool_format_for
from ftis_flwr.wire.groups import Group

STOPS = ("answer", "length", "max_turns", "budget")
"""Why an episode ended: the model answered (a turn without a tool call), its turn ran into the
budget, the turn limit was reached after a tool call, or the tool turn would fill the budget."""


@dataclass
class Episode:
    """One episode's tokens after the prompt, what the model sampled of them, and its record."""

    tokens: np.ndarray
    """int64: every token after the prompt, the model's turns and the tool turns, in order."""
    logprobs: np.ndarray
    """float32: pi_gen of each sampled token; exactly 0.0 on the tool turns' tokens."""
    sampled: np.ndarray
    """uint8: 1 on the tokens the model sampled, 0 on the tool turns'."""
    messages: list[dict] = field(default_factory=list)
    """The turns after the prompt as text: ``assistant`` (its decoded turn) and ``tool`` (name,
    content) messages, including tool results that were not appended (the last turn's)."""
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    stop: str = "answer"
    """Why it ended, one of :data:`STOPS`."""
    reward: float | None = None
    """``get_reward()`` of the episode's environment, when it has one."""


@dataclass
class EpisodeGroup:
    """G episodes of one row, from one prompt."""

    prompt_ids: np.ndarray
    prompt_messages: list[dict]
    """The prompt's messages, ``reset``'s text appended to the last user message."""
    episodes: list[Episode]

    def group(self, prompt_id: str, *, node: str, model_id: str, tokenizer_fp: str,
              rewards: Sequence[float] | None = None) -> Group:
        """The episodes as a wire group with their sampled masks; ``rewards`` default to the
        environment's (0.0 where it gave none)."""
        if rewards is None:
            rewards = [0.0 if e.reward is None else e.reward for e in self.episodes]
        return Group(prompt_id=prompt_id, prompt_tokens=self.prompt_ids,
                     completions=[e.tokens for e in self.episodes], logprobs=[e.logprobs for e in self.episodes],
                     rewards=np.asarray(rewards, np.float32), node=node, model_id=model_id,
                     tokenizer_fp=tokenizer_fp, sampled_masks=[e.sampled for e in self.episodes])


def turn_seed(seed: int | None, episode: int, turn: int) -> int | None:
    """The engine's seed for one turn of one episode of a group (None: the global generator)."""
    if seed is None:
        return None
    return (int(seed) * 1_000_003 + episode * 7_919 + turn) % (2**63)


@dataclass
class Sampling:
    """How each turn is sampled (``rollout.*``) and what bounds an episode (``task.max_turns``,
    the episode's token budget)."""

    max_turns: int
    max_tokens: int
    """Tokens after the prompt, model and tool turns together."""
    max_turn_tokens: int | None = None
    """Tokens one model turn may sample (None: what is left of the budget)."""
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.max_turns < 1 or self.max_tokens < 1 or (self.max_turn_tokens is not None and self.max_turn_tokens < 1):
            raise ValueError(f"max_turns, max_tokens and max_turn_tokens must be >= 1, got {self.max_turns}, "
                             f"{self.max_tokens}, {self.max_turn_tokens}")


def run_group(engine: Any, tokenizer: Any, spec: EnvironmentSpec, *, row: Mapping[str, Any],
              messages: Sequence[Mapping[str, Any]], n: int, seed: int, stop_ids: Sequence[int],
              sampling: Sampling, tool_format: Any = None, sample_seed: int | None = None) -> EpisodeGroup:
    """``n`` episodes of ``row`` through ``engine`` (its ``sample``), from ``messages`` (the
    prompt before ``reset``'s text); ``seed`` seeds ``reset``, ``sample_seed`` (default ``seed``)
    the turns; ``tool_format``: a :data:`ftis_flwr.tasks.tool_calls.TOOL_FORMATS` reader (default:
    :func:`~ftis_flwr.tasks.tool_calls.tool_format_for` the tokenizer). EnvironmentFault when the
    environment cannot start or score the episodes."""
    fmt = tool_format or tool_format_for(tokenizer)
    envs = [spec.acquire() for _ in range(int(n))]
    try:
        extras = [env.reset(row, seed) for env in envs]
        if len(set(extras)) > 1:
            raise EnvironmentFault(f"{spec.name}.reset(**row) returned different texts for one row and seed "
                                   f"({extras[0]!r}, {next(e for e in extras if e != extras[0])!r}): the episodes of a "
                                   "group must start from the same state (draw randomness from 'random' or numpy's "
                                   "global generator, which are seeded, or seed your own from them)")
        prompt_messages = with_reset_text(messages, extras[0])
        prompt = prompt_ids(tokenizer, prompt_messages, spec.schemas)
        turns = seed if sample_seed is None else sample_seed
        episodes = [run_episode(engine, tokenizer, env, prompt, seed=turn_seed(turns, j, 0), stop_ids=stop_ids,
                                sampling=sampling, tool_format=fmt) for j, env in enumerate(envs)]
        for env, ep in zip(envs, episodes):
            ep.reward = env.reward()
    finally:
        for env in envs:
            spec.release(env)
    return EpisodeGroup(np.asarray(prompt, np.int64), prompt_messages, episodes)


def run_episode(engine: Any, tokenizer: Any, env: Environment, prompt: Sequence[int], *, seed: int | None,
                stop_ids: Sequence[int], sampling: Sampling, tool_format: Any) -> Episode:
    """One episode from ``prompt`` (token ids) with ``env`` already reset (module docstring); turn t
    is sampled with ``seed + t`` (None: the global generator). ``stop_ids`` must be the engine's."""
    ids: list[int] = []
    lps: list[float] = []
    mask: list[int] = []
    ep = Episode(np.zeros(0, np.int64), np.zeros(0, np.float32), np.zeros(0, np.uint8))
    while True:
        left = sampling.max_tokens - len(ids)
        cap = left if sampling.max_turn_tokens is None else min(left, sampling.max_turn_tokens)
        s = engine.sample([list(prompt) + ids], 1, temperature=sampling.temperature, top_k=sampling.top_k,
                          top_p=sampling.top_p, max_new_tokens=cap, batch_size=1,
                          generator_seed=None if seed is None else seed + ep.turns)[0][0]
        tokens = [int(t) for t in s.tokens]
        ids += tokens
        lps += [float(x) for x in s.logprobs]
        mask += [1] * len(tokens)
        ep.turns += 1
        ended = bool(s.finished)  # closed by a stop id (kept as its last token), not cut by the cap
        text = tokenizer.decode(tokens[:-1] if ended else tokens, skip_special_tokens=False)
        calls = tool_format.parse(text, env.spec.tools) if ended else []
        ep.messages.append({"role": "assistant", "content": text})
        if not ended:
            ep.stop = "length"
            break
        if not calls:
            ep.stop = "answer"
            break
        results = [env.call(c.name, c.arguments) if not c.error else
                   ToolResult(c.name, str({"error": c.error}), error=c.error) for c in calls]
        ep.tool_calls += len(results)
        ep.tool_errors += sum(1 for r in results if r.error)
        ep.messages += [{"role": "tool", "name": r.name, "content": r.content} for r in results]
        if ep.turns >= sampling.max_turns:
            ep.stop = "max_turns"
            break
        suffix = turn_tokens.tool_turn_ids(tokenizer, results, stop_ids)
        if len(ids) + len(suffix) >= sampling.max_tokens:
            ep.stop = "budget"
            break
        ids += suffix
        lps += [0.0] * len(suffix)
        mask += [0] * len(suffix)
    ep.tokens = np.asarray(ids, np.int64)
    ep.logprobs = np.asarray(lps, np.float32)
    ep.sampled = np.asarray(mask, np.uint8)
    return ep
