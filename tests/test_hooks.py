"""CGX's layer-wise hook and DDP training over the cgx backend, on real ranks."""

from __future__ import annotations

import gc
import io
import json
import pickle

import pytest
import torch
import torch.distributed as dist
from dist_helpers import run_ranks

from torch_cgx.bounds import allreduce_error_bound


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 96),  # weight 3072: compressed; bias 96: exact
        torch.nn.ReLU(),
        torch.nn.LayerNorm(96),  # 1-D: exact
        torch.nn.Linear(96, 8),  # weight 768 < layer_min_size: exact
    )


def local_grads(model, x, y):
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


def body_hook(rank, world):
    from cgx_utils import CGXState, cgx_hook  # the CGX import path

    dist.init_process_group("cgx")  # CGX_* unset: bits 32, plain allreduce is exact
    gloo = dist.new_group(backend="gloo")
    model = make_model(0)
    ddp = torch.nn.parallel.DistributedDataParallel(make_model(0))
    # Without error feedback each step is one allreduce of this step's gradients (the bound).
    state = CGXState(
        None, 1024, {"bits": 4, "bucket_size": 128}, error_feedback=False, rotation=False
    )
    ddp.register_comm_hook(state, cgx_hook)
    other = torch.nn.parallel.DistributedDataParallel(make_model(1))
    other.register_comm_hook(CGXState(dist.group.WORLD, compression_params={"bits": 8}), cgx_hook)
    # bits 32: every layer exact, the compressible ones' spans and the others' in one part
    # (concatenated out of the buffer's order, they were refused: "spans must be increasing")
    exact32 = torch.nn.parallel.DistributedDataParallel(make_model(0))
    exact32.register_comm_hook(CGXState(None, 1024, {"bits": 32}), cgx_hook)
    for step in range(3):
        g = torch.Generator().manual_seed(100 * step + rank)
        x, y = torch.randn(16, 32, generator=g), torch.randint(0, 8, (16,), generator=g)
        per_rank = []
        for r in range(world):
            gr = torch.Generator().manual_seed(100 * step + r)
            xr, yr = torch.randn(16, 32, generator=gr), torch.randint(0, 8, (16,), generator=gr)
            per_rank.append(local_grads(model, xr, yr))
        ddp.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        # An allreduce outside DDP between steps must not disturb anything (no call-order registry).
        t = torch.ones(5000)
        dist.all_reduce(t)
        assert torch.equal(t, torch.full((5000,), float(world)))
        other.zero_grad()
        torch.nn.functional.cross_entropy(other(x), y).backward()
        exact32.zero_grad()
        torch.nn.functional.cross_entropy(exact32(x), y).backward()
        for i, (p, p32) in enumerate(zip(ddp.parameters(), exact32.parameters())):
            grads = [pr[i] for pr in per_rank]
            exact = torch.stack([g.double() for g in grads]).sum(0) / world
            assert torch.allclose(p32.grad.double(), exact, rtol=1e-6, atol=1e-7), f"32: {i}"
            if p.dim() > 1 and p.numel() >= 1024:
                bound = allreduce_error_bound([g.reshape(-1) for g in grads], 4, 128, average=True)
                err = (p.grad.double().reshape(-1) - exact.reshape(-1)).abs()
                assert bool((err <= bound).all()), f"param {i}: {err.max()} > bound"
                assert not torch.equal(p.grad, exact.float()), "a compressed layer came out exact"
            else:
                # Exact layers: the fp32 sum of two ranks is exact up to one rounding, then / W.
                assert torch.allclose(p.grad.double(), exact, rtol=1e-6, atol=1e-7), f"param {i}"
            raw = p.grad.reshape(-1).view(torch.uint8)
            out = [torch.empty_like(raw) for _ in range(world)]
            dist.all_gather(out, raw, group=gloo)
            assert all(torch.equal(o, out[0]) for o in out), f"param {i} differs across ranks"
    dist.destroy_process_group()


def test_cgx_hook_layers_bounds_and_identical_replicas():
    run_ranks(body_hook, 2)


