"""The planner's auto mode on real groups (CGX_COMPRESSOR=auto): the same plan on every rank,
exact everywhere when calibration fails, bad rules refused, and the compression hook following
the group's plan."""

from __future__ import annotations

import os

import pytest


def body_auto(rank, world):
    import torch
    import torch.distributed as dist

    import torch_cgx
    from torch_cgx.plan import probe

    if rank == 0 and os.environ.get("BREAK_CALIBRATION"):

        def broken(*a, **k):
            raise OSError("no codec today")

        probe.calibrate = broken
    dist.init_process_group("cgx")
    gloo = dist.new_group(backend="gloo")
    backend = torch_cgx.cgx_backend()
    rules = [(r.max_numel, r.compressor, r.bits, r.algorithm, r.segments) for r in backend.plan()]
    everyone = [None] * world
    dist.all_gather_object(everyone, rules, group=gloo)
    assert all(r == rules for r in everyone)  # one plan on every rank
    assert torch_cgx.get_config().compressor == "auto"
    small, big = torch.full((64,), float(rank + 1)), torch.randn(1 << 22) + rank
    want = big.clone()
    dist.all_reduce(want, group=gloo)
    dist.all_reduce(small)
    assert torch.equal(small, torch.full((64,), float(world * (world + 1) // 2)))  # exact
    dist.all_reduce(big)
    if os.environ.get("BREAK_CALIBRATION"):
        assert rules == [] and torch.equal(big, want)  # no plan: every call exact
    else:
        rule = next(r for r in rules if (1 << 22) <= r[0])
        # 16 MiB on loopback: the probe finds compression about 2x faster than exact here
        assert rule[1] in ("maxmin", "fp16", "bf16"), rule
        assert backend.last_bytes_sent() < 4 * (1 << 22) * 0.6  # compressed on the wire
        err = (big - want).abs().max() / want.abs().max()
        assert 0 < err < 0.1  # quantized (fp16's relative error is about 1e-3), not garbage
    torch_cgx.set_config(compressor="maxmin", bits=8)  # a fixed choice drops the plan
    assert backend.plan() == []
    torch_cgx.set_config(compressor="auto", bits=6)  # planned again, with the new budget
    assert all(r.bits >= 6 for r in backend.plan() if r.compressor == "maxmin")
    dist.destroy_process_group()


@pytest.mark.parametrize("broken", [False, True])
def test_auto_plans_the_group_the_same_on_every_rank(broken):
    from dist_helpers import run_ranks

    env = {"CGX_COMPRESSOR": "auto"}
    if broken:
        env["BREAK_CALIBRATION"] = "1"
    run_ranks(body_auto, 2, env=env, timeout=180)


def body_bad_rules(rank, world):
    import torch.distributed as dist

    import torch_cgx
    from torch_cgx import _C

    dist.init_process_group("cgx")
    backend = torch_cgx.cgx_backend()

    def rule(max_numel, compressor="maxmin", segments=1, **params):
        r = _C.PlanRule()
        r.max_numel, r.compressor, r.segments, r.bits = max_numel, compressor, segments, 4
        r.params = params
        return r

    torch_cgx.set_config(compressor="auto")  # one rank: nothing to plan, no probe
    assert backend.plan() == []
    with pytest.raises(ValueError, match="increasing max_numel"):
        backend.set_plan([rule(100), rule(50)])
    with pytest.raises(ValueError, match="segments"):
        backend.set_plan([rule(100, segments=-1)])
    with pytest.raises(ValueError, match="unknown compressor"):
        backend.set_plan([rule(100, "zip")])
    with pytest.raises(ValueError, match="ratio"):
        backend.set_plan([rule(100, "topk", ratio=2.0)])
    assert backend.plan() == []  # nothing was applied
    dist.destroy_process_group()


def test_bad_plan_rules_are_refused():
    from dist_helpers import run_ranks

    run_ranks(body_bad_rules, 1, timeout=60)


def body_hook_plan(rank, world):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torch_cgx
    from torch_cgx import hooks

    dist.init_process_group("cgx")

    def make():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                    torch.nn.Linear(512, 8))  # fmt: skip
        ddp = DDP(model)
        state = hooks.CompressionState(plan="auto", module=model, layer_min_size=1024)
        ddp.register_comm_hook(state, hooks.compression_hook)
        return model, ddp, state

    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(rank))
    _, broken, _ = make()
    with pytest.raises(ValueError, match="planned group"):  # the group has no plan yet
        broken(x).sum().backward()
    del broken  # DDP cannot go on after a failed backward
    model, ddp, state = make()
    torch_cgx.set_config(compressor="auto")
    backend = torch_cgx.cgx_backend()
    # One rule that compresses everything at 4 bits, so that the effect is visible.
    from torch_cgx import _C
    from torch_cgx.bounds import allreduce_error_bound

    rule = _C.PlanRule()
    rule.max_numel, rule.compressor, rule.bits, rule.bucket_size = 1 << 62, "maxmin", 4, 64
    backend.set_plan([rule])
    ddp.zero_grad()
    ddp(x).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    exact = [torch.empty_like(g) for g in grads]
    gloo = dist.new_group(backend="gloo")
    model.zero_grad()
    model(x).sum().backward()
    own = [torch.empty_like(model[0].weight) for _ in range(world)]  # each rank's layer-0 grad
    dist.all_gather(own, model[0].weight.grad, group=gloo)
    for e, p in zip(exact, model.parameters()):
        e.copy_(p.grad)
        dist.all_reduce(e, group=gloo)
        e /= world
    weight = grads[0]  # compressible: quantized at 4 bits, error feedback kept
    # The codec's bound (SRA, averaged): the compressible layers hold multiples of 64 values, so
    # the codec's buckets are this layer's own, whatever their order in the DDP bucket.
    bound = allreduce_error_bound([g.reshape(-1) for g in own], 4, 64, "sra", average=True)
    err = (weight.double() - exact[0].double()).abs().reshape(-1)
    assert not torch.equal(weight, exact[0]) and bool((err <= bound).all()), float(err.max())
    assert torch.equal(grads[1], exact[1])  # a bias: exact
    assert state.residuals and all(r.abs().sum() > 0 for r in state.residuals.values())
    restored = hooks.CompressionState.__new__(hooks.CompressionState)
    restored.__setstate__(state.__getstate__())
    assert restored.plan == "auto"
    del ddp
    dist.destroy_process_group()


def test_compression_hook_follows_the_groups_plan():
    from dist_helpers import run_ranks

    run_ranks(body_hook_plan, 2, timeout=180)
