"""fsdp's compressed reduce-scatter refuses what a peer announces beyond what a chunk can take:
ranks with other settings all raise before the payloads move, and the group stays usable."""

from __future__ import annotations

import torch
import torch.distributed as dist
from dist_helpers import run_ranks


def body_oversized_payload(rank, world):
    from torch_cgx.fsdp import CompressedReduceScatter

    dist.init_process_group("gloo")
    n = 4096
    # Rank 1 sends fp16 payloads (2 bytes a value) where rank 0 expects 4-bit max-min ones:
    # every rank refuses before the payloads move (nothing allocated from a peer's size).
    comm = (
        CompressedReduceScatter("maxmin", bits=4) if rank == 0 else CompressedReduceScatter("fp16")
    )
    x = torch.randn(world * n, generator=torch.Generator().manual_seed(rank))
    try:
        comm(torch.empty(n), x, dist.group.WORLD, dist.ReduceOp.SUM)
        raised = None
    except ValueError as e:
        raised = str(e)
    assert raised and "compressor settings differ" in raised, raised
    # The group still works: the next exchange is in step on both ranks.
    t = torch.ones(4)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((4,), float(world)))
    dist.destroy_process_group()


def test_reduce_scatter_refuses_an_oversized_payload():
    run_ranks(body_oversized_payload, 2, timeout=120)
