"""The episode loop (algorithm §13, issue #57): G multi-turn, tool-using episodes of one row.

An episode is one token sequence after the prompt that interleaves what the model **sampled** (its
turns, each closed by one of the node's stop ids) with what it did **not** (each tool turn: the
chat template's markers and the tools' results). Per turn:

1. sample from the episode's tokens so far until a stop id, the per-turn cap or what is left of
   the episode's token budget (the group's live episodes in one engine call: :func:`run_episodes`);
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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ftis_flwr.node import turns as turn_tokens
from ftis_flwr.tasks.environment import Environment, EnvironmentFault, EnvironmentSpec
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
    score: float | None = None
    """The episode's reward as trained on, when :func:`run_groups` was given ``score``: the
    environment's, else the task's reward functions' (which may read the instance)."""


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


def turn_seed(seed: int | None, step: int) -> int | None:
    """The engine's seed for one step of a group's episodes, each live episode sampling its next
    turn (None: the global generator)."""
    if seed is None:
        return None
    return (int(seed) * 1_000_003 + step * 7_919 + 1) % (2**63)


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
    batch_size: int = 0
    """Sequences one engine call samples at most (``rollout.batch_size``); 0: every live episode."""

    def __post_init__(self) -> None:
        if self.max_turns < 1 or self.max_tokens < 1 or (self.max_turn_tokens is not None and self.max_turn_tokens < 1):
            raise ValueError(f"max_turns, max_tokens and max_turn_tokens must be >= 1, got {self.max_turns}, "
                             f"{self.max_tokens}, {self.max_turn_tokens}")


Score = Callable[[int, list[Episode], list[Any], list[dict]], Sequence[float]]
"""(row index, the row's episodes, their environment instances, the row's prompt messages) -> their
rewards."""


def run_group(engine: Any, tokenizer: Any, spec: EnvironmentSpec, *, row: Mapping[str, Any],
              messages: Sequence[Mapping[str, Any]], n: int, seed: int, stop_ids: Sequence[int],
              sampling: Sampling, tool_format: Any = None, sample_seed: int | None = None) -> EpisodeGroup:
    """``n`` episodes of ``row``: :func:`run_groups` for one row, ``seed`` seeding its ``reset`` and
    ``sample_seed`` (default ``seed``) its turns."""
    return run_groups(engine, tokenizer, spec, rows=[(row, messages, seed)], n=n, stop_ids=stop_ids,
                      sampling=sampling, tool_format=tool_format,
                      sample_seed=seed if sample_seed is None else sample_seed)[0]


def run_groups(engine: Any, tokenizer: Any, spec: EnvironmentSpec, *,
               rows: Sequence[tuple[Mapping[str, Any], Sequence[Mapping[str, Any]], int]], n: int,
               sample_seed: int | None, stop_ids: Sequence[int], sampling: Sampling,
               tool_format: Any = None, score: Score | None = None) -> list[EpisodeGroup]:
    """``n`` episodes of each ``(row, messages, reset seed)`` through ``engine`` (its ``sample``),
    every episode of every row sampling its turns together (:func:`run_episodes`, seeded by
    ``sample_seed``); ``messages`` is the row's prompt before ``reset``'s text; ``tool_format``: a
    :data:`ftis_flwr.tasks.tool_calls.TOOL_FORMATS` reader (default:
    :func:`~ftis_flwr.tasks.tool_calls.tool_format_for` the tokenizer); ``score(row index,
    episodes, their instances, the prompt's messages)``: the row's episodes' rewards
    (:attr:`Episode.score`), called while the instances still hold the episodes' state, before
    they go back to the pool. EnvironmentFault
    when the environment cannot start or score the episodes."""
    fmt = tool_format or tool_format_for(tokenizer)
    envs = [[spec.acquire() for _ in range(int(n))] for _ in rows]
    try:
        starts = []
        for (row, messages, seed), mine in zip(rows, envs):
            extras = [env.reset(row, seed) for env in mine]
            if len(set(extras)) > 1:
                raise EnvironmentFault(
                    f"{spec.name}.reset(**row) returned different texts for one row and seed ({extras[0]!r}, "
                    f"{next(e for e in extras if e != extras[0])!r}): the episodes of a group must start from the "
                    "same state (draw randomness from 'random' or numpy's global generator, which are seeded, or "
                    "seed your own from them)")
            shown = with_reset_text(messages, extras[0])
            starts.append((shown, prompt_ids(tokenizer, shown, spec.schemas)))
        flat = [env for mine in envs for env in mine]
        episodes = run_episodes(engine, tokenizer, flat, [prompt for _, prompt in starts for _ in range(int(n))],
                                seed=sample_seed, stop_ids=stop_ids, sampling=sampling, tool_format=fmt)
        for env, ep in zip(flat, episodes):
            ep.reward = env.reward()
        for i in range(len(rows) if score is not None else 0):
            mine = slice(i * int(n), (i + 1) * int(n))
            for ep, value in zip(episodes[mine], score(i, episodes[mine], [env.instance for env in flat[mine]],
                                                       list(starts[i][0]))):
                ep.score = float(value)
    finally:
        for env in (env for mine in envs for env in mine):
            spec.release(env)
    return [EpisodeGroup(np.asarray(prompt, np.int64), shown, episodes[i * int(n):(i + 1) * int(n)])
            for i, (shown, prompt) in enumerate(starts)]


