"""The weights a vLLM engine loads, cut to the tokenizer, and the two ways updates reach it.

**Output rows = the tokenizer.** Some models carry spare embedding and output rows past their
tokenizer (Qwen2.5: 151,936 rows for 151,665 tokens). A sampler must never draw one, and the way
to say so per request (``allowed_token_ids``) is capped at 1,024 ids by vLLM's GPU sampler
(:mod:`ftis_flwr.node.engines.vllm_limits`). So the folder vLLM loads holds a model whose input
and output embeddings have exactly the tokenizer's rows and whose ``config.json`` says so
(``vocab_size``); every weight update is cut the same way. The kept rows are the learner's
first ``vocab`` rows unchanged, so the engine's distribution is the learner's over the tokenizer
(``completion_logprobs`` renormalises over the same rows).

**Updates.** ``file``: the weights go to one safetensors file that vLLM's worker reloads in
place (``collective_rpc("reload_weights", weights_path=...)``; ``vllm/v1/worker/gpu_model_runner.py``
and the CPU runner). ``ipc``: vLLM 0.33's weight-transfer API with its CUDA IPC backend
(``vllm/entrypoints/rl/offline.py``: ``init_weight_transfer_engine``, ``start_weight_update``,
``update_weights``, ``finish_weight_update``; ``vllm/distributed/weight_transfer/ipc_engine.py``,
``IPCWeightTransferUpdateInfo``): the learner's CUDA tensors are shared with the engine's worker
by handle, with no copy through the disk. Only the file path has run (on vLLM's CPU build).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

__all__ = ["base_state_dict", "cut_rows", "engine_tensors", "engine_weights", "ipc_update_info", "is_peft",
           "output_row_names", "refuse_vocabulary_adapters", "trainable_checkpoint_weights", "vocabulary_modules",
           "write_base", "write_weights"]


def is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def plain(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under a peft wrapper (the model itself without one)."""
    return model.get_base_model() if is_peft(model) else model


def base_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights under plain transformers names: a peft model's base weights without
    its adapters (``...q_proj.base_layer.weight`` -> ``...q_proj.weight``, ``lora_*`` dropped)."""
    out = {}
    for name, tensor in plain(model).state_dict().items():
        if "lora_" in name or "modules_to_save" in name:
            continue
        out[name.replace(".base_layer.", ".")] = tensor
    return out


def trainable_checkpoint_weights(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Every parameter of a fully fine-tuned model, under checkpoint names, detached (on the
    model's device); shared (tied) tensors once."""
    seen, out = set(), []
    for name, p in model.named_parameters():  # named_parameters lists a tied tensor once
        if id(p) in seen:
            continue
        seen.add(id(p))
        out.append((name, p.detach()))
    return out


