"""The entry points that are not the backend's own, on their device path with
CPU tensors: ``torch_cgx.fsdp`` (reduce-scatter, all-gather, ``fully_shard``), the PowerSGD hooks
(their passes: tests/test_device_lowrank.py), ``PowerSGDGradientAverager`` and the default
hooks. Each runs on real ranks under the host-read recorder of tests/device_engine_reads.py
(item, tolist, cpu, numpy, to(cpu), bool, int, float, index and value-sized ops on data): nothing
is read back but the
documented size exchange, the results equal the native (host) path's bit for bit where the bytes
are the native ones or lie within the bound derived from the sums' rounding, and every replica
holds the same values. docs/gpu-engine.md, "Entry points on the device"."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.distributed as dist
from device_engine_reads import host_reads
from dist_helpers import run_ranks

U = 2.0**-24  # fp32's unit roundoff


def replicas_equal(t: torch.Tensor) -> bool:
    copies = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(copies, t.contiguous())
    return all(torch.equal(c, copies[0]) for c in copies)


# ---- fsdp ----

_RS_CASES = [
    ("maxmin", dict(bits=4, bucket_size=64)),
    ("maxmin", dict(bits=3, bucket_size=100, stochastic=True)),
    ("fp16", {}),
    ("topk", dict(ratio=0.05)),  # data-dependent sizes: the size exchange every call
    ("randomk", dict(ratio=0.1)),
]


def device_reads(fn):
    """host_reads of ``fn`` less the codecs' CPU-only shortcuts: lines guarded by
    ``device.type != "cpu" or ...``, which read nothing on a GPU (as tests/test_device_engine.py
    counts them)."""
    return [r for r in host_reads(fn) if 'device.type != "cpu" or' not in r]


def _size_reads(reads):
    """The recorded reads that are fsdp's documented size exchange (``_sizes``' tolist)."""
    return [r for r in reads if "fsdp.py" in r and "tolist" in r and "heads.tolist" in r]


def _reduce_scatter_cases(rank, world, group):
    from torch_cgx.fsdp import CompressedReduceScatter

    n = 64 * 40
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(world * n, generator=g) * (1 + torch.arange(world * n) % 7)
    for name, params in _RS_CASES:
        for dtype in (torch.float32, torch.bfloat16):
            dev = CompressedReduceScatter(name, min_size=1024, data_plane="device", **params)
            host = CompressedReduceScatter(name, min_size=1024, data_plane="host", **params)
            assert dev.device_codec is not None and host.device_codec is None
            dev.check = "deferred"  # as on a GPU: the header flag is read where one syncs
            xin = x.to(dtype)
            for call, op in enumerate((dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.SUM)):
                got, want = torch.empty(n, dtype=dtype), torch.empty(n, dtype=dtype)
                reads = device_reads(lambda c=dev, o=got, i=xin, op=op: c(o, i, group, op))
                host(want, xin, group, op)
                assert torch.equal(got, want), (name, params, dtype, call)
                sized = _size_reads(reads)
                assert sized == reads, reads  # nothing but the size exchange
                # fixed-size payloads: sizes read once (the settings check), then never
                expect = 1 if call == 0 or not dev.device_codec.fixed_size else 0
                assert len(sized) == expect, (name, call, reads)
            dev.check_headers()
            assert dev.bytes_sent == host.bytes_sent and dev.calls == host.calls == 3


def _all_gather_case(rank, world, group):
    from torch_cgx.fsdp import CompressedAllGather

    m = 256 * 10
    shard = torch.randn(m, generator=torch.Generator().manual_seed(50 + rank)) * (rank + 1)
    for dtype in (torch.float32, torch.float16):
        dev = CompressedAllGather(bits=8, bucket_size=256, min_size=1024, data_plane="device")
        host = CompressedAllGather(bits=8, bucket_size=256, min_size=1024, data_plane="host")
        got = torch.empty(world * m, dtype=dtype)
        want = torch.empty(world * m, dtype=dtype)
        s = shard.to(dtype)
        assert device_reads(lambda c=dev, o=got, i=s: c(o, i, group)) == []
        host(want, s, group)
        assert torch.equal(got, want), dtype
        assert torch.equal(got.view(world, m)[rank], s)  # its own shard stays exact
        # every rank decoded the same payloads: slot j is the same wherever j is not the owner
        for j in range(world):
            slot = got.view(world, m)[j].clone()
            if j == rank:
                slot.zero_()
            copies = [torch.empty_like(slot) for _ in range(world)]
            dist.all_gather(copies, slot)
            others = [c for r, c in enumerate(copies) if r != j]
            assert all(torch.equal(c, others[0]) for c in others), j


def _fully_shard_run(rank, world, data_plane, steps=4):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from torch_cgx import fsdp

    # a CPU mesh, named: FSDP2's default mesh is CUDA's wherever a GPU is (one GPU and three
    # ranks: "invalid device ordinal", seen on the GPU check)
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.GELU(), torch.nn.Linear(256, 8))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    comm = fsdp.compress(model, bits=4, bucket_size=128, min_size=1024, all_gather_bits=8,
                         data_plane=data_plane)  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step in range(steps):
        x = torch.randn(16, 32, generator=torch.Generator().manual_seed(100 * step + rank))
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    full = [v.full_tensor() for v in model.state_dict().values()]
    calls = (comm.calls, comm.all_gather.calls)
    del model, opt, comm
    gc.collect()
    return losses, full, calls


def body_fsdp(rank, world):
    dist.init_process_group("gloo")
    group = dist.group.WORLD
    _reduce_scatter_cases(rank, world, group)
    _all_gather_case(rank, world, group)
    dev, dev_full, calls = _fully_shard_run(rank, world, "device")
    host, host_full, _ = _fully_shard_run(rank, world, "host")
    assert calls[0] > 0 and calls[1] > 0
    assert all(torch.equal(a, b) for a, b in zip(dev, host)), (dev, host)
    assert all(torch.equal(a, b) and replicas_equal(a) for a, b in zip(dev_full, host_full))
    # Everything that may hold the group goes, and the ranks leave together, before destroy:
    # Gloo's threads then stop with the interpreter alive (the exit-time abort of test_fsdp.py).
    del dev, host, dev_full, host_full
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def test_fsdp_entry_points_on_the_device_path():
    run_ranks(body_fsdp, 3, timeout=180)


def test_fsdp_bad_data_plane():
    from torch_cgx.fsdp import CompressedAllGather, CompressedReduceScatter

    with pytest.raises(ValueError, match="data_plane"):
        CompressedReduceScatter("maxmin", data_plane="gpu")
    with pytest.raises(ValueError, match="data_plane"):
        CompressedAllGather(data_plane=None)


# ---- PowerSGD hooks, the averager and the default hooks under DDP ----


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 48), torch.nn.ReLU(),
        torch.nn.Linear(48, 32),
    )  # fmt: skip


def _batch(rank, step):
    return torch.randn(16, 64, generator=torch.Generator().manual_seed(10 * step + rank))


def _ddp_run(rank, hook, state, device, steps=4):
    """Gradients of ``steps`` backward passes of a DDP model with ``hook`` (``device``: lowrank's
    device path): (grads per step, reads, hook calls). The autograd engine runs DDP's hooks with
    the Python modes of the caller switched off, so the recorder is entered in each hook call
    (all of a hook's collectives and arithmetic are issued there; only the futures' callbacks,
    a copy or a division, may run after it)."""
    import contextlib

    from torch_cgx.hooks import lowrank

    reads, calls = [], []

    def recorded(state, bucket):
        out = []
        reads.extend(device_reads(lambda: out.append(hook(state, bucket))))
        calls.append(bucket.index())
        return out[0]

    net = _net()
    ddp = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.02)
    ddp.register_comm_hook(state, recorded)
    grads = []
    for step in range(steps):
        loss = ddp(_batch(rank, step)).square().mean()
        with lowrank.device_path() if device else contextlib.nullcontext():
            loss.backward()
        grads.append([p.grad.clone() for p in net.parameters()])
        net.zero_grad()
    del ddp
    return grads, reads, len(calls)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The end-to-end check of the device path against the native one: the per-pass differences
    (bounded above) pass through Gram-Schmidt and the averages, so this compares at a relative
    256 u of the largest magnitude (a tolerance, not a derived bound)."""
    return bool((a - b).abs().max() <= 256 * U * b.abs().max())


