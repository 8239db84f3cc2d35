"""What a finished (or crashed) run says: its metrics and events read back from disk, and the
summary the ServerApp, the sweeps and the tests compute from exactly those rows (first and last
accuracy and reward per node, failed rounds, the final line). Non-finite values never crash
anything: they read as None and show as "nan". Writing the files is :mod:`.reporting`'s job."""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def _jsonable(obj: Any, where: str) -> Any:
    """Plain JSON tree: NaN/inf -> None, Path -> str, tuples -> lists; anything else is an error."""
    if obj is None or isinstance(obj, (str, bool)):
        return obj
    if isinstance(obj, numbers.Integral):
        return int(obj)
    if isinstance(obj, numbers.Real):
        x = float(obj)
        return x if math.isfinite(x) else None
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v, f"{where}.{k}") for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _jsonable(dataclasses.asdict(obj), where)
    if hasattr(obj, "item") and callable(obj.item):  # numpy / torch 0-d scalars
        return _jsonable(obj.item(), where)
    raise TypeError(f"{where}: cannot write {type(obj).__name__} value {obj!r} as JSON")


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _read_jsonl(path: Path) -> list[dict]:
    """Lines of a JSONL file; a torn final line (crash mid-write) is skipped with a warning."""
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    lines = path.read_text().split("\n")
    out = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as e:
            if i == len(lines) - 1:  # no trailing newline: the writer died mid-line
                warnings.warn(f"{path}: skipping torn last line {i + 1}", stacklevel=2)
                continue
            raise ValueError(f"{path}: line {i + 1} is not valid JSON: {e}") from e
    return out


def load_metrics(run_dir: str | Path) -> list[dict]:
    """The per-round records of a run, in the order they were logged."""
    return _read_jsonl(Path(run_dir) / "metrics.jsonl")


def load_events(run_dir: str | Path) -> list[dict]:
    """The event records (failures, checkpoints, ...) of a run."""
    return _read_jsonl(Path(run_dir) / "events.jsonl")


# ----------------------------------------------------------------------------- summary
@dataclass(frozen=True)
class Change:
    """First and last finite value of one series; delta in points (x100) when both exist."""

    first: float | None = None
    first_round: int | None = None
    last: float | None = None
    last_round: int | None = None
    no_start: bool = False
    """The node has no value in the split's first evaluated round (it failed that round): nothing
    to compare its last value with, so ``first`` and ``delta`` stay empty, never taken later."""

    @property
    def delta(self) -> float | None:
        if self.first is None or self.last is None:
            return None
        return 100.0 * (self.last - self.first)


@dataclass
class Summary:
    """``accuracy[node][split]`` and ``reward[node]`` as Change; mean_* per split over nodes with data."""

    rounds: int
    nodes: list[str]
    splits: list[str]
    accuracy: dict[str, dict[str, Change]]
    reward: dict[str, Change]
    mean_first: dict[str, float | None]
    mean_last: dict[str, float | None]
    mean_delta: dict[str, float | None]
    checkpoints: dict[str, str] = field(default_factory=dict)
    paths: dict[str, Path] = field(default_factory=dict)
    start_round: int = 0
    incidents: list[dict] = field(default_factory=list)
    """Failures and rejections from events.jsonl, one row per (event, who): see :func:`incidents`."""
    health: list[dict] = field(default_factory=list)
    """Per (source, receiver): filtered share, ESS and weight / log-ratio quantiles over the run
    (:func:`ftis_flwr.server.reporting.source_health.source_health`)."""
    failure: str = ""
    """Why the run failed ("" when it did not): said before anything else (:mod:`.run_failure`)."""
    num_rounds: int | None = None
    """The rounds the run was asked for (``rounds.num_rounds``; its rows are rounds 0..R)."""
    steps: bool = False
    """The rows are an asynchronous run's steps, not rounds."""
    last_round: int | None = None
    """The last round (step) logged."""
    warnings: list[str] = field(default_factory=list)
    """What an operator must read first: a peer's samples mostly unrepresentable for a receiver
    or almost all filtered (:func:`ftis_flwr.server.reporting.source_health.warnings_first`), a node whose
    greedy answers collapsed to one for most problems, or whose accuracy is partial credit only
    (:mod:`ftis_flwr.server.reporting.answer_health`), a node whose training reward stayed at 0
    (:mod:`ftis_flwr.server.reporting.reward_health`)."""

    def to_dict(self) -> dict:
        def ch(c: Change) -> dict:
            return {"first": c.first, "first_round": c.first_round, "last": c.last,
                    "last_round": c.last_round, "delta_points": c.delta, "no_start_eval": c.no_start}
        return _jsonable({
            "failure": self.failure, "rounds": self.rounds, "num_rounds": self.num_rounds,
            "last_round": self.last_round,
            "nodes": self.nodes, "splits": self.splits,
            "accuracy": {n: {s: ch(c) for s, c in d.items()} for n, d in self.accuracy.items()},
            "mean": {s: {"first": self.mean_first[s], "last": self.mean_last[s],
                         "delta_points": self.mean_delta[s]} for s in self.splits},
            "reward": {n: ch(c) for n, c in self.reward.items()},
            "checkpoints": self.checkpoints, "paths": self.paths, "incidents": self.incidents,
            "warnings": self.warnings, "health": self.health,
        }, "summary")


def _change(points: list[tuple[int, float | None]], start: int | None = None) -> Change:
    """First and last finite point; with ``start``, a series not evaluated in round ``start``
    has no first value (``no_start``)."""
    pts = [(r, v) for r, v in points if _finite(v) is not None]
    if not pts:
        return Change()
    if start is not None and pts[0][0] != start:
        return Change(None, None, pts[-1][1], pts[-1][0], no_start=True)
    return Change(pts[0][1], pts[0][0], pts[-1][1], pts[-1][0])


