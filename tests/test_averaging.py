"""PowerSGDGradientAverager (hivemind's averager_rank / min_compression_ratio) on real ranks."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from dist_helpers import run_ranks

from torch_cgx.averaging import PowerSGDGradientAverager, matrix_shape


def test_matrix_shape_and_choice():
    assert matrix_shape((64, 3, 3, 3)) == (64, 27)
    assert matrix_shape((8, 8, 4, 4)) == (64, 16)
    assert matrix_shape((10,)) == (10, 1)
    params = [torch.nn.Parameter(torch.zeros(s)) for s in [(256, 256), (8, 8), (300,), (8, 512)]]
    avg = PowerSGDGradientAverager(params, averager_rank=2, min_compression_ratio=0.5)
    # 1 - 2 * (256 + 256) / 65536 = 0.98; 1 - 2 * 16 / 64 = 0.5; 1-D; 1 - 2 * 520 / 4096 = 0.75
    assert avg.compressed() == [True, True, False, True]
    avg = PowerSGDGradientAverager(params, averager_rank=2, min_compression_ratio=0.6)
    assert avg.compressed() == [True, False, False, True]
    for bad, match in [
        ({"averager_rank": 0}, "averager_rank"),
        ({"averager_rank": 1, "min_compression_ratio": 2}, "min_compression"),
    ]:
        with pytest.raises(ValueError, match=match):
            PowerSGDGradientAverager(params, **bad)  # fmt: skip


def body(rank, world, steps):
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.zeros(s)) for s in [(48, 32), (32,), (16, 4, 3)]]
    avg = PowerSGDGradientAverager(params, averager_rank=2, min_compression_ratio=0.3)
    assert avg.compressed() == [True, False, True]
    delivered = [torch.zeros(p.shape) for p in params]
    exact_sum = [torch.zeros(p.shape) for p in params]
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * step + rank)
        local = [torch.randn(p.shape, generator=g) for p in params]
        for p, grad, ex in zip(params, local, exact_sum):
            p.grad = grad.clone()
            parts = [torch.empty_like(grad) for _ in range(world)]
            dist.all_gather(parts, grad)
            ex += sum(parts) / world
        avg.step()
        for p, d in zip(params, delivered):
            copies = [torch.empty_like(p.grad) for _ in range(world)]
            dist.all_gather(copies, p.grad)
            assert all(torch.equal(c, copies[0]) for c in copies)  # identical on every rank
            d += p.grad
    # Error feedback: what was delivered plus the ranks' mean residual is the exact sum (the
    # residuals telescope); the exactly averaged bias has no residual.
    for i, (d, ex) in enumerate(zip(delivered, exact_sum)):
        res = avg.residuals.get(i, torch.zeros(ex.numel())).reshape(ex.shape).clone()
        dist.all_reduce(res)
        total = d + res / world
        assert torch.allclose(total, ex, atol=1e-4, rtol=1e-4), i
        if i == 0:  # rank 2 of a 48 x 32 random matrix: far from exact at each step
            assert (d - ex).norm() > 0.1 * ex.norm()
    state = avg.state_dict()
    other = PowerSGDGradientAverager(params, averager_rank=2, min_compression_ratio=0.3)
    other.load_state_dict(state)
    assert torch.equal(other.qs[0], avg.qs[0]) and other.steps == steps
    dist.destroy_process_group()


def test_averager_error_feedback_telescopes():
    run_ranks(body, 2, 6, timeout=120)
