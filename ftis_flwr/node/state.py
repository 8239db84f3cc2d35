"""A node's training state on disk, so that a worker that dies (or a run that restarts) resumes.

Why: a worker holds a node's only copy of its trained weights, optimiser moments, update count
and the groups it generated last round (the next round trains on them). Losing the process must
not silently put the base model back in the federation (issue 7). After a round the worker
saves, every ``rounds.state_every`` rounds, into ``<worker dir>/state/round-NNNNNN/``:

- ``trainable.safetensors``: the trainable parameters only (all weights, or the LoRA adapter),
  whole whatever the node's rank count (a sharded node's rank 0 writes it, and every rank reads
  it: a run may resume with another ``ranks``);
- ``state.pt``: the optimiser's state dict and torch's RNG state (loaded with weights_only);
- ``pending.npz`` + ``state.json``: last round's own groups (exact float32 log-probs, no
  pickle), the round, the update counter and what the state belongs to (card, model, tokenizer).

Each save is written to a temporary folder and renamed, so a crash mid-save leaves the previous
state whole; the newest :data:`KEEP` are kept (a replayed round needs the one before it).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ftis_flwr.node.host.ranks import SINGLE
from ftis_flwr.node.sharding import full_optimizer_state, load_optimizer_state, load_trainable, trainable_names
from ftis_flwr.wire.groups import Group

log = logging.getLogger(__name__)

VERSION = 1
KEEP = 2
"""Saved rounds kept per node: the newest, and the one before it (to replay a round)."""
_ROUND_DIR = re.compile(r"round-(\d{6})")


class StateError(RuntimeError):
    """A saved state that does not belong to this node or cannot be read; the message says why."""


@dataclass
class SaveInfo:
    round: int
    path: Path
    seconds: float
    nbytes: int


def saved_rounds(root: Path) -> list[int]:
    """Rounds with a complete saved state under ``root``, oldest first."""
    if not Path(root).is_dir():
        return []
    found = (_ROUND_DIR.fullmatch(p.name) for p in Path(root).iterdir())
    return sorted(int(m.group(1)) for m in found if m)


def _identity(node) -> dict:
    return {"card": node.card.name, "model_id": node.policy.model_id, "tokenizer_fp": node.fingerprint,
            "lora": bool(node.card.lora)}


def save_state(node, root: Path, round_idx: int) -> SaveInfo:
    """Write ``node``'s state after ``round_idx`` under ``root`` (atomically) and prune old ones."""
    t0 = time.perf_counter()
    ranks = getattr(node, "ranks", SINGLE)
    optimizer = full_optimizer_state(node.model, node.optimizer) if ranks.sharded else node.optimizer.state_dict()
    if not ranks.leader:  # the state is whole on rank 0, which writes it
        return SaveInfo(int(round_idx), Path(root) / f"round-{int(round_idx):06d}", time.perf_counter() - t0, 0)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    from safetensors.torch import save_file

    whole = dict(getattr(node, "engine_model", node.model).named_parameters())  # full on any rank count
    trainable = {n: whole[n].detach().to("cpu").contiguous() for n in trainable_names(node.model)}
    save_file(trainable, str(tmp / "trainable.safetensors"))
    torch.save({"optimizer": optimizer, "torch_rng": torch.get_rng_state()},
               tmp / "state.pt")
    arrays, groups = {}, []
    for i, g in enumerate(node.pending):
        arrays[f"p{i}"] = np.asarray(g.prompt_tokens)
        arrays[f"r{i}"] = np.asarray(g.rewards, dtype=np.float32)
        for j, (c, lp) in enumerate(zip(g.completions, g.logprobs)):
            arrays[f"c{i}_{j}"] = np.asarray(c)
            arrays[f"l{i}_{j}"] = np.asarray(lp, dtype=np.float32)
            if g.sampled_masks is not None:  # an episode's sampled tokens (Group.sampled_masks)
                arrays[f"m{i}_{j}"] = np.asarray(g.sampled_masks[j], dtype=np.uint8)
        groups.append({"prompt_id": g.prompt_id, "node": g.node, "model_id": g.model_id,
                       "tokenizer_fp": g.tokenizer_fp, "size": g.size})
    np.savez(tmp / "pending.npz", **arrays)
    (tmp / "state.json").write_text(json.dumps({
        "version": VERSION, "round": int(round_idx), "updates": int(node.updates),
        "identity": _identity(node), "groups": groups, "saved_at": time.time()}, indent=1))
    final = root / f"round-{int(round_idx):06d}"
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    for old in saved_rounds(root)[:-KEEP]:
        shutil.rmtree(root / f"round-{old:06d}", ignore_errors=True)
    nbytes = sum(f.stat().st_size for f in final.iterdir())
    return SaveInfo(int(round_idx), final, time.perf_counter() - t0, nbytes)


