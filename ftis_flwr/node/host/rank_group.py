"""A sharded node's ranks as processes: the worker is rank 0 and runs every command on all of them.

Why: with ``ModelCard.ranks`` = N the node's learner is one FSDP2 model over N processes, and
every collective (a layer's gather, a gradient reduction, a state gather) needs all N to make the
same calls in the same order. So the worker (:mod:`ftis_flwr.node.host.worker`, rank 0) starts ranks
1..N-1 itself, in its own process group, and sends each of them every command it is about to run
on its own node (:data:`COMMANDS`: build, resume, step, save the state, save the model); each rank
runs it on its own node. Only rank 0 answers the ClientApp and writes files.

Failure is never a hang: a rank that dies closes its connections, and the collective on every
other rank raises at once (gloo: "Connection closed by peer"). The worker then answers the round
with the error and exits, killing its process group (every rank), and the next round starts a
fresh worker that resumes from the saved state. A rank whose worker vanished exits within a
second (it watches its parent), and an error on a rank ends that rank, so rank 0 learns of it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

COLLECTIVE_TIMEOUT_S = 3600.0
"""How long a rank waits in one collective for the others: longer than any phase one rank can
spend alone (sampling its prompts), since a rank that died is noticed at once anyway."""


class Host:
    """What one rank holds: its worker directory, spec, place among the ranks and node."""

    def __init__(self, directory: Path, ranks: Any):
        self.directory = Path(directory)
        self.spec = json.loads((self.directory / "spec.json").read_text())
        self.ranks = ranks
        self.node: Any = None

    @property
    def state_root(self) -> Path:
        return self.directory / "state"


def build_node(spec: dict[str, Any], ranks: Any) -> Any:
    """The node of ``spec`` on this rank (its device: ``cuda:<rank>`` among the visible GPUs)."""
    from ftis_flwr.config.merge import card_from_dict, from_dict
    from ftis_flwr.node.node import Node

    # import_registries: a loss.method given as "package.module:function" is imported and
    # registered here, in the worker process, before the Node looks it up.
    experiment = from_dict(spec["experiment"], import_registries=True)
    card = card_from_dict(spec["card"])
    if card.device.startswith("cuda"):
        card.device = "cuda"  # CUDA_VISIBLE_DEVICES already pins the chosen GPU(s)
        if ranks.sharded:  # join() already made cuda:<rank> current
            card.device = f"cuda:{ranks.rank}"
    return Node(card, experiment, cache_dir=Path(spec["cache_dir"]), ranks=ranks)


def _build(host: Host) -> None:
    host.node = None  # a rebuild (a replayed round 0) frees the old node first
    host.node = build_node(host.spec, host.ranks)


def _resume(host: Host, at_most: int | None) -> int | None:
    from ftis_flwr.node.state import load_state

    return load_state(host.node, host.state_root, at_most=at_most)


def _step(host: Host, payload: dict[str, Any]) -> dict[str, Any]:
    from ftis_flwr.node.host.payload_step import step_from_payloads

    return step_from_payloads(host.node, payload)


def _save_state(host: Host, round_idx: int) -> Any:
    from ftis_flwr.node.state import save_state

    return save_state(host.node, host.state_root, round_idx)


def _save(host: Host, out_dir: str) -> Path:
    return host.node.save(Path(out_dir))


COMMANDS: dict[str, Callable[..., Any]] = {"build": _build, "resume": _resume, "step": _step,
                                            "save_state": _save_state, "save": _save}
"""What the worker runs on its node, by name; every rank runs the same, in the same order."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def join(rank: int, world: int, port: int, device: str) -> None:
    """Join the node's process group (gloo on the CPU, NCCL on CUDA), over the loopback.

    On CUDA each rank first makes ``cuda:<rank>`` its current device and names it to the group
    (``device_id``): NCCL's object collectives (``broadcast_object_list``, the first thing the
    ranks do) run on ``torch.cuda.current_device()``, which is ``cuda:0`` on every rank until it
    is set, and NCCL refuses two ranks on one GPU."""
    import torch.distributed as dist

    kwargs = {}
    if device.startswith("cuda"):
        kwargs["device_id"] = rank_device(rank)
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo",
                            init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S), **kwargs)


