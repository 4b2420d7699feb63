"""Work and futures of the cgx backend on real ranks: collectives issued (and waited for) from
future callbacks, PyTorch's PowerSGD hooks registered directly, Work.wait's timeout, a barrier
that does not block its caller, and the C++ side's own validation of settings."""

from __future__ import annotations

import datetime
import threading
import time

import pytest
import torch
import torch.distributed as dist
from dist_helpers import run_ranks


def same_on_all_ranks(t: torch.Tensor, gloo) -> bool:
    raw = t.detach().contiguous().view(-1).view(torch.uint8)
    out = [torch.empty_like(raw) for _ in range(dist.get_world_size())]
    dist.all_gather(out, raw, group=gloo)
    return all(torch.equal(o, out[0]) for o in out)


def body_powersgd(rank, world, bits, batched):
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    import torch_cgx

    dist.init_process_group("cgx")
    gloo = dist.new_group(backend="gloo")
    torch_cgx.set_config(bits=bits)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 256),
        torch.nn.Linear(256, 10),
    )
    # Small buckets: several per step, each with callbacks that issue and wait for allreduces.
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.1)
    state = psgd.PowerSGDState(
        process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=2,
        min_compression_rate=0.5,
    )  # fmt: skip
    ddp.register_comm_hook(state, psgd.batched_powerSGD_hook if batched else psgd.powerSGD_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for step in range(5):
        g = torch.Generator().manual_seed(10 * step + rank)
        loss = ddp(torch.randn(8, 64, generator=g)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert state.iter == 5
    for p in ddp.parameters():
        assert same_on_all_ranks(p, gloo)
    dist.destroy_process_group()


@pytest.mark.parametrize("bits,batched", [(32, False), (4, False)])
def test_pytorch_powersgd_hooks_run_on_cgx(bits, batched):
    # Each step's callbacks issue allreduces and block on them: a deadlock or a collective
    # issued in a different order on each rank would hang or fail here (bounded by the timeout).
    run_ranks(body_powersgd, 2, bits, batched, timeout=120)


def body_callbacks(rank, world):
    import torch_cgx

    dist.init_process_group("cgx")
    torch_cgx.set_config(bits=8)
    seen = []
    issued = threading.Event()

    def nested(fut):
        # On the worker: an allreduce issued here runs at once, in place; so does a barrier.
        t = torch.ones(4096)
        dist.all_reduce(t)  # waits for it
        dist.barrier()
        seen.append(float(t[0]))
        return fut.value()

    def waits_for_later(fut):
        # Waits for work queued after the one whose callback this is: run in place.
        issued.wait(30)
        later_work.wait()
        seen.append(float(later[0]))
        return fut.value()

    a = torch.ones(5000)
    fut = dist.all_reduce(a, async_op=True).get_future().then(nested)
    first = torch.ones(5000)
    fut2 = dist.all_reduce(first, async_op=True).get_future().then(waits_for_later)
    later = torch.full((5000,), 2.0)
    later_work = dist.all_reduce(later, async_op=True)
    issued.set()
    fut.wait()
    fut2.wait()
    assert seen[0] == pytest.approx(world, rel=1e-2)
    assert seen[1] == pytest.approx(2.0 * world, rel=1e-2)
    dist.destroy_process_group()


def test_collectives_from_callbacks_do_not_deadlock():
    run_ranks(body_callbacks, 2, timeout=60)


def body_wait_timeout_and_async_barrier(rank, world):
    import torch_cgx

    dist.init_process_group("cgx")
    torch_cgx.set_config(bits=4)
    x = torch.ones(100_000)
    if rank == 1:
        time.sleep(4)  # late: rank 0's wait must time out, its barrier must not block
    work = dist.all_reduce(x, async_op=True)
    if rank == 0:
        start = time.monotonic()
        with pytest.raises(RuntimeError, match="timed out"):
            work.wait(timeout=datetime.timedelta(milliseconds=500))
        assert time.monotonic() - start < 2.5
        start = time.monotonic()
        barrier = dist.barrier(async_op=True)
        assert time.monotonic() - start < 1.0, "barrier(async_op=True) blocked its caller"
        assert not barrier.is_completed()
    else:
        barrier = dist.barrier(async_op=True)
    assert work.wait() and barrier.wait()  # both finish once rank 1 is there
    assert torch.allclose(x, torch.full_like(x, float(world)), rtol=0.01)
    dist.destroy_process_group()


def test_wait_timeout_and_async_barrier():
    run_ranks(body_wait_timeout_and_async_barrier, 2, timeout=60)


def body_native_validation(rank, world):
    import torch_cgx
    from torch_cgx import _C

    dist.init_process_group("cgx")
    backend = torch_cgx.cgx_backend()
    t = torch.ones(4096)
    good = torch_cgx.get_config().replace(bits=4).to_native()
    for field, value, message in [
        ("algorithm", 7, "unknown allreduce algorithm"),
        ("bits", 9, "bits must be"),
        ("bucket_size", 0, "bucket_size"),
        ("fusion_buffer_bytes", -1, "fusion_buffer_bytes"),
        ("pipeline_segment_bytes", -5, "pipeline_segment_bytes"),
        ("minimal_size", -1, "minimal_size"),
    ]:
        bad = torch_cgx.get_config().replace(bits=4).to_native()
        setattr(bad, field, value)
        with pytest.raises(ValueError, match=message):
            backend.allreduce_with(t, bad, False)
        with pytest.raises(ValueError, match=message):
            backend.set_config(bad)
    assert isinstance(good, _C.BackendConfig)
    assert torch_cgx.get_config().bits == 32  # nothing was applied
    backend.allreduce_with(t, good, False).wait()
    assert torch.allclose(t, torch.full_like(t, float(world)), rtol=0.01)
    dist.destroy_process_group()


def test_cpp_side_validates_settings():
    run_ranks(body_native_validation, 2, timeout=60)


def body_blocked_callback(rank, world):
    import torch_cgx

    dist.init_process_group("cgx", timeout=datetime.timedelta(seconds=3))
    torch_cgx.set_config(bits=8)
    outcome = {}
    issued = threading.Event()

    def blocks_on_a_later_future(fut):
        # Future.wait on work issued after this one: cannot be run in place. The watchdog
        # cancels the waiting work after the group's timeout, so this raises instead of hanging.
        issued.wait(30)
        start = time.monotonic()
        try:
            later_fut.wait()
        except Exception as e:  # the cancellation, as DistBackendError
            outcome["error"], outcome["after"] = str(e), time.monotonic() - start
        return fut.value()

    a = torch.ones(5000)
    fut = dist.all_reduce(a, async_op=True).get_future().then(blocks_on_a_later_future)
    later = torch.ones(5000)
    later_fut = dist.all_reduce(later, async_op=True).get_future()
    issued.set()
    fut.wait()
    assert "blocked the group's worker" in outcome["error"] and 2.5 < outcome["after"] < 10
    # The group is usable afterwards, and agrees.
    c = torch.ones(5000)
    dist.all_reduce(c)
    assert torch.allclose(c, torch.full_like(c, float(world)), rtol=0.01)
    dist.destroy_process_group()


def test_callback_blocking_on_a_later_future_fails_instead_of_hanging():
    run_ranks(body_blocked_callback, 2, timeout=60)