def _powersgd_cases(rank):
    from torch_cgx.hooks.powersgd import PowerSGDState, batched_powerSGD_hook, powerSGD_hook

    for hook in (powerSGD_hook, batched_powerSGD_hook):
        runs = []
        for device in (True, False):
            state = PowerSGDState(None, matrix_approximation_rank=2, start_powerSGD_iter=2,
                                  min_compression_rate=1.5)  # fmt: skip
            runs.append(_ddp_run(rank, hook, state, device))
        (dev, reads, calls), (native, _, _) = runs
        assert calls > 4 and reads == [], (hook.__name__, calls, reads)  # > 1 bucket a step
        for step, (d, n) in enumerate(zip(dev, native)):
            for a, b in zip(d, n):
                assert replicas_equal(a), (hook.__name__, step)
                assert _close(a, b), (hook.__name__, step, float((a - b).abs().max()))


def _default_hook_cases(rank):
    from torch_cgx.hooks import default
    from torch_cgx.hooks.powersgd import PowerSGDState, powerSGD_hook

    cases = [
        (default.allreduce_hook, None),
        (default.fp16_compress_hook, None),
        (default.bf16_compress_hook, None),
        (default.fp16_compress_wrapper(powerSGD_hook),
         PowerSGDState(None, matrix_approximation_rank=2, start_powerSGD_iter=2)),
    ]  # fmt: skip
    for hook, state in cases:
        grads, reads, calls = _ddp_run(rank, hook, state, True, steps=3)
        assert calls > 3 and reads == [], (hook.__name__, calls, reads)
        assert all(replicas_equal(g) for g in grads[-1]), hook.__name__


