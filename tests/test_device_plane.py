"""The cgx backend's device plane (torch_cgx/device/plane.py, csrc/torch/device_plane.h), run on
CPU tensors with data_plane="device": the same Python code a CUDA tensor takes on a GPU, here
over a Gloo carrier. Each case compares a group on the device plane with a group on the native
engine (data_plane="host") fed the same values: max-min at nearest rounding gives bitwise the
same results (the device codecs write the native bytes and the device engine mirrors the native
algorithms)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from dist_helpers import run_ranks


def _groups(**settings):
    import torch_cgx

    dist.init_process_group("gloo")
    ranks = list(range(dist.get_world_size()))
    dev = dist.new_group(
        ranks, backend="cgx", pg_options=torch_cgx.Options(data_plane="device", **settings)
    )
    host = dist.new_group(
        ranks, backend="cgx", pg_options=torch_cgx.Options(data_plane="host", **settings)
    )
    return dev, host


def _values(rank: int, n: int, step: int = 0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(100 * step + rank))


def body_allreduce_equals_native(rank, world, algorithm):
    import torch_cgx
    from torch_cgx.device import plane

    dev, host = _groups(bits=4, bucket_size=128, algorithm=algorithm)
    assert plane.plane_of(torch_cgx.cgx_backend(dev)) is not None
    assert plane.plane_of(torch_cgx.cgx_backend(host)) is None
    for step, n in enumerate((5000, 1000, 7)):  # 7: under min_size, exact on both
        a, b = _values(rank, n, step), _values(rank, n, step)
        dist.all_reduce(a, group=dev)
        dist.all_reduce(b, group=host)
        assert torch.equal(a, b), (algorithm, n, (a - b).abs().max())
        everyone = [torch.empty_like(a) for _ in range(world)]
        dist.all_gather(everyone, a, group=host)
        assert all(torch.equal(x, a) for x in everyone)  # replicas bitwise equal
    avg_dev, avg_host = _values(rank, 3000), _values(rank, 3000)
    dist.all_reduce(avg_dev, op=dist.ReduceOp.AVG, group=dev)
    dist.all_reduce(avg_host, op=dist.ReduceOp.AVG, group=host)
    assert torch.equal(avg_dev, avg_host)
    s = torch_cgx.stats(dev)
    assert s.calls_compressed == 3 and s.calls_exact == 1 and s.bytes_sent < s.bytes_exact
    dist.destroy_process_group()


@pytest.mark.parametrize("algorithm", ["sra", "ring", "allgather"])
def test_allreduce_on_the_device_plane_equals_the_native_engine(algorithm):
    run_ranks(body_allreduce_equals_native, 2, algorithm, timeout=120)


def body_other_calls(rank, world):
    dev, host = _groups(bits=4, bucket_size=64)
    # MAX and integer sums: exact, on the plane's carrier.
    m = torch.tensor([float(rank), -float(rank)])
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=dev)
    assert m.tolist() == [world - 1.0, 0.0]
    i = torch.arange(4) + rank
    dist.all_reduce(i, group=dev)
    assert torch.equal(i, torch.arange(4) * world + sum(range(world)))
    with pytest.raises(ValueError, match="AVG needs a floating-point"):
        dist.all_reduce(i, op=dist.ReduceOp.AVG, group=dev)
    premul = dist._make_nccl_premul_sum(0.5)  # its factor never reaches the plane: refused
    with pytest.raises(ValueError, match="does not serve reduce op"):
        dist.all_reduce(torch.ones(4), op=premul, group=dev)
    # Coalesced: one fused piece, like the native adapter.
    xs = [_values(rank, 300, 1), _values(rank, 1000, 2).view(10, 100)]
    ys = [x.clone() for x in xs]
    dist.all_reduce_coalesced(xs, group=dev)
    dist.all_reduce_coalesced(ys, group=host)
    assert all(torch.equal(x, y) for x, y in zip(xs, ys))
    # FSDP2's reduce-scatter, the tensor form and the list form.
    inp = _values(rank, 2048 * world, 3)
    out_dev, out_host = torch.empty(2048), torch.empty(2048)
    dist.reduce_scatter_tensor(out_dev, inp, group=dev)
    dist.reduce_scatter_tensor(out_host, inp, group=host)
    assert torch.equal(out_dev, out_host)
    chunks = list(inp.chunk(world))
    out_list = torch.empty(2048)
    dist.reduce_scatter(out_list, chunks, group=dev)
    assert torch.equal(out_list, out_host)
    # allreduce_with (the hooks' entry): result and error-feedback residual as natively.
    import torch_cgx

    x, y = _values(rank, 3000, 4), _values(rank, 3000, 4)
    res_dev, res_host = torch.empty(3000), torch.empty(3000)
    for group, t, res in ((dev, x, res_dev), (host, y, res_host)):
        backend = torch_cgx.cgx_backend(group)
        backend.allreduce_with(t, backend.config(), True, res).wait()
    assert torch.equal(x, y) and torch.equal(res_dev, res_host) and res_dev.abs().sum() > 0
    # Forwarded collectives of CPU tensors stay on the inner Gloo backend.
    b = torch.full((3,), float(rank))
    dist.broadcast(b, src=1, group=dev)
    assert b.tolist() == [1.0] * 3
    dist.destroy_process_group()


def test_other_calls_on_the_device_plane():
    run_ranks(body_other_calls, 2, timeout=120)


def body_no_host_reads(rank, world):
    from device_engine_reads import host_syncs

    import torch_cgx
    from torch_cgx.device import plane

    dev, _ = _groups(bits=4, bucket_size=128)
    x = _values(rank, 4096)
    engine = plane.plane_of(torch_cgx.cgx_backend(dev)).engines["cpu"]
    engine.check = "deferred"  # as on a GPU: the header flag is read where the caller syncs
    dist.all_reduce(x.clone(), group=dev)  # warm-up: the constants' first upload
    seen = host_syncs(lambda: dist.all_reduce(x, group=dev))
    reads = [r for r in seen["reads"] if 'device.type != "cpu" or' not in r]  # CPU shortcuts
    assert reads == [] and seen["uploads"] == [], seen
    engine.check_headers()
    # the recorders see inside the plane's calls: a planted read of the data is caught
    original = engine.allreduce
    engine.allreduce = lambda t, *a, **k: (t.sum().item(), original(t, *a, **k))
    planted = host_syncs(lambda: dist.all_reduce(x, group=dev))["reads"]
    assert any("item" in r for r in planted), planted
    engine.allreduce = original
    dist.destroy_process_group()


def test_the_device_plane_reads_nothing_back_for_max_min():
    run_ranks(body_no_host_reads, 2, timeout=120)


def body_ddp(rank, world):
    torch.manual_seed(0)
    dev, host = _groups(bits=4, bucket_size=64)
    models = []
    for group in (dev, host):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
        ddp = torch.nn.parallel.DistributedDataParallel(net, process_group=group)
        x = torch.randn(16, 32, generator=torch.Generator().manual_seed(rank))
        ddp(x).square().sum().backward()
        models.append([p.grad.clone() for p in net.parameters()])
        del ddp
    assert all(torch.equal(a, b) for a, b in zip(*models))
    dist.barrier()
    dist.destroy_process_group()


def test_ddp_step_on_the_device_plane_equals_the_native_engine():
    run_ranks(body_ddp, 2, timeout=120)


def test_bad_data_plane_value():
    import torch_cgx

    with pytest.raises(ValueError, match="data_plane"):
        torch_cgx.Options(data_plane="gpu")


def body_hierarchical(rank, world):
    import torch_cgx
    from torch_cgx.device import plane

    dev, host = _groups(bits=4, bucket_size=128, hierarchical="on", inner_communicator="gloo")
    assert torch_cgx.cgx_backend(dev).hierarchical() and torch_cgx.cgx_backend(host).hierarchical()
    assert plane.plane_of(torch_cgx.cgx_backend(dev)).engines["cpu"].hierarchy is not None
    for n in (5000, 777):
        a, b = _values(rank, n), _values(rank, n)
        dist.all_reduce(a, group=dev)
        dist.all_reduce(b, group=host)
        assert torch.equal(a, b), (n, (a - b).abs().max())
    dist.destroy_process_group()


def test_hierarchical_allreduce_on_the_device_plane_equals_the_native_engine():
    # 4 ranks as 2 emulated nodes of 2 (the launcher's LOCAL_WORLD_SIZE)
    run_ranks(body_hierarchical, 4, env={"LOCAL_WORLD_SIZE": "2"}, timeout=180)
