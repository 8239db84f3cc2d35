"""The learner sharded with FSDP2, and the full copies a sharded node still needs.

Why: a node whose parameters, gradients and Adam state do not fit one device splits them over its
ranks with PyTorch's ``fully_shard`` (FSDP2; what prime-rl and verl use), one group per decoder
layer plus the root, so a forward gathers one layer at a time. What needs the whole model keeps a
plain, unsharded copy, refreshed from the learner after every update (:func:`sync_copy`):

- the rollout engine samples and evaluates on it, each rank on its own prompts, with no collective
  in the decoding loop (a sharded forward would need every rank to decode the same number of
  steps; TRL gathers ZeRO-3 weights for generation for the same reason, and vLLM engines hold
  their own copy anyway);
- the final checkpoint and the saved state are written from it (rank 0), as plain full weights
  that ``from_pretrained`` loads.

The copy holds the full weights once per rank; gradients and optimiser state, the larger part of
full fine-tuning with Adam, stay sharded (``ftis-flwr plan`` counts both).

Saved optimiser state is the one-rank layout (``optimizer.state_dict()``: parameters by index in
the order of the trainable parameters), whatever the rank count, so a run resumes with another
``ranks`` (:func:`full_optimizer_state`, :func:`load_optimizer_state`).
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


def _layer_classes(model: torch.nn.Module) -> set[str]:
    """Class names of the model's repeated blocks (transformers' ``_no_split_modules``)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(inner, "_no_split_modules", None) or ())
    if not names:
        raise ValueError(f"{type(inner).__name__} names no decoder layer class (_no_split_modules): "
                         "cannot shard it layer by layer")
    return names


def _mixed_dtype_parts(block: torch.nn.Module) -> list[torch.nn.Module]:
    """Sub-modules of ``block`` that own trainable parameters of another dtype than the block's
    frozen ones (LoRA adapters in float32 on bfloat16 weights): FSDP2 gathers one dtype per group,
    so each becomes a group of its own."""
    frozen = {p.dtype for p in block.parameters() if not p.requires_grad}
    if not frozen:
        return []
    return [m for m in block.modules() if m is not block
            and any(p.requires_grad and p.dtype not in frozen for p in m.parameters(recurse=False))]


def shard(model: torch.nn.Module, device: str) -> int:
    """Apply ``fully_shard`` to every decoder layer and the root, in place; -> number of groups."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cuda" if device.startswith("cuda") else "cpu", (dist.get_world_size(),))
    classes, groups = _layer_classes(model), 0
    for block in [m for m in model.modules() if type(m).__name__ in classes]:
        for part in _mixed_dtype_parts(block):
            fully_shard(part, mesh=mesh)
            groups += 1
        fully_shard(block, mesh=mesh)
        groups += 1
    fully_shard(model, mesh=mesh)
    return groups + 1


def plain_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of the model before it is sharded: the engine's and the checkpoint's."""
    twin = copy.deepcopy(model)
    for p in twin.parameters():
        p.requires_grad_(False)  # never trained; refreshed by sync_copy
    return twin


def trainable_names(model: torch.nn.Module) -> list[str]:
    """The trainable parameters' names, in the order the optimiser holds them."""
    return [n for n, p in model.named_parameters() if p.requires_grad]


def full_trainable(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trainable parameters, whole, on every rank (a collective: every rank calls it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                ignore_frozen_params=True))
    return {n: full[n] for n in trainable_names(model)}


@torch.no_grad()
def sync_copy(twin: torch.nn.Module, model: torch.nn.Module) -> None:
    """Copy the learner's trainable parameters into the plain copy (a collective)."""
    params = dict(twin.named_parameters())
    for name, value in full_trainable(model).items():
        params[name].copy_(value.to(params[name].device, params[name].dtype))


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimiser's state in the one-rank layout, on rank 0 (other ranks get {}; a collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    full = get_optimizer_state_dict(model, optimizer,
                                    options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not full:
        return {}
    index = {name: i for i, name in enumerate(trainable_names(model))}
    return {"state": {index[name]: state for name, state in full["state"].items()},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in full["param_groups"]]}


def load_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                         state: dict[str, Any]) -> None:
    """Load a one-rank-layout optimiser state into a sharded optimiser (every rank passes it whole)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = trainable_names(model)
    fqn = {"state": {names[int(i)]: s for i, s in state["state"].items()},
           "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]}
                            for g in state["param_groups"]]}
    set_optimizer_state_dict(model, optimizer, optim_state_dict=fqn,
                             options=StateDictOptions(full_state_dict=True))


def load_trainable(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Load whole trainable parameters into the sharded learner (every rank passes them whole)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    # a copy of the dict: set_model_state_dict puts the shards it makes back into the one it is given
    set_model_state_dict(model, dict(tensors), options=StateDictOptions(full_state_dict=True, strict=False))


def norm_value(total: torch.Tensor) -> float:
    """``clip_grad_norm_``'s result as a float (a DTensor on a sharded learner)."""
    full = getattr(total, "full_tensor", None)
    return float(full() if full is not None else total)
