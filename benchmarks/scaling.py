"""Per-node cost as the federation grows: bytes received and update time, budget off and on.

    python -m benchmarks.scaling --m 2 4 8 --rounds 4            # budget off, then on, per m
    python -m benchmarks.scaling --m 2 4 8 --rounds 4 --select reward_variance
    python -m benchmarks.scaling --m 2 4 8 --direct --repeats 3   # one receiver Node, no Flower

m tiny nodes in one ``flwr.simulation.run_simulation`` (each in its own process): the offline
default's recipe (preset cpu-pair) with its two shipped models repeated under new card names
(``small0, large0, small1, large1, ...``: same weights and seeds, so nothing warm-starts). Per
node per round the strategy records ``foreign_bytes_received`` (payload bytes forwarded to it),
``foreign_groups_received`` and the node's ``seconds_train`` (its update on own + received
groups). Means are over rounds 1..R (round 0 receives nothing) and nodes. The budget, when on, is
what one other node sends (``rounds.prompts_per_node`` groups: m=2's volume), chosen by
``--select``. Printed side by side: the ratio of each m to m=2 with the budget off and on.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

CARDS = {"small": "{name: %s, source: tiny, tiny_size: small, warmstart_ops: '+-', warmstart_target: 0.6, seed: 0}",
         "large": "{name: %s, source: tiny, tiny_size: large, warmstart_ops: '+-', warmstart_target: 0.6, seed: 1}"}
"""The offline default's two shipped models (ftis_flwr/config/presets/cpu-pair.yaml's cards)."""


def nodes_yaml(m: int) -> str:
    """m cards alternating the shipped small and large models."""
    cards = [CARDS[kind] % f"{kind}{i // 2}" for i, kind in ((i, ("small", "large")[i % 2]) for i in range(m))]
    return "nodes:\n" + "".join(f"  - {c}\n" for c in cards)


def one(a) -> None:
    """One simulation in this process; writes result.json with its run folder."""
    from ftis_flwr.experiment import load_experiment
    from simulations.runs import simulate

    sets = dict(kv.split("=", 1) for kv in a.set)
    exp = load_experiment(a.preset, dict(sets, run_dir=str(Path(a.out) / "runs")), yaml_text=nodes_yaml(a.m[0]))
    result = {"run_dir": simulate(a.preset, {}, experiment=exp)}
    (Path(a.out) / "result.json").write_text(json.dumps(result))


def direct(a) -> None:
    """Without Flower (one process, two model instances): one real receiver Node's update on its
    own groups plus what m - 1 real sources send, cut by the strategy's own ForeignBudget;
    configurations interleaved ``--repeats`` times, so machine load hits them alike."""
    import copy
    import statistics
    import time

    from ftis_flwr.config.schema import ExchangeConfig
    from ftis_flwr.experiment import load_experiment
    from ftis_flwr.node.host.payload_step import step_from_payloads
    from ftis_flwr.node.node import Node
    from ftis_flwr.server.budget import ForeignBudget
    from ftis_flwr.wire.rollouts import encode_groups, payload_bytes
    from ftis_flwr.wire.selection import group_count

    m_max = max(a.m)
    exp = load_experiment(a.preset, dict(kv.split("=", 1) for kv in a.set), yaml_text=nodes_yaml(m_max))
    b, g = exp.rounds.prompts_per_node, exp.rollout.group_size
    n = a.budget or b
    receiver = Node(exp.nodes[0], exp)
    makers = [Node(copy.deepcopy(c), exp) for c in exp.nodes[:2]]  # small, large: relabelled per source
    payloads = {}
    for j, card in enumerate(exp.nodes[1:], start=1):
        maker = makers[j % 2]
        maker.card.name = card.name  # the groups carry the source's card name, as its own node would
        idx = list(range(j * b, (j + 1) * b))
        payloads[card.name] = (*encode_groups(maker.generate(idx, g, 0), vocab_size=maker.vocab_size), idx)
    budgets = {"off": ForeignBudget(ExchangeConfig()),
               "on": ForeignBudget(ExchangeConfig(max_foreign_groups=n, select=a.select), exp.rounds.seed)}
    times: dict[tuple[str, int], list[float]] = {}
    sent: dict[tuple[str, int], tuple[int, int]] = {}
    for rep in range(a.repeats):
        for m in a.m:
            offer = {src: payloads[src] for src in [c.name for c in exp.nodes[1:m]]}
            for label, budget in budgets.items():
                chosen = budget.select(receiver.card.name, rep + 1, offer)
                sent[label, m] = (sum(group_count(arr, meta) for arr, meta, _ in chosen.values()),
                                  sum(payload_bytes(arr, meta) for arr, meta, _ in chosen.values()))
                receiver.pending = receiver.generate(list(range(10_000, 10_000 + b)), g, rep)
                t0 = time.perf_counter()
                out = step_from_payloads(receiver, {"round": 1, "num_rounds": 2, "prompt_indices": [],
                                                    "group_size": g, "evaluate": False, "foreign_payloads": chosen})
                step = time.perf_counter() - t0
                times.setdefault((label, m), []).append(out["metrics"]["seconds_train"])
                print(f"rep {rep} m={m} {label}: {sent[label, m][0]} groups, train "
                      f"{out['metrics']['seconds_train']:.2f} s (whole step {step:.2f} s)", flush=True)
    print(f"\none receiver ({receiver.card.name}), medians over {a.repeats} interleaved repeats "
          f"(budget: {n} groups, select={a.select}):")
    print("| m | budget | groups received | kB received | x m=2 | update s | x m=2 |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for label in budgets:
        ref_groups, ref_bytes = sent[label, min(a.m)]
        ref_t = statistics.median(times[label, min(a.m)])
        for m in a.m:
            t = statistics.median(times[label, m])
            print(f"| {m} | {label} | {sent[label, m][0]} | {sent[label, m][1] / 1e3:.1f} | "
                  f"{sent[label, m][1] / ref_bytes:.2f} | {t:.2f} | {t / ref_t:.2f} |")


def per_node(run_dir: Path) -> dict[str, float]:
    """Means over rounds >= 1 and nodes of the per-node cost figures."""
    from ftis_flwr.server.reporting.summary import load_metrics

    keys = ("foreign_bytes_received", "foreign_groups_received", "seconds_train", "idle_fraction")
    vals: dict[str, list[float]] = {k: [] for k in keys}
    rounds = [r for r in load_metrics(run_dir) if r["round"] >= 1]
    for r in rounds:
        for m in r["nodes"].values():
            for k in keys:
                if k in m:
                    vals[k].append(m[k])
    out = {k: sum(v) / len(v) for k, v in vals.items() if v}
    out["round_seconds"] = sum(r["server"]["round_seconds"] for r in rounds) / len(rounds)
    out["failures"] = sum(r["server"].get("nodes_failed", 0) for r in rounds)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--preset", default="cpu-pair")
    p.add_argument("--select", default="random")
    p.add_argument("--budget", type=int, default=0, help="groups per node per round (0: prompts_per_node)")
    p.add_argument("--set", nargs="*", action="extend", default=[], help="extra overrides, key=value")
    p.add_argument("--skip", nargs="*", default=[], help="runs to skip, e.g. 2:on (the budget is m=2's volume: "
                   "at m=2 it forwards everything, as off does)")
    p.add_argument("--direct", action="store_true", help="one receiver Node without Flower (see direct())")
    p.add_argument("--repeats", type=int, default=3, help="--direct: interleaved repeats")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default="")
    a = p.parse_args(argv)
    if a.one:
        one(a)
        return
    if a.direct:
        direct(a)
        return
    from ftis_flwr.experiment import load_experiment

    n = a.budget or load_experiment(a.preset).rounds.prompts_per_node
    base = [f"rounds.num_rounds={a.rounds}", "rounds.eval_every=0", "rounds.eval_size=50", *a.set]
    budgets = {"off": [], "on": [f"exchange.max_foreign_groups={n}", f"exchange.select={a.select}"]}
    table: dict[tuple[str, int], dict[str, float]] = {}
    for m in a.m:
        for label, extra in budgets.items():
            if f"{m}:{label}" in a.skip:
                continue
            out = Path(tempfile.mkdtemp(prefix=f"scaling-m{m}-{label}-"))
            cmd = [sys.executable, "-m", "benchmarks.scaling", "--one", "--m", str(m), "--preset", a.preset,
                   "--out", str(out), "--set", *base, *extra]
            print(f"m={m}, budget {label}: running ({out})", flush=True)
            with open(out / "log.txt", "w") as log:
                rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
            if rc != 0:
                print(f"  failed (exit {rc}), see {out / 'log.txt'}", flush=True)
                continue
            row = per_node(Path(json.loads((out / "result.json").read_text())["run_dir"]))
            if row["failures"]:  # e.g. Ray killing a ClientApp actor when the machine runs low on memory
                print(f"  {row['failures']:.0f} node failures (see {out / 'log.txt'}): not used", flush=True)
                continue
            table[label, m] = row
            print(f"  per node per round: {row['foreign_bytes_received'] / 1e3:.1f} kB received "
                  f"({row['foreign_groups_received']:.0f} groups), update {row['seconds_train']:.2f} s; "
                  f"round {row['round_seconds']:.1f} s", flush=True)
    print(f"\nper node per round, means over rounds 1..{a.rounds} (budget: {n} groups, select={a.select}):")
    print("| m | budget | groups received | kB received | x m=2 | update s | x m=2 | round s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for label in budgets:
        ref = table.get((label, min(a.m))) or table.get(("off", min(a.m)))
        for m in a.m:
            r = table.get((label, m))
            if r is None or ref is None:
                continue
            print(f"| {m} | {label} | {r['foreign_groups_received']:.0f} | {r['foreign_bytes_received'] / 1e3:.1f} | "
                  f"{r['foreign_bytes_received'] / ref['foreign_bytes_received']:.2f} | {r['seconds_train']:.2f} | "
                  f"{r['seconds_train'] / ref['seconds_train']:.2f} | {r['round_seconds']:.1f} |")


if __name__ == "__main__":
    main()
