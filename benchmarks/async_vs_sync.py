"""Synchronous rounds vs the asynchronous schedule (exchange.schedule=async), over seeds.

    python -m benchmarks.async_vs_sync --seeds 0-2 --set rounds.num_rounds=20 \
        rounds.eval_every=5 rounds.eval_size=200 --out runs/async-vs-sync

Runs ``simulations/seeds.py`` twice per seed (resumable: a finished seed is kept), once with each
schedule, then reads every run's ``metrics.jsonl`` and prints, per schedule, mean and range over
seeds of:

- each node's idle fraction (rounds 1..R: the share of its round it did not compute);
- the run's wall time (the last row's ``elapsed``);
- each node's final held-out accuracy;
- the time to the synchronous run's final mean accuracy (same seed): the first moment the mean
  of every node's latest evaluation reaches it ("-" if never).

The default federation is the offline default (preset cpu-pair): the small model is the fast
node, the large one about twice as slow. Timings share the machine with whatever else runs: run
both schedules under the same load (they alternate per seed).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

from simulations.runs import seed_list

REPO = Path(__file__).resolve().parent.parent

SPLIT = "test"


def rows(run_dir: str | Path) -> list[dict]:
    with open(Path(run_dir) / "metrics.jsonl") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def figures(run_dir: str | Path) -> dict:
    """Idle fraction and final accuracy per node, wall time, and the mean-accuracy curve."""
    data = rows(run_dir)
    idle: dict[str, list[float]] = {}
    latest: dict[str, float] = {}
    curve: list[tuple[float, float]] = []  # (elapsed, mean of the nodes' latest accuracy)
    nodes = list(dict.fromkeys(n for r in data for n in r["nodes"]))
    for r in data:
        for name, m in r["nodes"].items():
            if (m.get("round") or 0) >= 1 and m.get("idle_fraction") is not None:
                idle.setdefault(name, []).append(m["idle_fraction"])
            acc = m.get(f"eval/{SPLIT}/accuracy")
            if acc is not None:
                latest[name] = acc
        if len(latest) == len(nodes) and any(f"eval/{SPLIT}/accuracy" in m for m in r["nodes"].values()):
            curve.append((r["elapsed"], sum(latest.values()) / len(latest)))
    return {"idle": {n: sum(v) / len(v) for n, v in idle.items()}, "final": dict(latest),
            "wall": data[-1]["elapsed"], "curve": curve}


def time_to(curve: list[tuple[float, float]], target: float) -> float | None:
    return next((t for t, acc in curve if acc >= target - 1e-9), None)


def _stat(xs: list[float | None], fmt: str) -> str:
    got = [x for x in xs if x is not None and math.isfinite(x)]
    if not got:
        return "-"
    missing = f" ({len(xs) - len(got)} never)" if len(got) < len(xs) else ""
    return f"{format(sum(got) / len(got), fmt)} ({format(min(got), fmt)}..{format(max(got), fmt)}){missing}"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="cpu-pair")
    p.add_argument("--seeds", default="0-2")
    p.add_argument("--set", nargs="*", action="extend", default=[], help="overrides for both, key=value")
    p.add_argument("--out", default="runs/async-vs-sync")
    a = p.parse_args(argv)
    out = Path(a.out).resolve()
    try:
        seeds = seed_list(a.seeds)
    except ValueError as exc:
        p.error(f"--seeds: {exc}")
    results: dict[str, dict[int, dict]] = {"sync": {}, "async": {}}
    for seed in seeds:
        for schedule in ("sync", "async"):
            folder = out / schedule
            cmd = [sys.executable, "-m", "simulations.seeds", "--preset", a.preset,
                   "--seeds", str(seed), "--out", str(folder), "--set", *a.set, f"exchange.schedule={schedule}"]
            if not (folder / f"seed-{seed}.json").is_file():
                print(f"seed {seed}, {schedule}: running", flush=True)
                subprocess.run(cmd, cwd=REPO, check=False, stdout=subprocess.DEVNULL)
            done = folder / f"seed-{seed}.json"
            if not done.is_file():
                print(f"seed {seed}, {schedule}: failed (see {folder / f'seed-{seed}.log'})", flush=True)
                continue
            results[schedule][seed] = figures(json.loads(done.read_text())["run_dir"])
    seeds = sorted(set(results["sync"]) & set(results["async"]))
    if not seeds:
        raise SystemExit("no seed finished with both schedules")
    nodes = list(results["sync"][seeds[0]]["final"])
    print(f"\n{a.preset}, seeds {seeds}, overrides {' '.join(a.set) or '-'}: mean (min..max) over seeds\n")
    print("| figure | sync | async |\n| --- | --- | --- |")
    for node in nodes:
        print(f"| {node}: idle fraction | " + " | ".join(
            _stat([results[s][k]["idle"].get(node) for k in seeds], ".2f") for s in ("sync", "async")) + " |")
    for node in nodes:
        print(f"| {node}: final accuracy | " + " | ".join(
            _stat([results[s][k]["final"].get(node) for k in seeds], ".3f") for s in ("sync", "async")) + " |")
    print("| mean final accuracy | " + " | ".join(
        _stat([sum(results[s][k]["final"].values()) / len(nodes) for k in seeds], ".3f")
        for s in ("sync", "async")) + " |")
    print("| wall time (s) | " + " | ".join(
        _stat([results[s][k]["wall"] for k in seeds], ".0f") for s in ("sync", "async")) + " |")
    targets = {k: sum(results["sync"][k]["final"].values()) / len(nodes) for k in seeds}
    print("| time to sync's final mean accuracy (s) | " + " | ".join(
        _stat([time_to(results[s][k]["curve"], targets[k]) for k in seeds], ".0f")
        for s in ("sync", "async")) + " |")
    pairs = []
    for k in seeds:
        t_async, t_sync = (time_to(results[s][k]["curve"], targets[k]) for s in ("async", "sync"))
        pairs.append(f"seed {k} {'never' if t_async is None else f'{t_async:.0f}'} vs {t_sync:.0f} s")
    print(f"\ntime to sync's final mean accuracy, async vs sync: {'; '.join(pairs)}")


if __name__ == "__main__":
    main()
