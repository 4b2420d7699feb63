"""The per-group stats API (ProcessGroupCGX.stats / reset_stats) on 2 real ranks: bytes against
the payload sizes of docs/FORMAT.md, what an exact fp32 ring would have sent, calls counted by
kind, and time split between the codec and the wire."""

from __future__ import annotations

import torch
import torch.distributed as dist
from dist_helpers import run_ranks

KEYS = {
    "bytes_sent",
    "bytes_exact",
    "bytes_saved",
    "calls_compressed",
    "calls_exact",
    "reduce_scatter_compressed",
    "reduce_scatter_exact",
    "compute_seconds",
    "wire_seconds",
}


def maxmin_payload(n: int, bits: int, bucket: int) -> int:
    """docs/FORMAT.md: header, (min, unit) per bucket, packed codes (no raw tail)."""
    return 24 + 8 * -(-n // bucket) + -(-n * bits // 8)


def body_stats(rank, world):
    import torch_cgx

    dist.init_process_group("cgx")
    backend = torch_cgx.cgx_backend()
    torch_cgx.set_config(bits=4, bucket_size=512)
    backend.reset_stats()
    s = backend.stats()
    assert set(s) == KEYS and all(v == 0 for v in s.values()), s
    total0 = backend.total_bytes_sent()

    n = 4096  # two chunks of 2048 values: whole buckets, one pipeline segment
    x = torch.randn(n, generator=torch.Generator().manual_seed(rank))
    dist.all_reduce(x)
    s = backend.stats()
    # SRA on 2 ranks: one payload of the other rank's chunk out, this rank's reduced chunk in
    # the allgather.
    chunk = maxmin_payload(n // world, 4, 512)
    assert s["bytes_sent"] == 2 * (world - 1) * chunk == backend.last_bytes_sent(), s
    assert s["bytes_exact"] == 2 * (world - 1) * 4 * n // world, s
    assert s["bytes_saved"] == s["bytes_exact"] - s["bytes_sent"] > 0
    assert (s["calls_compressed"], s["calls_exact"]) == (1, 0), s
    assert s["compute_seconds"] > 0 and s["wire_seconds"] > 0, s

    # An integer tensor is reduced exactly: what it sent is what an exact call sends.
    i = torch.arange(1000, dtype=torch.int32)
    dist.all_reduce(i)
    assert torch.equal(i, torch.arange(1000, dtype=torch.int32) * world)
    t = backend.stats()
    exact = 2 * (world - 1) * 4 * 1000 // world
    assert (t["calls_compressed"], t["calls_exact"]) == (1, 1), t
    assert t["bytes_sent"] - s["bytes_sent"] == exact, t
    assert t["bytes_exact"] - s["bytes_exact"] == exact, t
    assert t["wire_seconds"] > s["wire_seconds"]

    # A hook's call counts too; bytes_sent follows the long-standing counter.
    options = torch_cgx._C.CallOptions(backend.config())
    backend.allreduce_call(torch.ones(n), options, True).wait()
    u = backend.stats()
    assert u["calls_compressed"] == 2
    assert u["bytes_sent"] == backend.total_bytes_sent() - total0

    # reset_stats zeroes the stats only.
    backend.reset_stats()
    assert all(v == 0 for v in backend.stats().values())
    assert backend.total_bytes_sent() - total0 == u["bytes_sent"]
    dist.destroy_process_group()


def test_stats_count_against_the_math():
    run_ranks(body_stats, 2)


def body_reduce_scatter_stats(rank, world):
    import torch_cgx

    dist.init_process_group("cgx")
    backend = torch_cgx.cgx_backend()
    torch_cgx.set_config(bits=4, bucket_size=512)
    backend.reset_stats()
    n = 2048  # this rank's chunk: whole buckets
    x = torch.randn(world * n, generator=torch.Generator().manual_seed(rank))
    out = torch.empty(n)
    dist.reduce_scatter_tensor(out, x)
    s = backend.stats()
    # One payload of the other rank's chunk, after the payloads' sizes (8 bytes per rank).
    assert s["bytes_sent"] == (world - 1) * maxmin_payload(n, 4, 512) + 8 * world, s
    assert s["bytes_exact"] == (world - 1) * 4 * world * n // world, s
    assert (s["reduce_scatter_compressed"], s["reduce_scatter_exact"]) == (1, 0), s
    assert (s["calls_compressed"], s["calls_exact"]) == (0, 0), s
    assert s["compute_seconds"] > 0 and s["wire_seconds"] > 0, s
    # 32 bits: exact, on the worker's connection; a ring reduce-scatter's bytes.
    torch_cgx.set_config(bits=32)
    dist.reduce_scatter_tensor(out, x)
    t = backend.stats()
    exact = (world - 1) * 4 * world * n // world
    assert (t["reduce_scatter_compressed"], t["reduce_scatter_exact"]) == (1, 1), t
    assert t["bytes_sent"] - s["bytes_sent"] == exact == t["bytes_exact"] - s["bytes_exact"], t
    dist.destroy_process_group()


def test_reduce_scatter_stats():
    run_ranks(body_reduce_scatter_stats, 2)
