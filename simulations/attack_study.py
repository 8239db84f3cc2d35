"""Does a forger in the federation move the honest nodes? The same federation over run seeds,
with and without one, through Flower.

    python -m simulations.attack_study --seeds 0-4 --out runs/attack-study

Three conditions per seed, each one real Flower simulation in its own process, of
``studies/attack-trio.yaml`` (the offline default's small + large nodes and a third card):

- ``pair``: the two honest nodes alone together (the third card left out);
- ``honest``: the third node is an honest peer;
- ``forger``: the third node replaces every reply with a forgery of its real groups, cycling
  through ``forger.forgeries`` (NaN and positive log-probs, ids outside the vocabulary, ragged
  lengths, a wrong tokenizer fingerprint, an oversized payload, a relabelled source, unassigned
  and duplicated prompts, inflated rewards, over-long completions), one per round.

The spread without the attacker is the honest nodes' final held-out accuracy over the seeds of
``pair`` and of ``honest`` (min..max). The test, fixed before any run: per honest node, the paired
difference d_s = forger - baseline (points, same seed: same models, prompts, sampling) is "level"
when its mean is within ±2 points and the seeds do not all agree in sign (``verdicts.verdict``,
at least 5 seeds); and each forger run's final accuracy is counted inside or outside the
baseline's min..max. A finished run (``<out>/<condition>-seed-N.json``) is not run again.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from simulations.runs import run_missing, seed_list
from simulations.sweep_report import mean_range
from simulations.verdicts import fmt_points, paired, verdict

HERE = Path(__file__).resolve().parent

EXPERIMENT = HERE / "studies" / "attack-trio.yaml"
CONDITIONS = ("pair", "honest", "forger")
ATTACKER = "third"


def experiment(condition: str, seed: int, out: Path):
    from ftis_flwr.experiment import load_experiment

    exp = load_experiment(str(EXPERIMENT), {"rounds.seed": seed, "run_dir": str(out / "runs")})
    if condition == "pair":
        exp = dataclasses.replace(exp, nodes=[c for c in exp.nodes if c.name != ATTACKER])
    return exp


def client_app(condition: str, exp):
    """The forger's ClientApp for ``forger``; this project's own ClientApp otherwise."""
    if condition != "forger":
        from clients.client_app import app

        return app
    from ftis_flwr.node.tiny.models import build_char_tokenizer
    from simulations.forger import forgeries, forging_app

    honest = [c.name for c in exp.nodes if c.name != ATTACKER]
    plan = list(forgeries(vocab_size=len(build_char_tokenizer()), max_new_tokens=exp.rollout.max_new_tokens,
                          max_tokens_per_payload=exp.wire.max_tokens_per_payload, relabel_as=honest[0]).values())
    return forging_app(ATTACKER, lambda rnd: plan[rnd % len(plan)])


def run_one(condition: str, seed: int, out: Path) -> None:
    """One simulation in this process; writes ``<condition>-seed-<seed>.json``."""
    from ftis_flwr.server.reporting.summary import load_metrics
    from simulations.runs import simulate

    exp = experiment(condition, seed, out)
    run_dir = simulate(str(EXPERIMENT), {}, experiment=exp, client_app=client_app(condition, exp))
    rounds = load_metrics(run_dir)
    nodes = {}
    for name in (c.name for c in exp.nodes):
        series = [(r["round"], r["nodes"][name]["eval/test/accuracy"]) for r in rounds
                  if "eval/test/accuracy" in r["nodes"].get(name, {})]
        rejected = sum(r["nodes"].get(name, {}).get(f"{ATTACKER}/samples_rejected", 0) for r in rounds)
        foreign = sum(r["nodes"].get(name, {}).get("samples_foreign", 0) for r in rounds)
        nodes[name] = {"accuracy": series, "samples_rejected_from_third": rejected, "samples_foreign": foreign}
    (out / f"{condition}-seed-{seed}.json").write_text(json.dumps(
        {"condition": condition, "seed": seed, "run_dir": run_dir, "nodes": nodes}, indent=1))


def table(out: Path) -> str:
    """Markdown: per honest node and condition, final accuracy; forger against each baseline."""
    res = {(r["condition"], r["seed"]): r
           for r in (json.loads(p.read_text()) for p in sorted(out.glob("*-seed-*.json")))}
    if not res:
        return "no finished run"
    seeds = sorted({s for _, s in res})
    honest = [n for n in next(iter(res.values()))["nodes"] if n != ATTACKER]

    def final(cond: str) -> dict[int, dict[str, float]]:
        """seed -> honest node -> final accuracy (``verdicts.paired``'s shape)."""
        return {s: {n: res[(cond, s)]["nodes"][n]["accuracy"][-1][1] for n in honest}
                for s in seeds if (cond, s) in res}

    finals = {c: final(c) for c in CONDITIONS}

    rows = [f"seeds: {', '.join(map(str, seeds))}", "",
            "| node | start | " + " | ".join(f"{c}: final, mean (min..max)" for c in CONDITIONS) + " |",
            "| --- | --- |" + " --- |" * len(CONDITIONS)]
    for node in honest:
        start = [r["nodes"][node]["accuracy"][0][1] for r in res.values()]
        rows.append(f"| {node} | {sum(start) / len(start):.3f} | "
                    + " | ".join(mean_range([v[node] for v in finals[c].values()]) for c in CONDITIONS) + " |")
    rows += ["", "| node | forger - baseline | difference, points: mean (min..max) | seeds | forger runs inside "
             "the baseline's min..max | verdict (level) |", "| --- | --- | --- | --- | --- | --- |"]
    forged = finals["forger"]
    for node in honest:
        for base in ("pair", "honest"):
            b = finals[base]
            d = paired(forged, b, node)
            spread = [v[node] for v in b.values()]
            inside = sum(min(spread) <= forged[s][node] <= max(spread) for s in forged if s in b) if spread else 0
            rows.append(f"| {node} | forger - {base} | {fmt_points(d)} | {len(d)} | {inside}/{len(d)} | "
                        f"{verdict(d, 'level')} |")
    rej = [r["nodes"][n]["samples_rejected_from_third"] for (c, _), r in res.items() if c == "forger" for n in honest]
    if rej:
        rows += ["", f"Samples from the forger rejected per honest node and run: {min(rej):.0f}..{max(rej):.0f}."]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0-4", help="e.g. 0-4 or 0,3,5")
    p.add_argument("--conditions", default=",".join(CONDITIONS), help=f"some of {', '.join(CONDITIONS)}")
    p.add_argument("--out", default="runs/attack-study")
    p.add_argument("--one", nargs=2, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    conditions = [c for c in a.conditions.split(",") if c]
    bad = [c for c in conditions if c not in CONDITIONS]
    if bad:
        p.error(f"--conditions: {', '.join(bad)} unknown; use some of {', '.join(CONDITIONS)}")
    if a.one is not None:
        run_one(a.one[0], int(a.one[1]), out)
        return
    try:
        seeds = seed_list(a.seeds)
    except ValueError as exc:
        p.error(f"--seeds: {exc}")
    # seed-major: a study stopped part way holds whole seeds
    run_missing([(f"{cond}-seed-{seed}", ["-m", "simulations.attack_study", "--out", str(out), "--one", cond,
                                          str(seed)]) for seed in seeds for cond in conditions], out)
    text = table(out)
    print(text)
    (out / "table.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
