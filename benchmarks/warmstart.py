"""Calibrate the tiny models' supervised warm-start: accuracy on test/ood against steps and time.

    PYTHONPATH=. python -m benchmarks.warmstart --size small --ops +- --seeds 0,1,2

Trains one model per seed exactly as ``tiny.warm_start`` would (same recipe and early stop at
``ModelCard.warmstart_target``, but nothing cached) and prints steps run, training seconds, steps/s
and greedy exact match on ``test`` and ``ood``, overall and per operation. ``--eval-every N``
adds greedy evaluations along the way (not counted in the training time).
"""

from __future__ import annotations

import argparse
import logging

import torch

from ftis_flwr.config.schema import ModelCard
from ftis_flwr.node.tiny.models import build_char_tokenizer, train_tiny
from ftis_flwr.tasks import ArithmeticTask, op_of


@torch.no_grad()
def greedy_accuracy(model, tok, problems, batch: int = 500) -> dict[str, float]:
    """Exact match of greedy completions (special tokens skipped, whitespace stripped)."""
    model.eval()
    hits: dict[str, list[int]] = {"+": [], "-": []}
    for i in range(0, len(problems), batch):
        chunk = problems[i:i + batch]
        enc = tok([p.question for p in chunk], return_tensors="pt", padding=True,
                  add_special_tokens=False)
        out = model.generate(**enc, do_sample=False, max_new_tokens=5,
                             pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
        texts = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        for p, t in zip(chunk, texts):
            hits[op_of(p)].append(int(t.strip() == p.gold))
    every = hits["+"] + hits["-"]
    res = {"all": sum(every) / len(every)}
    for op, h in hits.items():
        if h:
            res[op] = sum(h) / len(h)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="small", choices=["small", "large"])
    ap.add_argument("--ops", default="+-")
    ap.add_argument("--steps", type=int, default=None, help="max steps (default: the card default)")
    ap.add_argument("--target", type=float, default=None,
                    help="stop accuracy (default: ModelCard.warmstart_target; 0 = run all steps)")
    ap.add_argument("--eval-every", type=int, default=0, help="greedy test/ood every N steps (0: end only)")
    ap.add_argument("--seeds", default="0", help="comma-separated model seeds")
    ap.add_argument("--task-seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    task = ArithmeticTask(seed=args.task_seed)
    test, ood = task.problems("test"), task.problems("ood")
    tok = build_char_tokenizer()

    def fmt(r: dict[str, float]) -> str:
        return f"{r['all']:.3f} (+ {r.get('+', float('nan')):.3f}, - {r.get('-', float('nan')):.3f})"

    def evaluate(model) -> str:
        return f"test {fmt(greedy_accuracy(model, tok, test))}  ood {fmt(greedy_accuracy(model, tok, ood))}"

    for seed in [int(s) for s in args.seeds.split(",")]:
        card = ModelCard(name="bench", tiny_size=args.size, warmstart_ops=args.ops, seed=seed,
                         torch_threads=args.threads)
        if args.steps is not None:
            card.warmstart_steps = args.steps
        if args.target is not None:
            card.warmstart_target = args.target

        def on_step(step: int, model) -> None:
            if args.eval_every and step % args.eval_every == 0:
                print(f"  step {step:5d}  {evaluate(model)}", flush=True)

        model, _, report = train_tiny(card, task, callback=on_step)
        print(f"size={args.size} ops={args.ops} seed={seed} threads={args.threads} "
              f"params={report['params']} steps={report['steps_run']}/{card.warmstart_steps} "
              f"train_s={report['seconds']:.1f} steps/s={report['steps_per_second']:.1f} "
              f"check={report['train_exact_match']:.3f}  {evaluate(model)}", flush=True)


if __name__ == "__main__":
    main()
