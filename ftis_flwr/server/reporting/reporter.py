"""Run reporting for the ServerApp: metrics.jsonl, events.jsonl, the trackers of ``report.to``
(TensorBoard by default, MLflow, W&B: :mod:`ftis_flwr.server.reporting.trackers`), a progress line, and at
the end plot.png + summary.md + summary.json.

Every round's numbers land on disk immediately (a crashed run still has its history), and the
end-of-run plot and summary are computed from exactly what was logged, read back by
:mod:`ftis_flwr.server.reporting.summary`. Non-finite values never crash anything: they are written as JSON
null and shown as "nan".
"""
from __future__ import annotations

import dataclasses
import json
import math
import numbers
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ftis_flwr.config.choices import Schedule, Tracker
from ftis_flwr.server.reporting.answer_health import collapsed_answers, partial_credit_only
from ftis_flwr.server.reporting.eta import format_left, seconds_left
from ftis_flwr.server.reporting.incidents import incidents
from ftis_flwr.server.reporting.plots import ACC_PREFIX, ACC_SUFFIX, plot_run
from ftis_flwr.server.reporting.reward_health import zero_reward
from ftis_flwr.server.reporting.run_names import rounds_said, run_name, run_title
from ftis_flwr.server.reporting.source_health import source_health, warnings_first
from ftis_flwr.server.reporting.summary import (
    Summary,
    _change,
    _finite,
    _fmt,
    _jsonable,
    _mean,
    format_summary_table,
    load_events,
    load_metrics,
)
from ftis_flwr.server.reporting.trackers import Trackers, check_names
from ftis_flwr.server.run_failure import failed_throughout

PROGRESS_LEGEND = ("per-round line: reward = mean reward of the node's new samples; acc = greedy "
                   "held-out accuracy (evaluated rounds); filt = share of the samples received from "
                   "other nodes that the filter dropped; B/tok = bytes on the wire per completion "
                   "token; s = the round's wall time; ~ left = the rest of the run, from the rounds so far")
_TB_WARNED = False
"""TensorBoard's absence is warned about once per process (it is the default tracker)."""


__all__ = ["PROGRESS_LEGEND", "RunReporter", "run_name", "run_title"]
"""``run_name`` and ``run_title`` are :mod:`.run_names`' and may be imported from here too."""


# ----------------------------------------------------------------------------- JSON helpers
def _metric(value: Any, where: str) -> float | None:
    """One metric value -> float (may be NaN/inf) or None; strings etc. are a caller bug."""
    if value is None:
        return None
    if hasattr(value, "item") and not isinstance(value, numbers.Real):
        value = value.item()
    if isinstance(value, numbers.Real):
        return float(value)
    raise TypeError(f"{where}: metric must be a number or None, got {type(value).__name__} {value!r}")


