"""Where a run's numbers go besides metrics.jsonl (``report.to``, TRL's ``report_to``): TensorBoard,
MLflow, Weights & Biases, one small class per tracker in a registry; a second, different
registration of a name is refused (as :func:`ftis_flwr.tasks.registry.register_task` does).

Why apart: the reporter (:mod:`ftis_flwr.server.reporting.reporter`) writes each number once and fans it
out (:class:`Trackers`); a tracker that fails (an MLflow server that went away) is warned about
once and left out, never failing the run. ``mlflow`` and ``wandb`` (the ``[trackers]`` extra) are
imported only when their tracker opens.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ftis_flwr.config.imports import register_unique


class TrackerError(ValueError):
    """A ``report.to`` name that names no tracker, or a second registration of a name."""


class TrackerUnavailable(RuntimeError):
    """A tracker's package is not installed here: the run goes on without that tracker."""


class Tracker:
    """One run's connection to one tracker; a subclass overrides what its tracker supports:
    ``open(run_dir, run_name, config)`` (TrackerUnavailable when its package is missing),
    ``log_metrics(step, {"<node>/<metric>": value})``, ``log_params(config)`` (nested, once),
    ``log_table(step, name, columns, rows)``, ``log_artifact(path)``, ``close("FINISHED" |
    "FAILED")`` and ``locations()`` (where the run is: ``Summary.paths`` entries)."""

    def __init__(self, **parts: Any):
        self.__dict__.update(parts)  # what open() connected: a writer, a client and run id, a run

    @classmethod
    def open(cls, run_dir: Path, run_name: str, config: dict) -> Tracker:
        raise NotImplementedError

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None: ...
    def log_params(self, config: dict) -> None: ...
    def log_table(self, step: int, name: str, columns: list[str], rows: list[list[Any]]) -> None: ...
    def log_artifact(self, path: Path) -> None: ...
    def close(self, status: str) -> None: ...

    def locations(self) -> dict[str, Any]:
        return {}


_TRACKERS: dict[str, type[Tracker]] = {}
NO_TRACKER = "none"
"""``report.to=none``: no tracker (metrics.jsonl, events.jsonl and the summary are always written)."""


def register_tracker(name: str, cls: type[Tracker]) -> type[Tracker]:
    """Make ``report.to=<name>`` open ``cls``; a second, different class is refused."""
    if name == NO_TRACKER:
        raise TrackerError(f"{NO_TRACKER!r} means no tracker and cannot be registered")
    return register_unique(_TRACKERS, name, cls, "tracker", TrackerError)


def tracker_names() -> tuple[str, ...]:
    """Every valid ``report.to`` name: the registered trackers, then ``none``."""
    return (*_TRACKERS, NO_TRACKER)


def get_tracker(name: str) -> type[Tracker]:
    """The class registered as ``name``; TrackerError listing the valid names otherwise."""
    if name not in _TRACKERS:
        raise TrackerError(f"unknown tracker {name!r}; valid: {', '.join(tracker_names())}")
    return _TRACKERS[name]


def check_names(names: Sequence[str]) -> list[str]:
    """``names`` as a list, each a valid ``report.to`` name; TrackerError naming the first that is not."""
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise TrackerError(f"report_to must be a list of tracker names, got {names!r}")
    for n in names:
        if n != NO_TRACKER:
            get_tracker(n)
    return list(names)