def load_state(node, root: Path, at_most: int | None = None) -> int | None:
    """Load the newest saved state with round <= ``at_most`` into ``node``; its round, or None.

    Refuses (StateError) a state saved by another card, model or tokenizer, so a changed
    experiment never trains on top of weights it did not make.
    """
    rounds = [r for r in saved_rounds(root) if at_most is None or r <= at_most]
    if not rounds:
        return None
    folder = Path(root) / f"round-{rounds[-1]:06d}"
    try:
        info = json.loads((folder / "state.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise StateError(f"cannot read {folder / 'state.json'}: {exc}") from exc
    if info.get("version") != VERSION:
        raise StateError(f"{folder} has state version {info.get('version')!r}, this code reads {VERSION}")
    if info["identity"] != _identity(node):
        raise StateError(f"{folder} belongs to {info['identity']}, not to this node {_identity(node)}: "
                         "the experiment changed; start a new run (or delete that folder)")
    from safetensors.torch import load_file

    tensors = load_file(str(folder / "trainable.safetensors"))
    expected = set(trainable_names(node.model))
    if set(tensors) != expected:
        raise StateError(f"{folder}: saved parameters {sorted(set(tensors) ^ expected)[:5]} do not "
                         "match this node's trainable parameters")
    ranks = getattr(node, "ranks", SINGLE)
    if ranks.sharded:
        load_trainable(node.model, tensors)
    params = dict(getattr(node, "engine_model", node.model).named_parameters())
    with torch.no_grad():
        for name, value in tensors.items():
            params[name].copy_(value.to(params[name].device, params[name].dtype))
    extra = torch.load(folder / "state.pt", weights_only=True, map_location="cpu")
    if ranks.sharded:  # saved in the one-rank layout, whatever the rank count that saved it
        load_optimizer_state(node.model, node.optimizer, extra["optimizer"])
    else:
        node.optimizer.load_state_dict(extra["optimizer"])
    torch.set_rng_state(extra["torch_rng"])
    with np.load(folder / "pending.npz", allow_pickle=False) as z:
        node.pending = [Group(
            prompt_id=g["prompt_id"], prompt_tokens=z[f"p{i}"],
            completions=[z[f"c{i}_{j}"] for j in range(g["size"])],
            logprobs=[z[f"l{i}_{j}"] for j in range(g["size"])], rewards=z[f"r{i}"],
            node=g["node"], model_id=g["model_id"], tokenizer_fp=g["tokenizer_fp"],
            sampled_masks=[z[f"m{i}_{j}"] for j in range(g["size"])] if f"m{i}_0" in z else None)
            for i, g in enumerate(info["groups"])]
    node.updates = int(info["updates"])
    node.round = int(info["round"])
    sync = getattr(getattr(node, "engine", None), "sync_weights", None)
    if sync is not None:  # an engine with its own copy of the weights (vLLM) must see these
        sync(getattr(node, "engine_model", node.model))
    return node.round