@dataclass
class LiveEpisode:
    """An episode being sampled: its tokens so far, their log-probs and mask, and its record."""

    env: Environment
    prompt: list[int]
    ids: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    ep: Episode = field(default_factory=lambda: Episode(np.zeros(0, np.int64), np.zeros(0, np.float32),
                                                        np.zeros(0, np.uint8)))
    done: bool = False

    def cap(self, sampling: Sampling) -> int:
        """Tokens its next turn may sample: what is left of the budget, at most the per-turn cap."""
        left = sampling.max_tokens - len(self.ids)
        return left if sampling.max_turn_tokens is None else min(left, sampling.max_turn_tokens)


def run_episodes(engine: Any, tokenizer: Any, envs: Sequence[Environment], prompts: Sequence[Sequence[int]], *,
                 seed: int | None, stop_ids: Sequence[int], sampling: Sampling, tool_format: Any) -> list[Episode]:
    """One episode per instance of ``envs`` (each already reset) from its prompt in ``prompts``
    (token ids), the live ones sampling their next turn together in engine calls of at most
    ``sampling.batch_size`` sequences (0: all of them; module docstring); step t of
    the group samples with ``turn_seed(seed, t)`` (None: the global generator). A turn sampled
    past an episode's own cap (the batch samples up to the largest) is cut there, unfinished: its
    first tokens are distributed as if sampled with that cap. ``stop_ids`` must be the engine's."""
    live = [LiveEpisode(env, [int(t) for t in prompt]) for env, prompt in zip(envs, prompts)]
    step = 0
    while True:
        active = [s for s in live if not s.done]
        if not active:
            break
        caps = [s.cap(sampling) for s in active]
        outs = engine.sample([s.prompt + s.ids for s in active], 1, temperature=sampling.temperature,
                             top_k=sampling.top_k, top_p=sampling.top_p, max_new_tokens=max(caps),
                             batch_size=min(len(active), sampling.batch_size or len(active)),
                             generator_seed=turn_seed(seed, step))
        for s, out, cap in zip(active, outs, caps):
            tokens, lps, finished = [int(t) for t in out[0].tokens], [float(x) for x in out[0].logprobs], \
                bool(out[0].finished)
            if len(tokens) > cap:
                tokens, lps, finished = tokens[:cap], lps[:cap], False
            s.done = take_turn(s, tokens, lps, finished, tokenizer, stop_ids, sampling, tool_format)
        step += 1
    for s in live:
        s.ep.tokens = np.asarray(s.ids, np.int64)
        s.ep.logprobs = np.asarray(s.lps, np.float32)
        s.ep.sampled = np.asarray(s.mask, np.uint8)
    return [s.ep for s in live]


def take_turn(s: LiveEpisode, tokens: list[int], lps: list[float], finished: bool, tokenizer: Any,
               stop_ids: Sequence[int], sampling: Sampling, tool_format: Any) -> bool:
    """Append one sampled turn to ``s``, run its tool calls and append their turn; True when the
    episode ended (its ``stop`` set). The loop's one step, which a receiver's replay also drives
    (:mod:`ftis_flwr.node.replay`), so both end an episode by the same rule."""
    ep, env = s.ep, s.env
    s.ids += tokens
    s.lps += lps
    s.mask += [1] * len(tokens)
    ep.turns += 1
    text = tokenizer.decode(tokens[:-1] if finished else tokens, skip_special_tokens=False)
    calls = tool_format.parse(text, env.spec.tools) if finished else []
    ep.messages.append({"role": "assistant", "content": text})
    if not finished:
        ep.stop = "length"
        return True
    if not calls:
        ep.stop = "answer"
        return True
    results = env.run(calls)
    ep.tool_calls += len(results)
    ep.tool_errors += sum(1 for r in results if r.error)
    ep.messages += [{"role": "tool", "name": r.name, "content": r.content} for r in results]
    if ep.turns >= sampling.max_turns:
        ep.stop = "max_turns"
        return True
    suffix = turn_tokens.tool_turn_ids(tokenizer, results, stop_ids)
    if len(s.ids) + len(suffix) >= sampling.max_tokens:
        ep.stop = "budget"
        return True
    s.ids += suffix
    s.lps += [0.0] * len(suffix)
    s.mask += [0] * len(suffix)
    return False
