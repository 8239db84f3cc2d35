"""The Flower ServerApp: builds FTISStrategy from the run config + YAML preset and reports.

Configuration, lowest to highest priority: the dataclass defaults (``ftis_flwr.config``), the
YAML preset named by ``preset`` (``simulations/presets/<name>.yaml`` or a path), the YAML file
named by ``config-file``, then every other ``[tool.flwr.app.config]`` / ``--run-config`` key that
is not empty (``""`` means "leave it to the preset").
"""

from __future__ import annotations

import logging
import secrets
import time
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from ftis_flwr.config import load_experiment, to_dict
from ftis_flwr.reporting import RunReporter, format_summary_table
from ftis_flwr.strategy import FTISStrategy

log = logging.getLogger("ftis_flwr")

app = ServerApp()


def experiment_from_run_config(run_config: dict):
    """Split Flower's flat run config into preset, YAML file and non-empty overrides."""
    preset = str(run_config.get("preset", "") or "")
    config_file = str(run_config.get("config-file", run_config.get("config_file", "")) or "")
    overrides = {k: v for k, v in run_config.items()
                 if k not in ("preset", "config-file", "config_file") and v != ""}
    yaml_text = Path(config_file).expanduser().read_text() if config_file else None
    return load_experiment(preset or None, overrides, yaml_text=yaml_text)


def run(grid: Grid, experiment, *, connect_timeout: float = 120.0) -> Path:
    """Run the federation described by ``experiment``; returns the run directory."""
    name = f"{time.strftime('%Y%m%d-%H%M%S')}-{Path(experiment.preset).stem or 'run'}-{secrets.token_hex(2)}"
    run_dir = Path(experiment.run_dir).expanduser().resolve() / name
    nodes = [c.name for c in experiment.nodes]
    with RunReporter(run_dir, config=to_dict(experiment), node_names=nodes,
                     num_rounds=experiment.rounds.num_rounds) as reporter:
        print(f"ftis-flwr: run directory {run_dir}", flush=True)
        print(f"ftis-flwr: round 0 builds every node and evaluates it (tiny models are warm-started "
              f"once and cached: a few minutes on a 2-core CPU); each node logs to "
              f"<cache>/workers/{name}/<node>/worker.log on its machine", flush=True)

        def on_round(rnd, node_metrics, server_metrics):
            print(reporter.log_round(rnd, node_metrics, server_metrics), flush=True)

        strategy = FTISStrategy(experiment, run_name=name, out_dir=str(run_dir / "checkpoints"),
                                on_round=on_round, on_event=reporter.log_event,
                                connect_timeout=connect_timeout)
        strategy.start(grid)
        summary = reporter.finish(extra={"checkpoints": strategy.checkpoints})
    print(format_summary_table(summary), flush=True)
    print(f"ftis-flwr: metrics, plot and summary in {run_dir}", flush=True)
    return run_dir


def _log_to_console() -> None:
    """Our warnings and info on stderr, without raising every library's log level."""
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


@app.main()
def main(grid: Grid, context: Context) -> None:
    _log_to_console()
    run(grid, experiment_from_run_config(dict(context.run_config)))
