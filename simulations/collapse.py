"""Collapse counts across seeds, judged by the rule ``sweeps/xfamily-upper-40.yaml`` fixed before its
first run (issue #55): prevents, reduces, delays, or not shown.

    python -m simulations.collapse simulations/results/sweep-xfamily-upper-40            # markdown to stdout
    python -m simulations.collapse runs/sweep-xfamily-upper-40 --split test

A node has **collapsed** in a run at an evaluation when its accuracy there is below ``THRESHOLD``
(0.10). By round R: below it at an evaluation at or before R (a node that recovers later still
counts, and is reported as recovered). Its **onset** is the first round of the unbroken stretch of
rounds with own-sample training reward 0 (``train_reward_own`` in ``metrics.jsonl``) that ends at
the evaluation where the collapse is first seen; that evaluation's round when its reward there is
not 0.

Per node and arm, n20 and n40 count the seeds collapsed by round 20 and by round 40. NoIS against
each other arm X: the one-sided Fisher exact test (:func:`fisher_greater`) that NoIS collapses in
more seeds than X, by round 20 (p20) and round 40 (p40), at 0.05. On a node where NoIS collapses,
X **prevents** (n40(X) = 0 and p40 < 0.05), **reduces** (n40(X) >= 1 and p40 < 0.05), **delays**
(p20 < 0.05 and p40 >= 0.05), else **not shown** ("too few NoIS collapses to tell" when n40(X) = 0
but p40 >= 0.05). F-NoIS against F-TIS is the same test (F-NoIS collapsing more), by round 40.

The metrics of a run are read from ``<study>/run-data/<key>/metrics.jsonl`` (a study landed in
docs/) or from the run directory its result file names.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from math import comb
from pathlib import Path

from simulations.sweep_report import config_label, load_results

THRESHOLD = 0.10
ALPHA = 0.05
NOIS = "nois vertical"
"""The arm every other is tested against (in a study of several setups, the first setup's)."""


@dataclass
class NodeRun:
    """One node in one run: its accuracy at each evaluation and its own-sample reward per round."""

    arm: str
    seed: int
    node: str
    accuracy: dict[int, float]
    reward_own: dict[int, float] = field(default_factory=dict)

    def collapsed_by(self, rnd: int) -> bool:
        return any(acc < THRESHOLD for r, acc in self.accuracy.items() if 0 < r <= rnd)

    def first_seen(self) -> int | None:
        """The first evaluation (after round 0) below the threshold, or None."""
        return next((r for r in sorted(self.accuracy) if r > 0 and self.accuracy[r] < THRESHOLD), None)

    def onset(self) -> int | None:
        """The collapse's onset round (module docstring), or None when it never collapsed."""
        seen = self.first_seen()
        if seen is None:
            return None
        r = seen
        while r - 1 >= 1 and self.reward_own.get(r) == 0.0 and self.reward_own.get(r - 1) == 0.0:
            r -= 1
        return r if self.reward_own.get(r) == 0.0 else seen

    def recovered(self, rnd: int) -> bool:
        """Collapsed by ``rnd`` and above the threshold at its last evaluation up to ``rnd``."""
        seen = [r for r in sorted(self.accuracy) if r <= rnd]
        return self.collapsed_by(rnd) and bool(seen) and self.accuracy[seen[-1]] >= THRESHOLD


def fisher_greater(a: int, n_a: int, b: int, n_b: int) -> float:
    """One-sided Fisher exact p that the first arm (``a`` of ``n_a`` collapsed) collapses more often
    than the second (``b`` of ``n_b``): P(X >= a) for X hypergeometric with the table's margins."""
    total, hits = n_a + n_b, a + b
    denom = comb(total, n_a)
    return sum(comb(hits, k) * comb(total - hits, n_a - k) for k in range(a, min(hits, n_a) + 1)) / denom


def category(n40_x: int, p20: float, p40: float) -> str:
    """What arm X shows against NoIS on a node where NoIS collapses (module docstring)."""
    if p40 < ALPHA:
        return "prevents" if n40_x == 0 else "reduces"
    if p20 < ALPHA:
        return "delays"
    return "not shown (too few NoIS collapses to tell)" if n40_x == 0 else "not shown"


def _metrics_file(study: Path, result: dict) -> Path | None:
    landed = study / "run-data" / result["point"]["key"] / "metrics.jsonl"
    if landed.is_file():
        return landed
    run_dir = Path(result["summary"].get("run_dir", ""))
    return run_dir / "metrics.jsonl" if (run_dir / "metrics.jsonl").is_file() else None


def node_runs(study: Path, split: str = "test") -> list[NodeRun]:
    """Every node of every finished run of ``study``, its accuracy on ``split`` and its rewards; an
    arm is named by its configuration, and by its setup too where the study has several."""
    out = []
    results = load_results(study)
    several = len({r["point"]["setup"] for r in results}) > 1
    for result in results:
        rewards: dict[str, dict[int, float]] = {}
        path = _metrics_file(study, result)
        if path is not None:
            for line in path.read_text().splitlines():
                row = json.loads(line)
                for node, m in row.get("nodes", {}).items():
                    if "train_reward_own" in m:
                        rewards.setdefault(node, {})[int(row["round"])] = float(m["train_reward_own"])
        for node, s in result["summary"]["nodes"].items():
            acc = {int(r): float(a) for r, a in s["accuracy"].get(split, [])}
            arm = config_label(result["point"]) + (f" [{result['point']['setup']}]" if several else "")
            out.append(NodeRun(arm, int(result["point"]["seed"]), node, acc, rewards.get(node, {})))
    return out


def counts(runs: list[NodeRun], arm: str, node: str, rnd: int) -> tuple[int, int]:
    """(seeds collapsed by ``rnd``, seeds run) of ``arm`` on ``node``."""
    mine = [r for r in runs if r.arm == arm and r.node == node]
    return sum(r.collapsed_by(rnd) for r in mine), len(mine)


def table(runs: list[NodeRun], early: int = 20, late: int = 40) -> list[str]:
    """Markdown rows: per node and arm, the counts, onsets and NoIS-vs-arm tests and category."""
    nois = next((a for a in sorted({r.arm for r in runs}) if a.startswith(NOIS)), NOIS)
    arms = sorted({r.arm for r in runs}, key=lambda a: (a != nois, a))
    nodes = list(dict.fromkeys(r.node for r in runs))
    rows = [f"| node | arm | seeds | n{early} | n{late} | recovered | onsets (seed: round) | p{early} | p{late} | "
            "against NoIS |", "|" + " --- |" * 10]
    for node in nodes:
        nois_e, nois_n = counts(runs, nois, node, early)
        nois_l, _ = counts(runs, nois, node, late)
        for arm in arms:
            mine = sorted((r for r in runs if r.arm == arm and r.node == node), key=lambda r: r.seed)
            n_e, n = counts(runs, arm, node, early)
            n_l, _ = counts(runs, arm, node, late)
            onsets = ", ".join(f"{r.seed}: {r.onset()}" for r in mine if r.onset() is not None) or "-"
            back = sum(r.recovered(late) for r in mine)
            if arm == nois or not nois_n:
                p_e = p_l = "-"
                said = "-"
            else:
                pe, pl = fisher_greater(nois_e, nois_n, n_e, n), fisher_greater(nois_l, nois_n, n_l, n)
                p_e, p_l = f"{pe:.3f}", f"{pl:.3f}"
                said = category(n_l, pe, pl) if nois_l else "NoIS did not collapse here"
            rows.append(f"| {node} | {arm} | {n} | {n_e} | {n_l} | {back} | {onsets} | {p_e} | {p_l} | {said} |")
        fnois = next((a for a in arms if a.startswith("f-nois vertical")), None)
        ftis = next((a for a in arms if a.startswith("f-tis vertical")), None)
        if fnois and ftis:
            a, na = counts(runs, fnois, node, late)
            b, nb = counts(runs, ftis, node, late)
            if na and nb:
                p = fisher_greater(a, na, b, nb)
                rows.append(f"| {node} | {fnois} against {ftis} | {na}, {nb} | - | {a}, {b} | - | - | - | {p:.3f} | "
                            f"{'the weights add to the filter' if p < ALPHA else 'not shown'} |")
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("study", type=Path, help="a sweep's output folder, or its landed copy under docs/")
    ap.add_argument("--split", default="test")
    ap.add_argument("--early", type=int, default=20)
    ap.add_argument("--late", type=int, default=40)
    args = ap.parse_args(argv)
    runs = node_runs(args.study, args.split)
    if not runs:
        raise SystemExit(f"no finished run under {args.study}/results")
    print("\n".join(table(runs, args.early, args.late)))


if __name__ == "__main__":
    main()
