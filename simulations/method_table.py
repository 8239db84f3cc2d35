r"""Final in-distribution accuracy per setup, node and method, on the seeds every method ran.

    python -m simulations.method_table runs/sweep-main --seeds 0-4 --rule level \
        --configs "alone,nois vertical,tis vertical,vis vertical,f-tis vertical g=50"

One row per setup and node: each config's final accuracy in points, the mean over the given
seeds (a config missing one of them is left out of that setup, and said so), then each config's
paired difference against the last one listed, mean (min..max) over those seeds. With ``--rule``
each difference also gets ``verdicts.py``'s decision under that rule ("level": within ±2 points
and the seeds not all on one side; "above": every seed above), shortened to a word. What the
table in docs/claims.md of TIS, VIS and the homogeneous control shows; ``verdicts.py`` judges the paper's
claims.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from simulations.runs import seed_list
from simulations.sweep_report import load_results
from simulations.verdicts import decide, finals, fmt_points, paired, starts


def judged(d: list[float], rule: str) -> str:
    """``fmt_points`` with ``verdicts.decide``'s word for the rule: "level", "above"/"below"
    (every seed on that side), or "?" (inconclusive, fewer seeds than the rule needs included)."""
    return f"{fmt_points(d)} {decide(d, rule)}"


def table(results: list[dict], configs: list[str], seeds: list[int], split: str = "test",
          rule: str | None = None) -> list[str]:
    ref = configs[-1]
    rows = ["| setup | node | " + " | ".join(configs) + " | " + " | ".join(f"{c} - {ref}" for c in configs[:-1])
            + " |", "|" + " --- |" * (2 * len(configs) + 1)]
    for setup in dict.fromkeys(r["point"]["setup"] for r in results):
        got = {c: {s: v for s, v in finals(results, setup, c, split).items() if s in seeds} for c in configs}
        missing = [c for c in configs if set(got[c]) != set(seeds)]
        if missing:
            print(f"{setup}: left out, {', '.join(missing)} not run on every seed of {seeds}", file=sys.stderr)
            continue
        for node in starts(results, setup, split):
            means = [f"{100 * sum(v[node] for v in got[c].values()) / len(seeds):.1f}" for c in configs]
            diffs = [judged(d, rule) if rule else fmt_points(d)
                     for d in (paired(got[c], got[ref], node) for c in configs[:-1])]
            rows.append(f"| {setup} | {node} | " + " | ".join(means + diffs) + " |")
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweep", help="a sweep's output folder (holding results/)")
    p.add_argument("--configs", required=True,
                   help="comma-separated config labels as in results.md; differences are against the last")
    p.add_argument("--seeds", default="0-4", help="e.g. 0-2 or 0,3,5")
    p.add_argument("--split", default="test")
    p.add_argument("--rule", choices=["level", "above"], default=None,
                   help="also decide each difference with verdicts.py's rule ('?' = inconclusive)")
    a = p.parse_args(argv)
    try:
        seeds = seed_list(a.seeds)
    except ValueError as exc:
        p.error(f"--seeds: {exc}")
    configs = [c.strip() for c in a.configs.split(",") if c.strip()]
    if len(configs) < 2:
        p.error("--configs: name at least two config labels (e.g. 'alone,f-tis vertical g=50')")
    results = load_results(Path(a.sweep))
    if not results:
        raise SystemExit(f"{a.sweep}: no finished run under results/")
    rows = table(results, configs, seeds, a.split, a.rule)
    if len(rows) == 2:
        raise SystemExit(f"{a.sweep}: no setup ran every one of {configs} on seeds {seeds}")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
