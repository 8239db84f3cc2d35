"""One real Flower simulation per process, and what a study keeps of it.

Shared by ``simulations/seeds.py`` (one preset over run seeds) and ``simulations/sweep.py`` (a
grid): :func:`simulate` runs one federation in this process through
``flwr.simulation.run_simulation`` with the project's ServerApp body and ClientApp;
:func:`summarize` reads its ``metrics.jsonl`` into per-node series; :func:`run_child` starts a
fresh Python for one run (Ray, torch threads and the workers never leak from one run into the
next) and logs it to a file.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ftis_flwr.config.dtypes import BF16_CPU_FLAGS

REPO = Path(__file__).resolve().parent.parent


def card_order(preset: str, overrides: Mapping[str, Any]) -> list[str]:
    """The node names of an experiment, in card order."""
    from ftis_flwr.experiment import load_experiment

    return [c.name for c in load_experiment(preset, dict(overrides), import_registries=False).nodes]


def seed_list(spec: str) -> list[int]:
    """``"0-4"`` or ``"0,3,5"`` (or both, comma-separated) -> run seeds; ValueError naming the
    spec when a part is not a number or a rising range."""
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()) or int(hi or lo) < int(lo or 0):
            raise ValueError(f"seeds={spec!r}: use 'a-b' (a <= b) or 'a,b,c', non-negative integers")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def simulate(preset: str, overrides: Mapping[str, Any], *, experiment: Any = None, client_app: Any = None) -> str:
    """Run ``preset`` with ``overrides`` (or a loaded ``experiment``) through Flower in this
    process; returns the run folder. The benchmarks use it too. ``client_app``: another ClientApp
    than this project's (the attack study's forger).

    SystemExit when the ServerApp did not finish (its error is in the log above).
    """
    from flwr.serverapp import ServerApp
    from flwr.simulation import run_simulation

    if client_app is None:
        from clients.client_app import app as client_app
    from ftis_flwr.config.schema import default_cache_dir
    from ftis_flwr.experiment import load_experiment
    from server_app.server_app import run, run_name

    exp = experiment if experiment is not None else load_experiment(preset, dict(overrides))
    result: dict = {}
    server = ServerApp()
    name = run_name(exp)  # named here: only this run's workers are stopped after it

    @server.main()
    def main(grid, context):
        result["run_dir"] = str(run(grid, exp, name=name))

    from ftis_flwr.node.host.processes import kill_workers_of_run

    try:
        run_simulation(server, client_app, num_supernodes=len(exp.nodes),
                       backend_config={"client_resources": {"num_cpus": 1}})
    finally:  # workers that outlived the run (it failed, or Ray left them): stopped by pid
        kill_workers_of_run(default_cache_dir(exp.cache_dir), name)
    if "run_dir" not in result:
        raise SystemExit(f"{preset}: the run did not finish (see the log above)")
    return result["run_dir"]


def incomplete(run_dir: str | Path, order: list[str]) -> list[str]:
    """Why a finished run is unfit for a study's tables, one line per node of ``order`` that never
    replied or failed the last round (so the run has no final figures from it); empty when every
    node replied in the last round. The federation goes on without a failed node, as it should,
    but a node whose model cannot be built (a missing package, a bad adapter setting) fails every
    round, and a run without it must not stand in a table as if both had trained."""
    from ftis_flwr.server.reporting.summary import load_events, load_metrics

    rows = load_metrics(run_dir)
    if not rows:
        return [f"{run_dir}: no metrics rows"]
    last = rows[-1]["round"]
    out = {}
    for name in order:
        replied = [r["round"] for r in rows if name in r.get("nodes", {})]
        if not replied:
            out[name] = f"node {name} failed every one of the run's {len(rows)} rounds"
        elif replied[-1] != last:
            out[name] = f"node {name} failed the last round ({last}): the run has no final figures from it"
    first: dict[str, str] = {}
    events = Path(run_dir) / "events.jsonl"
    for e in load_events(run_dir) if out and events.is_file() else []:
        if e.get("event") == "node_failed" and e.get("node") in out:
            first.setdefault(e["node"], str(e.get("reason", "")))
    return [line + (f"; its first failure: {_last_error_line(first[name])}" if name in first else "")
            for name, line in out.items()]


def require_complete(run_dir: str | Path, order: list[str], label: str) -> None:
    """SystemExit naming what :func:`incomplete` finds, so that no result is written for the run."""
    if problems := incomplete(run_dir, order):
        raise SystemExit(f"{label}: no result written (the run in {run_dir} is incomplete):\n  "
                         + "\n  ".join(problems))


def _last_error_line(reason: str) -> str:
    """The line of a failure's text (a traceback, as Ray passes it on) that names the error, without
    the quote and bracket that close Ray's wrapping of it."""
    lines = [ln.strip() for ln in reason.splitlines() if re.match(r"\s*[\w.]*(Error|Exception)\b", ln)]
    text = lines[-1] if lines else reason.strip().splitlines()[0] if reason.strip() else ""
    text = re.sub(r"'>$", "", text)
    return text if len(text) <= 300 else text[:297] + "..."


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def summarize(run_dir: str | Path, order: list[str] | None = None) -> dict[str, Any]:
    """Per node: every eval split's accuracy by round, and per round the filtered share of
    received samples and the truncated token share (what the sweep's tables and figures show).
    Nodes come in ``order`` (the experiment's card order), the rest after them: the metrics
    rows list nodes in reply order, which changes from run to run."""
    from ftis_flwr.server.reporting.summary import load_metrics

    rounds = load_metrics(run_dir)
    if not rounds:
        raise ValueError(f"{run_dir}: no metrics rows")
    nodes: dict[str, Any] = {}
    for name in dict.fromkeys([*(order or []), *(n for r in rounds for n in r["nodes"])]):
        acc: dict[str, list] = {}
        filtered, truncated = [], []
        for r in rounds:
            m = r["nodes"].get(name) or {}
            for key, v in m.items():
                if key.startswith("eval/") and key.endswith("/accuracy") and _num(v) is not None:
                    acc.setdefault(key[len("eval/"):-len("/accuracy")], []).append([r["round"], v])
            foreign = _num(m.get("samples_foreign"))
            if foreign:
                filtered.append([r["round"], (_num(m.get("filtered")) or 0.0) / foreign])
            if _num(m.get("frac_tokens_truncated")) is not None:
                truncated.append([r["round"], m["frac_tokens_truncated"]])
        nodes[name] = {"accuracy": acc, "filtered": filtered, "truncated": truncated}
    return {"run_dir": str(run_dir), "rounds": rounds[-1]["round"], "nodes": nodes}


