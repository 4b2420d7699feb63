"""Two ranks on a GPU through the cgx backend (the GPU check's device-tests step,
docs/gpu-check.md; skipped without CUDA, a failure under ``CGX_TEST_REQUIRE_CUDA=1``).

Rank ``r`` uses GPU ``r % device_count``: on a one-GPU machine both ranks share it, so the
device plane's carrier is its own Gloo group (the ranks compare their GPUs' UUIDs: NCCL needs a
GPU per rank); with two GPUs it is NCCL. Each check compares a cgx group with the default
``data_plane="auto"`` (CUDA tensors on the device plane) against a ``data_plane="host"`` group
(the native CPU engine) fed CPU copies of the same values, at nearest rounding: the device
codecs write the native bytes and the device engine mirrors the native algorithms, so the
results must be bitwise equal.

- ``dist.all_reduce`` of CUDA tensors: max-min 4 bits, SRA and ring, SUM and AVG, a ragged size;
- a DDP step with ``device_ids=[r % device_count]`` on a CUDA module: one ``Linear`` layer, batch
  of one, loss ``(out * c).sum()``, so every local gradient is one exactly rounded product
  (``c_i x_j``) and equal on the GPU and the CPU; the averaged gradients must be bitwise equal;
- ``init_process_group("cgx", device_id=...)``: the world binds the device, its CUDA tensors go
  to the device plane (bitwise the host engine), its barrier returns;
- no device-to-host copy in the data path: ``dist.all_reduce`` of a CUDA tensor (after a first
  call, which runs the fused kernel's one-time self-check) under the host-read recorder of
  tests/device_engine_reads.py plus a recorder of CUDA-to-host ``copy_`` / ``to`` / ``cpu``.
  With a Gloo carrier Gloo itself stages CUDA tensors through the host inside its C++
  collectives (not seen here, and not part of cgx's data path); with NCCL nothing leaves.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from dist_helpers import run_ranks

SETTINGS = dict(bits=4, bucket_size=512)


def cuda_or_skip() -> None:
    if torch.cuda.is_available():
        return
    if os.environ.get("CGX_TEST_REQUIRE_CUDA") == "1":
        pytest.fail("CGX_TEST_REQUIRE_CUDA=1, but torch sees no CUDA device")
    pytest.skip("no CUDA device")


def _run(body, *args):
    cuda_or_skip()
    # the plane finds the shared GPU itself (device UUIDs through the store)
    run_ranks(body, 2, *args, timeout=300)


def _setup(rank: int, algorithm: str = "sra"):
    """(device, the auto group, the host group); the world group is Gloo."""
    import torch_cgx

    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group("gloo")
    ranks = list(range(dist.get_world_size()))
    dev = dist.new_group(ranks, backend="cgx",
                         pg_options=torch_cgx.Options(algorithm=algorithm, **SETTINGS))  # fmt: skip
    host = dist.new_group(ranks, backend="cgx", pg_options=torch_cgx.Options(
        data_plane="host", algorithm=algorithm, **SETTINGS))  # fmt: skip
    return device, dev, host


def _cuda_engine(group):
    import torch_cgx
    from torch_cgx.device import plane

    p = plane.plane_of(torch_cgx.cgx_backend(group))
    assert p is not None and "cuda" in p.engines and "cpu" not in p.engines
    return p.engines["cuda"]


def _values(rank: int, n: int, step: int = 0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(100 * step + rank))


def body_allreduce(rank, world, algorithm):
    device, dev, host = _setup(rank, algorithm)
    engine = _cuda_engine(dev)
    for step, (n, op) in enumerate([(100003, "SUM"), (4096, "AVG"), (7, "SUM")]):
        x = _values(rank, n, step)
        a, b = x.to(device), x.clone()
        dist.all_reduce(a, op=getattr(dist.ReduceOp, op), group=dev)
        dist.all_reduce(b, op=getattr(dist.ReduceOp, op), group=host)
        assert a.device == device
        got = a.cpu()
        assert torch.equal(got, b), (algorithm, n, op, (got - b).abs().max())
    engine.check_headers()
    assert engine.stats()["calls_compressed"] == 2  # the 7 values are under min_size: exact
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("algorithm", ["sra", "ring"])
def test_allreduce_of_cuda_tensors_equals_the_cpu_engine(algorithm):
    _run(body_allreduce, algorithm)


def _ddp_grads(rank, group, device, device_ids):
    torch.manual_seed(0)  # the same initial weights on every rank and device
    net = torch.nn.Linear(64, 300).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(net, device_ids=device_ids,
                                                    process_group=group)  # fmt: skip
    g = torch.Generator().manual_seed(rank)
    x, c = torch.randn(1, 64, generator=g), torch.randn(1, 300, generator=g)
    (ddp(x.to(device)) * c.to(device)).sum().backward()
    return [p.grad.detach().cpu() for p in net.parameters()]


def body_ddp(rank, world):
    device, dev, host = _setup(rank)
    engine = _cuda_engine(dev)
    on_gpu = _ddp_grads(rank, dev, device, [device.index])
    on_cpu = _ddp_grads(rank, host, torch.device("cpu"), None)
    for a, b in zip(on_gpu, on_cpu):
        assert torch.equal(a, b), (a - b).abs().max()
    assert engine.stats()["calls_compressed"] >= 1  # the 19500 gradients went compressed
    engine.check_headers()
    dist.barrier()
    dist.destroy_process_group()


def test_ddp_step_on_cuda_equals_the_cpu_engine():
    _run(body_ddp)


def body_no_device_to_host(rank, world):
    from device_engine_reads import host_syncs, through_plane
    from torch.overrides import TorchFunctionMode

    device, dev, _ = _setup(rank)
    x = _values(rank, 1 << 16).to(device)
    dist.all_reduce(x.clone(), group=dev)  # first call: the fused kernel's self-check
    torch.cuda.synchronize()
    copies = []

    class DeviceToHost(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = getattr(func, "__name__", "")
            src = args[1] if name == "copy_" and len(args) > 1 else args[0] if args else None
            out = func(*args, **kwargs)
            if isinstance(src, torch.Tensor) and src.is_cuda:
                if name == "copy_" and not args[0].is_cuda:
                    copies.append("copy_ to the host")
                elif name in ("cpu", "to") and isinstance(out, torch.Tensor) and not out.is_cuda:
                    copies.append(f"{name} to the host")
            return out

    def watch(fn):
        with DeviceToHost():
            fn()
        return []

    # through_plane: a TorchFunctionMode is off inside dist.all_reduce, which it intercepts
    seen = host_syncs(lambda: through_plane(watch, lambda: dist.all_reduce(x, group=dev)))
    assert seen["reads"] == [] and seen["uploads"] == [] and copies == [], (seen, copies)
    torch.cuda.synchronize()
    _cuda_engine(dev).check_headers()
    dist.barrier()
    dist.destroy_process_group()


def test_no_device_to_host_copy_in_the_data_path():
    _run(body_no_device_to_host)


def body_device_id(rank, world):
    import torch_cgx

    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group("cgx", device_id=device, pg_options=torch_cgx.Options(**SETTINGS))
    world_group = dist.group.WORLD
    assert world_group.bound_device_id == device
    _cuda_engine(world_group)  # the world's CUDA tensors are on the device plane
    host = dist.new_group([0, 1], backend="cgx",
                          pg_options=torch_cgx.Options(data_plane="host", **SETTINGS))  # fmt: skip
    x = _values(rank, 100003)
    a, b = x.to(device), x.clone()
    dist.all_reduce(a)
    dist.all_reduce(b, group=host)
    assert a.device == device and torch.equal(a.cpu(), b)
    dist.barrier()  # on the bound device (torch passes it in BarrierOptions)
    dist.destroy_process_group()


def test_init_process_group_with_device_id():
    """``init_process_group('cgx', device_id=...)``: the world binds the device, serves its CUDA
    tensors on the device plane (bitwise the host engine's result) and its barrier returns."""
    _run(body_device_id)


def _diloco_run(device, group, n: int = 20011, steps: int = 4):
    """DiLoCo (max-min 4 bits, error feedback) over ``group`` on one parameter of ``device``
    whose gradients are set by hand and stepped with SGD at lr 1 (inner and outer): every
    update is one exactly rounded subtraction on any device. (parameter, residual) on the CPU."""
    from torch_cgx.diloco import DiLoCo

    rank = dist.get_rank()
    module = torch.nn.Module()
    module.w = torch.nn.Parameter(_values(0, n, 99).to(device))
    opt = torch.optim.SGD(module.parameters(), lr=1.0)
    outer = lambda params: torch.optim.SGD(params, lr=1.0)  # noqa: E731
    d = DiLoCo(module, opt, outer, sync_every=2, group=group, compressor="maxmin",
               compressor_params={"bits": 4})  # fmt: skip
    assert d.error_feedback
    with d:
        for t in range(steps):
            module.w.grad = _values(rank, n, t).to(device)
            opt.step()
    frag = d._fragments[0]
    res = frag.residuals["w"]
    assert res.device == module.w.device and res.abs().sum() > 0
    return module.w.detach().cpu(), res.cpu()


def body_diloco(rank, world):
    device, dev, host = _setup(rank)
    w_dev, r_dev = _diloco_run(device, dev)
    w_host, r_host = _diloco_run(torch.device("cpu"), host)
    assert torch.equal(w_dev, w_host), (w_dev - w_host).abs().max()
    assert torch.equal(r_dev, r_host), (r_dev - r_host).abs().max()
    assert _cuda_engine(dev).stats()["calls_compressed"] == 2
    dist.barrier()
    dist.destroy_process_group()


def test_diloco_on_cuda_parameters_equals_the_cpu_engine():
    """DiLoCo over a cgx group with CUDA parameters and error feedback: the residual is written
    on the GPU by the device plane (a CPU residual was refused: "residual is on cpu"), and the
    parameters and residuals are bitwise those of the same run on the CPU engine."""
    _run(body_diloco)
