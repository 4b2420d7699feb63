"""No host synchronisation on the device data path, past the first call: the DDP hooks' bucket
reduction on the device plane and FSDP2's compressed reduce-scatter and all-gather on the device
codecs, on CPU tensors, under tests/device_engine_reads.py's recorders. On CUDA a host read
(``item``, ``tolist``, ``nonzero``, ...) and a host-to-device copy of a value made on the host
(``torch.tensor(list, device=...)``, ``from_numpy(a).to(device)``) each block the host until
the stream is idle; device constants come from torch_cgx/device/constants.py's cache, per-call
values through its non-blocking ``upload`` (the engine's own cases: tests/test_device_engine.py).
One spawn of 2 ranks; the recorders' own behaviour is tested in tests/test_device_engine.py."""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.distributed as dist
from dist_helpers import run_ranks


def _cpu_only(seen):
    """Drops max-min's CPU-only shortcuts (guarded by the device type: they never run on a GPU)."""
    return [s for s in seen if 'device.type != "cpu"' not in s]


def _wait(hook, state, bucket):
    return hook(state, bucket).wait()


def _hooks(rank):
    """Each hook's second step (the first warms the caches up) under both recorders."""
    from device_engine_reads import host_syncs
    from test_hook_buckets import _Bucket, _groups, _model

    from torch_cgx import CGXState, cgx_hook
    from torch_cgx.hooks import CompressionState, compression_hook

    p4 = {"bits": 4, "bucket_size": 512}
    found = {}
    for name, make, hook in (
        ("cgx", lambda m: CGXState(None, 512, p4, error_feedback=True, module=m), cgx_hook),
        ("maxmin", lambda m: CompressionState(None, "maxmin", p4, module=m), compression_hook),
        ("topk", lambda m: CompressionState(None, "topk", {"ratio": 0.05}, module=m),
         compression_hook),
    ):  # fmt: skip
        model = _model()
        state = make(model)
        for step in range(2):
            for i, params in enumerate(_groups(model)):
                n = sum(p.numel() for p in params)
                buf = torch.randn(n, generator=torch.Generator().manual_seed(10 * step + i + rank))
                bucket = _Bucket(params, i, i == 2, buf)
                call = partial(_wait, hook, state, bucket)
                if step == 0:
                    call()
                else:
                    found[f"{name} bucket {i}"] = host_syncs(call)
    return found


def _fsdp(rank, world):
    """FSDP2's compressed reduce-scatter (max-min) and all-gather on the device codecs, on a Gloo
    group, the second call of each recorded."""
    from device_engine_reads import host_syncs

    from torch_cgx import fsdp

    gloo = dist.new_group(backend="gloo")
    rs = fsdp.CompressedReduceScatter("maxmin", min_size=16, data_plane="device", bits=4)
    rs.check = "deferred"  # as on a GPU: the header flag is read where the caller syncs
    ag = fsdp.CompressedAllGather(8, 256, min_size=16, data_plane="device")
    g = torch.Generator().manual_seed(rank)
    x, out = torch.randn(world * 3000, generator=g), torch.empty(3000)
    shard, gathered = torch.randn(2000, generator=g), torch.empty(world * 2000)
    found = {}
    for name, call in (
        ("reduce_scatter", partial(rs, out, x, gloo, dist.ReduceOp.AVG)),
        ("all_gather", partial(ag, gathered, shard, gloo)),
    ):
        call()
        found["fsdp " + name] = host_syncs(call)
    rs.check_headers()
    dist.destroy_process_group(gloo)
    return found


def body_no_sync(rank, world):
    import torch_cgx

    dist.init_process_group("cgx", pg_options=torch_cgx.Options(data_plane="device"))
    from torch_cgx.device.plane import plane_of

    engine = plane_of(torch_cgx.cgx_backend()).engines["cpu"]
    engine.check = "deferred"  # as on a GPU: the header flag is read where the caller syncs
    found = {**_hooks(rank), **_fsdp(rank, world)}
    engine.check_headers()
    dist.barrier()
    dist.destroy_process_group()
    problems = {
        name: {"reads": _cpu_only(s["reads"]), "uploads": s["uploads"]}
        for name, s in found.items()
        if _cpu_only(s["reads"]) or s["uploads"]
    }
    assert not problems, problems


def test_hooks_and_fsdp_neither_read_nor_upload_after_warm_up():
    run_ranks(body_no_sync, 2, timeout=180)


# ---- torch_cgx/device/constants.py, single process ----


def test_constants_are_built_once_per_key_and_device_in_a_bounded_cache(monkeypatch):
    from torch_cgx.device import constants

    constants.clear()
    made = []

    def make():
        made.append(1)
        return [1, 2, 3]

    a = constants.get(("t",), "cpu", make)
    assert constants.get(("t",), torch.device("cpu"), make) is a and made == [1]
    assert a.tolist() == [1, 2, 3] and constants.size() == 1
    monkeypatch.setattr(constants, "CAPACITY", 2)
    first = constants.get(("u",), "cpu", lambda: torch.zeros(2))
    constants.get(("t",), "cpu", make)  # the most recent again
    constants.get(("v",), "cpu", lambda: torch.ones(1))  # evicts ("u",), the least recent
    assert constants.get(("t",), "cpu", make) is a and made == [1]
    assert constants.get(("u",), "cpu", lambda: torch.zeros(2)) is not first
    assert constants.bytes_of((1, 2), "cpu").dtype == torch.uint8
    host = torch.arange(3)
    assert constants.upload(host, "cpu") is host  # CPU: nothing to copy
    with pytest.raises(ValueError, match="host values"):
        constants.get(("m",), "cpu", lambda: torch.zeros(1, device="meta"))
    constants.clear()


def test_a_reader_on_another_stream_waits_for_the_copy_once(monkeypatch):
    """On CUDA a constant is copied on the stream current at its creation: a reader on another
    stream waits for that copy's event (on the device) and marks the tensor used by its stream,
    once per stream (fakes for the streams and the tensor: the logic, not CUDA)."""
    from torch_cgx.device import constants

    class Stream:
        def __init__(self, handle):
            self.cuda_stream, self.waited = handle, []

        def wait_event(self, event):
            self.waited.append(event)

    class Tensor:
        recorded: list = []

        def record_stream(self, stream):
            self.recorded.append(stream)

    creator, other = Stream(11), Stream(22)
    entry = constants._Entry(Tensor(), "copy done", {11})
    current = [creator]
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current[0])
    constants._for_stream(entry, torch.device("cuda", 0))
    assert creator.waited == [] and entry.tensor.recorded == []  # the copy's own stream
    current[0] = other
    for _ in range(3):
        constants._for_stream(entry, torch.device("cuda", 0))
    assert other.waited == ["copy done"] and entry.tensor.recorded == [other]
