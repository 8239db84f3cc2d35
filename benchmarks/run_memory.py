r"""The whole run's memory: every process it starts together (Flower, Ray, the node workers), sampled.

    python -m benchmarks.run_memory -- \
        ftis-flwr run . --stream --federation-config "num-supernodes=2 client-resources-num-cpus=1"

Runs the command after ``--`` and, every ``--every`` seconds, sums the PSS (proportional set
size: shared pages split between the processes sharing them, so the sum is what the run takes
from the machine) of every process that was not running before the command started: the
command's own tree, the SuperLink it leaves running, Ray's processes and the node workers (which
lead their own sessions, so they are not the command's children). Prints the peak sum, the peak
per kind of process and the wall time. Run it on an otherwise quiet machine: a process another
job starts meanwhile is counted too. Stops the SuperLink the command left running (by its pid,
through ``ftis-flwr stop``) at the end, as a user would.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

GIB = 1024 ** 3


def _pids() -> set[int]:
    return {int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()}


def _pss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _kind(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "gone"
    for word, kind in (("ftis_flwr.node.host.worker", "node worker"), ("rank_group", "node rank"),
                       ("flower-superlink", "SuperLink"), ("flwr", "Flower"), ("ray", "Ray"),
                       ("raylet", "Ray"), ("gcs_server", "Ray")):
        if word in cmd:
            return kind
    return "other"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        raise SystemExit("usage: python -m benchmarks.run_memory [--every S] -- COMMAND ...")
    cut = argv.index("--")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--every", type=float, default=0.5)
    a = p.parse_args(argv[:cut])
    before = _pids() | {os.getpid()}
    peak, peak_kinds, done = [0], {}, threading.Event()

    def sample() -> None:
        while not done.is_set():
            kinds: dict[str, int] = {}
            for pid in _pids() - before:
                kinds[_kind(pid)] = kinds.get(_kind(pid), 0) + _pss(pid)
            total = sum(kinds.values())
            if total > peak[0]:
                peak[0] = total
                peak_kinds.clear()
                peak_kinds.update(kinds)
            done.wait(a.every)

    t0 = time.perf_counter()
    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    rc = subprocess.call(argv[cut + 1:])
    wall = time.perf_counter() - t0
    done.set()
    watcher.join()
    subprocess.call(["ftis-flwr", "stop"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parts = ", ".join(f"{k} {v / GIB:.2f}" for k, v in sorted(peak_kinds.items(), key=lambda kv: -kv[1]))
    print(f"\nexit {rc}; wall {wall:.0f} s; peak summed PSS {peak[0] / GIB:.2f} GiB ({parts} GiB)")


if __name__ == "__main__":
    main()
