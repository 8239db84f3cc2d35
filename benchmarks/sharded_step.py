"""A node's update on 1 and N ranks (FSDP2 over gloo on the CPU): step time and peak memory per rank.

    python -m benchmarks.sharded_step --preset cpu-pair --node large --ranks 2 --steps 3
    python -m benchmarks.sharded_step --preset cpu-smollm2 --node full --ranks 2 --steps 3

Builds the node once to sample its groups (``rounds.prompts_per_node`` prompts x G), then, for one
rank and for ``--ranks`` ranks (one process each, joined over gloo as a node's worker starts them),
takes ``--steps`` updates on those same groups and prints, per rank count, the median update time
and each rank's peak RSS (VmHWM: the node's model, its engine copy when sharded, optimiser state
and the update's activations). Medians over the steps after the first (a warm-up).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _peak_gib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024 ** 2
    return float("nan")


def _rank(rank: int, world: int, port: int, job_path: str, out_path: str) -> None:
    """One rank: build the node, take the updates, write its timings (every rank its own file)."""
    from ftis_flwr.node.host.rank_group import join
    from ftis_flwr.node.host.ranks import SINGLE, Ranks
    from ftis_flwr.node.node import Node

    job = pickle.loads(Path(job_path).read_bytes())
    if world > 1:
        join(rank, world, port, "cpu")
    node = Node(job["card"], job["exp"], cache_dir=job["cache"],
                ranks=Ranks(rank, world) if world > 1 else SINGLE)
    times = []
    for step in range(job["steps"]):
        t0 = time.perf_counter()
        node.train(job["groups"], step + 1, job["steps"] + 1)
        times.append(time.perf_counter() - t0)
    Path(f"{out_path}.{rank}").write_text(json.dumps({"times": times, "peak_gib": _peak_gib()}))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch(world: int, job_path: Path, out: Path) -> list[dict]:
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "benchmarks.sharded_step", "--rank", str(r), "--world", str(world),
                               "--port", str(port), "--job", str(job_path), "--out", str(out)], cwd=ROOT)
             for r in range(world)]
    try:
        codes = [p.wait() for p in procs]
    finally:
        for p in procs:  # stopped by pid whatever happened
            if p.poll() is None:
                p.kill()
    if any(codes):
        raise SystemExit(f"a rank failed (exit codes {codes})")
    return [json.loads(Path(f"{out}.{r}").read_text()) for r in range(world)]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="cpu-pair")
    p.add_argument("--node", default="large")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--job", default="", help=argparse.SUPPRESS)
    p.add_argument("--out", default="", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.rank >= 0:
        return _rank(a.rank, a.world, a.port, a.job, a.out)
    from ftis_flwr.config.schema import default_cache_dir
    from ftis_flwr.experiment import load_experiment
    from ftis_flwr.node.node import Node

    exp = load_experiment(a.preset, overrides={"advantage.mode": "alone"})
    card = next(c for c in exp.nodes if c.name == a.node)
    cache = default_cache_dir(exp.cache_dir)
    node = Node(card, exp, cache_dir=cache)
    groups = node.generate(list(range(exp.rounds.prompts_per_node)), exp.rollout.group_size, 0)
    del node
    samples = sum(g.size for g in groups)
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.pkl"
        job.write_bytes(pickle.dumps({"exp": exp, "card": card, "cache": cache, "groups": groups,
                                      "steps": a.steps + 1}))
        print(f"# {a.preset} node {a.node} ({card.source}{', LoRA' if card.lora else ''}): {samples} samples, "
              f"micro-batch {exp.train.micro_batch_size}, {a.steps} timed updates after one warm-up; "
              f"{os.cpu_count()} cores", flush=True)
        print("| ranks | update s (median) | peak RSS per rank GiB |\n| --- | --- | --- |")
        for world in (1, a.ranks):
            ranks = _launch(world, job, Path(tmp) / f"out{world}")
            step = statistics.median(t for r in ranks for t in r["times"][1:])
            peaks = " / ".join(f"{r['peak_gib']:.2f}" for r in ranks)
            print(f"| {world} | {step:.2f} | {peaks} |", flush=True)


if __name__ == "__main__":
    main()
