"""A grid of federations (setup x method x mode x g x seed), each a real Flower simulation.

    python -m simulations.sweep simulations/sweeps/quick.yaml --out runs/sweep-quick
    python -m simulations.sweep simulations/sweeps/paper.yaml --dry-run

The grid file is described in ``sweep_grid.py``. Each run is one Flower simulation
(``flwr.simulation.run_simulation`` with the project's ServerApp and ClientApp) in its own
process, logged to ``<out>/logs/<key>.log``; a finished run writes ``<out>/results/<key>.json``
and is never run again, so an interrupted sweep resumes where it stopped. A failed run is
reported with its log and the sweep goes on (it is retried next time); so is a run in which a
node failed every round or the last one (the federation goes on without it, but such a run has
no final figures from that node and is not written as a result). Tiny models are
warm-started once, before the first run, into the shared cache (``FTIS_CACHE``, else
``~/.cache/ftis-flwr``: keyed by everything that determines them), so no run warm-starts.
At the end (and with ``--report-only``): ``results.csv``, ``results.md`` and PNG figures in
``<out>``. ``--dry-run`` prints the grid, the number of runs and a time estimate, and builds,
downloads and runs nothing. ``--pause`` asks a running sweep in ``<out>`` to stop after its current
run (the run finishes and lands; no other starts), so a long study pauses without losing a run;
running the sweep again goes on.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from simulations.runs import REPO, run_child
from simulations.sweep_grid import Grid, GridError, Point, load_grid

WARMSTART_ESTIMATE_S = {"small": 240, "large": 600}
"""Rough seconds to warm-start one tiny model on 2 shared cores (FACTS: 1-6 min, x2 margin)."""


RUN_OVERHEAD_S = 60
"""Seconds a run spends outside its rounds (Ray start, building and evaluating the nodes, stop): a
guess for 2 idle cores. Measured with 4 users on 2 cores (load 7-19): 3-5 min per 2-round run,
round 0 alone 43-50 s."""


def _fmt_s(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def models(grid: Grid) -> list[tuple[str, str, str]]:
    """(setup, card, state) of every model the grid needs: state says shipped / cached / to build
    (tiny) or where it comes from; nothing is built or downloaded."""
    from ftis_flwr.config.named_sources import NAMED_SOURCES, missing_package
    from ftis_flwr.experiment import load_experiment
    from ftis_flwr.tasks import make_task

    out = []
    for s in grid.setups:
        exp = load_experiment(s["preset"], s["overrides"], import_registries=False)
        for card in exp.nodes:
            if card.source == "tiny":
                from ftis_flwr.node.tiny.models import MARKER, find_shipped
                from ftis_flwr.node.tiny.tools import warm_started

                d = warm_started(card, make_task(exp.task), Path(exp.cache_dir) if exp.cache_dir else None,
                                 build=False)
                state = ("cached" if (d / MARKER).is_file() else "shipped" if find_shipped(d.name)
                         else f"to warm-start (~{WARMSTART_ESTIMATE_S[card.tiny_size] // 60} min)")
                out.append((s["name"], card.name, f"tiny {d.name}: {state}"))
            elif card.source in NAMED_SOURCES:
                need = missing_package(card.source)
                state = f"NOT INSTALLED: {need}" if need else "package installed (converted once, at its first run)"
                out.append((s["name"], card.name, f"{card.source}: {state}"))
            else:
                local = Path(card.source).expanduser().exists()
                state = "local file or folder" if local else "hub id, fetched by its node at the first run"
                out.append((s["name"], card.name, f"{card.source}: {state}"))
    return out


def missing(grid: Grid) -> list[str]:
    """What the grid's points need and this machine lacks (a named source's package, a tracker's),
    one line each: found before the first run, not after each of them has failed."""
    from ftis_flwr.cli import missing_packages
    from ftis_flwr.experiment import load_experiment

    used = {p.setup for p in grid.points}
    return list(dict.fromkeys(f"{s['name']}: {line}" for s in grid.setups if s["name"] in used
                              for line in missing_packages(load_experiment(s["preset"], s["overrides"],
                                                                           import_registries=False))))


def warm_all(grid: Grid) -> None:
    """Warm-start every tiny model of the grid once, before the runs (each run then finds it)."""
    from ftis_flwr.experiment import load_experiment
    from ftis_flwr.node.tiny.tools import warm_started
    from ftis_flwr.tasks import make_task

    done: set[str] = set()
    used = {p.setup for p in grid.points}
    for s in (s for s in grid.setups if s["name"] in used):
        exp = load_experiment(s["preset"], s["overrides"], import_registries=False)
        for card in exp.nodes:
            if card.source == "tiny":
                path = warm_started(card, make_task(exp.task), Path(exp.cache_dir) if exp.cache_dir else None)
                if str(path) not in done:
                    done.add(str(path))
                    print(f"model {s['name']}/{card.name}: {path}", flush=True)


def estimate(grid: Grid, points: list[Point]) -> float:
    rounds = {s["name"]: s["rounds"] or 1 for s in grid.setups}
    return sum((rounds[p.setup] + 1) * grid.seconds_per_round + RUN_OVERHEAD_S for p in points)


def finished_walls(grid: Grid, out: Path) -> list[float]:
    """The wall seconds of the grid's runs already finished in ``out``."""
    return [w for p in grid.points if (w := _wall(result_file(out, p.key))) is not None]


