"""The Flower tax: the share of a round that is not any node's compute.

    python -m benchmarks.flower_tax sim --rounds 10 --poll 0.2 0.02     # side by side, one run
    python -m benchmarks.flower_tax deploy --rounds 6                    # SuperLink + 2 SuperNodes
    python -m benchmarks.flower_tax breakdown --rounds 3                 # a node's step, no Flower

Per round: tax = (round wall time - the slowest node's in-worker compute) / round wall time,
where in-worker compute is the timings a node's reply carries (train, generate, evaluate, state
save: ``ftis_flwr.server.budget.COMPUTE_KEYS``) and the round wall time is the strategy's
``round_seconds`` (push to last reply aggregated). ``wall`` also counts what the ServerApp does
between rounds (logging, saving its state): the time between two rounds' metrics lines. Round 0
(every node builds its model) is shown but left out of the means.

``sim``: the preset (default cpu-pair, the offline default) in ``flwr.simulation.run_simulation``,
once per ``--poll`` value (``ftis_flwr.server.grid_io.POLL_INTERVAL``), each in its own process.
``deploy``: a local ``flower-superlink --insecure`` and one ``flower-supernode`` per card, then
``flwr run . <federation>`` as benchmarks/chaos.py does; every process is stopped by its pid.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from deploy.secure_local import BIN, free_port, start, stop
from ftis_flwr.config.merge import ConfigError, parse_overrides
from ftis_flwr.node.host.processes import kill_workers_of_new_runs, worker_runs

REPO = Path(__file__).resolve().parent.parent


def taxes(run_dir: Path) -> list[dict]:
    """Per round: round_seconds, the slowest node's compute, tax, wall and tax of the wall."""
    from ftis_flwr.server.budget import compute_seconds
    from ftis_flwr.server.reporting.summary import load_metrics

    rows, prev = [], None
    for r in load_metrics(run_dir):
        rsec = r["server"]["round_seconds"]
        busy = max(compute_seconds(m) for m in r["nodes"].values())
        row = {"round": r["round"], "round_seconds": rsec, "compute": busy, "tax": (rsec - busy) / rsec}
        if prev is not None:
            row["wall"] = r["time"] - prev
            row["tax_wall"] = (row["wall"] - busy) / row["wall"]
        prev = r["time"]
        rows.append(row)
    return rows


def report(label: str, rows: list[dict]) -> dict:
    later = [r for r in rows if r["round"] > 0]
    mean = {k: sum(r[k] for r in later) / len(later) for k in ("round_seconds", "compute", "tax", "wall", "tax_wall")}
    print(f"\n{label}: {len(later)} rounds after round 0")
    print("round  round_s  compute_s   tax   wall_s  tax(wall)")
    for r in rows:
        print(f"{r['round']:5d}  {r['round_seconds']:7.2f}  {r['compute']:9.2f}  {r['tax']:5.3f}"
              + (f"  {r['wall']:7.2f}  {r['tax_wall']:9.3f}" if "wall" in r else ""))
    print(f" mean  {mean['round_seconds']:7.2f}  {mean['compute']:9.2f}  {mean['tax']:5.3f}  "
          f"{mean['wall']:7.2f}  {mean['tax_wall']:9.3f}")
    return mean


def _overrides(pairs: list[str]) -> dict[str, str]:
    """``--set`` through the library's own key=value parser (the shell's tokens re-quoted)."""
    try:
        return parse_overrides(shlex.join(pairs))
    except ConfigError as exc:
        raise SystemExit(f"--set: {exc}") from None


def sim_one(preset: str, sets: dict[str, str], poll: float, out: Path) -> None:
    """One simulation in this process with grid_io.POLL_INTERVAL = poll; writes out/result.json."""
    import ftis_flwr.server.grid_io as grid_io
    from simulations.runs import simulate

    grid_io.POLL_INTERVAL = poll
    run_dir = simulate(preset, dict(sets, run_dir=str(out / "runs")))
    (out / "result.json").write_text(json.dumps({"run_dir": run_dir}))


def sim(a) -> None:
    means = {}
    for poll in a.poll:
        out = Path(tempfile.mkdtemp(prefix=f"tax-sim-{poll}-"))
        cmd = [sys.executable, "-m", "benchmarks.flower_tax", "sim-one", "--preset", a.preset, "--poll", str(poll),
               "--out", str(out), "--set", f"rounds.num_rounds={a.rounds}", *a.set]
        print(f"poll {poll} s: running ({out})", flush=True)
        with open(out / "log.txt", "w") as log:
            rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        if rc != 0:
            raise SystemExit(f"poll {poll}: failed (exit {rc}), see {out / 'log.txt'}")
        run_dir = Path(json.loads((out / "result.json").read_text())["run_dir"])
        means[poll] = report(f"simulation, {a.preset}, grid poll {poll} s", taxes(run_dir))
    print("\nsummary (means over rounds >= 1):")
    for poll, m in means.items():
        print(f"  poll {poll:5.3f} s: tax {m['tax']:.3f} (of the wall between rounds: {m['tax_wall']:.3f}), "
              f"round {m['round_seconds']:.2f} s, slowest compute {m['compute']:.2f} s")


