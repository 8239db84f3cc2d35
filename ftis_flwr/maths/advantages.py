"""Group advantages, the F-TIS sample filter and per-node g schedules (algorithm §2, §3, §6).

Pure functions over numpy arrays / torch tensors, no model and no Flower, so every rule the
paper states can be checked on hand-made numbers.

Conventions that matter:

* The group std is the **population** std (``ddof=0`` / ``unbiased=False``), as in the paper's
  ``(r - mean) / (std + eps)``; with G=12 the unbiased std would shrink advantages by ~4%.
* A group whose rewards are all equal gets advantages that are **exactly** 0 (not ~1e-11 from
  rounding in the mean), and is what :func:`frac_zero_std_groups` counts.
* Advantages are computed from all G rewards *before* filtering (algorithm §3): :func:`filter_mask`
  only decides which samples lose their advantage afterwards; it never changes a group's
  statistics.
* ``vertical`` mode is recommended (algorithm §2). :func:`pooled_advantages` implements the
  ``horizontal`` ablation, where each node generated G/m completions of the same prompt and the
  pooled group's mean/std biases every node's baseline towards the swarm average.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import torch

from ftis_flwr.maths.params import (
    FILTER_RULES,
    FILTER_SCOPES,
    G_KINDS,
    SCALES,
    FilterRule,
    FilterScope,
    GKind,
    GSchedule,
    Scale,
)

ArrayLike = TypeVar("ArrayLike", np.ndarray, torch.Tensor)


def group_advantages(rewards: ArrayLike, scale: str = "group", eps: float = 1e-6) -> ArrayLike:
    """Per-row GRPO advantages of ``rewards`` shaped [n_groups, G]; same type and shape back.

    ``scale="group"``: ``(r - mean) / (std + eps)`` with the population std (``ddof=0``);
    ``scale="none"``: ``r - mean``. Rows whose rewards are all equal are exactly 0.
    Integer or bool rewards give float64 (numpy) or the default float dtype (torch).
    """
    assert scale in SCALES and eps >= 0, f"scale={scale!r}, eps={eps}: validate advantage.* first"
    if not isinstance(rewards, (torch.Tensor, np.ndarray)):
        raise TypeError(f"rewards must be a torch.Tensor or np.ndarray, got {type(rewards).__name__}")
    if rewards.ndim != 2:
        raise ValueError(f"rewards must be 2-D [n_groups, G], got shape {tuple(rewards.shape)}")
    if isinstance(rewards, torch.Tensor):
        r = rewards if rewards.is_floating_point() else rewards.to(torch.get_default_dtype())
        if not torch.isfinite(r).all():
            raise ValueError("rewards contain NaN or inf")
        centred = r - r.mean(dim=1, keepdim=True)
        equal = (r == r[:, :1]).all(dim=1, keepdim=True)
        if scale == Scale.GROUP:
            centred = centred / (r.std(dim=1, unbiased=False, keepdim=True) + eps)
        return torch.where(equal, torch.zeros_like(centred), centred)
    r = rewards if np.issubdtype(rewards.dtype, np.floating) else rewards.astype(np.float64)
    if not np.isfinite(r).all():
        raise ValueError("rewards contain NaN or inf")
    centred = r - r.mean(axis=1, keepdims=True)
    equal = (r == r[:, :1]).all(axis=1, keepdims=True)
    if scale == Scale.GROUP:
        centred = centred / (r.std(axis=1, ddof=0, keepdims=True) + eps)
    return np.where(equal, np.zeros_like(centred), centred)


def pooled_advantages(rewards: Sequence[np.ndarray], keys: Sequence[str], scale: str = "group",
                      eps: float = 1e-6) -> list[np.ndarray]:
    """Advantages for groups where entries sharing a key are pooled (horizontal mode).

    ``rewards[i]`` is a 1-D array of one node's completions of prompt ``keys[i]``; all entries
    with the same key are normalised with the mean/std of their concatenation and split back.
    With unique keys this is exactly :func:`group_advantages` per entry (vertical mode).
    Returns float64 arrays with the shapes of ``rewards``.
    """
    if len(rewards) != len(keys):
        raise ValueError(f"rewards ({len(rewards)} entries) and keys ({len(keys)}) must have the "
                         "same length")
    arrays = []
    for i, r in enumerate(rewards):
        a = np.asarray(r, dtype=np.float64)
        if a.ndim != 1 or a.size == 0:
            raise ValueError(f"rewards[{i}] must be a non-empty 1-D array, got shape {a.shape}")
        arrays.append(a)
    out: list[np.ndarray] = [np.empty(0)] * len(arrays)
    for idx in _indices_by_key(keys):
        pooled = np.concatenate([arrays[i] for i in idx])[None, :]
        adv = group_advantages(pooled, scale=scale, eps=eps)[0]
        start = 0
        for i in idx:
            out[i] = adv[start:start + arrays[i].size]
            start += arrays[i].size
    return out


def _indices_by_key(keys: Sequence[str]) -> list[list[int]]:
    """Positions of the entries sharing each key, in first-seen key order."""
    by_key: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        by_key.setdefault(k, []).append(i)
    return list(by_key.values())


def pooled_rewards(rewards: Sequence[np.ndarray], keys: Sequence[str]) -> list[np.ndarray]:
    """The groups :func:`pooled_advantages` normalises over: entries sharing a key, concatenated."""
    return [np.concatenate([np.asarray(rewards[i]) for i in idx]) for idx in _indices_by_key(keys)]


def frac_zero_std_groups(rewards: np.ndarray | torch.Tensor | Sequence[np.ndarray]) -> float:
    """Fraction of groups whose rewards are all equal (their advantages are all 0).

    Accepts a 2-D array/tensor [n_groups, G] or a list of 1-D arrays; 0.0 for no groups.
    """
    if isinstance(rewards, torch.Tensor):
        rewards = rewards.detach().cpu().numpy()
    if isinstance(rewards, np.ndarray):
        if rewards.ndim != 2:
            raise ValueError(f"rewards must be 2-D [n_groups, G], got shape {rewards.shape}")
        rows = list(rewards)
    else:
        rows = [np.asarray(r) for r in rewards]
    if not rows:
        return 0.0
    equal = sum(1 for r in rows if r.size == 0 or bool(np.all(r == r.reshape(-1)[0])))
    return equal / len(rows)


def filter_mask(advantages: ArrayLike, kl: ArrayLike, foreign: ArrayLike, *, threshold: float,
                rule: str = "and", scope: str = "foreign") -> tuple[ArrayLike, ArrayLike, ArrayLike]:
    """Which samples the F-TIS filter removes (algorithm §6), and why. Torch or numpy, all [B].

    A sample is *eligible* if it is foreign (``scope="foreign"``) or always (``scope="all"``).
    With ``neg = A <= 0`` and ``far = not (kl <= g)`` (so a NaN KL counts as far, the safe
    side), an eligible sample is filtered when ``neg and far`` (rule ``"and"``) or
    ``neg or far`` (rule ``"or"``).

    Returns ``(filtered, filtered_negative, filtered_kl)`` where
    ``filtered_negative = filtered & neg`` and ``filtered_kl = filtered & far``: the causes that
    held for each filtered sample. Every filtered sample has at least one cause; under ``"and"``
    both masks equal ``filtered``, under ``"or"`` a sample may have both. ``filtered_negative``
    follows the paper's ``A <= 0`` test, so it includes ``A == 0`` samples: count those apart
    with ``filtered & (advantages == 0)`` (loss metrics report it as
    ``filtered_zero_advantage``).
    """
    assert rule in FILTER_RULES and scope in FILTER_SCOPES, f"rule={rule!r}, scope={scope!r}: validate first"
    shapes = {name: tuple(x.shape) for name, x in
              (("advantages", advantages), ("kl", kl), ("foreign", foreign))}
    if len(set(shapes.values())) != 1 or len(shapes["advantages"]) != 1:
        raise ValueError(f"advantages, kl and foreign must be 1-D of equal length, got {shapes}")
    if foreign.dtype not in (torch.bool, np.bool_):
        raise ValueError(f"foreign must be a bool mask, got dtype {foreign.dtype}")
    neg = advantages <= 0
    far = ~(kl <= threshold)
    eligible = foreign if scope == FilterScope.FOREIGN else (foreign | ~foreign)
    filtered = eligible & ((neg & far) if rule == FilterRule.AND else (neg | far))
    return filtered, filtered & neg, filtered & far


def g_for_round(schedule: GSchedule, default_g: float, round_idx: int, num_rounds: int) -> float:
    """The filter threshold g of one round (1-based) under a node's schedule.

    ``"constant"``: ``default_g`` (the LossConfig's kl_threshold). ``"linear"``: ``start`` at
    round 1, ``end`` at round ``num_rounds``, linear in between and clamped outside; with a
    single round, ``start``.
    """
    assert schedule.kind in G_KINDS and num_rounds >= 1, f"{schedule}, num_rounds={num_rounds}: validate first"
    if schedule.kind == GKind.CONSTANT:
        return float(default_g)
    if num_rounds == 1:
        return float(schedule.start)
    frac = min(max((round_idx - 1) / (num_rounds - 1), 0.0), 1.0)
    return float(schedule.start + frac * (schedule.end - schedule.start))