def estimate_line(grid: Grid, todo: list[Point], before: list[float]) -> str:
    """How long the runs to do will take: from the finished runs' wall seconds ``before`` where
    there are some (a resumed sweep), else projected from the grid's ``seconds_per_round``."""
    if before:
        mean = sum(before) / len(before)
        return (f"estimate: {_fmt_s(mean * len(todo))} for the {len(todo)} runs to do (a finished run took "
                f"{_fmt_s(mean)} on average, {_fmt_s(min(before))} to {_fmt_s(max(before))})")
    return (f"estimate: {_fmt_s(estimate(grid, todo))} for the {len(todo)} runs to do "
            f"({grid.seconds_per_round:g} s per round + {RUN_OVERHEAD_S} s start and stop each; warm-starts "
            f"not included)")


def run_order(points: list) -> list:
    """The order a sweep runs its points in: seed-major, so a sweep stopped part way holds every
    configuration at its first seeds (and the dry run lists them so)."""
    return sorted(points, key=lambda p: p.seed)


def result_file(out: Path, key: str) -> Path:
    """Where a run's result is written; its presence is what marks the run finished."""
    return out / "results" / f"{key}.json"


def pause_file(out: Path) -> Path:
    """The file that asks the sweep in ``out`` to stop after its current run (``--pause`` writes it)."""
    return out / "PAUSE"


def request_pause(out: Path) -> str:
    """Ask the sweep running in ``out`` to stop after its current run; returns what to tell the user."""
    if not out.is_dir():
        raise FileNotFoundError(f"{out} is not a sweep's output folder (no such folder)")
    pause_file(out).write_text("stop after the current run\n")
    return (f"asked the sweep in {out} to stop after its current run (it finishes and lands; no other "
            "starts). Run the sweep again, without --pause, to go on.")


def to_run(grid: Grid, out: Path) -> list:
    """The grid's unfinished points, in :func:`run_order`."""
    return [p for p in run_order(grid.points) if not result_file(out, p.key).is_file()]


def dry_run(grid: Grid, out: Path) -> None:
    todo = to_run(grid, out)
    print(f"grid {grid.name}: {len(grid.setups)} setups, {len(grid.points)} runs "
          f"({len(grid.points) - len(todo)} finished in {out})")
    for s in grid.setups:
        print(f"  setup {s['name']}: preset {s['preset']}, {s['nodes']} nodes, {s['rounds']} rounds, "
              f"overrides {s['overrides']}")
    for setup, card, state in models(grid):
        print(f"  model {setup}/{card}: {state}")
    for k, p in enumerate(run_order(grid.points), 1):
        done = "done" if p not in todo else "todo"
        print(f"  [{k:>3}/{len(grid.points)}] {done} {p.key}")
    print(estimate_line(grid, todo, finished_walls(grid, out)))


def run_point(grid_path: Path, key: str, out: Path) -> None:
    """The child process: run one grid point and write its result file (atomically)."""
    from simulations.runs import card_order, machine, require_complete, simulate, summarize

    grid = load_grid(grid_path)
    point = next((p for p in grid.points if p.key == key), None)
    if point is None:
        raise SystemExit(f"no grid point {key!r} in {grid_path}")
    final = result_file(out, key)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_suffix(".json.tmp")
    tmp.write_text("")  # fails now, not after the run, when the result cannot be written
    t0 = time.perf_counter()
    try:  # a run that fails (it raises) or lacks a node (SystemExit) leaves no file behind
        run_dir = simulate(point.preset, dict(point.overrides, run_dir=str(out / "runs" / key)))
        order = card_order(point.preset, dict(point.overrides))
        require_complete(run_dir, order, key)
        result = {"point": {"key": key, "setup": point.setup, "method": point.method, "mode": point.mode,
                            "g": point.g, "seed": point.seed, "preset": point.preset},
                  "overrides": dict(point.overrides), "wall_s": time.perf_counter() - t0,
                  "machine": machine(), "summary": summarize(run_dir, order)}
        tmp.write_text(json.dumps(result, indent=1))
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)


def _wall(result: Path) -> float | None:
    """A finished run's wall time from its result file (None if it is absent or unreadable)."""
    try:
        wall = json.loads(result.read_text()).get("wall_s")
    except (OSError, ValueError):
        return None
    return float(wall) if isinstance(wall, (int, float)) else None


