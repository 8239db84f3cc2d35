"""Chunk sums for the loss (cross-tokenizer samples): per-sample sums of [B, T] tensors over each
chunk's tokens, spread back over those tokens, in torch (see :mod:`ftis_flwr.maths.loss`, "Chunks").

Why apart: the loss module stays the loss family; this is the bookkeeping that turns token-level
log-probs into chunk-level ones, and is the identity when every token is its own chunk.
"""

from __future__ import annotations

import torch


def validate_chunks(chunks: torch.Tensor, m: torch.Tensor, shape) -> None:
    """``LossInputs.chunks``: integers, per sample 0, 1, ... in order over the real tokens."""
    if not isinstance(chunks, torch.Tensor) or tuple(chunks.shape) != tuple(shape) or chunks.is_floating_point():
        raise ValueError(f"LossInputs.chunks must be an integer tensor of shape {tuple(shape)}")
    c = chunks.detach().cpu().long()
    for b in range(c.shape[0]):
        real = c[b][m[b].cpu()]
        steps = torch.diff(real)
        if real[0] != 0 or (steps < 0).any() or (steps > 1).any():
            raise ValueError(f"LossInputs.chunks of sample {b} must count 0, 1, ... over its real tokens "
                             f"in order, got {real.tolist()[:12]}")


class Chunked:
    """Per-sample chunk sums of [B, T] tensors, spread back over each chunk's tokens."""

    def __init__(self, chunks: torch.Tensor | None, m: torch.Tensor):
        self.m = m
        if chunks is None:
            self.idx = None
            self.first, self.count = m, m.sum(dim=1).double()
            return
        self.idx = torch.where(m, chunks.to(m.device).long(), 0)
        self.width = int(self.idx.max()) + 1
        prev = torch.cat([torch.full_like(self.idx[:, :1], -1), self.idx[:, :-1]], dim=1)
        prev_real = torch.cat([torch.zeros_like(m[:, :1]), m[:, :-1]], dim=1)
        self.first = m & (~prev_real | (self.idx != prev))  # each chunk's first real token
        self.count = self.first.sum(dim=1).double()

    def to(self, device) -> Chunked:
        if self.idx is None or self.idx.device == torch.device(device):
            return self
        out = Chunked.__new__(Chunked)
        out.m, out.idx, out.width = self.m.to(device), self.idx.to(device), self.width
        out.first, out.count = self.first.to(device), self.count
        return out

    def spread(self, x: torch.Tensor) -> torch.Tensor:
        """Each token's chunk sum of ``x`` (0 on padding); ``x`` itself when tokens are chunks."""
        if self.idx is None:
            return x
        sums = torch.zeros(x.shape[0], self.width, dtype=x.dtype, device=x.device)
        sums.scatter_add_(1, self.idx, torch.where(self.m.to(x.device), x, 0.0))
        return torch.where(self.m.to(x.device), sums.gather(1, self.idx), 0.0)

    def chunk_gen(self, lp: torch.Tensor, gen: torch.Tensor) -> torch.Tensor:
        """Per-token generator log-probs that make ``lp - gen`` each token's chunk sum of it
        (``lp`` detached: the gradient stays each token's own); ``gen`` when tokens are chunks."""
        if self.idx is None:
            return gen
        return torch.where(self.m.to(lp.device), lp - self.spread(lp - gen), 0.0)
