"""The Flower ServerApp: builds FTISStrategy from the run config + YAML preset and reports.

Configuration, lowest to highest priority: the dataclass defaults (``ftis_flwr.config.schema``), the
YAML preset named by ``preset`` (``ftis_flwr/config/presets/<name>.yaml`` or a path), the YAML file
named by ``config-file``, then every other ``[tool.flwr.app.config]`` / ``--run-config`` key that
is not empty (``""`` means "leave it to the preset").
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from ftis_flwr.config.schema import ConfigError, to_dict
from ftis_flwr.experiment import from_dict, load_run_config
from ftis_flwr.server.reporting.reporter import PROGRESS_LEGEND, RunReporter, run_name, run_title
from ftis_flwr.server.reporting.summary import FAILED_PREFIX, final_line, format_summary_table
from ftis_flwr.server.roster import FederationError
from ftis_flwr.server.run_failure import RunFailed, exception_line
from ftis_flwr.server.state import ServerStateError, load_server_state
from ftis_flwr.server.strategy import FTISStrategy

log = logging.getLogger("ftis_flwr")

app = ServerApp()


def experiment_from_run_config(run_config: dict):
    """Flower's flat run config -> validated experiment (:func:`ftis_flwr.config.merge.load_run_config`):
    the ``preset``, the ``config-file`` on top, every non-empty key, then ``overrides``."""
    return load_run_config(run_config)


def run(grid: Grid, experiment, *, connect_timeout: float = 120.0,
        after_round: Callable[[int, dict], None] | None = None, resume: str | Path = "",
        name: str = "") -> Path:
    """Run the federation described by ``experiment``; returns the run directory.

    ``name``: the run's name (default :func:`run_name`); whoever starts a simulation names it
    first to stop exactly its workers afterwards (``ftis_flwr.node.host.processes.kill_workers_of_run``).

    ``resume``: a run directory to continue after its last completed round, with the
    configuration saved in it (``experiment`` is then not used). ``after_round(round,
    node_metrics)`` is called after each round is logged (tests use it to kill a worker).

    A run that stops (a reward that failed, too few nodes: ``FederationError``, or anything that
    raises) still writes its summary and plot, the failure first, prints one line that says why
    and raises; one in which a node replied in no round writes its outputs, then raises
    ``RunFailed`` (:mod:`ftis_flwr.server.run_failure`). Raising marks the run failed in Flower.
    """
    state = None
    if resume:
        run_dir = Path(resume).expanduser().resolve()
        state = load_server_state(run_dir)
        experiment = from_dict(json.loads((run_dir / "config.json").read_text()), import_registries=True)
        name = run_dir.name
    else:
        name = name or run_name(experiment)
        run_dir = Path(experiment.run_dir).expanduser().resolve() / name
    nodes = [c.name for c in experiment.nodes]
    with RunReporter(run_dir, config=to_dict(experiment), node_names=nodes,
                     num_rounds=experiment.rounds.num_rounds, evaluates=experiment.rounds.evaluates,
                     resume_after=None if state is None else state.round,
                     report_to=list(experiment.report.to)) as reporter:
        print(f"ftis-flwr: {run_title(to_dict(experiment))}; run directory {run_dir}", flush=True)
        print(f"ftis-flwr: {PROGRESS_LEGEND}", flush=True)
        if state is not None:
            print(f"ftis-flwr: resuming after {'step' if state.schedule else 'round'} {state.round} with the "
                  f"run's saved configuration "
                  f"({run_dir / 'config.json'}; other run-config keys are not used); each node "
                  "continues from its own saved state", flush=True)
            reporter.log_event("resumed", after_round=state.round)
        else:
            print(f"ftis-flwr: every node builds its model before round 0, its progress below (a model the "
                  f"package does not ship is warm-started or converted once, then cached); round 0 evaluates "
                  f"them; each node logs to <cache>/workers/{name}/<node>/worker.log on its machine", flush=True)

        def on_round(rnd, node_metrics, server_metrics):
            print(reporter.log_round(rnd, node_metrics, server_metrics), flush=True)
            if after_round is not None:
                after_round(rnd, node_metrics)

        strategy = FTISStrategy(experiment, run_name=name, out_dir=str(run_dir / "checkpoints"),
                                on_round=on_round, on_event=reporter.log_event,
                                on_samples=lambda rnd, node, rows: reporter.log_table(
                                    rnd, f"samples/{node}", ["round", "node", "prompt", "completion", "reward"],
                                    [[rnd, node, r["prompt"], r["completion"], r["reward"]] for r in rows]),
                                connect_timeout=connect_timeout, state_dir=str(run_dir))
        try:
            if state is not None:
                strategy.restore(state)
            strategy.start(grid)
        except Exception as exc:  # the run stopped: its outputs are written all the same, failure first
            _finish_failed(reporter, strategy, run_dir, exception_line(exc))
            raise
        summary = reporter.finish(extra={"checkpoints": strategy.checkpoints})
    print(format_summary_table(dataclasses.replace(summary, failure="")), flush=True)  # the last line says it
    print(final_line(summary, run_dir), flush=True)
    if summary.failure:  # a node replied in no round: the run did not do what it was asked
        raise RunFailed(summary.failure)
    return run_dir


def _finish_failed(reporter: RunReporter, strategy: FTISStrategy, run_dir: Path, why: str) -> None:
    """Write a stopped run's summary.md, summary.json and plot.png (why it failed first) and say
    why on one line, the stream's only account of it (the tables are in summary.md); a failure to
    write them is warned about and never hides why the run stopped."""
    try:
        summary = reporter.finish(extra={"checkpoints": strategy.checkpoints}, failure=why)
    except Exception as exc:  # noqa: BLE001 - the run's own failure is what must be raised
        log.warning("could not write the failed run's summary and plot: %s: %s", type(exc).__name__, exc)
        print(f"{FAILED_PREFIX}{why} (metrics and events in {run_dir})", flush=True)
        return
    print(final_line(summary, run_dir), flush=True)


def _log_to_console() -> None:
    """Our warnings and info on stderr, without raising every library's log level."""
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


class _WithoutTraceback(logging.Filter):
    """Flower logs a failed ServerApp with its traceback; for a ConfigError, and for a run that
    stopped because of its federation (a node, a reward), the message printed before suffices."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, (ConfigError, ServerStateError, FederationError)):
            why = ("the run failed (why: the `ftis-flwr: the run failed` line above)"
                   if isinstance(exc, FederationError) else "invalid configuration (listed above)")
            record.msg, record.args = f"{record.getMessage()}: {why}", ()
            record.exc_info, record.exc_text = None, None
        return True


_FILTER = _WithoutTraceback()


@app.main()
def main(grid: Grid, context: Context) -> None:
    _log_to_console()
    logging.getLogger("flwr").addFilter(_FILTER)  # once: adding the same filter again is a no-op
    resume = str(context.run_config.get("resume", "") or "")
    try:
        experiment = None if resume else experiment_from_run_config(dict(context.run_config))
        if resume:
            load_server_state(Path(resume).expanduser())  # refuse early: a clear message, no traceback
    except (ConfigError, ServerStateError) as exc:
        # One short message listing every error; raising marks the run failed in Flower (`flwr ls`),
        # but `flwr run --stream` still exits 0 in Flower 1.42: it does not check the run's status.
        print(f"ftis-flwr: {exc}", flush=True)
        raise exc.with_traceback(None) from None
    try:
        run(grid, experiment, resume=resume)
    except FederationError as exc:  # said on one line by run(); raising marks the run failed in Flower
        raise exc.with_traceback(None) from None
