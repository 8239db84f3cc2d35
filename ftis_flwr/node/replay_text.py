"""Replaying a peer's episodes across tokenizers (algorithm §4 and §13, issue #57): the receiver
rebuilds each episode in its own tokens from the sender's text, checking it as it goes, and aligns
only the turns the sender sampled with the sender's log-probs.

A peer of another tokenizer sends each episode's text (its model turns and tool turns) with the
bytes each of its tokens covers (``Group.texts`` / ``Group.byte_lengths``) and its sampled mask.
The receiver, as on the token path (:mod:`ftis_flwr.node.replay`), resets its own instances from the
row with the row's seed and renders the prompt itself (the sender's prompt, in other tokens, is not
compared), then for each sampled span (a model turn) in order:

1. encodes the turn's text with its own tokenizer, aligned byte for byte with the sender's tokens
   (:func:`ftis_flwr.xtok.translate._one_completion`: the sender's log-probs summed per chunk, the
   sender's end-of-turn token becoming this node's); a turn its tokens cannot stand for refuses the
   group;
2. drives the episode loop's own step (:func:`ftis_flwr.node.episodes.take_turn`) with it: the
   calls are read with this node's tool-call format and run through its instance;
3. checks that the tool turn the sender conditioned on is, byte for byte, the sender's layout
   (``Group.tool_layout``: the markers its template writes around results) of this node's
   replayed results, or this node's own tool turn when the sender sent no layout (an altered
   observation fails here). The markers are the sender's; the observations must be this node's.
   This node then continues with its own tool turn, so the rebuilt episode is in its own template;
4. ends where the sender ended: after a turn without a call, at the turn limit, or where the
   sender's own token budget ran out (checked in the sender's tokens), never earlier.

A peer whose model writes tool calls in another format (``Group.tool_format``) is refused: its
calls, trained on here, would teach this model a format it does not use.

Tool tokens are context (mask 0) and never a ratio term. The reward is this node's
(``get_reward()``, else the task's reward over the final answer). Any difference refuses the whole
group, counted in ``<source>/env_replay_refused``, like the token path. ``loss.cross_tokenizer_ratio``
``chunk`` and ``word`` are supported; ``sequence`` (one ratio per completion) is not, for episodes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ftis_flwr.config.choices import CrossTokenizerRatio
from ftis_flwr.node.episodes import LiveEpisode, take_turn
from ftis_flwr.node.replay import ReplayMismatch, each_episode, replayed_scores, reset_instances, spans
from ftis_flwr.tasks.base import Problem
from ftis_flwr.tasks.environment import Environment
from ftis_flwr.wire.groups import Group
from ftis_flwr.wire.tool_turns import NO_LAYOUT, ToolTurnLayout
from ftis_flwr.xtok.align import AlignError
from ftis_flwr.xtok.represent import Unrepresentable
from ftis_flwr.xtok.token_bytes import token_bytes
from ftis_flwr.xtok.translate import _one_completion


@dataclasses.dataclass
class OwnEpisode:
    """One replayed episode in this node's tokens, ready for the loss."""

    ids: np.ndarray
    gen: np.ndarray
    """The sender's log-probs summed per chunk, on each chunk's last token; 0 on tool tokens."""
    chunks: np.ndarray
    mask: np.ndarray
    messages: list[dict]
    """The replayed episode's messages after the prompt (what its reward is computed from)."""


def replay_text_group(node: Any, g: Group, problem: Problem) -> Group:
    """``g`` (another tokenizer's episodes, with texts) replayed and rebuilt in this node's tokens:
    a group with its own prompt, tokens, chunks, sampled masks and ``replayed_rewards``;
    :class:`ReplayMismatch` naming the first difference otherwise."""
    if g.texts is None or g.byte_lengths is None:
        raise ReplayMismatch("it carries no texts: a peer of another tokenizer replays episodes from their text")
    if node.cfg.loss.cross_tokenizer_ratio == CrossTokenizerRatio.SEQUENCE:
        raise ReplayMismatch("loss.cross_tokenizer_ratio=sequence has no per-turn ratio for episodes (use chunk "
                             "or word)")
    layout = sender_layout(node, g)
    masks = g.sampled_masks or [np.ones(len(c), np.uint8) for c in g.completions]
    with reset_instances(node, g.size, problem) as (envs, prompt, messages):
        own = each_episode(lambda env, text, lengths, gen, mask: replay_text_episode(
            node, env, bytes(text), np.asarray(lengths, np.int64), np.asarray(gen, np.float32), np.asarray(mask),
            layout), envs, g.texts, g.byte_lengths, g.logprobs, masks)
        scores = replayed_scores(node, envs, [e.messages for e in own], problem, messages)
    return Group(prompt_id=g.prompt_id, prompt_tokens=np.asarray(prompt, np.int64),
                 completions=[e.ids for e in own], logprobs=[e.gen for e in own], rewards=g.rewards, node=g.node,
                 model_id=g.model_id, tokenizer_fp=g.tokenizer_fp, chunks=[e.chunks for e in own],
                 sampled_masks=[e.mask for e in own], replayed_rewards=np.asarray(scores, np.float32))


def sender_layout(node: Any, g: Group) -> ToolTurnLayout | None:
    """How ``g``'s sender writes its tool turns (None: as this node does, byte for byte);
    :class:`ReplayMismatch` when it writes its tool calls in another format than this node reads,
    or says it has no layout while its template differs."""
    if g.tool_format is None:
        return None
    mine = node.env.format.name
    if g.tool_format != mine:
        raise ReplayMismatch(f"its model writes tool calls in the {g.tool_format!r} format and this node's in "
                             f"{mine!r}: a turn's calls would train this model on a format it does not use")
    if g.tool_layout == NO_LAYOUT:
        return None
    try:
        layout = ToolTurnLayout.from_wire(g.tool_layout)
    except ValueError as exc:  # the wire checked it; a group built by hand may not have been
        raise ReplayMismatch(f"its tool-turn layout: {exc}") from None
    return None if layout.wire() == node.env.layout else layout


