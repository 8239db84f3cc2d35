"""``ftis-flwr run``'s hand-over to Flower: ``flwr run`` with the checked arguments, streamed; the
run's final status asked of the SuperLink (``flwr ls --run-id``), the exit code its outcome; a
SuperLink that does not answer yet asked again for up to ``--wait`` seconds."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ftis_flwr.cli.checking import _as_toml

EXIT_FAILED = 1
STARTED = re.compile(r"Successfully started run (\d+)")
FAILED_LINE = "ftis-flwr: the run failed: "
"""How the ServerApp's line for a failed run begins (``ftis_flwr.server.reporting.summary.FAILED_PREFIX``):
``run`` ends with its reason's first sentence after the run's status."""
TRACKER_ENV = {"mlflow": "MLFLOW_", "wandb": "WANDB_"}
"""Tracker -> the prefix of the environment variables it reads where the ServerApp runs."""
UNREACHABLE = "Connection to the SuperLink is unavailable"  # flwr 1.42's words when nothing answers
WAIT_STEP = 2.0


def flwr_command() -> str:
    """Flower's ``flwr``: beside this interpreter (its environment's), else the first on PATH."""
    here = Path(sys.executable).parent / "flwr"
    return str(here) if here.exists() else (shutil.which("flwr") or "flwr")


def flwr_args(args: argparse.Namespace, given: dict[str, Any]) -> list[str]:
    """The ``flwr run`` command line: the user's arguments, ``--run-config`` rewritten with the
    declared spellings (and, for the local SuperLink, absolute paths)."""
    cmd = [flwr_command(), "run", str(args.app), *args.rest]
    if given:  # a TOML file's pairs too: Flower takes key=value pairs or one file, not both
        cmd += ["--run-config", " ".join(f"{k}={_as_toml(v)}" for k, v in given.items())]
    return cmd


def run_status(run_id: str, app: Path, superlink: list[str]) -> str:
    """Flower's status of a run (``finished:completed``, ``finished:failed``, ...) on the SuperLink
    the run went to, or "" when it cannot be read."""
    try:
        out = subprocess.run([flwr_command(), "ls", *superlink, "--run-id", run_id, "--format", "json"], cwd=app,
                             capture_output=True, text=True, timeout=60).stdout
        runs = json.loads(out[out.index("{"):]).get("runs", [])
        return str(runs[0].get("status", "")) if runs else ""
    except (OSError, ValueError, subprocess.SubprocessError, IndexError, AttributeError):
        return ""


def _stream(cmd: list[str]) -> tuple[int, str, bool, str]:
    """Run ``flwr run``, echoing its output: (exit code, run id or "", whether it could not reach
    the SuperLink, why the run failed as its ServerApp said it or "")."""
    run_id, unreachable, why = "", False, ""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
        try:
            for line in proc.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                match = STARTED.search(line)
                run_id = run_id or (match.group(1) if match else "")
                unreachable = unreachable or UNREACHABLE in line
                if line.startswith(FAILED_LINE):
                    why = line[len(FAILED_LINE):].strip().split(". ")[0].split(" (metrics")[0]
        except KeyboardInterrupt:
            proc.terminate()
            print(f"\nftis-flwr: interrupted; the run may go on in the SuperLink (flwr stop {run_id or '<run id>'})")
            return 130, run_id, False, ""
    return proc.returncode, run_id, unreachable, why


def stale_tracker_env(exp: Any, port: int | None = None) -> str:
    """Why the local SuperLink cannot report as this shell asks, or "": a tracker of ``report.to``
    reads variables (``MLFLOW_*``, ``WANDB_*``) on which this shell and the running local SuperLink
    (whose environment its ServerApp gets: that of the command that started it) disagree. Only the
    names are said: a value may be a secret."""
    from ftis_flwr import local_superlink

    prefixes = tuple(TRACKER_ENV[t] for t in exp.report.to if t in TRACKER_ENV)
    port = port or int(os.environ.get("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", local_superlink.PORT))
    for pid in local_superlink.listening_pids(port) if prefixes else []:
        try:
            pairs = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
        except OSError:  # not ours to read: nothing to compare
            continue
        there = dict(p.partition("=")[::2] for p in pairs if "=" in p)
        names = sorted(k for k in {*os.environ, *there} if k.startswith(prefixes) and os.environ.get(k) != there.get(k))
        if names:
            return (f"the local SuperLink (pid {pid}), whose environment the run's server gets, was started with other "
                    f"tracker settings than this shell's ({', '.join(names)}). Stop it (`ftis-flwr stop`) and run this "
                    "command again: the SuperLink starts anew with this shell's environment")
    return ""


def _run(args: argparse.Namespace, given: dict[str, Any]) -> int:
    cmd = flwr_args(args, given)
    print("ftis-flwr: " + " ".join(cmd), flush=True)
    deadline = time.monotonic() + args.wait
    while True:
        returncode, run_id, unreachable, why = _stream(cmd)
        # a SuperLink started a moment ago (the deployment recipe) may not answer yet: no run was
        # started, so asking again is safe
        if not (returncode and unreachable and not run_id and time.monotonic() < deadline):
            break
        print(f"ftis-flwr: the SuperLink does not answer yet; trying again for up to "
              f"{deadline - time.monotonic():.0f} s more (--wait)", flush=True)
        try:
            time.sleep(WAIT_STEP)
        except KeyboardInterrupt:
            return 130
    if returncode == 130:
        return 130
    if returncode:
        print(f"ftis-flwr: flwr run exited with {returncode}", file=sys.stderr)
        return returncode
    if not run_id:
        print("ftis-flwr: flwr run started no run", file=sys.stderr)
        return EXIT_FAILED
    superlink = args.rest[:1] if args.rest and not args.rest[0].startswith("-") else []
    status = run_status(run_id, args.app, superlink)
    if "--stream" not in args.rest:
        print(f"ftis-flwr: run {run_id} started ({status or 'status unknown'}); follow it with "
              f"`flwr log {run_id}`, see its outcome with `flwr ls --run-id {run_id}`")
        return 0
    ok = status.endswith("completed")
    why = f": {why}" if why and not ok else ""
    print(f"ftis-flwr: run {run_id} {status or 'ended with an unknown status'}{why}",
          file=sys.stdout if ok else sys.stderr)
    return 0 if ok else EXIT_FAILED
