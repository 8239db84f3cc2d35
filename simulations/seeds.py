"""One federation repeated over run seeds, through Flower: the spread a learning claim needs.

    python -m simulations.seeds --preset cpu-pair --seeds 0-11 --set rounds.num_rounds=10 \
        --out runs/seeds-cpu-pair

Each seed is one real Flower simulation (``flwr.simulation.run_simulation`` with this project's
ServerApp and ClientApp, in its own process) of the preset with ``rounds.seed`` set: the models
stay the same, the prompts and the sampling change. A finished seed (``seed-N.json`` in ``--out``)
is not run again, so an interrupted sweep resumes. At the end a table gives each node's
held-out accuracy before and after, and the gain's mean, min and max over seeds.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

from ftis_flwr.config.merge import ConfigError, parse_overrides
from simulations.runs import run_missing, seed_list


def run_one(preset: str, seed: int, sets: dict[str, str], out: Path) -> None:
    """One simulation in this process; writes ``seed-<seed>.json`` with first/last accuracies."""
    from simulations.runs import card_order, require_complete, simulate, summarize

    overrides = dict(sets, **{"rounds.seed": seed, "run_dir": str(out / "runs")})
    run_dir = simulate(preset, overrides)
    order = card_order(preset, overrides)
    require_complete(run_dir, order, f"seed {seed}")
    acc = {}
    for node, data in summarize(run_dir, order)["nodes"].items():
        series = [tuple(p) for p in data["accuracy"].get("test", [])]
        acc[node] = {"first": series[0][1], "last": series[-1][1], "rounds": series}
    (out / f"seed-{seed}.json").write_text(json.dumps({"seed": seed, "run_dir": run_dir,
                                                        "accuracy": acc}, indent=1))


def table(out: Path) -> str:
    """Markdown: per node, accuracy before/after and the gain in points over all finished seeds."""
    results = [json.loads(p.read_text()) for p in sorted(out.glob("seed-*.json"))]
    if not results:
        return "no finished seed"
    nodes = list(results[0]["accuracy"])
    rows = [f"{len(results)} seeds ({', '.join(str(r['seed']) for r in results)})", "",
            "| node | before (mean) | after (mean) | gain mean | gain min | gain max |",
            "| --- | --- | --- | --- | --- | --- |"]
    gains_by_seed = [[] for _ in results]
    for node in nodes:
        first = [r["accuracy"][node]["first"] for r in results]
        last = [r["accuracy"][node]["last"] for r in results]
        gains = [100 * (b - a) for a, b in zip(first, last)]
        for i, g in enumerate(gains):
            gains_by_seed[i].append(g)
        rows.append(f"| {node} | {sum(first) / len(first):.3f} | {sum(last) / len(last):.3f} | "
                    f"{sum(gains) / len(gains):+.1f} | {min(gains):+.1f} | {max(gains):+.1f} |")
    means = [sum(g) / len(g) for g in gains_by_seed]
    rows.append(f"| mean of nodes | | | {sum(means) / len(means):+.1f} | {min(means):+.1f} | "
                f"{max(means):+.1f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="cpu-pair")
    p.add_argument("--seeds", default="0-4", help="e.g. 0-11 or 0,3,5")
    p.add_argument("--set", nargs="*", action="extend", default=[], help="extra overrides, key=value")
    p.add_argument("--out", default="runs/seeds")
    p.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    try:  # the library's own key=value parser, on the shell's tokens re-quoted
        sets = parse_overrides(shlex.join(a.set))
    except ConfigError as exc:
        p.error(str(exc))
    if a.one is not None:
        run_one(a.preset, a.one, sets, out)
        return
    try:
        seeds = seed_list(a.seeds)
    except ValueError as exc:
        p.error(f"--seeds: {exc}")
    run_missing([(f"seed-{seed}", ["-m", "simulations.seeds", "--preset", a.preset, "--out", str(out), "--one",
                                   str(seed), "--set", *a.set]) for seed in seeds], out)
    text = table(out)
    print(text)
    (out / "table.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
