"""The cgx backend's own reduce-scatter (csrc/torch/reduce_scatter.cc) on real ranks, every form
FSDP2 and users call: reduce_scatter_tensor, the list form and the coalesced one, compressed
within the bound of one quantization per value (the cases: tests/test_fsdp.py)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from dist_helpers import run_ranks
from test_fsdp import BITS, BUCKET, scatter_case, scatter_case_of


def body_backend_reduce_scatter(rank, world):
    import torch_cgx

    dist.init_process_group("cgx")
    gloo = dist.new_group(backend="gloo")
    n, x, exact, bound = scatter_case(rank, world, gloo)
    out, want = torch.empty(n), torch.empty(n)
    dist.reduce_scatter_tensor(out, x)  # bits 32: exact, as Gloo's
    dist.reduce_scatter_tensor(want, x, group=gloo)
    assert torch.equal(out, want)
    torch_cgx.set_config(bits=BITS, bucket_size=BUCKET)
    sent = torch_cgx.cgx_backend().total_bytes_sent()
    dist.reduce_scatter_tensor(out, x)  # the group's settings: compressed, one-shot
    err = (out.double() - exact).abs()
    assert (err <= bound).all() and err.max() > 0
    assert torch_cgx.cgx_backend().total_bytes_sent() - sent < (world - 1) * n * 4 / 3.5
    dist.reduce_scatter_tensor(out, x, op=dist.ReduceOp.AVG)
    assert ((out.double() - exact / world).abs() <= bound / world + 1e-7).all()
    dist.reduce_scatter_tensor(out, x, op=dist.ReduceOp.MAX)  # other ops: exact
    dist.reduce_scatter_tensor(want, x, op=dist.ReduceOp.MAX, group=gloo)
    assert torch.equal(out, want)
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_cgx_backend_reduce_scatter_is_compressed(world):
    run_ranks(body_backend_reduce_scatter, world, timeout=120)


def body_list_and_coalesced_forms(rank, world):
    import torch_cgx

    dist.init_process_group("cgx")
    gloo = dist.new_group(backend="gloo")
    n, x, exact, bound = scatter_case(rank, world, gloo)
    torch_cgx.set_config(bits=BITS, bucket_size=BUCKET)
    # The list form: the same chunks, the same single quantization.
    out = torch.empty(n)
    sent = torch_cgx.cgx_backend().total_bytes_sent()
    dist.reduce_scatter(out, list(x.view(world, n).unbind(0)))
    err = (out.double() - exact).abs()
    assert (err <= bound).all() and err.max() > 0
    assert torch_cgx.cgx_backend().total_bytes_sent() - sent < (world - 1) * n * 4 / 3.5
    # The coalesced form (FSDP2 and torch's coalescing manager): one fused piece for all pairs;
    # each output within its own chunk's bound. The second pair is x's chunks in reverse order.
    y = x.view(world, n).flip(0).contiguous().view(-1)
    _, _, exact_y, bound_y = scatter_case_of(rank, world, gloo, y)
    a, b = torch.empty(n), torch.empty(n)
    sent = torch_cgx.cgx_backend().total_bytes_sent()
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.reduce_scatter_tensor(a, x)
        dist.reduce_scatter_tensor(b, y)
    cm.wait()
    assert 0 < torch_cgx.cgx_backend().total_bytes_sent() - sent < 2 * (world - 1) * n * 4 / 3.5
    assert ((a.double() - exact).abs() <= bound).all() and not torch.equal(a.double(), exact)
    assert ((b.double() - exact_y).abs() <= bound_y).all()
    # fp16 and bf16 buffers (FSDP2's reduce_dtype): encoded from that dtype, summed in fp32,
    # rounded once to the output's dtype.
    for dtype, eps in ((torch.float16, 2**-11), (torch.bfloat16, 2**-8)):
        xh = x.to(dtype)
        _, _, exact_h, bound_h = scatter_case_of(rank, world, gloo, xh.float())
        oh = torch.empty(n, dtype=dtype)
        dist.reduce_scatter_tensor(oh, xh, op=dist.ReduceOp.AVG)
        err = (oh.double() - exact_h / world).abs()
        assert (err <= bound_h / world + exact_h.abs() / world * eps).all(), dtype
        assert err.max() > 0
    # Mixed dtypes and other ops: forwarded, Gloo's results bit for bit.
    h, want = torch.empty(n, dtype=torch.float64), torch.empty(n, dtype=torch.float64)
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.reduce_scatter_tensor(a, x)
        dist.reduce_scatter_tensor(h, x.double())
    cm.wait()
    dist.reduce_scatter_tensor(want, x.double(), group=gloo)
    assert torch.equal(h, want)
    dist.reduce_scatter(out, list(x.view(world, n).unbind(0)), op=dist.ReduceOp.MAX)
    mx = torch.empty(n)
    dist.reduce_scatter_tensor(mx, x, op=dist.ReduceOp.MAX, group=gloo)
    assert torch.equal(out, mx)
    dist.destroy_process_group()


def test_cgx_backend_list_and_coalesced_reduce_scatter():
    run_ranks(body_list_and_coalesced_forms, 3, timeout=120)
