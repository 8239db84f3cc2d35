"""Test-wide settings: never reach a model hub, keep Flower quiet, keep torch to one thread."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def kill_workers(cache) -> None:
    """Stop, by pid, every node worker a test's federation left under its cache directory."""
    import json
    import signal
    from pathlib import Path

    for address in Path(cache).glob("workers/*/*/address.json"):
        try:
            os.kill(json.loads(address.read_text())["pid"], signal.SIGKILL)
        except (ProcessLookupError, ValueError, KeyError):
            pass


def simulate(experiment, num_supernodes: int = 2):
    """Run ``experiment`` in a real in-process Flower simulation; returns the run directory.

    ``run_simulation`` hands the ServerApp an empty run config (FACTS.md), so the experiment is
    passed in directly; the node workers are stopped afterwards whatever happens.
    """
    from flwr.serverapp import ServerApp
    from flwr.simulation import run_simulation

    from clients.client_app import app as client_app
    from server_app.server_app import run

    out = {}
    server = ServerApp()

    @server.main()
    def main(grid, context):
        out["run_dir"] = run(grid, experiment, connect_timeout=60)

    try:
        run_simulation(server, client_app, num_supernodes=num_supernodes,
                       backend_config={"client_resources": {"num_cpus": 1}})
    finally:
        kill_workers(experiment.cache_dir)
    assert "run_dir" in out, "the ServerApp did not finish: see the simulation log above"
    return out["run_dir"]
