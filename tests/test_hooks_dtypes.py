"""Every hook takes fp32, fp16 and bf16 gradients (models in half precision), on real ranks:
the delivered gradient is identical on every rank and close to the exact average of the ranks'
gradients, within what the hook's compression and each dtype's rounding allow."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from dist_helpers import run_ranks

from torch_cgx.bounds import allreduce_error_bound

# Unit roundoff: a rounding to the dtype moves a value by at most this, relatively.
U = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def roundings(name: str, dtype: torch.dtype) -> float:
    """The relative L2 error allowed for an exactly reduced layer: the roundings on its way (each
    relative, so their sum bounds the L2 error too), 1% slack for their products. The average of
    2 ranks is a sum (exact in fp32) rounded once to the dtype, then halved (exact); fp16 / bf16
    hooks round an fp32 gradient to 16 bits first (bf16 into fp16 is exact, fp16 into bf16 is
    not, bf16 back into fp16 is) and a bf16 gradient back from fp16; PowerSGD at full rank is
    exact but for its six roundings in the dtype (P = M Q, its allreduce, the orthogonalization,
    Q = M^T P, its allreduce, P Q^T)."""
    u, u16, ubf = U[dtype], U[torch.float16], U[torch.bfloat16]
    if name == "fp16":
        total = {torch.float32: 2 * u16, torch.float16: u16, torch.bfloat16: u16 + ubf}[dtype]
    elif name == "bf16":
        total = 2 * ubf if dtype != torch.bfloat16 else ubf
    elif name == "powersgd_full_rank":
        total = 6 * u
    else:  # allreduce, and the layers the compressing hooks reduce exactly
        total = u
    return 1.01 * total


def cgx8_bound(parts, dtype):
    """Max-min, 8 bits, buckets of 64, SRA, averaged: the codec's bound (docs/algorithms.md)."""
    return allreduce_error_bound([p.reshape(-1) for p in parts], 8, 64, "sra", True, dtype=dtype)


def qsgd8_bound(parts, dtype):
    """QSGD, 8 bits (L = 127 levels), one bucket (the layer), SRA of W ranks, averaged: a value
    moves by at most one level, norm / L, when sent (norm <= B = the sum of the ranks' norms)
    and again in the owner's sum s / W (|s| <= B (1 + sqrt(n) / L)); then one rounding."""
    n, levels, world = parts[0].numel(), 127, len(parts)
    assert n <= 512  # one bucket
    b = sum(float(p.double().norm()) for p in parts)
    exact = sum(p.double() for p in parts).reshape(-1) / world
    return b * (2 + n**0.5 / levels) / levels / world * 1.0001 + U[dtype] * 1.01 * exact.abs()


HOOKS = {
    "allreduce": None,
    "fp16": None,
    "bf16": None,
    "cgx8": cgx8_bound,
    "compression_qsgd8": qsgd8_bound,
    "powersgd_full_rank": None,
}


def make_state(name, model):
    from torch_cgx import hooks

    group = dist.group.WORLD
    if name == "allreduce":
        return group, hooks.allreduce_hook
    if name in ("fp16", "bf16"):
        return group, getattr(hooks, f"{name}_compress_hook")
    if name == "cgx8":
        params = {"bits": 8, "bucket_size": 64}
        return hooks.CGXState(layer_min_size=64, compression_params=params), hooks.cgx_hook
    if name == "compression_qsgd8":
        state = hooks.CompressionState(compressor="qsgd", params={"bits": 8}, layer_min_size=64,
                                       module=model)  # fmt: skip
        return state, hooks.compression_hook
    state = hooks.PowerSGDState(None, matrix_approximation_rank=8, start_powerSGD_iter=2,
                                min_compression_rate=0, module=model)  # fmt: skip
    return state, hooks.powerSGD_hook


def check_layer(name, got, parts, dtype) -> None:
    """A layer's delivered average against the exact one: within the codec's bound, per value,
    where the hook compresses it (matrices of >= 64 values), else within the roundings."""
    exact = sum(q.float() for q in parts) / len(parts)
    err = (got.float() - exact).reshape(-1)
    if HOOKS[name] is not None and got.dim() > 1 and got.numel() >= 64:
        bound = HOOKS[name]([q.float() for q in parts], dtype)
        assert bool((err.abs().double() <= bound).all()), (name, dtype, float(err.abs().max()))
        assert float(err.abs().max()) > 0  # compressed indeed
    else:
        rel = (err.norm() / exact.norm()).item()
        assert rel <= roundings(name, dtype), (name, dtype, rel)


def body(rank, world, dtype_name):
    import torch_cgx  # noqa: F401

    dtype = getattr(torch, dtype_name)
    dist.init_process_group("cgx")
    gloo = dist.new_group(backend="gloo")
    for name in HOOKS:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Linear(8, 4)).to(dtype)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        ddp.register_comm_hook(*make_state(name, model))
        for step in range(3):  # no optimizer step: the same weights; PowerSGD starts at step 2
            x = torch.randn(8, 16, generator=torch.Generator().manual_seed(7 * step + rank))
            ddp.zero_grad()
            ddp(x.to(dtype)).float().square().mean().backward()
        delivered = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        model(x.to(dtype)).float().square().mean().backward()  # this rank's own gradient
        for got, p in zip(delivered, model.parameters()):
            assert got.dtype == dtype, name
            parts = [torch.empty_like(p.grad) for _ in range(world)]
            dist.all_gather(parts, p.grad, group=gloo)
            check_layer(name, got, parts, dtype)
            copies = [torch.empty_like(got) for _ in range(world)]
            dist.all_gather(copies, got, group=gloo)
            assert all(torch.equal(c, copies[0]) for c in copies), name
    dist.destroy_process_group()


@pytest.mark.parametrize("dtype_name", ["float32", "float16", "bfloat16"])
def test_hooks_take_every_float_dtype(dtype_name):
    run_ranks(body, 2, dtype_name, timeout=180)
