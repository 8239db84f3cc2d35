"""The paper-sized node on a GPU, without the hub: measured memory and time vs ``ftis_flwr.config.plan``.

    python -m benchmarks.gpu_check --model Qwen/Qwen2.5-1.5B [--dtype float32] [--out results.json]

Builds the model's *architecture* with random weights (nothing is downloaded; memory and time
do not depend on the values), then runs what one paper round asks of a node: the HF engine
samples G=12 completions for 12 prompts of 256 tokens up to 640 new tokens (random weights never
emit EOS, so every completion is full length: the worst case), and one F-TIS update over those
144 samples with micro-batches of 8 and AdamW. Prints the peak CUDA memory of each phase next to
the plan's estimate, tokens/s, and the on-policy check: |learner - engine| log-prob of the
sampled tokens (float32, and bfloat16 autocast). Then the same update through the sharded
learner's path (``ModelCard.ranks``; :mod:`ftis_flwr.node.sharding`): FSDP2 on a process group of
one rank (NCCL), the engine's plain copy beside it, and the copy's refresh after the step; its
peak memory is printed beside the plan's one-rank figure plus the copy. Needs a CUDA GPU
(``--device cpu`` runs the same phases on the CPU, gloo, as a smoke test of the script).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

import torch

from ftis_flwr.config.plan import GIB, KNOWN, PROMPT_TOKENS, estimate
from ftis_flwr.config.schema import ExperimentConfig, LossConfig, ModelCard
from ftis_flwr.maths.loss import LossInputs, compute_loss
from ftis_flwr.node.engines.hf import HFEngine
from ftis_flwr.node.logprobs import completion_logprobs, pack_batch
from ftis_flwr.node.sharding import norm_value, plain_copy, shard, sync_copy


class _Tok:
    """The engine needs only EOS/pad ids and a length from a tokenizer."""

    def __init__(self, vocab: int):
        self.vocab, self.eos_token_id, self.pad_token_id = vocab, 0, 0

    def __len__(self) -> int:
        return self.vocab


def _peak() -> float:
    if not torch.cuda.is_available():
        return float("nan")  # a CPU smoke run (--device cpu) measures no memory
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / GIB


def _reset() -> None:
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def _update(model, samples, a, vocab_tokens) -> tuple[list[float], float]:
    """One F-TIS update over ``samples`` in micro-batches, AdamW; -> (own log-prob gaps, grad norm)."""
    params = [q for q in model.parameters() if q.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-6)
    gaps = []
    model.train()
    for start in range(0, len(samples), a.micro_batch):
        chunk = samples[start:start + a.micro_batch]
        batch = pack_batch([c[0] for c in chunk], [c[1].tokens for c in chunk], pad_id=0)
        lp = completion_logprobs(model, batch, vocab_size=vocab_tokens)
        gen = torch.zeros_like(lp)
        for i, (_, s) in enumerate(chunk):
            gen[i, :len(s.logprobs)] = torch.from_numpy(s.logprobs).to(a.device)
        mask = batch.completion_mask.to(a.device).bool()
        gaps.append((lp.detach() - gen).abs()[mask].max().item())
        out = compute_loss(LossInputs(lp, gen, torch.randn(len(chunk), device=a.device), mask,
                                      torch.zeros(len(chunk), dtype=torch.bool, device=a.device)),
                           LossConfig(method="f-tis"))
        out.loss_sum.backward()
    norm = norm_value(torch.nn.utils.clip_grad_norm_(params, 1.0))
    opt.step()
    opt.zero_grad(set_to_none=True)
    return gaps, norm


def _sharded(model, samples, a, vocab_tokens, est) -> dict:
    """The update through the sharded learner's path on a one-rank process group: FSDP2 groups per
    decoder layer, the engine's plain copy, its refresh after the step."""
    import os

    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29561")
    dist.init_process_group("nccl" if a.device != "cpu" else "gloo", rank=0, world_size=1)
    try:
        twin = plain_copy(model)
        groups = shard(model, a.device)
        _reset()
        t0 = time.perf_counter()
        _, norm = _update(model, samples, a, vocab_tokens)
        _peak()
        update_s, peak = time.perf_counter() - t0, _peak()
        t0 = time.perf_counter()
        sync_copy(twin, model)
        sync_s = time.perf_counter() - t0
    finally:
        dist.destroy_process_group()
    return {"fsdp_groups": groups, "fsdp_update_s": update_s, "fsdp_update_peak_GiB": peak,
            "fsdp_copy_sync_s": sync_s, "fsdp_grad_norm": norm,
            "fsdp_estimate_GiB": (est.total + est.weights) / GIB}  # one rank's figure plus the copy


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="Qwen/Qwen2.5-1.5B", choices=sorted(k for k in KNOWN if "/" in k))
    p.add_argument("--dtype", default="float32")
    p.add_argument("--prompts", type=int, default=12)
    p.add_argument("--group", type=int, default=12)
    p.add_argument("--new-tokens", type=int, default=640)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--out", default="")
    p.add_argument("--device", default="cuda")
    a = p.parse_args()
    from transformers import AutoModelForCausalLM, Qwen2Config

    arch = KNOWN[a.model]
    vocab_tokens = 151665  # Qwen2.5's tokenizer: the model has arch.vocab rows (spare rows masked)
    cfg = Qwen2Config(hidden_size=arch.hidden, num_hidden_layers=arch.layers,
                      num_attention_heads=arch.heads, num_key_value_heads=arch.kv_heads,
                      intermediate_size=arch.intermediate, vocab_size=arch.vocab,
                      tie_word_embeddings=arch.tied, max_position_embeddings=4096)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[a.dtype]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).to(a.device)
    model.generation_config.eos_token_id = 0
    n = a.prompts * a.group
    exp = ExperimentConfig()
    exp.rollout.max_new_tokens, exp.rollout.batch_size = a.new_tokens, n
    exp.train.micro_batch_size = a.micro_batch
    est = estimate(ModelCard(name="node", source=a.model, dtype=a.dtype), exp)
    res: dict = {"model": a.model, "dtype": a.dtype,
                 "gpu": torch.cuda.get_device_name() if a.device != "cpu" else "cpu",
                 "params": est.params, "estimate_GiB": {k: getattr(est, k) / GIB for k in
                 ("weights", "gradients", "optimizer", "kv_cache", "activations", "total")}}
    res["after_load_GiB"] = _peak()

    engine = HFEngine(model, _Tok(vocab_tokens), vocab_size=vocab_tokens, eos_token_ids=[0])
    prompts = torch.randint(1, vocab_tokens, (a.prompts, PROMPT_TOKENS)).tolist()
    _reset()
    t0 = time.perf_counter()
    groups = engine.sample(prompts, a.group, temperature=1.0, max_new_tokens=a.new_tokens,
                           batch_size=n, generator_seed=1)
    _peak()
    gen_s = time.perf_counter() - t0
    toks = sum(len(s.tokens) for g in groups for s in g)
    res.update(generate_s=gen_s, generate_tok_per_s=toks / gen_s, generate_peak_GiB=_peak(),
               max_sampled_id=max(int(s.tokens.max()) for g in groups for s in g))

    samples = [(prompts[i], s) for i, g in enumerate(groups) for s in g]
    _reset()
    t0 = time.perf_counter()
    gaps, _ = _update(model, samples, a, vocab_tokens)
    _peak()
    res.update(update_s=time.perf_counter() - t0, update_peak_GiB=_peak(),
               own_logprob_gap_max=max(gaps))

    # bf16 autocast: the same check on a short generation (what compute_dtype: bfloat16 does)
    with torch.autocast(a.device, dtype=torch.bfloat16):
        g2 = engine.sample(prompts[:2], 4, max_new_tokens=64, batch_size=8, generator_seed=2)
        chunk = [(prompts[i], s) for i, g in enumerate(g2) for s in g]
        batch = pack_batch([c[0] for c in chunk], [c[1].tokens for c in chunk], pad_id=0)
        with torch.no_grad():
            lp = completion_logprobs(model, batch, vocab_size=vocab_tokens)
    gen = torch.zeros_like(lp)
    for i, (_, s) in enumerate(chunk):
        gen[i, :len(s.logprobs)] = torch.from_numpy(s.logprobs).to(a.device)
    mask = batch.completion_mask.to(a.device).bool()
    d = (lp - gen).abs()[mask]
    res.update(bf16_autocast_gap_max=d.max().item(), bf16_autocast_gap_mean=d.mean().item())
    print(json.dumps(res, indent=1), flush=True)
    res.update(_sharded(model, samples, a, vocab_tokens, est))
    print(json.dumps({k: v for k, v in res.items() if k.startswith("fsdp")}, indent=1), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
