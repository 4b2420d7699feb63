"""torch_cgx.hooks' default hooks against torch's own, on the same model and data, on real ranks.

With two ranks every exact sum is one IEEE addition per value (commutative, correctly rounded),
so the hooks that do torch's arithmetic step for step must give torch's gradients bit for bit,
whatever the group (Gloo, or a cgx group's exact path)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from dist_helpers import run_ranks

from torch_cgx.bounds import allreduce_error_bound


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 96), torch.nn.ReLU(), torch.nn.LayerNorm(96), torch.nn.Linear(96, 8)
    )


def grads_after(ddp, rank, steps=2):
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * step + rank)
        x, y = torch.randn(16, 32, generator=g), torch.randint(0, 8, (16,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        if step + 1 < steps:
            opt.step()
    return [p.grad.clone() for p in ddp.parameters()]


def ddp_with(group, state, hook, bucket_cap_mb=0.01):
    ddp = torch.nn.parallel.DistributedDataParallel(
        make_model(), process_group=group, bucket_cap_mb=bucket_cap_mb
    )
    ddp.register_comm_hook(state, hook)
    return ddp


def renamed(hook):
    """torch's hook under another name: DDP refuses hooks named bf16_compress_hook (or its
    wrapper's) without CUDA and NCCL, by name."""

    def hook_as_torch_wrote_it(state, bucket):
        return hook(state, bucket)

    return hook_as_torch_wrote_it


def body_parity(rank, world, backend):
    from torch.distributed.algorithms.ddp_comm_hooks import debugging_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as theirs

    from torch_cgx import hooks as ours

    dist.init_process_group(backend)  # a cgx group: bits 32 unless CGX_* say otherwise
    gloo = dist.new_group(backend="gloo")
    pairs = [
        ("allreduce_hook", theirs.allreduce_hook, ours.allreduce_hook),
        ("fp16_compress_hook", theirs.fp16_compress_hook, ours.fp16_compress_hook),
        ("bf16_compress_hook", renamed(theirs.bf16_compress_hook), ours.bf16_compress_hook),
        ("noop_hook", debugging_hooks.noop_hook, ours.noop_hook),
        ("fp16(allreduce)", theirs.fp16_compress_wrapper(theirs.allreduce_hook),
         ours.fp16_compress_wrapper(ours.allreduce_hook)),
        ("bf16(allreduce)", renamed(theirs.bf16_compress_wrapper(theirs.allreduce_hook)),
         ours.bf16_compress_wrapper(ours.allreduce_hook)),
    ]  # fmt: skip
    for name, their_hook, our_hook in pairs:
        expected = grads_after(ddp_with(gloo, gloo, their_hook), rank)
        state = None if name == "noop_hook" else dist.group.WORLD
        got = grads_after(ddp_with(dist.group.WORLD, state, our_hook), rank)
        for e, g in zip(expected, got):
            assert torch.equal(e, g), f"{name} on {backend}: differs from torch's hook"
    dist.destroy_process_group()


@pytest.mark.parametrize("backend", ["gloo", "cgx"])
def test_default_hooks_match_torch_bit_for_bit(backend):
    run_ranks(body_parity, 2, backend, timeout=180)


def body_wrapped_cgx(rank, world):
    from torch_cgx import CGXState, hooks

    dist.init_process_group("cgx")
    gloo = dist.new_group(backend="gloo")
    state = CGXState(layer_min_size=1024, compression_params={"bits": 4, "bucket_size": 64})
    for dtype, wrap in ((torch.float16, hooks.fp16_compress_wrapper),
                        (torch.bfloat16, hooks.bf16_compress_wrapper)):  # fmt: skip
        local = grads_after(ddp_with(gloo, None, hooks.noop_hook, 25), rank, steps=1)
        got = grads_after(ddp_with(dist.group.WORLD, state, wrap(hooks.cgx_hook), 25), rank, 1)
        for loc, g in zip(local, got):
            half = loc.to(dtype)
            parts = [torch.empty_like(half) for _ in range(world)]
            dist.all_gather(parts, half, group=gloo)
            exact = sum(p.float() for p in parts) / world
            if loc.dim() > 1 and loc.numel() >= 1024:  # compressed: 4-bit bound, then a cast
                flat = [p.float().view(-1) for p in parts]
                bound = allreduce_error_bound(flat, 4, 64, average=True, dtype=dtype)
                bound = bound.view_as(exact) + exact.abs() * torch.finfo(dtype).eps
                assert ((g - exact).abs() <= bound + 1e-30).all(), dtype
            else:  # exact in half precision: within one rounding of the half sum
                tol = exact.abs() * torch.finfo(dtype).eps * 2
                assert ((g - exact).abs() <= tol + 1e-30).all(), dtype
            copies = [torch.empty_like(g) for _ in range(world)]
            dist.all_gather(copies, g, group=gloo)
            assert all(torch.equal(c, copies[0]) for c in copies)
    dist.destroy_process_group()


def test_half_wrappers_run_the_cgx_hook():
    run_ranks(body_wrapped_cgx, 2, timeout=120)
