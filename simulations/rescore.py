"""Re-evaluate a sweep's final checkpoints: what their greedy answers are, under two rewards.

Why (#24): on ``basic-math`` the paper's math-verify reward also paid for an expression in
``<answer>``, and a model can learn to copy the question's operands there (``43+29``) instead of
adding them. The task now pays only for the number (``ftis_flwr.tasks.basic_math.numeric_answer``).
Runs measured before that fix keep their final checkpoints, so this tells, per run and node, how
much of the accuracy they reported was the number and how much the copied question:

    python -m simulations.rescore runs/sweep-xfamily --out simulations/results/sweep-xfamily/rescore.json \
        --results-out runs/sweep-xfamily-number
    python -m simulations.verdicts runs/sweep-xfamily-number

For each finished run (``<sweep>/results/<key>.json``), each ``checkpoints/<node>``: the node's
held-out splits, greedy, with the run's own settings (``config.json``: task, ``eval_size``,
``max_new_tokens``, ``batch_size``, stop tokens), scored by math-verify (``old``, what the run
reported) and by the task's reward now (``number``); each answer counted as a number, an
expression, something else, or no strict answer at all. The starting models (a full node's base;
a LoRA node's base, as its adapter starts as the identity) are scored once each, under
``"start"``. Finished runs are kept in ``--out`` and skipped when it is run again.
``--results-out DIR`` writes the sweep's result files with their first and last evaluations
replaced by the ``number`` scores, so the sweep's own report and verdicts run on them unchanged.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from ftis_flwr.node.answers import greedy_answers, run_task

ROOT = Path(__file__).resolve().parents[1]

_EXPRESSION = re.compile(r"[\d\s+\-*/().]+")


def write_results(sweep: Path, done: dict, out: Path) -> int:
    """Copies of the sweep's result files with the first and last evaluations re-scored."""
    written = 0
    for path in sorted(sweep.glob("results/*.json")):
        data = json.loads(path.read_text())
        runs = done.get(path.stem)
        nodes = data["summary"]["nodes"]
        if not runs or set(runs) != set(nodes):
            continue
        for name, node in nodes.items():
            for split, series in node.get("accuracy", {}).items():
                if series:
                    series[0][1] = done["start"][name][split]["number"]
                    series[-1][1] = runs[name][split]["number"]
        (out / "results").mkdir(parents=True, exist_ok=True)
        (out / "results" / path.name).write_text(json.dumps(data, indent=1))
        written += 1
    return written


def table(done: dict) -> str:
    """Markdown: per run and node, the accuracy reported and on numbers alone (%), and how many
    of its answers were expressions."""
    rows = ["| run | node | test: reported -> number | OOD: reported -> number | expressions |",
            "| --- | --- | --- | --- | --- |"]
    for key in sorted(k for k in done if k != "start"):
        for node, r in done[key].items():
            cells = [f"{100 * r[s]['old']:.1f} -> {100 * r[s]['number']:.1f}" for s in ("test", "ood") if s in r]
            expr = sum(x["kinds"]["expression"] for x in r.values())
            total = sum(x["problems"] for x in r.values())
            rows.append(f"| {key} | {node} | {' | '.join(cells)} | {expr} of {total} |")
    return "\n".join(rows)


def kind(text: str) -> str:
    """``number``, ``expression`` (digits and operators, not one number) or ``none`` (no strict answer)."""
    from ftis_flwr.tasks.basic_math import numeric_answer
    from ftis_flwr.tasks.rewards import parse_strict_answer

    answer = parse_strict_answer(text)
    if answer is None:
        return "none"
    if numeric_answer(answer) is not None:
        return "number"
    return "expression" if _EXPRESSION.fullmatch(answer) else "other"


def rescore(run_dir: Path, node: dict, threads: int = 2, start: bool = False) -> dict:
    """One node's final checkpoint (``start``: the model it started from), every held-out split:
    accuracies and answer kinds."""
    from ftis_flwr.tasks.rewards import math_reward

    task = run_task(json.loads((run_dir / "config.json").read_text()))
    out = {}
    for split, (problems, _, texts) in greedy_answers(run_dir, node, task, threads, start).items():
        kinds = [kind(t) for t in texts]
        old = [math_reward(t, p.gold) for t, p in zip(texts, problems)]
        new = [task.reward(t, p) for t, p in zip(texts, problems)]
        out[split] = {"problems": len(problems), "old": sum(old) / len(problems),
                      "number": sum(new) / len(problems),
                      "kinds": {k: kinds.count(k) for k in ("number", "expression", "other", "none")},
                      "examples": [texts[i] for i in range(min(3, len(texts)))]}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep", type=Path, help="a sweep's output folder (results/, and the runs' checkpoints)")
    ap.add_argument("--out", type=Path, required=True, help="JSON file, kept and extended run by run")
    ap.add_argument("--results-out", type=Path, default=None,
                    help="write the sweep's result files here with the re-scored accuracies")
    ap.add_argument("--nodes", nargs="*", default=None, help="only these nodes (default: every node)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2: the machine's cores)")
    args = ap.parse_args(argv)
    done = json.loads(args.out.read_text()) if args.out.exists() else {}
    runs, missing = [], []
    for path in sorted(args.sweep.glob("results/*.json")):  # finished runs only, each its own run folder
        run_dir = Path(json.loads(path.read_text())["summary"]["run_dir"])
        run_dir = run_dir if run_dir.is_absolute() else ROOT / run_dir
        (runs if (run_dir / "checkpoints").is_dir() else missing).append(run_dir)
    for run_dir in missing:
        print(f"rescore: {run_dir} has no checkpoints/ (skipped)", file=sys.stderr)
    if not runs:
        print(f"rescore: no finished run with checkpoints under {args.sweep}", file=sys.stderr)
        return 2

    def keep() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(done, indent=1, sort_keys=True))
        tmp.replace(args.out)

    for node in json.loads((runs[0] / "config.json").read_text())["nodes"]:
        if node["name"] not in done.get("start", {}):
            done.setdefault("start", {})[node["name"]] = rescore(runs[0], node, args.threads, start=True)
            keep()
            print(f"start {node['name']}: " + " | ".join(f"{s}: {r['number']:.3f} (old {r['old']:.3f})"
                  for s, r in done["start"][node["name"]].items()), flush=True)
    for i, run_dir in enumerate(runs, 1):
        key = run_dir.parent.name
        cfg = json.loads((run_dir / "config.json").read_text())
        for node in cfg["nodes"]:
            if node["name"] in done.get(key, {}) or (args.nodes and node["name"] not in args.nodes):
                continue
            t0 = time.perf_counter()
            result = rescore(run_dir, node, args.threads)
            done.setdefault(key, {})[node["name"]] = result
            keep()
            line = " | ".join(f"{s}: {r['old']:.3f} -> {r['number']:.3f} ({r['kinds']['expression']} expr)"
                              for s, r in result.items())
            print(f"[{i}/{len(runs)}] {key} {node['name']}: {line} | {time.perf_counter() - t0:.0f} s", flush=True)
    print(table(done))
    if args.results_out:
        n = write_results(args.sweep, done, args.results_out)
        print(f"rescore: {n} result files with re-scored accuracies in {args.results_out}/results")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