def replay_text_episode(node: Any, env: Environment, text: bytes, lengths: np.ndarray, gen: np.ndarray,
                        mask: np.ndarray, layout: ToolTurnLayout | None = None) -> OwnEpisode:
    """One episode (``env`` already reset) rebuilt from the sender's text (module docstring);
    ``layout``: how the sender writes tool turns (None: as this node does)."""
    rollout, tok = node.env, node.tokenizer
    cfg = node.cfg
    at = np.concatenate([[0], np.cumsum(lengths)])  # byte offset of each sender token
    runs = spans(mask)
    turns = [(a, b) for a, b, sampled in runs if sampled]
    if not runs or not runs[0][2] or not runs[-1][2]:
        raise ReplayMismatch("it does not start and end with a sampled turn")
    if len(turns) > cfg.task.max_turns:
        raise ReplayMismatch(f"{len(turns)} model turns, more than task.max_turns={cfg.task.max_turns}")
    budget, per_turn = cfg.episode_budget(), rollout.sampling.max_turn_tokens
    # this node's own counts never end the replay: the sender's tokens and the turn limit do (checked here)
    loose = dataclasses.replace(rollout.sampling, max_tokens=cfg.wire.max_tokens_per_completion + 1)
    live = LiveEpisode(env, [])
    gens, chunks, n_chunks, tool_ids, results = [], [], 0, [], []
    words = cfg.loss.cross_tokenizer_ratio == CrossTokenizerRatio.WORD
    for k, (a, b) in enumerate(turns):
        if live.done:
            raise ReplayMismatch(f"turn {k} calls no tool, yet a tool turn follows it" if live.ep.stop == "answer"
                                 else f"the episode ended after turn {k} ({live.ep.stop}), yet it goes on")
        if k:  # the tool turn the sender conditioned on: its layout (else this node's text) of the same results
            sent = text[at[turns[k - 1][1]]:at[a]]
            expected = sender_tool_turn(tok, tool_ids, results, layout)
            if sent != expected:
                whose = "the sender's layout" if layout else "this node's text"
                raise ReplayMismatch(f"the tool turn after turn {k} is not {whose} of what its replayed calls "
                                     f"returned ({len(sent)} bytes sent, {len(expected)} replayed)")
        raw = text[at[a]:at[b]]
        finished = lengths[b - 1] == 0
        if not finished and (k < len(turns) - 1 or (b - a) < min(budget - a, per_turn or budget)):
            raise ReplayMismatch(f"turn {k + 1} is not closed by an end-of-turn token, yet "
                                 + ("the episode goes on" if k < len(turns) - 1 else
                                    "it stops with tokens left to sample"))
        try:
            ids, r_gen, r_chunks, _ = _one_completion(raw.decode("utf-8"), raw, lengths[a:b], gen[a:b], tok,
                                                      node.stop_ids[0], cfg.wire.max_tokens_per_completion, words)
        except (Unrepresentable, AlignError, UnicodeDecodeError) as exc:
            raise ReplayMismatch(f"turn {k + 1} cannot be written in this node's tokens: {exc}") from None
        gens.append(r_gen)
        chunks.append(r_chunks + n_chunks)
        n_chunks += int(r_chunks.max()) + 1 if len(r_chunks) else 0
        start, said = len(live.ids), len(live.ep.messages)
        try:
            live.done = take_turn(live, ids.tolist(), [0.0] * len(ids), bool(finished), tok, node.stop_ids, loose,
                                  rollout.format)
        except ValueError as exc:  # the template cannot render the tool turn
            raise ReplayMismatch(f"the tool turn after turn {k + 1} cannot be rendered here: {exc}") from None
        tool_ids = live.ids[start + len(ids):]
        results = [m["content"] for m in live.ep.messages[said:] if m.get("role") == "tool"]
        if tool_ids:  # context: no ratio term, the chunk of the turn before (masked out of the loss)
            gens.append(np.zeros(len(tool_ids), np.float32))
            chunks.append(np.full(len(tool_ids), n_chunks - 1, np.int64))
    if not live.done:  # the sender stopped after a tool call: only where its budget ran out
        tool = sender_tool_turn(tok, tool_ids, results, layout)
        if len(mask) + len(tool) < budget:  # its tool turn, in its tokens, is at most as long as in bytes
            raise ReplayMismatch(f"it ends on turn {len(turns)}, which called a tool, with turns and tokens left")
        cut = len(live.ids) - len(tool_ids)
        live.ids, live.mask = live.ids[:cut], live.mask[:cut]
        gens, chunks = gens[:-1], chunks[:-1]
    ids = np.asarray(live.ids, np.int64)
    if len(ids) > cfg.wire.max_tokens_per_completion:
        raise ReplayMismatch(f"{len(ids)} tokens here, more than wire.max_tokens_per_completion")
    return OwnEpisode(ids=ids, gen=np.concatenate(gens).astype(np.float32), chunks=np.concatenate(chunks),
                      mask=np.asarray(live.mask, np.uint8), messages=live.ep.messages)


def sender_tool_turn(tok: Any, tool_ids: list[int], results: list[str], layout: ToolTurnLayout | None) -> bytes:
    """The bytes the sender's tool turn must hold for these replayed results: its ``layout``
    around their contents, else this node's own tool turn (``tool_ids``)."""
    if layout is not None:
        return layout.text(results)
    return b"".join(token_bytes(tok, tool_ids, specials="content"))