def _mean(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _fmt(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def failed_node_rounds(summary: Summary) -> str:
    """``"b 3 (rounds 1, 2, 3)"`` per node whose rounds failed, ``;``-joined; "" when none did."""
    failed = [r for r in summary.incidents if r["event"] == "node_failed"]
    return "; ".join(f"{r['who']} {r['times']} (round{'s' if len(r['rounds']) > 1 else ''} "
                     f"{', '.join(map(str, r['rounds'][:8]))}{' ...' if len(r['rounds']) > 8 else ''})"
                     for r in failed)


FAILED_PREFIX = "ftis-flwr: the run failed: "
"""How the ServerApp's line for a failed run begins (``ftis-flwr run`` repeats its reason last)."""


def final_line(summary: Summary, run_dir: Path | str) -> str:
    """The run's last line: where its outputs are, and first whether it failed or any node
    round failed."""
    if summary.failure:
        return f"{FAILED_PREFIX}{summary.failure} (metrics, plot and summary in {run_dir})"
    lost = failed_node_rounds(summary)
    return (f"ftis-flwr: finished with failed node rounds: {lost}; " if lost else "ftis-flwr: ") + \
        f"metrics, plot and summary in {run_dir}"


def rounds_line(summary: Summary) -> str:
    """``Rounds: 40 of 40 (41 logged: ...)``: the last round logged of those asked for, as the
    progress line counts them (a run of R rounds logs rounds 0..R: round 0 only generates and
    evaluates the starting models)."""
    if summary.steps or summary.num_rounds is None:
        return f"{'Steps' if summary.steps else 'Rounds'} logged: {summary.rounds}"
    if summary.last_round is None:
        return f"Rounds: none of {summary.num_rounds} logged"
    return (f"Rounds: {summary.last_round} of {summary.num_rounds} ({summary.rounds} logged: round 0 only "
            "generates and evaluates the starting models)")


def format_summary_table(summary: Summary) -> str:
    """Markdown tables (accuracy per node/split with a mean row; train reward) + checkpoints;
    first, why the run failed, then the warnings."""
    lost = failed_node_rounds(summary)
    out = [rounds_line(summary) + (f"; failed node rounds: {lost}" if lost else ""), ""]
    out[0:0] = [f"**Warning:** {w}" for w in summary.warnings] + ([""] if summary.warnings else [])
    if summary.failure:
        out[0:0] = [f"**Run failed:** {summary.failure}", ""]
    if summary.splits:
        out += ["| node | split | first acc (round) | last acc (round) | change (pts) |",
                "|---|---|---|---|---|"]
        for split in summary.splits:
            for node in summary.nodes:
                c = summary.accuracy[node][split]
                fr = "" if c.first_round is None else f" (r{c.first_round})"
                lr = "" if c.last_round is None else f" (r{c.last_round})"
                if c.no_start:
                    fr = f" (no r{summary.start_round} eval: not compared)"
                out.append(f"| {node} | {split} | {_fmt(c.first, '.3f')}{fr} | "
                           f"{_fmt(c.last, '.3f')}{lr} | {_fmt(c.delta, '+.1f')} |")
            out.append(f"| **mean** | {split} | {_fmt(summary.mean_first[split], '.3f')} | "
                       f"{_fmt(summary.mean_last[split], '.3f')} | "
                       f"{_fmt(summary.mean_delta[split], '+.1f')} |")
    else:
        out.append("No evaluation was recorded.")
    out += ["", "| node | first train reward | last train reward | change (pts) |",
            "|---|---|---|---|"]
    for node in summary.nodes:
        c = summary.reward[node]
        out.append(f"| {node} | {_fmt(c.first, '.3f')} | {_fmt(c.last, '.3f')} | "
                   f"{_fmt(c.delta, '+.1f')} |")
    if summary.health:
        out += ["", "Per-source health (means over the rounds; w = truncated weight, |log-ratio| = "
                "|log pi_old - log pi_gen| per token):", "",
                "| source | receiver | samples | filtered | ESS | w p50 / p90 / p99 | abs log-ratio p50 / p90 / p99 |",
                "|---|---|---|---|---|---|---|"]
        for h in summary.health:
            w = " / ".join(_fmt(h[f"w_p{q}"], ".2f") for q in (50, 90, 99))
            lr = " / ".join(_fmt(h[f"abs_log_ratio_p{q}"], ".2f") for q in (50, 90, 99))
            out.append(f"| {h['source']} | {h['receiver']} | {h['samples']:.0f} | {100 * h['filtered_share']:.0f}% | "
                       f"{_fmt(h['ess'], '.2f')} | {w} | {lr} |")
    if summary.incidents:
        out += ["", "Failures and rejections (events.jsonl):", "",
                "| event | node / source | seen by | times | rounds | groups | samples |",
                "|---|---|---|---|---|---|---|"]
        for r in summary.incidents:
            rounds = ", ".join(map(str, r["rounds"][:12])) + (" ..." if len(r["rounds"]) > 12 else "")
            out.append(f"| {r['event']} | {r['who']} | {r['by'] or '-'} | {r['times']} | {rounds or '-'} | "
                       f"{r['groups']:.0f} | {r['samples']:.0f} |")
    if summary.checkpoints:
        out += ["", "Checkpoints:", ""]
        out += [f"- {node}: `{path}`" for node, path in summary.checkpoints.items()]
    return "\n".join(out) + "\n"
