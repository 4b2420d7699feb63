"""Helpers of the DiLoCo tests: a small model, per-rank data, inner steps, snapshots, gathers."""

from __future__ import annotations

from typing import List

import torch
import torch.distributed as dist


def make_model(seed: int, layers: int = 2, width: int = 48) -> torch.nn.Sequential:
    """``layers`` Linear layers (16 -> width -> ... -> 4), weights seeded by ``seed``."""
    torch.manual_seed(seed)
    dims = [16] + [width] * (layers - 1) + [4]
    return torch.nn.Sequential(*[torch.nn.Linear(a, b) for a, b in zip(dims, dims[1:])])


def batches(rank: int, steps: int) -> List[tuple]:
    g = torch.Generator().manual_seed(1000 + rank)
    return [(torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)) for _ in range(steps)]


def inner_step(model, opt, batch) -> None:
    x, y = batch
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()


def snapshot(modules) -> List[torch.Tensor]:
    return [p.detach().clone() for m in modules for p in m.parameters()]


def gather(t: torch.Tensor, group=None) -> List[torch.Tensor]:
    """Every rank's copy of ``t`` (rank order)."""
    out = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, t.contiguous(), group=group)
    return out


def assert_same_everywhere(tensors, group=None) -> None:
    """Each tensor is bitwise the same on every rank of ``group``."""
    for t in tensors:
        for other in gather(t, group):
            assert torch.equal(other, t), float((other - t).abs().max())


def sgd1(params):
    """Outer SGD with lr 1 and no momentum: the new global copy is ``global - average``."""
    return torch.optim.SGD(params, lr=1.0)


def documented(h, k, d):
    """docs/diloco.md: o_f = floor(h (f + 1) / k); start at t with (t + d - o_f) % h == 0,
    apply at t >= 1 with (t - o_f) % h == 0."""
    offsets = [h * (f + 1) // k for f in range(k)]
    starts = {
        f: [t for t in range(1, 4 * h) if (t + d - o) % h == 0] for f, o in enumerate(offsets)
    }
    applies = {f: [t for t in range(1, 4 * h) if (t - o) % h == 0] for f, o in enumerate(offsets)}
    return starts, applies
