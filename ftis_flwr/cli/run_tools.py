"""A finished (or running) run's own tools, as ``ftis-flwr`` commands: ``report`` (where its rounds
went), ``compare`` (two runs side by side) and ``answers`` (what its models answer).

Why here and not in scripts: a user of one run needs them, not the project's maintainers; each reads
the run's folder (``config.json``, ``metrics.jsonl``, ``checkpoints/``) and nothing else. The
commands' work lives in :mod:`ftis_flwr.server.reporting.round_report`, :mod:`ftis_flwr.server.reporting.run_compare`
and :mod:`ftis_flwr.node.answers`; this module only reads their arguments.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

COMMANDS = ("report", "compare", "answers")


def add_commands(sub: Any, epilog: str = "") -> None:
    """The three commands' parsers, under ``ftis-flwr``'s subcommands."""
    fmt = argparse.RawDescriptionHelpFormatter
    what = "where a run's rounds went: each round's wall time and each node's phases (its metrics.jsonl)"
    r = sub.add_parser("report", help=what, description=f"ftis-flwr report: {what}.", epilog=epilog,
                       formatter_class=fmt)
    r.add_argument("run", type=Path, help="a run's folder (runs/<run name>)")
    what = "two runs side by side: the settings that differ, accuracies and training rewards"
    c = sub.add_parser("compare", help=what, description=f"ftis-flwr compare: {what}.", epilog=epilog,
                       formatter_class=fmt)
    c.add_argument("run_a", type=Path, help="the first run's folder")
    c.add_argument("run_b", type=Path, help="the second run's folder")
    what = "what a finished run's models answer, greedy, on its own held-out problems"
    a = sub.add_parser("answers", help=what, description=f"ftis-flwr answers: {what}.", epilog=epilog,
                       formatter_class=fmt)
    a.add_argument("run", type=Path, help="a finished run's folder (config.json, metrics.jsonl, checkpoints/)")
    a.add_argument("--node", action="append", default=[], help="only this node (may repeat; default: every node)")
    a.add_argument("--split", action="append", default=[],
                   help="only this split (may repeat; default: every held-out split of the task)")
    a.add_argument("--show", type=int, default=5, help="examples printed per node and split (default 5)")
    a.add_argument("--start", action="store_true", help="the model each node started from, not its final one")
    a.add_argument("--threads", type=int, default=None, help="torch threads (default: the node's own, as in the run)")
    a.add_argument("--json", type=Path, default=None, help="also write everything here, every answer included")


def main(args: argparse.Namespace) -> int:
    """Run the command ``args`` names; 2 (and one line on stderr) when a folder lacks what it needs."""
    try:
        if args.command == "report":
            from ftis_flwr.server.reporting.round_report import run_report

            print(run_report(args.run), flush=True)
        elif args.command == "compare":
            from ftis_flwr.server.reporting.run_compare import compare

            print(compare(args.run_a, args.run_b), flush=True)
        else:
            from ftis_flwr.node.answers import answer_report
            from ftis_flwr.server.reporting.summary import load_metrics

            rows = [] if args.start or not (args.run / "metrics.jsonl").is_file() else load_metrics(args.run)
            answer_report(args.run, rows, nodes=args.node, splits=args.split, show=args.show, start=args.start,
                          threads=args.threads, json_path=args.json, say=lambda line: print(line, flush=True))
    except (FileNotFoundError, ValueError) as exc:  # AnswersError is a ValueError
        print(f"ftis-flwr {args.command}: {exc}", file=sys.stderr)
        return 2
    return 0
