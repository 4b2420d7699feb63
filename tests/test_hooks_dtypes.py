"""Every hook takes fp32, fp16 and bf16 gradients (models in half precision), on real ranks:
the delivered gradient is identical on every rank and close to the exact average of the ranks'
gradients (within what the hook's compression allows, measured relative to the gradient)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from dist_helpers import run_ranks

# Relative L2 error of the delivered average allowed per hook: the exact ones round once in the
# gradient's dtype (2^-8 for bf16); 8-bit max-min with 64-value buckets errs by at most half a
# step (range / 255 / 2) per value, well under 5% in L2; PowerSGD at a rank equal to the small
# matrices' rank is exact up to rounding at the first step with a fresh, orthogonalized Q.
HOOKS = {
    "allreduce": 1e-2,
    "fp16": 1e-2,
    "bf16": 1e-2,
    "cgx8": 5e-2,
    "compression_qsgd8": 1e-1,
    "powersgd_full_rank": 2e-2,
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


def body(rank, world, dtype_name):
    import torch_cgx  # noqa: F401

    dtype = getattr(torch, dtype_name)
    dist.init_process_group("cgx")
    gloo = dist.new_group(backend="gloo")
    for name, tol in HOOKS.items():
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
            exact = sum(q.float() for q in parts) / world
            err = ((got.float() - exact).norm() / exact.norm()).item()
            assert err <= tol, (name, dtype_name, err)
            copies = [torch.empty_like(got) for _ in range(world)]
            dist.all_gather(copies, got, group=gloo)
            assert all(torch.equal(c, copies[0]) for c in copies), name
    dist.destroy_process_group()


@pytest.mark.parametrize("dtype_name", ["float32", "float16", "bfloat16"])
def test_hooks_take_every_float_dtype(dtype_name):
    run_ranks(body, 2, dtype_name, timeout=180)
