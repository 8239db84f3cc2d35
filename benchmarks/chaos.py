"""A chaos run: a local deployment (SuperLink + one SuperNode per card) under a seeded fault driver.

    python -m benchmarks.chaos [--schedule sync|async] [--rounds 30] [--seed 0] [--no-faults]
                               [--workdir DIR] [--out FILE.json] [--set key=value ...]
    python -m benchmarks.chaos --report DIR     # a markdown table of every DIR/*.json

What the driver does while ``flwr run`` trains the study (default: the four-node
``simulations/studies/cpu-quad.yaml``, lightened with ``--set``), all of it seeded by ``--seed``:
  - every ``--kill-every`` rounds (round = the furthest round any node has logged), SIGKILLs a
    random node's worker process group (the pid its ``address.json`` names);
  - once, at a seeded round in the middle third, stops the ServerApp (``flwr stop <run id>``) and
    resumes the run from its folder (``--run-config "resume='<run dir>'"``);
  - once, keeps one card's SuperNode away for two rounds (SIGTERM to its process group, started
    again two rounds later: the card moves to the new node id).
Then it checks what the run left: every round (step) exactly once in ``metrics.jsonl``; per node,
``updates`` strictly increasing over its rows (no update applied twice) and its final value within
its trained rounds (logged rows after round 0, plus at most one per failed round: an update can
land while its reply is lost); and at most two failed node rounds per fault injected. It prints
the faults injected, rounds lost and the recovery time of each fault (until the faulted node's
next logged round, or the resumed run's first), and the final accuracies. ``main(argv)`` returns
all of it as a dict. Every process it starts is stopped by its pid (process group) at the end,
also on failure; only 127.0.0.1 is used.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from deploy.secure_local import BIN, free_port, kill_workers, seed_cache, start, stop, wait_for

REPO = Path(__file__).resolve().parent.parent

STUDY = REPO / "simulations" / "studies" / "cpu-quad.yaml"
LIGHT = ("rounds.prompts-per-node=16", "rounds.eval-size=200", "rounds.eval-every=10",
         "rounds.round-timeout=300")
"""The study, lightened so a 30-round chaos run takes minutes on 2 cores (a round ~4 s of compute)."""


def say(msg: str) -> None:
    print(f"[chaos] {msg}", flush=True)


def rows(run_dir: Path | None) -> list[dict]:
    """metrics.jsonl as written so far (a half-written last line is left for the next read)."""
    path = None if run_dir is None else run_dir / "metrics.jsonl"
    if path is None or not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return out


def progress(records: list[dict]) -> int:
    """The furthest round any node has logged (sync: the round; async: a node's own round)."""
    best = -1
    for r in records:
        for m in r["nodes"].values():
            best = max(best, int(m.get("round", r["round"])))
    return best


def plan(seed: int, rounds: int, cards: list[str], kill_every: int, faults: bool) -> dict:
    rng = np.random.default_rng(seed)
    if not faults:
        return {"kills": {}, "stop_at": None, "away": None}
    kills = {r: str(rng.choice(cards)) for r in range(kill_every, rounds - 1, kill_every)}
    third = max(rounds // 3, 2)
    stop_at = int(rng.integers(third, max(2 * third, third + 1)))
    away_at = int(rng.integers(2, max(rounds - 4, 3)))
    if away_at <= stop_at <= away_at + 2:  # one fault at a time: the stop after the node is back
        stop_at = away_at + 3 if away_at + 3 < rounds else max(away_at - 1, 1)
    return {"kills": kills, "stop_at": stop_at, "away": (away_at, str(rng.choice(cards)))}


class Deployment:
    """The SuperLink, one SuperNode per card, and the ``flwr run`` in progress."""

    def __init__(self, work: Path, cards: list[str]):
        self.work, self.cards = work, cards
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        home = work / "flwr-home"
        home.mkdir(exist_ok=True)
        self.port = free_port()
        (home / "config.toml").write_text(f'[superlink]\ndefault = "chaos"\n\n[superlink.chaos]\n'
                                          f'address = "127.0.0.1:{self.port}"\ninsecure = true\n')
        self.env = dict(os.environ, FLWR_HOME=str(home), FLWR_TELEMETRY_ENABLED="0",
                        FLWR_DISABLE_UPDATE_CHECK="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        self.superlink = start([str(BIN / "flower-superlink"), "--insecure", "--isolation", "subprocess",
                                "--host", "127.0.0.1", "--port", str(self.port),
                                "--disable-runtime-dependency-installation"], self.env, self.logs / "superlink.log")
        self.supernodes: dict[str, subprocess.Popen] = {}
        self.run_proc: subprocess.Popen | None = None
        self.starts = 0

    def start_supernode(self, card: str) -> None:
        self.supernodes[card] = start([str(BIN / "flower-supernode"), "--insecure", "--superlink",
                                       f"127.0.0.1:{self.port}", "--port", str(free_port()),
                                       "--node-config", f'card="{card}"'],
                                      self.env, self.logs / f"supernode-{card}-{time.time():.0f}.log")

    def flwr_run(self, run_config: str) -> None:
        self.starts += 1
        log = open(self.logs / f"flwr-run-{self.starts}.log", "wb")
        self.run_proc = subprocess.Popen([str(BIN / "flwr"), "run", ".", "chaos", "--stream", "--run-config",
                                          run_config], cwd=REPO, env=self.env, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def flwr(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "flwr"), *args], cwd=REPO, env=self.env, capture_output=True,
                              text=True, timeout=120)

    def running_run_id(self) -> int | None:
        res = self.flwr("ls", "chaos", "--format", "json")
        try:
            runs = json.loads(res.stdout).get("runs", [])
        except json.JSONDecodeError:
            return None
        live = [r for r in runs if str(r.get("status", "")).startswith(("running", "starting", "pending"))]
        return int(live[-1]["run-id"]) if live else None

    def close(self, cache: Path) -> None:
        if self.run_proc is not None and self.run_proc.poll() is None:
            stop(self.run_proc)
        kill_workers(cache)
        for proc in self.supernodes.values():
            if proc.poll() is None:
                stop(proc)
        stop(self.superlink)


