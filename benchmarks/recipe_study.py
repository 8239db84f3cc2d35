"""Recipe study: many model seeds of one federation, driven in-process without Flower.

    python -m benchmarks.recipe_study --yaml simulations/studies/small-pair.yaml \\
        --pairs 0,1 2,3 4,5 6,7 8,9 10,11 --set train.lr=5e-5 --out runs/study-lr5e-5

For choosing a training recipe fast (no Ray, no sockets): each pair of model seeds
(``nodes.0.seed``, ``nodes.1.seed``: different warm-started models) runs the round loop the
strategy runs (vertical prompt split, last round's groups forwarded with the server's stamp,
alone mode supported) on ``Node`` objects in this process, one after the other. Learning claims
that tests and the docs make go through Flower (``simulations/seeds.py``); this tool only
explores. Prints each node's held-out accuracy per evaluation and the gains' mean/min/max.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ftis_flwr.experiment import load_experiment  # noqa: E402
from ftis_flwr.node.node import Node, Received, StepRequest  # noqa: E402
from ftis_flwr.server.strategy import PROMPT_STRIDE  # noqa: E402


def run_pair(exp, eval_every: int) -> list[dict[str, float]]:
    """Rounds 0..R of ``exp``; returns the test accuracy per node at each evaluated round."""
    nodes = [Node(c, exp) for c in exp.nodes]
    R, b = exp.rounds.num_rounds, exp.rounds.prompts_per_node
    cursor = PROMPT_STRIDE * exp.rounds.seed
    groups = {n.card.name: [] for n in nodes}
    assigned = {n.card.name: [] for n in nodes}
    history = []
    for rnd in range(R + 1):
        new_groups, new_assigned, acc = {}, {}, {"round": rnd}
        evaluate = rnd in (0, R) or (eval_every > 0 and rnd % eval_every == 0)
        for n in nodes:
            idx = list(range(cursor, cursor + b)) if rnd < R else []
            cursor += len(idx)
            foreign = [Received(src, gs, assigned[src]) for src, gs in groups.items()
                       if src != n.card.name and gs] if exp.advantage.mode != "alone" else []
            out = n.step(StepRequest(round=rnd, num_rounds=R, prompt_indices=idx,
                                     group_size=exp.rollout.group_size, evaluate=evaluate,
                                     foreign=foreign))
            new_groups[n.card.name], new_assigned[n.card.name] = out.groups, idx
            if evaluate:
                acc[n.card.name] = out.metrics["eval/test/accuracy"]
        groups, assigned = new_groups, new_assigned
        if evaluate:
            history.append(acc)
            print(json.dumps(acc), flush=True)
    return history


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    p.add_argument("--preset", default="")
    p.add_argument("--yaml", default="", help="a YAML experiment file (merged on the preset)")
    p.add_argument("--pairs", nargs="+", default=["0,1"], help="model seeds per run: a,b ...")
    p.add_argument("--set", nargs="*", action="extend", default=[], help="overrides key=value")
    p.add_argument("--eval-every", type=int, default=4)
    p.add_argument("--out", default="runs/study")
    a = p.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    sets = dict(kv.split("=", 1) for kv in a.set)
    yaml_text = Path(a.yaml).read_text() if a.yaml else None
    gains = []
    for pair in a.pairs:
        seeds = [int(x) for x in pair.split(",")]
        overrides = dict(sets, **{f"nodes.{i}.seed": s for i, s in enumerate(seeds)})
        exp = load_experiment(a.preset or None, overrides, yaml_text=yaml_text)
        print(f"model seeds {seeds}", flush=True)
        history = run_pair(exp, a.eval_every)
        (out / f"seeds-{'-'.join(map(str, seeds))}.json").write_text(json.dumps(history))
        for name in (c.name for c in exp.nodes):
            gains.append(100 * (history[-1][name] - history[0][name]))
    g = sorted(gains)
    print(f"{len(g)} nodes: held-out gain mean {sum(g) / len(g):+.1f}, min {g[0]:+.1f}, "
          f"max {g[-1]:+.1f} points; {sum(x <= 0 for x in g)} did not improve")


if __name__ == "__main__":
    main()