def body_hook_straddles_layers(rank, world):
    """Two compressible layers of different scales in one DDP bucket, sizes not multiples of the
    codec bucket: codec buckets straddle the two layers. Every gradient must be within the bound
    computed on the concatenation the hook reduces, and identical on every rank."""
    from torch_cgx import CGXState, cgx_hook

    dist.init_process_group("cgx")
    gloo = dist.new_group(backend="gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(33, 97), torch.nn.Linear(97, 40))
    with torch.no_grad():
        model[1].weight.mul_(50)  # second layer's gradients on another scale
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    # CGX's own hook (legacy): the layers concatenated, buckets straddling them.
    state = CGXState(None, 1000, {"bits": 4, "bucket_size": 256}, legacy=True)
    seen = []

    def recording_hook(s, bucket):
        flags = [s.compresses(p) for p in bucket.parameters()]
        sizes = [p.numel() for p in bucket.parameters()]
        seen.append((bucket.buffer().clone(), flags, sizes))
        return cgx_hook(s, bucket).then(lambda f: (seen.append(f.value().clone()), f.value())[1])

    ddp.register_comm_hook(state, recording_hook)
    g = torch.Generator().manual_seed(rank)
    ddp(torch.randn(16, 33, generator=g)).square().mean().backward()
    (before, flags, sizes), after = seen[0], seen[1]
    assert len(seen) == 2 and sum(flags) == 2, "expected one bucket with both weights"
    assert any(n % 256 for n, f in zip(sizes, flags) if f), "no codec bucket straddles layers"
    everyone = [torch.empty_like(before) for _ in range(world)]
    dist.all_gather(everyone, before, group=gloo)
    exact = torch.stack([b.double() for b in everyone]).mean(0)
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    picked = [(o, n) for o, n, f in zip(offsets, sizes, flags) if f]
    concat = [torch.cat([b[o : o + n] for o, n in picked]) for b in everyone]
    bound = allreduce_error_bound(concat, 4, 256, average=True)
    got = torch.cat([after[o : o + n] for o, n in picked]).double()
    want = torch.cat([exact[o : o + n] for o, n in picked])
    err = (got - want).abs()
    assert bool((err <= bound).all()), f"max err {err.max()} over the bound"
    assert not torch.equal(got, want)
    assert bool(
        ((after.double() - exact).abs() <= 1e-6 * exact.abs() + 1e-7)[
            ~torch.cat([torch.full((n,), f) for n, f in zip(sizes, flags)])
        ].all()
    )  # exact parts exact
    raw = after.view(torch.uint8)
    out = [torch.empty_like(raw) for _ in range(world)]
    dist.all_gather(out, raw, group=gloo)
    assert all(torch.equal(o, out[0]) for o in out)
    dist.destroy_process_group()


def test_cgx_hook_bucket_straddling_two_layers():
    run_ranks(body_hook_straddles_layers, 2)


def body_hook_needs_cgx(rank, world):
    from torch_cgx import CGXState, cgx_hook

    dist.init_process_group("gloo")
    ddp = torch.nn.parallel.DistributedDataParallel(make_model(0))
    ddp.register_comm_hook(CGXState(), cgx_hook)
    with pytest.raises(ValueError, match="not 'cgx'"):
        torch.nn.functional.cross_entropy(ddp(torch.randn(4, 32)), torch.zeros(4).long()).backward()
    dist.destroy_process_group()


def test_cgx_hook_on_a_non_cgx_group_says_so():
    run_ranks(body_hook_needs_cgx, 2)


def test_cgx_state_validation_and_pickling():
    from torch_cgx import CGXState

    with pytest.raises(ValueError, match="bits"):
        CGXState(compression_params={"bits": 9})
    with pytest.raises(ValueError, match="bucket_size"):
        CGXState(compression_params={"bucket_size": 0})
    with pytest.raises(ValueError, match="unknown compression_params"):
        CGXState(compression_params={"bitz": 4})
    with pytest.raises(ValueError, match="layer_min_size"):
        CGXState(layer_min_size=-1)
    s = pickle.loads(pickle.dumps(CGXState("not-a-group", 7, {"bits": 2})))
    assert s.process_group is None and s.layer_min_size == 7 and s.compression_params == {"bits": 2}
    buf = io.BytesIO()
    torch.save({"hook": CGXState(None, 9, {"bits": 4})}, buf)
    buf.seek(0)
    s = torch.load(buf, weights_only=True)["hook"]  # torch's default loader accepts it
    assert s.layer_min_size == 9 and s.compression_params == {"bits": 4}


def body_train(rank, world, how, out_path):
    import os

    if how.startswith("cgx"):
        os.environ["CGX_COMPRESSION_QUANTIZATION_BITS"] = how.split("-")[1]
        dist.init_process_group("cgx")
    else:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(20, 128),
        torch.nn.Tanh(),
        torch.nn.Linear(128, 128),
        torch.nn.Tanh(),
        torch.nn.Linear(128, 1),
    )
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    torch.manual_seed(42)
    teacher = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    losses = []
    for step in range(60):
        gs = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(64, 20, generator=gs)
        with torch.no_grad():
            y = teacher(x)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t = loss.detach().clone()
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # int-free exact op: same number on all ranks
        losses.append(t.item())
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(losses, f)
    # DDP holds the group: drop it first, so that the group (and Gloo's threads, which may
    # hold tensors) goes now, with the interpreter alive, not during its finalization.
    del ddp, opt, model
    gc.collect()
    dist.destroy_process_group()


def test_ddp_training_with_cgx_follows_gloo(tmp_path):
    curves = {}
    for how in ("gloo", "cgx-8", "cgx-4"):
        path = tmp_path / f"{how}.json"
        run_ranks(body_train, 2, how, str(path))
        curves[how] = json.loads(path.read_text())
    gloo = curves["gloo"]
    assert gloo[-1] < 0.5 * gloo[0], "the reference run did not learn"
    for how, tol in (("cgx-8", 0.02), ("cgx-4", 0.10)):
        c = curves[how]
        assert c != gloo, f"{how} gave Gloo's exact curve: compression did not happen"
        late = sum(c[-10:]) / 10
        late_ref = sum(gloo[-10:]) / 10
        assert abs(late - late_ref) <= tol * late_ref, f"{how}: {late} vs gloo {late_ref}"
