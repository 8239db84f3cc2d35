"""Run reporting for the ServerApp: metrics.jsonl, events.jsonl, TensorBoard, a progress line,
and at the end plot.png + summary.md + summary.json.

Why one module: every round's numbers must land on disk immediately (a crashed run still has
its history), and the end-of-run plot/summary must be computed from exactly what was logged.
Non-finite values never crash anything: they are written as JSON null and shown as "nan".
"""
from __future__ import annotations

import dataclasses
import json
import math
import numbers
import re
import secrets
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ftis_flwr.server.incidents import incidents
from ftis_flwr.server.plots import ACC_PREFIX, ACC_SUFFIX, plot_run

PROGRESS_LEGEND = ("per-round line: reward = mean reward of the node's new samples; acc = greedy "
                   "held-out accuracy (evaluated rounds); filt = share of the samples received from "
                   "other nodes that the filter dropped; B/tok = bytes on the wire per completion "
                   "token; s = the round's wall time")
_TB_WARNED = False


def run_name(experiment: Any) -> str:
    """``<date>-<time>-<preset>-<mode>-<method>-<4 hex>``: runs that differ in method or mode are
    told apart by their folder alone (the ServerApp's and a strategy's default name)."""
    parts = [Path(experiment.preset).stem or "run", experiment.advantage.mode, experiment.loss.method]
    safe = "-".join(re.sub(r"[^A-Za-z0-9.-]+", "_", p).strip("_") for p in parts)
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{safe}-{secrets.token_hex(2)}"


# ----------------------------------------------------------------------------- JSON helpers
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


