"""Destroying the default group and creating it again in the same process, 12 times, with the
settings changed between inits (what test suites with setUp / tearDown do): every instance must
use its own store keys, never the previous instance's addresses or settings. Each call's bytes
(exact, per its bits, bucket size and algorithm) and its random inputs' error bound tell the
settings apart (constant inputs, which max-min reproduces exactly at any width, could not)."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from dist_helpers import free_port, run_ranks

from torch_cgx import codec
from torch_cgx.bounds import allreduce_error_bound, chunk_ranges

CYCLES = 12


def expected_bytes(n: int, world: int, rank: int, config) -> int:
    """What one fp32 allreduce of n values sends from this rank (docs/algorithms.md): Gloo's
    ring at 32 bits; else SRA's W - 1 payloads of the other chunks (ring: the W - 1 hops' chunks,
    its own first) plus the final slot (the largest chunk's payload) to the W - 1 others."""
    if config.bits == 32:
        return 2 * (world - 1) * 4 * n // world
    sizes = [codec.encoded_size(e - b, config.bits, config.bucket_size)
             for b, e in chunk_ranges(n, world, config.bucket_size)]  # fmt: skip
    if config.algorithm == "sra":
        first = sum(p for j, p in enumerate(sizes) if j != rank)
    else:
        first = sum(sizes[(rank - s) % world] for s in range(world - 1))
    return first + max(sizes) * (world - 1)


def check_call(rank, world, n, seed, group=None) -> None:
    """A random allreduce on `group`: the bytes its settings send, the exact sum within their
    bound (at 32 bits the fp32 sum itself)."""
    import torch_cgx

    config = torch_cgx.get_config(group)
    inputs = [
        torch.randn(n, generator=torch.Generator().manual_seed(seed + r)) for r in range(world)
    ]
    backend = torch_cgx.cgx_backend(group)
    sent = backend.total_bytes_sent()
    y = inputs[rank].clone()
    dist.all_reduce(y, group=group)
    assert backend.total_bytes_sent() - sent == expected_bytes(n, world, rank, config), config
    if config.bits == 32:
        assert torch.equal(y, sum(inputs[1:], inputs[0].clone()))
        return
    exact = torch.stack([x.double() for x in inputs]).sum(0)
    bound = allreduce_error_bound(inputs, config.bits, config.bucket_size, config.algorithm)
    assert bool(((y.double() - exact).abs() <= bound).all()), (config, seed)


def body_reinit(rank, world):
    import torch_cgx

    gloo_checks = 0
    for cycle in range(CYCLES):
        bits = (32, 8, 4, 2)[cycle % 4]
        os.environ["CGX_COMPRESSION_QUANTIZATION_BITS"] = str(bits)
        os.environ["CGX_REDUCTION_ALGORITHM"] = "ring" if cycle % 2 else "sra"
        os.environ["CGX_COMPRESSION_BUCKET_SIZE"] = str(64 << (cycle % 3))
        dist.init_process_group("cgx")  # env:// on the same fixed port every time
        config = torch_cgx.get_config()
        assert config.bits == bits and config.bucket_size == 64 << (cycle % 3)
        assert config.algorithm == ("ring" if cycle % 2 else "sra")
        check_call(rank, world, 5000, 100 * cycle)
        if cycle % 3 == 0:  # a subgroup, created and destroyed with its parent
            sub = dist.new_group(list(range(world)), backend="cgx")
            torch_cgx.set_config(sub, bits=8)
            check_call(rank, world, 3000, 100 * cycle + 50, sub)
            gloo_checks += 1
        dist.barrier()
        dist.destroy_process_group()
    assert gloo_checks == 4


def test_twelve_destroy_reinit_cycles_with_changing_settings():
    run_ranks(body_reinit, 2, port=free_port(), timeout=150)
