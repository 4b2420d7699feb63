"""allreduce_coalesced compressed as one fused piece, and the backend's name (real ranks)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from dist_helpers import run_ranks


def _tensors(rank: int):
    g = torch.Generator().manual_seed(10 + rank)
    return [torch.randn(3000, generator=g), torch.randn(50, 40, generator=g)]


def body_coalesced(rank, world):
    import torch_cgx

    dist.init_process_group("cgx")
    torch_cgx.set_config(bits=8, bucket_size=256)
    ts = _tensors(rank)
    exact = [sum(_tensors(r)[i] for r in range(world)) for i in range(2)]
    before = torch_cgx.cgx_backend().total_bytes_sent()
    dist.all_reduce_coalesced(ts)
    sent = torch_cgx.cgx_backend().total_bytes_sent() - before
    fp32_ring = 2 * (world - 1) * 5000 * 4 // world
    assert sent < fp32_ring / 3  # compressed, one piece
    for t, e in zip(ts, exact):
        assert t.shape == e.shape
        err = (t - e).abs().max().item()
        assert 0 < err < 0.1  # 8 bits over a range of ~10 per bucket: ~0.04 per quantization
    gathered = [torch.empty(5000) for _ in range(world)]
    dist.all_gather(gathered, torch.cat([t.reshape(-1) for t in ts]))
    assert all(torch.equal(g, gathered[0]) for g in gathered)  # bit-identical replicas
    # Integer tensors: exact, as one piece too.
    ints = [torch.arange(10) + rank, torch.full((3, 3), rank, dtype=torch.int64)]
    dist.all_reduce_coalesced(ints)
    assert torch.equal(ints[0], 2 * torch.arange(10) + 1)
    assert torch.equal(ints[1], torch.ones(3, 3, dtype=torch.int64))
    # Mixed dtypes: the inner backend's error, not a hang.
    with pytest.raises((RuntimeError, ValueError)):
        dist.all_reduce_coalesced([torch.ones(3), torch.ones(3, dtype=torch.float64)])
    # The name torch asks the backend for.
    assert dist.get_backend() == "cgx"
    assert torch_cgx.cgx_backend().name() == "cgx"
    dist.destroy_process_group()


def test_allreduce_coalesced_is_compressed_and_identical():
    run_ranks(body_coalesced, 2, timeout=120)