def _metric(value: Any, where: str) -> float | None:
    """One metric value -> float (may be NaN/inf) or None; strings etc. are a caller bug."""
    if value is None:
        return None
    if hasattr(value, "item") and not isinstance(value, numbers.Real):
        value = value.item()
    if isinstance(value, numbers.Real):
        return float(value)
    raise TypeError(f"{where}: metric must be a number or None, got {type(value).__name__} {value!r}")


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
                warnings.warn(f"{path}: skipping torn last line {i + 1}")
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

    def to_dict(self) -> dict:
        def ch(c: Change) -> dict:
            return {"first": c.first, "first_round": c.first_round, "last": c.last,
                    "last_round": c.last_round, "delta_points": c.delta, "no_start_eval": c.no_start}
        return _jsonable({
            "rounds": self.rounds, "nodes": self.nodes, "splits": self.splits,
            "accuracy": {n: {s: ch(c) for s, c in d.items()} for n, d in self.accuracy.items()},
            "mean": {s: {"first": self.mean_first[s], "last": self.mean_last[s],
                         "delta_points": self.mean_delta[s]} for s in self.splits},
            "reward": {n: ch(c) for n, c in self.reward.items()},
            "checkpoints": self.checkpoints, "paths": self.paths, "incidents": self.incidents,
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


def final_line(summary: Summary, run_dir: Path | str) -> str:
    """The run's last line: where its outputs are, and first whether any node round failed."""
    lost = failed_node_rounds(summary)
    return (f"ftis-flwr: finished with failed node rounds: {lost}; " if lost else "ftis-flwr: ") + \
        f"metrics, plot and summary in {run_dir}"


def format_summary_table(summary: Summary) -> str:
    """Markdown tables (accuracy per node/split with a mean row; train reward) + checkpoints."""
    lost = failed_node_rounds(summary)
    out = [f"Rounds logged: {summary.rounds}" + (f"; failed node rounds: {lost}" if lost else ""), ""]
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


def run_title(config: Mapping) -> str:
    """"<preset>: <mode> <method>" from a run's config, e.g. "cpu-pair: vertical f-tis"."""
    preset = Path(str(config.get("preset") or "")).stem or "run"
    mode = (config.get("advantage") or {}).get("mode", "")
    method = (config.get("loss") or {}).get("method", "")
    return f"{preset}: {mode} {method}".strip().rstrip(":")


# ----------------------------------------------------------------------------- reporter
class RunReporter:
    """Writes one run's reports under run_dir; use as a context manager so files always close."""

    def __init__(self, run_dir: str | Path, *, config: Mapping | Any, node_names: list[str],
                 num_rounds: int | None = None, tensorboard: bool = True,
                 overwrite: bool = False, resume_after: int | None = None) -> None:
        """``resume_after=k``: continue the run already in ``run_dir`` after its round k; the
        rounds it logged after k (the interrupted round) are dropped, so each is logged once."""
        if not node_names or len(set(node_names)) != len(node_names):
            raise ValueError(f"node_names must be non-empty and unique, got {node_names!r}")
        if num_rounds is not None and (not isinstance(num_rounds, int) or num_rounds < 0):
            raise ValueError(f"num_rounds must be a non-negative int or None, got {num_rounds!r}")
        if not isinstance(config, Mapping) and not dataclasses.is_dataclass(config):
            raise TypeError(f"config must be a dict (or dataclass), got {type(config).__name__}")
        self.run_dir = Path(run_dir)
        self.node_names = list(node_names)
        self.num_rounds = num_rounds
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.events_path = self.run_dir / "events.jsonl"
        self._rows: list[dict] = []  # what was logged, with floats (NaN kept) for the summary
        self._t0 = time.time()
        if resume_after is not None:
            kept = [r for r in load_metrics(self.run_dir) if r["round"] <= resume_after]
            tmp = self.metrics_path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(json.dumps(r, allow_nan=False) + "\n" for r in kept))
            tmp.replace(self.metrics_path)
            self._rows = [{"round": r["round"], "nodes": r["nodes"], "server": r["server"]} for r in kept]
            if kept and "elapsed" in kept[0]:
                self._t0 = kept[0]["time"] - kept[0]["elapsed"]
            self._config = json.loads((self.run_dir / "config.json").read_text())
        else:
            if self.metrics_path.exists() and not overwrite:
                raise FileExistsError(f"{self.metrics_path} exists (a previous run?); pass "
                                      f"overwrite=True or use a fresh run_dir")
            self._config = _jsonable(config, "config")
            (self.run_dir / "config.json").write_text(json.dumps(self._config, indent=2) + "\n")
        mode = "w" if resume_after is None else "a"
        self._metrics = open(self.metrics_path, mode)
        self._events = open(self.events_path, mode)
        self._closed = False
        self._tb = self._open_tensorboard() if tensorboard else None
        self.steps = (self._config.get("exchange") or {}).get("schedule") == "async"
        """Asynchronous schedule: a row is a step (the nodes that replied in it), not a round; a
        node absent from a row is busy, not failed (failures are in events.jsonl)."""
        if self._tb is not None:
            self._tb.add_text("config", "```\n" + json.dumps(self._config, indent=2) + "\n```")

    def _open_tensorboard(self):
        global _TB_WARNED
        try:
            from torch.utils.tensorboard import SummaryWriter
        except Exception as e:  # noqa: BLE001 - any import problem means "run without TB"
            if not _TB_WARNED:
                warnings.warn(f"TensorBoard unavailable ({e}); continuing without it")
                _TB_WARNED = True
            return None
        return SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))

    def __enter__(self) -> "RunReporter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise RuntimeError(f"RunReporter.{what} called after finish()/close()")

    # -------------------------------------------------------------------------- per round
    def log_round(self, round_idx: int, node_metrics: Mapping[str, Mapping[str, Any]],
                  server_metrics: Mapping[str, Any]) -> str:
        """Append the round to metrics.jsonl (flushed), write TB scalars, return a progress line."""
        self._check_open("log_round")
        if not isinstance(round_idx, int) or isinstance(round_idx, bool) or round_idx < 0:
            raise ValueError(f"round_idx must be a non-negative int, got {round_idx!r}")
        if self._rows and round_idx <= self._rows[-1]["round"]:
            raise ValueError(f"round_idx {round_idx} is not after the last logged round "
                             f"{self._rows[-1]['round']}")
        unknown = sorted(set(node_metrics) - set(self.node_names))
        if unknown:
            raise ValueError(f"node_metrics has unknown nodes {unknown}; known: {self.node_names}")
        nodes = {n: {str(k): _metric(v, f"round {round_idx} node {n!r} metric {k!r}")
                     for k, v in m.items()} for n, m in node_metrics.items()}
        server = {str(k): _metric(v, f"round {round_idx} server metric {k!r}")
                  for k, v in server_metrics.items()}
        failed = [] if self.steps else [n for n in self.node_names if n not in nodes]
        row = {"round": round_idx, "nodes": nodes, "server": server}
        self._rows.append(row)
        now = time.time()
        record = {"round": round_idx, "time": now, "elapsed": now - self._t0,
                  "server": server, "nodes": nodes, "missing_nodes": failed}
        self._metrics.write(json.dumps(_jsonable(record, "record"), allow_nan=False) + "\n")
        self._metrics.flush()
        if self._tb is not None:
            for n, m in nodes.items():
                for k, v in m.items():
                    if v is not None:
                        self._tb.add_scalar(f"{n}/{k}", v, round_idx)
            for k, v in server.items():
                if v is not None:
                    self._tb.add_scalar(f"server/{k}", v, round_idx)
            self._tb.flush()
        return self._progress_line(round_idx, nodes, server)

    def _progress_line(self, r: int, nodes: dict, server: dict) -> str:
        parts = [f"step {r}" if self.steps else
                 f"round {r}" + (f"/{self.num_rounds}" if self.num_rounds is not None else "")]
        for name in self.node_names:
            m = nodes.get(name)
            if m is None:
                if not self.steps:
                    parts.append(f"{name}: FAILED")
                continue
            bits = [f"round {_fmt(m.get('round'), '.0f')}"] if self.steps else []
            if "reward_mean" in m:
                bits.append(f"reward {_fmt(m['reward_mean'], '.2f')}")
            accs = [(k[len(ACC_PREFIX):-len(ACC_SUFFIX)], v) for k, v in m.items()
                    if k.startswith(ACC_PREFIX) and k.endswith(ACC_SUFFIX)]
            if len(accs) == 1:
                bits.append(f"acc {_fmt(accs[0][1], '.2f')}")
            elif accs:
                bits.append("acc " + " ".join(f"{s} {_fmt(v, '.2f')}" for s, v in accs))
            filt, foreign = m.get("filtered"), m.get("samples_foreign")
            if filt is not None and foreign is not None and math.isfinite(filt) and foreign > 0:
                bits.append(f"filt {100.0 * filt / foreign:.0f}%")
            parts.append(f"{name}: " + (" ".join(bits) if bits else "ok"))
        if _finite(server.get("bytes_per_token")) is not None:
            parts.append(f"{_fmt(server['bytes_per_token'], '.1f')} B/tok")
        if server.get("round_seconds") is not None:
            parts.append(f"{_fmt(server['round_seconds'], '.1f')} s")
        return " | ".join(parts)

    def log_event(self, kind: str, **fields: Any) -> None:
        """Append {"event": kind, "round"?, ...} to events.jsonl (flushed)."""
        self._check_open("log_event")
        if not isinstance(kind, str) or not kind:
            raise ValueError(f"event kind must be a non-empty string, got {kind!r}")
        if "event" in fields or "time" in fields:
            raise ValueError("log_event fields may not be named 'event' or 'time' (reserved)")
        record = {"event": kind, "time": time.time(), **_jsonable(fields, f"event {kind!r}")}
        self._events.write(json.dumps(record, allow_nan=False) + "\n")
        self._events.flush()

    # -------------------------------------------------------------------------- end of run
    def summary(self, checkpoints: Mapping[str, Any] | None = None) -> Summary:
        """First/last evaluated accuracy per node and split, from what was logged."""
        splits: list[str] = []
        for row in self._rows:
            for m in row["nodes"].values():
                for k in m:
                    if k.startswith(ACC_PREFIX) and k.endswith(ACC_SUFFIX):
                        s = k[len(ACC_PREFIX):-len(ACC_SUFFIX)]
                        if s and s not in splits:
                            splits.append(s)

        def series(node: str, key: str) -> list[tuple[int, float | None]]:
            return [(r["round"], r["nodes"][node].get(key)) for r in self._rows
                    if node in r["nodes"]]

        def first_eval(split: str) -> int | None:  # the baseline round: the split's first evaluation
            rounds = [r for n in self.node_names for r, v in series(n, f"{ACC_PREFIX}{split}{ACC_SUFFIX}")
                      if _finite(v) is not None]
            return min(rounds) if rounds else None

        starts = {s: first_eval(s) for s in splits}
        acc = {n: {s: _change(series(n, f"{ACC_PREFIX}{s}{ACC_SUFFIX}"), starts[s]) for s in splits}
               for n in self.node_names}
        reward = {n: _change(series(n, "reward_mean")) for n in self.node_names}
        return Summary(
            rounds=len(self._rows), nodes=list(self.node_names), splits=splits,
            accuracy=acc, reward=reward,
            mean_first={s: _mean([acc[n][s].first for n in self.node_names]) for s in splits},
            mean_last={s: _mean([acc[n][s].last for n in self.node_names]) for s in splits},
            mean_delta={s: _mean([acc[n][s].delta for n in self.node_names]) for s in splits},
            checkpoints={str(k): str(v) for k, v in (checkpoints or {}).items()},
            start_round=min((r for r in starts.values() if r is not None), default=0),
            incidents=incidents(load_events(self.run_dir)) if self.events_path.exists() else [],
        )

    def finish(self, extra: Mapping[str, Any] | None = None) -> Summary:
        """Write plot.png, summary.md, summary.json; close everything; return the Summary."""
        self._check_open("finish")
        extra = dict(extra or {})
        ckpts = extra.get("checkpoints") or {}
        if not isinstance(ckpts, Mapping):
            raise TypeError(f"extra['checkpoints'] must map node -> path, got {type(ckpts).__name__}")
        try:
            summary = self.summary(ckpts)
            paths = {"metrics": self.metrics_path, "events": self.events_path,
                     "config": self.run_dir / "config.json", "plot": self.run_dir / "plot.png",
                     "summary_md": self.run_dir / "summary.md",
                     "summary_json": self.run_dir / "summary.json"}
            if self._tb is not None:
                paths["tensorboard"] = self.run_dir / "tensorboard"
            summary.paths = paths
            title = f"{run_title(self._config) or self.run_dir.name} ({summary.rounds} rounds)"
            plot_run(paths["plot"], title, self.node_names, summary.splits, self._rows, steps=self.steps)
            paths["summary_md"].write_text(f"# Run summary: {self.run_dir.name}\n\n"
                                           f"{run_title(self._config)}\n\n" + format_summary_table(summary))
            data = summary.to_dict()
            others = {k: v for k, v in extra.items() if k != "checkpoints"}
            if others:
                data["extra"] = _jsonable(others, "extra")
            paths["summary_json"].write_text(json.dumps(data, indent=2, allow_nan=False) + "\n")
        finally:
            self.close()
        return summary

    def close(self) -> None:
        """Close metrics/events files and the TB writer; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        for f in (self._metrics, self._events):
            f.close()
        if self._tb is not None:
            self._tb.close()
