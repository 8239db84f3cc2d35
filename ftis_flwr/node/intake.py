"""What a node accepts of the groups the server forwarded it (a receiver checks what only it can
judge: docs/security.md), and the text path's conversion into its own tokens.

Why apart from the node: it is the receiver's gate, one function per question: whose groups
these are by the server's stamp, whether their prompts were assigned to that source, whether they
fit this node's rollout caps and prompts, and whether they come through their text (another
tokenizer, or ``exchange.cross_tokenizer=always``: :mod:`ftis_flwr.xtok.translate`), and whether an
episode group replays through this node's environment (:mod:`ftis_flwr.node.replay`). Every rejected
group is counted and its reason reported once per source. ``node`` is a :class:`ftis_flwr.node.node.Node`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from ftis_flwr.config.choices import CrossTokenizerMode, CrossTokenizerRatio
from ftis_flwr.node.replay import REFUSED as REPLAY_REFUSED
from ftis_flwr.node.replay import ReplayMismatch, replay_group
from ftis_flwr.node.replay_text import replay_text_group
from ftis_flwr.wire import protocol
from ftis_flwr.wire.groups import Group
from ftis_flwr.xtok.represent import REASONS
from ftis_flwr.xtok.translate import AlignError, AlignStats, to_own_tokens

log = logging.getLogger(__name__)


@dataclass
class Received:
    """One source's groups as the server forwarded them.

    Provenance is the server's: ``source`` is the node the server received the groups from, and
    ``prompt_indices`` the train indices it assigned to that source in the round they were made.
    A group whose own ``node`` label or prompt disagrees is rejected (:func:`usable`).
    """

    source: str
    groups: list[Group]
    prompt_indices: list[int]


def usable(node, received: list[Received], metrics: dict[str, float], reasons: list[str]) -> list[Group]:
    """Foreign groups this node may train on: provenance, assignment and prompt tokens checked.

    Every rejected group is counted in ``<source>/groups_rejected`` and ``samples_rejected``
    under the server's stamp, and each (source, reason) is reported once in ``reasons``. On the
    text path each completion is judged on its own: one this node's tokens cannot stand for is
    counted in ``<source>/text_refused[_<reason>]`` (of ``<source>/text_samples``) and reported.
    """
    kept, rejected = [], {}  # (source, reason) -> [groups, samples, first prompt id]
    refused: dict[tuple[str, str], list] = {}  # (source, reason) -> [completions, first prompt id]
    for rec in received:
        src, seen = rec.source, set()
        assigned = {node.task.train_problem(i).id for i in rec.prompt_indices}
        stats, t0, through_text = AlignStats(), time.perf_counter(), 0
        for g in rec.groups:
            reason = why_unusable(node, g, src, assigned, seen)
            seen.add(g.prompt_id)
            if reason is None and is_episode(node, g):
                reason, g = replayed(node, g, src, metrics)  # another tokenizer's: rebuilt in this node's tokens
            elif reason is None and text_path(node, g):
                try:
                    g, one = to_own_tokens(
                        g, node.tokenizer, node._prompt_tokens(node.task.problem(g.prompt_id)),
                        node.stop_ids[0], max_tokens=node.cfg.wire.max_tokens_per_completion,
                        ratio=node.cfg.loss.cross_tokenizer_ratio)
                    stats.add(one)
                    through_text += g.size
                    count_refused(g, src, metrics, refused)
                except AlignError as exc:
                    reason = f"cannot align its text with this node's tokens: {exc}"
            if reason is None:
                if g.refused is None or not all(g.refused):  # a group of refused texts only: nothing to train
                    kept.append(g)
                continue
            if reason.startswith(NO_REPLAY):
                metrics[f"{src}/episodes_no_replay"] = metrics.get(f"{src}/episodes_no_replay", 0.0) + g.size
            for key, n in (("groups_rejected", 1), ("samples_rejected", g.size)):
                metrics[f"{src}/{key}"] = metrics.get(f"{src}/{key}", 0.0) + n
            entry = rejected.setdefault((src, reason), [0, 0, g.prompt_id])
            entry[0] += 1
            entry[1] += g.size
        if through_text:
            metrics[f"{src}/text_samples"] = float(through_text)
        if stats.receiver_tokens:  # the text path's diagnostics (algorithm §4)
            metrics[f"{src}/xtok_tokens"] = float(stats.receiver_tokens)
            metrics[f"{src}/xtok_chunks_per_token"] = stats.chunks / stats.receiver_tokens
            metrics[f"{src}/xtok_multi_token_share"] = stats.multi_tokens / stats.receiver_tokens
            if node.cfg.loss.cross_tokenizer_ratio == CrossTokenizerRatio.WORD and stats.unmerged_chunks:
                metrics[f"{src}/xtok_word_merged_share"] = 1.0 - stats.chunks / stats.unmerged_chunks
            metrics[f"{src}/xtok_align_seconds"] = time.perf_counter() - t0
    for (src, reason), (n, samples, first) in rejected.items():
        text = f"{src}: {n} group(s), {samples} sample(s) rejected: {reason} (first: {first!r})"
        reasons.append(text)
        log.warning("node %s: %s", node.card.name, text)
    for (src, why), (n, first) in refused.items():
        text = (f"{src}: {n} completion(s) {protocol.REFUSED_NOTE} ({why}: {REASONS[why]}; "
                f"first: {first!r})")
        reasons.append(text)
        log.warning("node %s: %s", node.card.name, text)
    return kept


def count_refused(g: Group, src: str, metrics: dict[str, float], refused: dict) -> None:
    """Count ``g``'s refused completions in ``<src>/text_refused`` and per reason
    ``<src>/text_refused_<reason>``; ``refused`` keeps (source, reason) -> [count, first group]."""
    for why in g.refused or []:
        if why:
            for key in (f"{src}/text_refused", f"{src}/text_refused_{why}"):
                metrics[key] = metrics.get(key, 0.0) + 1
            refused.setdefault((src, why), [0, g.prompt_id])[0] += 1


def why_unusable(node, g: Group, src: str, assigned: set[str], seen: set[str]) -> str | None:
    """Why a group forwarded from ``src`` cannot be trained on, or None; cheapest checks first."""
    if src == node.card.name:
        return "the server stamped these groups with this node's own name"
    if g.node != src:
        return f"labelled as made by {g.node!r}, but the server received it from {src!r}"
    if g.prompt_id not in assigned:
        return f"prompt id not assigned to {src} in the round it was generated"
    if g.prompt_id in seen:
        return "prompt id used more than once in one round"
    longest = max(len(c) for c in g.completions)
    if is_episode(node, g):  # its budget, then whether it can be replayed (the replay itself: usable)
        budget = node.cfg.episode_budget()
        if longest > budget:
            return f"an episode of {longest} tokens exceeds its budget of {budget} (task.episode_tokens)"
        return episode_unusable(node, g)
    if longest > node.cfg.rollout.max_new_tokens:  # no honest engine samples past the cap
        return f"a completion of {longest} tokens exceeds rollout.max_new_tokens={node.cfg.rollout.max_new_tokens}"
    try:
        problem = node.task.problem(g.prompt_id)
    except KeyError as exc:
        return f"unknown prompt id: {exc}"
    if text_path(node, g):  # its prompt is in the sender's tokens: this node renders its own
        return None
    if not np.array_equal(node._prompt_tokens(problem), g.prompt_tokens):
        return "prompt tokens differ from this node's encoding of the prompt"
    return None


NO_REPLAY = "episode_no_replay"
"""The reason (and, as ``<source>/episodes_no_replay``, the count) of a foreign episode group that
cannot be replayed here at all."""


def is_episode(node, g: Group) -> bool:
    """With ``task.environment`` every group is an episode group, a single-turn one too (the wire
    drops a mask of all ones: its ``sampled_masks`` is None)."""
    return g.sampled_masks is not None or getattr(node, "env", None) is not None


def episode_unusable(node, g: Group) -> str | None:
    """Why a foreign episode group cannot even be replayed here, or None.

    An episode's reward is read from its environment's state after the tools ran (``get_reward``)
    or from its last turn, and its tool turns are the environment's output: a receiver checks both
    only by replaying the episode (:mod:`ftis_flwr.node.replay`). Where it cannot, it would have to
    trust the sender's reward, which algorithm §8 forbids (an inflated reward poisons every
    receiver), so the group is refused and counted in ``<source>/episodes_no_replay``."""
    env = getattr(node, "env", None)
    if env is None:
        return f"{NO_REPLAY}: this node has no environment (task.environment) to replay episodes in"
    if not env.spec.deterministic:
        return (f"{NO_REPLAY}: the environment {env.spec.name} does not declare itself deterministic (a class "
                "attribute deterministic = True), so its episodes cannot be replayed and their rewards cannot be "
                "recomputed here; a node never trusts a reward it did not compute")
    return None


def replayed(node, g: Group, src: str, metrics: dict[str, float]) -> tuple[str | None, Group]:
    """Replay ``g`` through this node's environment: (None, the group with its ``replayed_rewards``),
    its episodes counted in ``<src>/env_replayed``; else (the reason, ``g``), the episodes counted in
    ``<src>/env_replay_refused``. Another tokenizer's episodes are replayed from their text and come
    back in this node's tokens (:mod:`ftis_flwr.node.replay_text`)."""
    try:
        problem = node.task.problem(g.prompt_id)
        if text_path(node, g):
            out = replay_text_group(node, g, problem)
            metrics[f"{src}/text_samples"] = metrics.get(f"{src}/text_samples", 0.0) + g.size
        else:
            g.replayed_rewards = replay_group(node, g, problem)
            out = g
    except KeyError as exc:
        return f"unknown prompt id: {exc}", g
    except ReplayMismatch as exc:
        metrics[f"{src}/{REPLAY_REFUSED}"] = metrics.get(f"{src}/{REPLAY_REFUSED}", 0.0) + g.size
        return f"{REPLAY_REFUSED}: {exc}", g
    metrics[f"{src}/env_replayed"] = metrics.get(f"{src}/env_replayed", 0.0) + g.size
    return None, out


def text_path(node, g: Group) -> bool:
    """A foreign group this node trains on through its text (``exchange.cross_tokenizer``)."""
    if g.node == node.card.name:
        return False
    return g.tokenizer_fp != node.fingerprint or node.cfg.exchange.cross_tokenizer == CrossTokenizerMode.ALWAYS