# ----------------------------------------------------------------------------- reporter
class RunReporter:
    """Writes one run's reports under run_dir; use as a context manager so files always close."""

    def __init__(self, run_dir: str | Path, *, config: Mapping | Any, node_names: list[str],
                 num_rounds: int | None = None, tensorboard: bool = True,
                 overwrite: bool = False, resume_after: int | None = None,
                 evaluates: Callable[[int], bool] | None = None,
                 report_to: list[str] | None = None) -> None:
        """``report_to``: the trackers (``report.to``; None: ``["tensorboard"]``; ``tensorboard=False``
        leaves TensorBoard out). Each gets the config as params now, every round's scalars, and
        summary.md, summary.json and plot.png at :meth:`finish`; one that fails is warned about,
        logged as a ``tracker_failed`` event and left out (:class:`ftis_flwr.server.reporting.trackers.Trackers`).
        ``resume_after=k``: continue the run already in ``run_dir`` after its round k; the
        rounds it logged after k (the interrupted round) are dropped, so each is logged once.
        ``evaluates(k)``: whether round k evaluates (``RoundConfig.evaluates``); with it and
        ``num_rounds`` the progress line ends with the time the run has left
        (:func:`ftis_flwr.server.reporting.eta.seconds_left`)."""
        if not node_names or len(set(node_names)) != len(node_names):
            raise ValueError(f"node_names must be non-empty and unique, got {node_names!r}")
        if num_rounds is not None and (not isinstance(num_rounds, int) or num_rounds < 0):
            raise ValueError(f"num_rounds must be a non-negative int or None, got {num_rounds!r}")
        if not isinstance(config, Mapping) and not dataclasses.is_dataclass(config):
            raise TypeError(f"config must be a dict (or dataclass), got {type(config).__name__}")
        names = check_names([Tracker.TENSORBOARD.value] if report_to is None else list(report_to))
        if not tensorboard:
            names = [n for n in names if n != Tracker.TENSORBOARD]
        self.run_dir = Path(run_dir)
        self.node_names = list(node_names)
        self.num_rounds = num_rounds
        self._evaluates = evaluates
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
        self.trackers = Trackers(names, self.run_dir, self.run_dir.name, self._config,
                                 on_unavailable=_unavailable, on_failure=self._tracker_failed)
        self.trackers.log_params(self._config)
        self.steps = (self._config.get("exchange") or {}).get("schedule") == Schedule.ASYNC
        """Asynchronous schedule: a row is a step (the nodes that replied in it), not a round; a
        node absent from a row is busy, not failed (failures are in events.jsonl)."""

    def _tracker_failed(self, tracker: str, error: str) -> None:
        if not self._events.closed:  # also while close() closes the trackers
            self._write_event("tracker_failed", {"tracker": tracker, "error": error})

    def __enter__(self) -> RunReporter:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close("FAILED" if exc_type is not None else "FINISHED")

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise RuntimeError(f"RunReporter.{what} called after finish()/close()")

    # -------------------------------------------------------------------------- per round
    def log_round(self, round_idx: int, node_metrics: Mapping[str, Mapping[str, Any]],
                  server_metrics: Mapping[str, Any]) -> str:
        """Append the round to metrics.jsonl (flushed), send the trackers its scalars
        (``<node>/<metric>``, ``server/<metric>``, at step ``round_idx``), return a progress line."""
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
        scalars = {f"{n}/{k}": v for n, m in nodes.items() for k, v in m.items() if v is not None}
        scalars.update({f"server/{k}": v for k, v in server.items() if v is not None})
        self.trackers.log_metrics(round_idx, scalars)
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
        if not self.steps and self._evaluates is not None and self.num_rounds is not None:
            left = seconds_left(self._rows, self.num_rounds, self._evaluates)
            if left is not None and r < self.num_rounds:
                parts.append(format_left(left))
        return " | ".join(parts)

    def log_event(self, kind: str, **fields: Any) -> None:
        """Append {"event": kind, "round"?, ...} to events.jsonl (flushed)."""
        self._check_open("log_event")
        if not isinstance(kind, str) or not kind:
            raise ValueError(f"event kind must be a non-empty string, got {kind!r}")
        if "event" in fields or "time" in fields:
            raise ValueError("log_event fields may not be named 'event' or 'time' (reserved)")
        self._write_event(kind, fields)

    def _write_event(self, kind: str, fields: Mapping[str, Any]) -> None:
        record = {"event": kind, "time": time.time(), **_jsonable(fields, f"event {kind!r}")}
        self._events.write(json.dumps(record, allow_nan=False) + "\n")
        self._events.flush()

    def log_table(self, step: int, name: str, columns: list[str], rows: list[list[Any]]) -> None:
        """A small table (e.g. sample completions) to every tracker; nothing on disk here."""
        self._check_open("log_table")
        self.trackers.log_table(step, name, list(columns), [list(r) for r in rows])

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
            warnings=warnings_first(self._rows) + collapsed_answers(self._rows) + partial_credit_only(self._rows)
            + zero_reward(self._rows, self._config),
            health=source_health(self._rows), num_rounds=self.num_rounds, steps=self.steps,
            last_round=self._rows[-1]["round"] if self._rows else None,
        )

    def finish(self, extra: Mapping[str, Any] | None = None, failure: str = "") -> Summary:
        """Write plot.png, summary.md, summary.json, send them to the trackers; close everything
        (the trackers' runs FINISHED, or FAILED when the run or writing failed); return the Summary.

        ``failure``: why the run stopped ("" when it ran to its end); a node that replied in no
        round at all fails the run too (:func:`ftis_flwr.server.run_failure.failed_throughout`).
        Either is ``Summary.failure``, the summary's first line, and the plot's title says so."""
        self._check_open("finish")
        extra = dict(extra or {})
        ckpts = extra.get("checkpoints") or {}
        if not isinstance(ckpts, Mapping):
            raise TypeError(f"extra['checkpoints'] must map node -> path, got {type(ckpts).__name__}")
        status = "FAILED"
        try:
            summary = self.summary(ckpts)
            summary.failure = failure or failed_throughout(
                self._rows, load_events(self.run_dir) if self.events_path.exists() else [], self.node_names,
                self.steps)
            paths = {"metrics": self.metrics_path, "events": self.events_path,
                     "config": self.run_dir / "config.json", "plot": self.run_dir / "plot.png",
                     "summary_md": self.run_dir / "summary.md",
                     "summary_json": self.run_dir / "summary.json"}
            paths.update(self.trackers.locations())
            summary.paths = paths
            said = rounds_said(self.num_rounds, self._rows, self.steps, failed=bool(summary.failure))
            title = f"{run_title(self._config) or self.run_dir.name} ({said})"
            plot_run(paths["plot"], title, self.node_names, summary.splits, self._rows, steps=self.steps,
                     config=self._config, failure=summary.failure)
            paths["summary_md"].write_text(f"# Run summary: {self.run_dir.name}\n\n"
                                           f"{run_title(self._config)}\n\n" + format_summary_table(summary))
            data = summary.to_dict()
            others = {k: v for k, v in extra.items() if k != "checkpoints"}
            if others:
                data["extra"] = _jsonable(others, "extra")
            paths["summary_json"].write_text(json.dumps(data, indent=2, allow_nan=False) + "\n")
            for key in ("summary_md", "summary_json", "plot"):
                self.trackers.log_artifact(paths[key])
            status = "FAILED" if summary.failure else "FINISHED"
        finally:
            self.close(status)
        return summary

    def close(self, status: str = "FINISHED") -> None:
        """Close the trackers' runs with ``status`` ("FINISHED"/"FAILED"), then the metrics and
        events files; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            self.trackers.close(status)
        finally:
            for f in (self._metrics, self._events):
                f.close()


def _unavailable(name: str, reason: str) -> None:
    """A tracker whose package is missing: warned about (TensorBoard once per process)."""
    global _TB_WARNED
    if name == Tracker.TENSORBOARD:
        if not _TB_WARNED:
            warnings.warn(f"TensorBoard unavailable ({reason}); continuing without it", stacklevel=2)
            _TB_WARNED = True
        return
    warnings.warn(f"{name} unavailable ({reason}); continuing without it", stacklevel=2)