def kill_worker(cache: Path, run_name: str, card: str) -> int | None:
    """SIGKILL ``card``'s worker (and its group) of run ``run_name``; its pid, None if none ran."""
    from ftis_flwr.node.host.processes import kill_worker_group, worker_dir

    address = worker_dir(cache, run_name, card) / "address.json"
    try:
        pid = int(json.loads(address.read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None
    kill_worker_group(pid)
    return pid


def check(records: list[dict], events: list[dict], cards: list[str], faults: int = 0) -> dict:
    """What the run left, checked: each round once, updates never repeated, counters explained,
    and at most two failed node rounds per fault injected (an away node must not burn rounds)."""
    out: dict = {"rounds_once": [r["round"] for r in records] == list(range(len(records)))}
    failed: dict[str, int] = {c: 0 for c in cards}
    for e in events:
        if e["event"] == "node_failed" and e.get("node") in failed:
            failed[e["node"]] += 1
    per_node = {}
    for card in cards:
        seq = [(r["round"], r["nodes"][card].get("updates")) for r in records if card in r["nodes"]]
        ups = [u for _, u in seq if u is not None]
        trained = sum(1 for rnd, u in seq if u is not None)
        final = ups[-1] if ups else 0
        per_node[card] = {"rows": len(seq), "trained_rows": trained, "failed_rounds": failed[card],
                          "steps_without_it": len(records) - len(seq),
                          "final_updates": final,
                          "strictly_increasing": all(b > a for a, b in zip(ups, ups[1:])),
                          "counter_explained": trained <= final <= trained + failed[card]}
    out["nodes"] = per_node
    out["failures_bounded"] = sum(failed.values()) <= 2 * faults
    out["ok"] = out["rounds_once"] and out["failures_bounded"] and all(
        n["strictly_increasing"] and n["counter_explained"] for n in per_node.values())
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--study", type=Path, default=STUDY)
    ap.add_argument("--schedule", choices=("sync", "async"), default="sync")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0, help="the run's seed (rounds.seed) and the driver's")
    ap.add_argument("--kill-every", type=int, default=5, help="rounds between two worker kills")
    ap.add_argument("--no-faults", action="store_true", help="the same run without the driver (the reference)")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--set", nargs="*", default=list(LIGHT), help="run-config overrides (default: %(default)s)")
    ap.add_argument("--timeout", type=float, default=5400, help="seconds the whole run may take")
    ap.add_argument("--out", type=Path, default=None, help="also write the result as JSON here")
    a = ap.parse_args(argv)
    from ftis_flwr.experiment import load_experiment
    from ftis_flwr.server.reporting.summary import load_events

    work = (a.workdir or Path(tempfile.mkdtemp(prefix="ftis-chaos-"))).resolve()
    cache, runs = work / "cache", work / "runs"
    exp = load_experiment(str(a.study))
    cards = [c.name for c in exp.nodes]
    faults = plan(a.seed, a.rounds, cards, a.kill_every, not a.no_faults)
    say(f"workdir {work}; {len(cards)} cards, {a.rounds} rounds, {a.schedule}; plan {faults}")
    seed_cache(cache, str(a.study))
    run_config = " ".join([f"config-file='{a.study}'", f"cache-dir='{cache}'", f"run-dir='{runs}'",
                           f"rounds.num-rounds={a.rounds}", f"rounds.seed={a.seed}",
                           f"exchange.schedule='{a.schedule}'", *a.set])
    dep = Deployment(work, cards)
    injected: list[dict] = []
    run_dir: Path | None = None
    t0 = time.monotonic()
    try:
        wait_for(lambda: _listening(dep.port), dep.superlink, "SuperLink listening", 60)
        for card in cards:
            dep.start_supernode(card)
        time.sleep(3)
        dep.flwr_run(run_config)
        done_kills, stopped, away = set(), False, None
        while time.monotonic() - t0 < a.timeout:
            if run_dir is None:
                found = sorted(runs.glob("*")) if runs.exists() else []
                run_dir = found[0] if found else None
            records = rows(run_dir)
            at = progress(records)
            for r, card in faults["kills"].items():
                if at >= r and r not in done_kills:
                    done_kills.add(r)
                    pid = kill_worker(cache, run_dir.name, card)
                    injected.append({"fault": "worker_killed", "node": card, "at_round": at, "pid": pid,
                                     "time": time.monotonic()})
                    say(f"round {at}: SIGKILL {card}'s worker (pid {pid})")
            if faults["away"] and away is None and at >= faults["away"][0]:
                card = faults["away"][1]
                stop(dep.supernodes[card])
                away = {"fault": "supernode_away", "node": card, "at_round": at, "time": time.monotonic()}
                injected.append(away)
                say(f"round {at}: SuperNode of {card} stopped (away for two rounds)")
            if away is not None and "back_time" not in away and at >= away["at_round"] + 2:
                dep.start_supernode(away["node"])
                away["back_time"] = time.monotonic()
                say(f"round {at}: SuperNode of {away['node']} started again")
            if faults["stop_at"] is not None and not stopped and at >= faults["stop_at"]:
                stopped = True
                run_id = dep.running_run_id()
                res = dep.flwr("stop", str(run_id), "chaos") if run_id is not None else None
                dep.run_proc.wait(timeout=120)
                injected.append({"fault": "server_stopped", "at_round": at, "run_id": run_id,
                                 "stop_exit": None if res is None else res.returncode, "time": time.monotonic()})
                say(f"round {at}: ServerApp of run {run_id} stopped; resuming {run_dir}")
                dep.flwr_run(f"resume='{run_dir}'")
            if dep.run_proc.poll() is not None and (stopped or faults["stop_at"] is None):
                break
            time.sleep(0.5)
        else:
            raise TimeoutError(f"the run did not end within {a.timeout:.0f} s")
        returncode = dep.run_proc.returncode
    finally:
        dep.close(cache)
    records, events = rows(run_dir), load_events(run_dir) if run_dir else []
    result = {"workdir": str(work), "run_dir": str(run_dir), "schedule": a.schedule, "seed": a.seed,
              "faults_planned": faults, "returncode": returncode, "wall_seconds": time.monotonic() - t0,
              "check": check(records, events, cards, len(injected)),
              "injected": _recovery(injected, records, run_dir),
              "final_accuracy": _final_accuracy(run_dir)}
    result["ok"] = result["check"]["ok"] and returncode == 0 and bool(result["final_accuracy"])
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    return result


def report(results: list[dict]) -> str:
    """Markdown: one row per run (faults, rounds lost, recovery, final accuracy), and per schedule
    each node's final accuracy with faults against the spread of the runs without."""
    lines = ["| schedule | seed | faults | faults injected | node rounds lost (sync: rows missing; async: "
             "failed) | recovery s (median, max) | "
             "checks | final test accuracy |", "|---|---|---|---|---|---|---|---|"]
    for r in sorted(results, key=lambda r: (r["schedule"], bool(r["injected"]), r["seed"])):
        rec = sorted(f["recovery_seconds"] for f in r["injected"] if f["recovery_seconds"] is not None)
        lost = sum(n["steps_without_it"] for n in r["check"]["nodes"].values()) if r["schedule"] == "sync" \
            else sum(n["failed_rounds"] for n in r["check"]["nodes"].values())
        acc = ", ".join(f"{k} {v:.3f}" for k, v in sorted(r["final_accuracy"].items()))
        kinds = ", ".join(sorted({f["fault"] for f in r["injected"]})) or "none"
        lines.append(f"| {r['schedule']} | {r['seed']} | {kinds} | {len(r['injected'])} | {lost} | "
                     + (f"{np.median(rec):.0f}, {max(rec):.0f}" if rec else "-")
                     + f" | {'pass' if r['ok'] else 'FAIL'} | {acc} |")
    lines += ["", "| schedule | node | with faults | without faults (min..max) | within the spread |",
              "|---|---|---|---|---|"]
    for sched in sorted({r["schedule"] for r in results}):
        ref = [r for r in results if r["schedule"] == sched and not r["injected"]]
        for r in [r for r in results if r["schedule"] == sched and r["injected"]]:
            for node, acc in sorted(r["final_accuracy"].items()):
                base = [x["final_accuracy"][node] for x in ref if node in x["final_accuracy"]]
                inside = "-" if not base else ("yes" if min(base) <= acc <= max(base) else "no")
                spread = f"{min(base):.3f}..{max(base):.3f}" if base else "-"
                lines.append(f"| {sched} (seed {r['seed']}) | {node} | {acc:.3f} | {spread} | {inside} |")
    return "\n".join(lines) + "\n"


def _listening(port: int) -> bool:
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def _recovery(injected: list[dict], records: list[dict], run_dir: Path | None) -> list[dict]:
    """Seconds from each fault until the faulted node (the server: anything) logged a round again,
    read from the rows' write times (metrics.jsonl's ``time``)."""
    out = []
    for f in injected:
        since = f.get("back_time", f["time"])
        start_wall = time.time() - (time.monotonic() - since)
        later = [r for r in records if r.get("time", 0) > start_wall
                 and (f["fault"] == "server_stopped" or f.get("node") in r["nodes"])]
        row = {k: v for k, v in f.items() if k not in ("time", "back_time")}
        row["recovery_seconds"] = (later[0]["time"] - start_wall) if later else None
        row["recovered_in_round"] = later[0]["round"] if later else None
        out.append(row)
    return out


def _final_accuracy(run_dir: Path | None) -> dict[str, float]:
    if run_dir is None or not (run_dir / "summary.json").exists():
        return {}
    data = json.loads((run_dir / "summary.json").read_text())
    return {node: splits["test"]["last"] for node, splits in data["accuracy"].items() if "test" in splits}


if __name__ == "__main__":
    def _stopped(*_):  # stopped: still stop what it started, and let a second signal not cut that short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        sys.exit(143)

    signal.signal(signal.SIGTERM, _stopped)
    if sys.argv[1:2] == ["--report"]:  # python -m benchmarks.chaos --report DIR: every DIR/*.json
        print(report([json.loads(p.read_text()) for p in sorted(Path(sys.argv[2]).glob("*.json"))]), end="")
        sys.exit(0)
    res = main()
    for f in res["injected"]:
        say(f"fault {f}")
    say(f"check: {json.dumps(res['check'])}")
    say(f"final test accuracy: {res['final_accuracy']}; wall {res['wall_seconds']:.0f} s; exit {res['returncode']}")
    say("OK" if res["ok"] else "FAILED")
    sys.exit(0 if res["ok"] else 1)