def _averager_case(rank):
    from torch_cgx.averaging import PowerSGDGradientAverager
    from torch_cgx.hooks import lowrank

    results = []
    for device in (True, False):
        net = _net()
        averager = PowerSGDGradientAverager(net.parameters(), averager_rank=2)
        steps = []
        for step in range(3):
            net.zero_grad()
            net(_batch(rank, step)).square().mean().backward()
            if device:
                with lowrank.device_path():
                    assert device_reads(averager.step) == []
            else:
                averager.step()
            steps.append([p.grad.clone() for p in net.parameters()])
        assert any(averager.compressed())
        results.append(steps)
    for d, n in zip(*results):
        for a, b in zip(d, n):
            assert replicas_equal(a) and _close(a, b), float((a - b).abs().max())


def body_hooks(rank, world):
    dist.init_process_group("gloo")
    _powersgd_cases(rank)
    _averager_case(rank)
    _default_hook_cases(rank)
    # The DDP models and hook states go, and the ranks leave together, before destroy: Gloo's
    # threads then stop with the interpreter alive (the exit-time abort of test_powersgd.py).
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def test_hooks_and_averager_on_the_device_path():
    run_ranks(body_hooks, 2, timeout=180)


# ---- measuring (docs/gpu.md): python tests/test_device_entry_points.py ----


def body_bench(rank, world, n, reps):
    import time

    from torch_cgx.fsdp import CompressedReduceScatter

    dist.init_process_group("gloo")
    x = torch.randn(world * n, generator=torch.Generator().manual_seed(rank))
    out = torch.empty(n)
    for plane in ("device", "host"):
        comm = CompressedReduceScatter("maxmin", bits=4, bucket_size=512, data_plane=plane)
        times = []
        for _ in range(reps + 1):
            dist.barrier()
            t = time.perf_counter()
            comm(out, x, dist.group.WORLD, dist.ReduceOp.AVG)
            times.append(time.perf_counter() - t)
        if rank == 0:
            print(f"fsdp reduce-scatter {plane}: {sorted(times[1:])[reps // 2] * 1e3:.1f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    run_ranks(body_bench, 2, 1 << 20, 5, timeout=300)
