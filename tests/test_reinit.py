"""Destroying the default group and creating it again in the same process, 12 times, with the
settings changed between inits (what test suites with setUp / tearDown do): every instance must
use its own store keys, never the previous instance's addresses or settings."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from dist_helpers import free_port, run_ranks

CYCLES = 12


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
        x = torch.full((5000,), float(rank + 1))
        dist.all_reduce(x)
        expected = world * (world + 1) / 2
        assert torch.allclose(x, torch.full_like(x, expected), rtol=0.02), (cycle, x[:3])
        if cycle % 3 == 0:  # a subgroup, created and destroyed with its parent
            sub = dist.new_group(list(range(world)), backend="cgx")
            torch_cgx.set_config(sub, bits=8)
            y = torch.ones(3000)
            dist.all_reduce(y, group=sub)
            assert torch.allclose(y, torch.full_like(y, float(world)), rtol=0.01)
            gloo_checks += 1
        dist.barrier()
        dist.destroy_process_group()
    assert gloo_checks == 4


def test_twelve_destroy_reinit_cycles_with_changing_settings():
    run_ranks(body_reinit, 2, port=free_port(), timeout=150)
