"""The allreduce schemes cgx is compared with, each run the way PyTorch's own DDP hooks run it,
on a plain Gloo group. Each method reduces a flat fp32 tensor in place to (an approximation of)
the sum over ranks and states the bytes one rank sends per call.

- ``fp16`` / ``bf16``: ``fp16_compress_hook`` / ``bf16_compress_hook``: cast, allreduce, cast back.
- ``perchannel8``: ``quantization_perchannel_hook``: rows of 512 values quantized to uint8 with a
  per-row scale and minimum, *allgathered* (quantized values cannot be summed in transit) and
  dequantized and summed by every rank.
- ``powersgd1`` / ``powersgd4``: one PowerSGD step (Vogels 2019) of rank 1 / 4 on the buffer viewed
  as a matrix of 1024 columns: P = M Q, allreduce P, orthonormalize P, Q = M^T P, allreduce Q,
  M' = P Q^T. It approximates the sum by a low-rank matrix, so its error is large on a random
  buffer; with error feedback across training steps that error is carried, not lost.
"""

from __future__ import annotations

from typing import Callable, Dict

import torch
import torch.distributed as dist

ROW = 512  # values per quantization row (the hook's default bucket of a channel)
COLUMNS = 1024  # PowerSGD matrix width


def _fp_cast(dtype: torch.dtype) -> Callable:
    def run(x: torch.Tensor, group) -> None:
        low = x.to(dtype)
        dist.all_reduce(low, group=group)
        x.copy_(low)

    return run


def _perchannel8(x: torch.Tensor, group) -> None:
    world = dist.get_world_size(group)
    n = x.numel()
    rows = torch.nn.functional.pad(x, (0, -n % ROW)).view(-1, ROW)
    mn, mx = rows.aminmax(dim=1)
    scale = ((mx - mn) / 255).clamp_min(1e-30)
    q = ((rows - mn[:, None]) / scale[:, None]).round_().clamp_(0, 255).to(torch.uint8)
    meta = torch.stack([mn, scale])
    qs = [torch.empty_like(q) for _ in range(world)]
    metas = [torch.empty_like(meta) for _ in range(world)]
    dist.all_gather(qs, q, group=group)
    dist.all_gather(metas, meta, group=group)
    total = torch.zeros_like(rows)
    for qj, mj in zip(qs, metas):
        total += qj.float() * mj[1][:, None] + mj[0][:, None]
    x.copy_(total.view(-1)[:n])


def _powersgd(rank: int) -> Callable:
    def run(x: torch.Tensor, group) -> None:
        n = x.numel()
        m = torch.nn.functional.pad(x, (0, -n % COLUMNS)).view(-1, COLUMNS)
        g = torch.Generator().manual_seed(0)  # the same Q on every rank (PowerSGD's shared seed)
        q = torch.randn(COLUMNS, rank, generator=g)
        p = m @ q
        dist.all_reduce(p, group=group)
        p, _ = torch.linalg.qr(p)
        q = m.t() @ p
        dist.all_reduce(q, group=group)
        x.copy_((p @ q.t()).view(-1)[:n])

    return run


def _gloo(x: torch.Tensor, group) -> None:
    dist.all_reduce(x, group=group)


# name -> (bits column, run(x, group), bytes sent per rank for n values on W ranks)
METHODS: Dict[str, tuple] = {
    "gloo": (32, _gloo, lambda n, w: 2 * (w - 1) / w * 4 * n),
    "fp16": (16, _fp_cast(torch.float16), lambda n, w: 2 * (w - 1) / w * 2 * n),
    "bf16": (16, _fp_cast(torch.bfloat16), lambda n, w: 2 * (w - 1) / w * 2 * n),
    "perchannel8": (8, _perchannel8, lambda n, w: (w - 1) * (n + 8 * -(-n // ROW))),
    "powersgd1": (0, _powersgd(1), lambda n, w: 2 * (w - 1) / w * 4 * (-(-n // COLUMNS) + COLUMNS)),
    "powersgd4": (
        0,
        _powersgd(4),
        lambda n, w: 2 * (w - 1) / w * 4 * 4 * (-(-n // COLUMNS) + COLUMNS),
    ),
}