def sweep(grid_path: Path, grid: Grid, out: Path, nice: int, retries: int = 1) -> list[tuple[str, Path]]:
    """Run every unfinished point in its own process, trying a failed one ``retries`` more times
    (Ray or a node can fail to start when the cores are overloaded); returns the failures
    (key, log of the last attempt; earlier attempts' logs are kept as ``<key>.attempt<N>.log``)."""
    order, todo = run_order(grid.points), to_run(grid, out)
    n = len(grid.points)
    print(f"grid {grid.name}: {n} runs, {n - len(todo)} finished before, {len(todo)} to run", flush=True)
    before = finished_walls(grid, out)
    if todo and before:  # a resumed sweep: the runs it already has say how long one takes
        print(estimate_line(grid, todo, before), flush=True)
    pause_file(out).unlink(missing_ok=True)  # asked before this sweep started: running it again goes on
    if todo:
        print(f"to stop after the current run: python -m simulations.sweep {os.path.relpath(grid_path)} --out "
              f"{os.path.relpath(out)} --pause", flush=True)
        warm_all(grid)
    failed: list[tuple[str, Path]] = []
    t0, walls = time.perf_counter(), []
    for i, p in enumerate(todo):
        if pause_file(out).exists():
            pause_file(out).unlink()
            print(f"paused, as asked (--pause): {i} runs done by this sweep, {len(todo) - i} left; run the "
                  "same command to go on", flush=True)
            break
        k = order.index(p) + 1
        log = out / "logs" / f"{p.key}.log"
        started, rc = time.perf_counter(), 0
        for attempt in range(1, retries + 2):
            if attempt > 1:
                os.replace(log, log.with_suffix(f".attempt{attempt - 1}.log"))
                print(f"run {k} of {n}: {p.key} failed (exit {rc}), trying again", flush=True)
            rc = run_child(["-m", "simulations.sweep", str(grid_path), "--out", str(out), "--one", p.key], log,
                           nice=nice)
            ok = rc == 0 and result_file(out, p.key).is_file()
            if ok:
                break
        walls.append(time.perf_counter() - started)
        left = len(todo) - i - 1
        eta = sum(walls + before) / len(walls + before) * left
        status = "ok" if ok else f"FAILED (exit {rc}, {attempt} attempts), log {log}"
        if not ok:
            failed.append((p.key, log))
        print(f"run {k} of {n}: {p.key} {status} in {_fmt_s(walls[-1])}; elapsed "
              f"{_fmt_s(time.perf_counter() - t0)}, ETA {_fmt_s(eta)} ({left} left)", flush=True)
    return failed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("grid", help="grid YAML file (simulations/sweeps/*.yaml)")
    ap.add_argument("--out", default="", help="output folder (default runs/sweep-<grid name>)")
    ap.add_argument("--dry-run", action="store_true", help="list the grid and an estimate; run nothing")
    ap.add_argument("--report-only", action="store_true", help="rebuild tables and figures only")
    ap.add_argument("--retries", type=int, default=1, help="extra attempts of a failed run (default 1)")
    ap.add_argument("--nice", type=int, default=None, help="niceness of the runs (default: the grid's, 15)")
    ap.add_argument("--only", default="", help="run only the points whose key contains every one "
                    "of these comma-separated strings (e.g. 'expertise__,seed-0')")
    ap.add_argument("--pause", action="store_true", help="ask the sweep running in --out to stop after "
                    "its current run, and return at once (run the sweep again to go on)")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    grid_path = Path(a.grid).resolve()
    try:
        grid = load_grid(grid_path)
    except GridError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if a.only and a.one is None:
        wanted = [w for w in a.only.split(",") if w]
        grid.points = [p for p in grid.points if all(w in p.key for w in wanted)]
        if not grid.points:
            print(f"error: --only {a.only!r} matches no point of {grid_path}", file=sys.stderr)
            return 2
    out = Path(a.out or REPO / "runs" / f"sweep-{grid.name}").resolve()
    if a.one is not None:
        run_point(grid_path, a.one, out)
        return 0
    if a.dry_run:
        dry_run(grid, out)
        return 0
    if a.pause:
        try:
            print(request_pause(out))
        except FileNotFoundError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0
    if not a.report_only and to_run(grid, out) and (lacking := missing(grid)):
        print("error: the grid's runs need packages this machine lacks; nothing was run:\n  "
              + "\n  ".join(lacking), file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    failed = [] if a.report_only else sweep(grid_path, grid, out, grid.nice if a.nice is None else a.nice,
                                         max(0, a.retries))
    from simulations.sweep_report import load_results, markdown, write_all

    # the tables cover every result in the folder: several grids may share it (sweeps/extra-*.yaml)
    title = f"sweep {grid.name}" if out.name == f"sweep-{grid.name}" else f"{out.name} (last grid: {grid.name})"
    paths = write_all(out, grid.id_split, grid.ood_split, title=title)
    print(markdown(load_results(out), grid.id_split, grid.ood_split, title=title))
    print("wrote " + ", ".join(str(p) for p in paths))
    for key, log in failed:
        print(f"failed: {key} (log {log})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