def vocabulary_modules(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Path -> module of the layers with one row per vocabulary entry: the input embedding and
    the output layer (under a peft wrapper too)."""
    base = plain(model)
    wanted = {id(m) for m in (base.get_input_embeddings(), base.get_output_embeddings()) if m is not None}
    return {path: module for path, module in base.named_modules() if id(module) in wanted}


def output_row_names(model: torch.nn.Module) -> set[str]:
    """The checkpoint names of the tensors with one row per vocabulary entry: the input
    embedding's and the output layer's weight (and bias, where it has one)."""
    names = set()
    for path, module in vocabulary_modules(model).items():
        for p_name, _ in module.named_parameters(recurse=False):
            names.add(f"{path}.{p_name}" if path else p_name)
    return {n.replace(".base_layer.", ".") for n in names}


def cut_rows(weights: Iterable[tuple[str, torch.Tensor]], names: set[str],
             vocab: int) -> list[tuple[str, torch.Tensor]]:
    """``weights`` with the tensors named in ``names`` cut to their first ``vocab`` rows (a view:
    no copy); a tensor with fewer rows than ``vocab`` is an error (tokenizer and model disagree)."""
    out = []
    for name, t in weights:
        if name in names:
            if t.shape[0] < vocab:
                raise ValueError(f"VLLMEngine: {name} has {t.shape[0]} rows, fewer than the tokenizer's {vocab} tokens")
            t = t[:vocab]
        out.append((name, t))
    return out


def write_base(model: torch.nn.Module, tokenizer: Any, folder: Path, vocab: int) -> None:
    """Config, generation config, tokenizer and safetensors weights of the (base) model, its
    vocabulary rows cut to ``vocab``, for vLLM to load."""
    from safetensors.torch import save_file

    base = plain(model)
    folder.mkdir(parents=True, exist_ok=True)
    base.config.save_pretrained(folder)
    _set_vocab_size(folder / "config.json", vocab)
    gen = getattr(base, "generation_config", None)
    if gen is not None:
        gen.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    tensors, seen = {}, set()
    state = base_state_dict(model)
    for name, t in cut_rows(state.items(), output_row_names(model), vocab):
        ptr = state[name].data_ptr()
        if ptr in seen:  # tied weights: safetensors refuses shared storage; vLLM re-ties
            continue
        seen.add(ptr)
        tensors[name] = t.detach().to("cpu").contiguous().clone()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def _set_vocab_size(config_json: Path, vocab: int) -> None:
    """Write ``vocab_size`` into a saved config (and its text config, for multimodal wrappers)."""
    cfg = json.loads(config_json.read_text())
    cfg["vocab_size"] = int(vocab)
    if isinstance(cfg.get("text_config"), dict):
        cfg["text_config"]["vocab_size"] = int(vocab)
    config_json.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def engine_weights(model: torch.nn.Module, vocab: int) -> list[tuple[str, torch.Tensor]]:
    """A fully fine-tuned model's parameters as the engine takes them: checkpoint names, tied
    tensors once, vocabulary rows cut to ``vocab``; still on the model's device."""
    return cut_rows(trainable_checkpoint_weights(model), output_row_names(model), vocab)


def write_weights(model: torch.nn.Module, folder: Path, vocab: int) -> None:
    """The ``file`` update: every parameter in one safetensors file (written then renamed, so
    the worker never reads half a file), with the config vLLM's reload expects beside it."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    plain(model).config.save_pretrained(folder)
    _set_vocab_size(folder / "config.json", vocab)
    tensors = {name: t.to("cpu").contiguous() for name, t in engine_weights(model, vocab)}
    tmp = folder / "model.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.replace(folder / "model.safetensors")


def ipc_update_info(weights: list[tuple[str, torch.Tensor]], gpu_uuid: str,
                    reduce: Callable[[torch.Tensor], tuple[Any, tuple]] | None = None) -> dict[str, Any]:
    """The ``update_info`` of one unpacked CUDA IPC update (``IPCWeightTransferUpdateInfo``):
    names, dtype names, shapes and, per tensor, ``{gpu_uuid: rebuild args}`` from
    ``torch.multiprocessing.reductions.reduce_tensor``, pickled and base64-encoded
    (``ipc_handles_pickled``, which vLLM's worker accepts with ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``).
    The tensors must stay alive until ``finish_weight_update`` returns. ``reduce`` is that
    function; it is an argument only so that the rest can be checked without a GPU."""
    import base64
    import pickle

    if reduce is None:
        from torch.multiprocessing.reductions import reduce_tensor as reduce
    handles = [{gpu_uuid: reduce(t.contiguous())[1]} for _, t in weights]
    return {"names": [n for n, _ in weights],
            "dtype_names": [str(t.dtype).removeprefix("torch.") for _, t in weights],
            "shapes": [list(t.shape) for _, t in weights],
            "ipc_handles_pickled": base64.b64encode(pickle.dumps(handles)).decode("ascii")}


def refuse_vocabulary_adapters(model: Any) -> None:
    """A LoRA adapter on the embedding or the output layer would have the learner's row count,
    not the engine's (cut to the tokenizer): refused, naming the module."""
    cfg = next(iter(model.peft_config.values()))
    touched = set(getattr(cfg, "modules_to_save", None) or ())
    targets = getattr(cfg, "target_modules", None) or ()
    touched |= {targets} if isinstance(targets, str) else set(targets)
    rows = {path.rsplit(".", 1)[-1] for path in vocabulary_modules(model)}
    bad = sorted(touched & rows)
    if bad:
        raise ValueError(f"VLLMEngine: the LoRA adapter trains {', '.join(bad)}, the vocabulary layers, which "
                         "the vLLM engine serves cut to the tokenizer's rows: adapt the attention/MLP "
                         "projections only (lora_config.target_modules) or use engine=hf")


def engine_tensors(model: torch.nn.Module, vocab: int) -> list[torch.Tensor]:
    """The tensors vLLM holds for ``model``: its base weights (tied ones once), rows cut."""
    state, seen, out = base_state_dict(model), set(), []
    for name, t in cut_rows(state.items(), output_row_names(model), vocab):
        if state[name].data_ptr() not in seen:
            seen.add(state[name].data_ptr())
            out.append(t)
    return out
