"""A node's ranks: the processes its learner is sharded over, as each one sees them.

Why: a node bigger than one device (``ModelCard.ranks`` > 1) runs one process per rank, joined by
``torch.distributed`` (gloo on the CPU, NCCL on CUDA). Every rank gets the same request and keeps
the same groups; each takes its share of the work (samples to train on, prompts to sample,
problems to evaluate) and the results are put back together in rank order, so that the shares
concatenated are the one-rank batch. :data:`SINGLE` (one rank) does no collective at all: the
one-rank node runs exactly the code it ran before ranks existed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Ranks:
    """This process's place among its node's ranks."""

    rank: int = 0
    world: int = 1

    @property
    def sharded(self) -> bool:
        return self.world > 1

    @property
    def leader(self) -> bool:
        """Rank 0: the one that talks to the ClientApp and writes files."""
        return self.rank == 0

    def bounds(self, n: int, rank: int | None = None) -> tuple[int, int]:
        """[start, stop) of ``rank``'s contiguous share of ``n`` items: the first ``n % world``
        ranks take one more, so shares differ by at most one and concatenate in rank order."""
        r = self.rank if rank is None else rank
        base, extra = divmod(n, self.world)
        start = r * base + min(r, extra)
        return start, start + base + (1 if r < extra else 0)

    def share(self, items: Sequence[Any]) -> list[Any]:
        start, stop = self.bounds(len(items))
        return list(items[start:stop])

    def most(self, n: int) -> int:
        """The largest share of ``n`` items (rank 0's)."""
        return -(-n // self.world)

    @contextlib.contextmanager
    def leader_first(self) -> Iterator[None]:
        """Rank 0 runs the block first, then the others (a cache that one rank fills and the
        others read: a tiny model's warm start, a converted GGUF file)."""
        if not self.sharded:
            yield
            return
        import torch.distributed as dist

        if not self.leader:
            dist.barrier()
        yield
        if self.leader:
            dist.barrier()

    def gather(self, part: list[Any]) -> list[Any]:
        """Every rank's ``part``, concatenated in rank order, on every rank."""
        if not self.sharded:
            return list(part)
        import torch.distributed as dist

        parts: list[Any] = [None] * self.world
        dist.all_gather_object(parts, list(part))
        return [x for p in parts for x in p]

    def all_sum(self, value: float) -> float:
        """``value`` summed over the ranks (in float64), on every rank."""
        if not self.sharded:
            return value
        import torch
        import torch.distributed as dist

        device = "cuda" if dist.get_backend() == "nccl" else "cpu"  # NCCL reduces CUDA tensors only
        t = torch.tensor([float(value)], dtype=torch.float64, device=device)
        dist.all_reduce(t)
        return float(t.item())


def micro_batches(samples: Sequence[Any], size: int, ranks: Ranks) -> list[list[Any]]:
    """This rank's micro-batches of ``size``: its share of ``samples`` cut in order, then empty
    ones up to the count of the rank with the largest share, since a sharded learner's ranks must
    run the same number of forwards and backwards (one rank: ``samples`` cut, no padding)."""
    local = ranks.share(samples)
    batches = [local[i:i + size] for i in range(0, len(local), size)]
    count = -(-ranks.most(len(samples)) // size)
    return batches + [[] for _ in range(count - len(batches))]


SINGLE = Ranks()
"""One rank: no process group, no collective."""