def deploy(a) -> None:
    from ftis_flwr.experiment import load_experiment

    tmp = Path(tempfile.mkdtemp(prefix="tax-deploy-"))
    port = free_port()
    home = tmp / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text(f'[superlink]\ndefault = "dep"\n\n[superlink.dep]\n'
                                      f'address = "127.0.0.1:{port}"\ninsecure = true\n')
    env = dict(os.environ, FLWR_HOME=str(home), FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1")
    cache, runs = Path(a.cache) if a.cache else tmp / "cache", tmp / "runs"
    before = worker_runs(cache)  # a shared --cache: only this run's workers are stopped after it
    cards = [c.name for c in load_experiment(a.preset).nodes]
    sets = " ".join(f"{k}={v}" for k, v in _overrides([f"rounds.num-rounds={a.rounds}", *a.set]).items())
    procs = [start([str(BIN / "flower-superlink"), "--insecure", "--isolation", "subprocess", "--host",
                     "127.0.0.1", "--port", str(port), "--disable-runtime-dependency-installation"],
                    env, tmp / "superlink.log")]
    print(f"deployment in {tmp}: SuperLink pid {procs[0].pid} on port {port}", flush=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or procs[0].poll() is not None:
                    raise SystemExit("flower-superlink did not start listening") from None
                time.sleep(0.3)
        for card in cards:
            procs.append(start([str(BIN / "flower-supernode"), "--insecure", "--superlink",
                                 f"127.0.0.1:{port}", "--port", str(free_port()), "--node-config",
                                 f'card="{card}"'], env, tmp / f"supernode-{card}.log"))
        run = subprocess.run([str(BIN / "flwr"), "run", ".", "dep", "--stream", "--run-config",
                              f"preset='{a.preset}' cache-dir='{cache}' run-dir='{runs}' {sets}"],
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=3600)
    finally:
        kill_workers_of_new_runs(cache, before)
        for proc in reversed(procs):
            stop(proc)
    dirs = list(runs.glob("*"))
    if run.returncode != 0 or len(dirs) != 1:
        raise SystemExit(f"the deployment run failed:\n{(run.stdout + run.stderr)[-3000:]}")
    m = report(f"deployment (SuperLink + {len(cards)} SuperNodes on localhost, --insecure), {a.preset}",
               taxes(dirs[0]))
    print(f"\nsummary: deployment tax {m['tax']:.3f} (of the wall between rounds: {m['tax_wall']:.3f}), "
          f"round {m['round_seconds']:.2f} s, slowest compute {m['compute']:.2f} s")


def breakdown(a) -> None:
    """Without Flower: a real node's whole step (decode + checks + compute + encode) against the
    compute it reports, on payloads of the preset's size. What is left of the tax after this is
    Flower's and the ClientApp's (message pick-up, record conversion, the worker socket)."""
    import time

    from ftis_flwr.experiment import load_experiment
    from ftis_flwr.node.host.payload_step import step_from_payloads
    from ftis_flwr.node.node import Node
    from ftis_flwr.server.budget import compute_seconds
    from ftis_flwr.wire.rollouts import encode_groups

    exp = load_experiment(a.preset, dict(kv.split("=", 1) for kv in a.set))
    b = exp.rounds.prompts_per_node
    nodes = [Node(card, exp) for card in exp.nodes]
    pending = {n.card.name: n.generate(list(range(i * b, (i + 1) * b)), exp.rollout.group_size, 0)
               for i, n in enumerate(nodes)}
    for n in nodes:
        n.pending = pending[n.card.name]
    print(f"{a.preset}: per node per round, seconds (best of {a.rounds})")
    for node in nodes:
        best = None
        for _ in range(a.rounds):
            others = {o.card.name: (*encode_groups(pending[o.card.name], vocab_size=o.vocab_size),
                                    list(range(j * b, (j + 1) * b))) for j, o in enumerate(nodes) if o is not node}
            t0 = time.perf_counter()
            out = step_from_payloads(node, {"round": 1, "num_rounds": 2, "prompt_indices":
                                             list(range(9000, 9000 + b)), "group_size": exp.rollout.group_size,
                                             "evaluate": False, "foreign_payloads": others})
            total = time.perf_counter() - t0
            busy = compute_seconds(out["metrics"])
            if best is None or total < best[0]:
                best = (total, busy)
        total, busy = best
        print(f"  {node.card.name}: whole step {total:.3f}, reported compute {busy:.3f}, "
              f"decode/checks/encode {total - busy:.3f} ({(total - busy) / total:.1%} of the step)")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    for name in ("sim", "deploy", "sim-one", "breakdown"):
        s = sub.add_parser(name)
        s.add_argument("--preset", default="cpu-pair")
        s.add_argument("--rounds", type=int, default=10)
        s.add_argument("--set", nargs="*", action="extend", default=[], help="extra overrides, key=value")
    sub.choices["sim"].add_argument("--poll", type=float, nargs="+", default=[0.2, 0.02])
    sub.choices["sim-one"].add_argument("--poll", type=float, required=True)
    sub.choices["sim-one"].add_argument("--out", required=True)
    sub.choices["deploy"].add_argument("--cache", default="", help="cache dir (default: a fresh one)")
    a = p.parse_args(argv)
    if a.mode == "sim-one":
        sim_one(a.preset, _overrides(a.set), a.poll, Path(a.out))
    elif a.mode == "sim":
        sim(a)
    elif a.mode == "breakdown":
        breakdown(a)
    else:
        deploy(a)


if __name__ == "__main__":
    main()