def rank_device(rank: int) -> Any:
    """``cuda:<rank>`` among the visible GPUs, made this process's current device (before the
    rank joins its NCCL group: :func:`join`)."""
    import torch

    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    return device


class RankGroup:
    """Rank 0's handle on ranks 1..N-1 (started by :meth:`start`)."""

    def __init__(self, procs: list[subprocess.Popen]):
        self.procs = procs

    @classmethod
    def start(cls, directory: Path, world: int, device: str) -> RankGroup:
        """Start ranks 1..world-1 (in this process's group, so the worker's exit kills them) and
        join the group as rank 0."""
        port = _free_port()
        procs = []
        for rank in range(1, world):
            with open(Path(directory) / f"rank-{rank}.log", "a") as out:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "ftis_flwr.node.host.rank_group", "--dir", str(directory),
                     "--rank", str(rank), "--world", str(world), "--port", str(port)],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT))
        (Path(directory) / "ranks.json").write_text(json.dumps(  # who to stop by pid, for an operator
            {"worker": os.getpid(), "ranks": {str(r): p.pid for r, p in enumerate(procs, 1)}}))
        log.info("started ranks 1..%d (pids %s); joining as rank 0 on port %d", world - 1,
                 ", ".join(str(p.pid) for p in procs), port)
        join(0, world, port, device)
        return cls(procs)

    def send(self, name: str, *args: Any) -> None:
        """Tell every other rank to run command ``name`` (before rank 0 runs it)."""
        import torch.distributed as dist

        dead = [p.pid for p in self.procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"rank process(es) {dead} exited: this node's ranks cannot go on")
        dist.broadcast_object_list([name, args], src=0)


def run(host: Host, name: str, *args: Any, group: RankGroup | None = None) -> Any:
    """Run command ``name`` on every rank (``group``: rank 0's handle; None: one rank)."""
    if group is not None:
        group.send(name, *args)
    return COMMANDS[name](host, *args)


def _watch_parent() -> None:
    """Exit when the worker that started this rank is gone (its process group kill is the rule;
    this covers a worker killed with SIGKILL before it could)."""
    parent = os.getppid()
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(1)


def follow(directory: Path, rank: int, world: int, port: int) -> None:
    """A rank > 0: run what rank 0 sends until it sends ``stop`` or goes away."""
    import torch.distributed as dist

    from ftis_flwr.node.host.ranks import Ranks

    threading.Thread(target=_watch_parent, daemon=True).start()
    host = Host(directory, Ranks(rank, world))
    join(rank, world, port, str(host.spec["card"].get("device", "cpu")))
    while True:
        message: list[Any] = [None, None]
        try:
            dist.broadcast_object_list(message, src=0)
        except Exception as exc:  # rank 0 is gone: nothing to follow
            log.error("rank %d: lost rank 0 (%s); exiting", rank, exc)
            os._exit(1)
        name, args = message
        if name == "stop":
            os._exit(0)
        try:
            run(host, name, *args)
        except Exception:  # out of step with rank 0 now: end, so its collective raises at once
            log.error("rank %d: command %r failed; exiting:\n%s", rank, name, traceback.format_exc())
            os._exit(1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="ftis-flwr: one rank > 0 of a sharded node (started by its worker)")
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--rank", required=True, type=int)
    parser.add_argument("--world", required=True, type=int)
    parser.add_argument("--port", required=True, type=int)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s rank %(process)d %(name)s %(levelname)s: %(message)s")
    follow(args.dir, args.rank, args.world, args.port)


if __name__ == "__main__":
    main()
