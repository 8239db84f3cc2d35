"""One rank of a sharded node for tests/test_sharded.py: train once on given groups, report.

Run as ``python tests/rank_child.py RANK WORLD PORT JOB OUT`` (a real process per rank, joined
over gloo, as a node's worker starts them). JOB: a pickle of the experiment, card, cache folder,
groups and round, which reduction to leave out ("": none) to show the test can fail, and a
saved state to resume from / a folder to save the state to after the update.
"""

import pickle
import sys

from ftis_flwr.node.host.rank_group import join
from ftis_flwr.node.host.ranks import Ranks
from ftis_flwr.node.node import Node
from ftis_flwr.node.sharding import full_trainable
from ftis_flwr.node.state import load_state, save_state


def main(rank: int, world: int, port: int, job_path: str, out_path: str) -> None:
    with open(job_path, "rb") as fh:
        job = pickle.load(fh)
    if job["leave_out"] == "all_sum":  # each rank normalises by its own samples only
        Ranks.all_sum = lambda self, value: value
    elif job["leave_out"] == "gather":  # each rank's metrics describe its own samples only
        Ranks.gather = lambda self, part: list(part)
    join(rank, world, port, "cpu")
    node = Node(job["card"], job["exp"], cache_dir=job["cache"], ranks=Ranks(rank, world))
    if job.get("resume_from"):  # a state saved by a node with another rank count
        load_state(node, job["resume_from"])
    metrics = node.train(job["groups"], job["round"], job["num_rounds"])
    if job.get("save_to"):
        save_state(node, job["save_to"], job["round"])
    params = full_trainable(node.model)
    metrics["updates"] = float(node.updates)
    if rank == 0:
        with open(out_path, "wb") as fh:
            pickle.dump({"metrics": metrics, "params": {k: v.detach().clone() for k, v in params.items()}}, fh)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