def _finite_items(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Only finite numbers: MLflow rejects NaN, and a missing value is no value."""
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def flatten_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested config -> ``{"loss.method": "f-tis", "nodes.0.name": "a", ...}``, values as strings
    (lists of scalars as JSON), each value cut to MLflow's 6000 characters."""
    out: dict[str, str] = {}
    for k, v in config.items() if isinstance(config, Mapping) else enumerate(config):
        nested = isinstance(v, Mapping) or isinstance(v, (list, tuple)) and all(isinstance(x, Mapping) for x in v)
        if v and nested:
            out.update(flatten_params(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = (v if isinstance(v, str) else json.dumps(v))[:6000]
    return out


def _mlflow_key(key: str) -> str:
    """MLflow's key rule (letters, digits, ``_ - . / : space``, at most 250 characters)."""
    return re.sub(r"[^A-Za-z0-9_\-./ :]", "_", key)[:250]


class TensorBoardTracker(Tracker):
    """``<run_dir>/tensorboard``: scalars per round, the config as text (torch's SummaryWriter)."""

    @classmethod
    def open(cls, run_dir: Path, run_name: str, config: dict) -> TensorBoardTracker:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except Exception as e:  # noqa: BLE001 - any import problem means "run without TB"
            raise TrackerUnavailable(str(e)) from None
        log_dir = Path(run_dir) / "tensorboard"
        return cls(writer=SummaryWriter(log_dir=str(log_dir)), log_dir=log_dir)

    def log_metrics(self, step, metrics):
        for k, v in _finite_items(metrics).items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def log_params(self, config):
        self.writer.add_text("config", "```\n" + json.dumps(config, indent=2) + "\n```")

    def log_table(self, step, name, columns, rows):
        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in r) + " |"
                  for r in rows]
        self.writer.add_text(name, "\n".join(lines), step)

    def close(self, status):
        self.writer.close()

    def locations(self):
        return {"tensorboard": self.log_dir}


def mlflow_store(run_dir: Path) -> tuple[str, str | None]:
    """(tracking URI, artifact location for a new experiment or None: the server's) of a run.

    ``$MLFLOW_TRACKING_URI`` when set; else a store of the run's own, ``<run_dir>/mlflow/mlflow.db``
    with its artifacts beside it (``mlflow ui --backend-store-uri sqlite:///<run_dir>/mlflow/mlflow.db``
    reads it), never MLflow's default, which writes ``mlflow.db`` and ``mlruns/`` into the working
    directory of whatever process the ServerApp runs in (the repository, for a local SuperLink
    started there). A SQLite or plain-path store of the user's keeps a new experiment's artifacts
    beside its file, not in that working directory either."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    if not uri:
        store = Path(run_dir).resolve() / "mlflow"
        store.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{store / 'mlflow.db'}", (store / "artifacts").as_uri()
    if uri.startswith("sqlite:///"):
        return uri, (Path(uri[len("sqlite:///"):]).expanduser().resolve().parent / "mlruns").as_uri()
    return uri, None


class MlflowTracker(Tracker):
    """One MLflow run per ftis-flwr run, named by the run's name, in the experiment
    ``$MLFLOW_EXPERIMENT_NAME`` (default ``ftis-flwr``), on ``$MLFLOW_TRACKING_URI``, else in a
    store in the run's folder (:func:`mlflow_store`). Everything goes through an ``MlflowClient``
    by run id: no active run is left in the process."""

    @classmethod
    def open(cls, run_dir: Path, run_name: str, config: dict) -> MlflowTracker:
        try:
            import mlflow
        except ImportError as e:
            raise TrackerUnavailable(f"{e}; pip install mlflow") from None
        uri, artifacts = mlflow_store(run_dir)
        client = mlflow.MlflowClient(uri)
        experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "ftis-flwr"
        found = client.get_experiment_by_name(experiment)
        exp_id = found.experiment_id if found is not None else client.create_experiment(
            experiment, artifact_location=artifacts)
        run = client.create_run(exp_id, run_name=run_name, tags={"ftis_flwr.run_dir": str(run_dir)})
        return cls(client=client, run_id=run.info.run_id, uri=uri)

    def log_metrics(self, step, metrics):
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(_mlflow_key(k), v, now, step) for k, v in _finite_items(metrics).items()]
        for i in range(0, len(batch), 1000):  # MLflow's caps per batch: 1000 metrics, 100 params
            self.client.log_batch(self.run_id, metrics=batch[i:i + 1000])

    def log_params(self, config):
        from mlflow.entities import Param

        params = [Param(_mlflow_key(k), v) for k, v in flatten_params(config).items()]
        for i in range(0, len(params), 100):
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def log_table(self, step, name, columns, rows):
        data = {c: [r[i] for r in rows] for i, c in enumerate(columns)}
        data["step"] = [step] * len(rows)
        with warnings.catch_warnings():  # MLflow's own use of pandas, not ours to fix
            warnings.simplefilter("ignore", DeprecationWarning)
            self.client.log_table(self.run_id, data=data, artifact_file=f"{name}.json")

    def log_artifact(self, path):
        self.client.log_artifact(self.run_id, str(path))

    def close(self, status):
        self.client.set_terminated(self.run_id, status=status)

    def locations(self):
        return {"mlflow_run_id": self.run_id, "mlflow_tracking_uri": self.uri}


class WandbTracker(Tracker):
    """One W&B run in the project ``$WANDB_PROJECT`` (default ``ftis-flwr``), its files under
    ``<run_dir>/wandb``; ``WANDB_MODE=offline`` needs no network (``wandb sync`` uploads later)."""

    @classmethod
    def open(cls, run_dir: Path, run_name: str, config: dict) -> WandbTracker:
        try:
            import wandb
        except ImportError as e:
            raise TrackerUnavailable(f"{e}; pip install wandb") from None
        run = wandb.init(project=os.environ.get("WANDB_PROJECT", "ftis-flwr"), name=run_name,
                         dir=str(run_dir), config=config, reinit="create_new")
        return cls(run=run, wandb=wandb)

    def log_metrics(self, step, metrics):
        self.run.log(_finite_items(metrics), step=step)

    def log_params(self, config):
        self.run.config.update(config, allow_val_change=True)

    def log_table(self, step, name, columns, rows):
        self.run.log({name: self.wandb.Table(columns=list(columns), data=[list(r) for r in rows])},
                     step=step)

    def log_artifact(self, path):
        self.run.save(str(path), base_path=str(Path(path).parent), policy="now")

    def close(self, status):
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)

    def locations(self):
        return {"wandb": Path(self.run.dir).parent}


register_tracker("tensorboard", TensorBoardTracker)
register_tracker("mlflow", MlflowTracker)
register_tracker("wandb", WandbTracker)


class Trackers:
    """The trackers a run opened; every call goes to each, and one that raises is warned about
    once (naming it and the error), reported to ``on_failure(name, error)`` and left out."""

    def __init__(self, names: Sequence[str], run_dir: Path, run_name: str, config: dict, *,
                 on_unavailable: Callable[[str, str], None] | None = None,
                 on_failure: Callable[[str, str], None] | None = None):
        """``on_unavailable(name, reason)``: a tracker whose package is missing (default: a warning)."""
        self.open: dict[str, Tracker] = {}
        self._on_failure = on_failure
        unavailable = on_unavailable or (lambda n, why: warnings.warn(f"{n} unavailable ({why}); "
                                                                      "continuing without it", stacklevel=2))
        for name in dict.fromkeys(check_names(names)):
            if name == NO_TRACKER:
                continue
            try:
                self.open[name] = get_tracker(name).open(Path(run_dir), run_name, config)
            except TrackerUnavailable as e:
                unavailable(name, str(e))
            except Exception as e:  # noqa: BLE001 - a tracker that cannot start never stops the run
                self._fail(name, e)

    def _fail(self, name: str, exc: BaseException) -> None:
        error = f"{type(exc).__name__}: {exc}"[:500]
        self.open.pop(name, None)
        warnings.warn(f"tracker {name} failed ({error}); the run goes on without it", RuntimeWarning, stacklevel=2)
        if self._on_failure is not None:
            self._on_failure(name, error)

    def _each(self, method: str, *args: Any) -> None:
        for name, tracker in list(self.open.items()):
            try:
                getattr(tracker, method)(*args)
            except Exception as e:  # noqa: BLE001 - see the class docstring
                self._fail(name, e)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self._each("log_metrics", step, metrics)

    def log_params(self, config: dict) -> None:
        self._each("log_params", config)

    def log_table(self, step: int, name: str, columns: list[str], rows: list[list[Any]]) -> None:
        self._each("log_table", step, name, columns, rows)

    def log_artifact(self, path: Path) -> None:
        self._each("log_artifact", path)

    def locations(self) -> dict[str, Any]:
        """Every open tracker's :meth:`Tracker.locations`, merged."""
        return {k: v for t in self.open.values() for k, v in t.locations().items()}

    def close(self, status: str) -> None:
        """Close every open tracker (a failure to close is warned about like any other)."""
        self._each("close", status)
        self.open.clear()
