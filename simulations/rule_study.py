"""The selection-rule study's table (docs/performance.md, "Many nodes"): one row per ``seeds.py`` output folder.

    python -m simulations.rule_study runs/quad-all runs/quad-random runs/quad-reward_variance runs/quad-low_kl

Per folder (one ``exchange.select`` rule over seeds): the mean over the nodes of the held-out
accuracy gain (first to last evaluation), its mean and min..max over seeds; and, averaged over
every node and training round, the foreign groups and kB a node received, its update seconds,
the share of received samples the filter dropped and the median KL of received samples.
A run folder without its last round (stopped) is left out and said so.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from ftis_flwr.server.reporting.summary import load_metrics


def row(folder: Path) -> str:
    gains, per_round = [], {k: [] for k in ("groups", "kb", "update", "filtered", "kl")}
    for run in sorted(p for p in (folder / "runs").iterdir() if p.is_dir()):
        rows = load_metrics(run)
        planned = json.loads((run / "config.json").read_text())["rounds"]["num_rounds"]
        if not rows or rows[-1]["round"] < planned:
            print(f"{run}: not finished, left out", file=sys.stderr)
            continue
        first, last = rows[0]["nodes"], rows[-1]["nodes"]
        gains.append(100 * statistics.mean(last[n]["eval/test/accuracy"] - first[n]["eval/test/accuracy"]
                                           for n in first))
        for r in rows[1:]:
            for m in r["nodes"].values():
                per_round["groups"].append(m.get("foreign_groups_received", 0))
                per_round["kb"].append(m.get("foreign_bytes_received", 0) / 1e3)
                per_round["update"].append(m.get("seconds_train", 0))
                per_round["filtered"].append(m.get("filtered", 0) / max(1, m.get("samples_foreign", 0)))
                per_round["kl"].append(m.get("kl_median_foreign", float("nan")))
    if not gains:
        return f"| {folder.name} | no finished run | | | | | |"
    mean = {k: statistics.mean(v) for k, v in per_round.items()}
    return (f"| {folder.name} | {statistics.mean(gains):+.1f} ({min(gains):+.1f}..{max(gains):+.1f}), "
            f"{len(gains)} seeds | {mean['groups']:.0f} | {mean['kb']:.1f} | {mean['update']:.2f} | "
            f"{mean['filtered']:.3f} | {mean['kl']:.3f} |")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+", type=Path, help="seeds.py --out folders, one rule each")
    a = p.parse_args(argv)
    print("| folder | mean gain of the nodes, points (min..max over seeds) | foreign groups per node "
          "per round | kB received | update s | share of received samples filtered | median KL "
          "of received samples |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for folder in a.folders:
        if not (folder / "runs").is_dir():
            raise SystemExit(f"{folder}: no runs/ folder (not a simulations/seeds.py --out folder)")
        print(row(folder))


if __name__ == "__main__":
    main()