MACHINE_FLAGS = ("avx2", "avx512f", *BF16_CPU_FLAGS)
"""The x86 CPU flags that pick different kernels for the same float32 op (and, for the last two,
native bfloat16): what a reader needs to tell whether two runs could repeat each other."""


def machine() -> dict[str, Any]:
    """This machine as a run's result records it: CPU model, cores, the kernel-picking flags of
    :data:`MACHINE_FLAGS` it has, and torch's version. A study spread over machines can then say
    which runs came from which CPU (docs/real-studies.md, "What repeats across CPUs")."""
    import os
    import platform

    import torch

    cpu, flags = "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = (part.strip() for part in line.partition(":"))
            if key == "model name" and not cpu:
                cpu = value
            elif key == "flags" and not flags:
                flags = set(value.split())
    except OSError:  # not Linux: the architecture is all that is told
        pass
    return {"cpu": cpu or platform.machine(), "cores": os.cpu_count(),
            "flags": [f for f in MACHINE_FLAGS if f in flags], "torch": torch.__version__}


def run_child(args: list[str], log: Path, nice: int = 0) -> int:
    """``python <args>`` in a new process from the repository root, output to ``log``; exit code."""
    cmd = [sys.executable, *args]
    if nice:
        cmd = ["nice", "-n", str(nice), *cmd]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as fh:
        return subprocess.call(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO)


def run_missing(jobs: list[tuple[str, list[str]]], out: Path, nice: int = 0) -> None:
    """Each job ``(name, args)`` whose ``<out>/<name>.json`` does not exist yet runs as
    ``python <args>`` in a new process, logged to ``<out>/<name>.log``; a failure is said and the
    rest go on (a study resumes where it stopped)."""
    for name, args in jobs:
        if (out / f"{name}.json").is_file():
            print(f"{name}: done before, kept", flush=True)
            continue
        print(f"{name}: running", flush=True)
        rc = run_child(args, out / f"{name}.log", nice)
        if rc != 0:
            print(f"{name}: failed (exit {rc}), see {out / f'{name}.log'}", flush=True)
