"""The DDP hooks on the device plane: with ``data_plane="device"`` a cgx group sends the hooks'
staged tensors through torch_cgx/device/plane.py (the path of CUDA gradients), here on CPU
tensors. Every preset of tests/test_hook_buckets.py gives bitwise the outputs, residuals,
momenta and adaptive bits of the native path (a ``data_plane="host"`` group), and a hook call
reads no tensor value back to the host (what would synchronise a GPU)."""

from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist
from dist_helpers import run_ranks


def _all_presets(rank):
    from test_hook_buckets import _presets, _run

    return {name: _run(rank, make, True, torch.float32) for name, make in _presets().items()}


def body_hooks_on_the_device_plane(rank, world):
    import torch_cgx

    results = {}
    for plane in ("device", "host"):
        dist.init_process_group("cgx", pg_options=torch_cgx.Options(data_plane=plane))
        assert bool(torch_cgx.cgx_backend().device_plane_token()) == (plane == "device")
        torch_cgx.reset_stats()
        results[plane] = _all_presets(rank)
        native = torch_cgx.cgx_backend().stats()["calls_compressed"]
        results[plane + " stats"] = (torch_cgx.stats().calls_compressed, native)
        dist.barrier()
        dist.destroy_process_group()
    total, native = results["device stats"]
    assert total > 0 and native == 0, results["device stats"]  # the plane did them all
    assert results["host stats"][0] == results["host stats"][1] > 0
    dev, host = results["device"], results["host"]
    assert dev.keys() == host.keys()
    for name in host:
        outs_d, res_d, mom_d, bits_d = dev[name]
        outs_h, res_h, mom_h, bits_h = host[name]
        assert all(torch.equal(a, b) for a, b in zip(outs_d, outs_h)), name
        for got, want in ((res_d, res_h), (mom_d, mom_h)):
            for a, b in zip(got, want):
                assert a.keys() == b.keys(), name
                assert all(torch.equal(a[k], b[k]) for k in a), name
        assert bits_d == bits_h, name


def test_every_hook_preset_on_the_device_plane_equals_the_native_path():
    run_ranks(body_hooks_on_the_device_plane, 2, timeout=240)


def body_no_host_reads(rank, world):
    from device_engine_reads import host_reads
    from test_hook_buckets import _Bucket, _groups, _model

    import torch_cgx
    from torch_cgx import CGXState, cgx_hook
    from torch_cgx.hooks import CompressionState, compression_hook

    dist.init_process_group("cgx", pg_options=torch_cgx.Options(data_plane="device"))
    from torch_cgx.device.plane import plane_of

    engine = plane_of(torch_cgx.cgx_backend()).engines["cpu"]
    engine.check = "deferred"  # as on a GPU: the header flag is read where the caller syncs
    p4 = {"bits": 4, "bucket_size": 512}
    for make, hook in (
        (lambda m: CGXState(None, 512, p4, error_feedback=True, module=m), cgx_hook),
        (lambda m: CompressionState(None, "maxmin", p4, module=m), compression_hook),
        (lambda m: CompressionState(None, "topk", {"ratio": 0.05}, module=m), compression_hook),
    ):
        model = _model()
        state = make(model)
        for step in range(2):
            for i, params in enumerate(_groups(model)):
                n = sum(p.numel() for p in params)
                buf = torch.randn(n, generator=torch.Generator().manual_seed(10 * step + i))
                bucket = _Bucket(params, i, i == 2, buf)
                reads = host_reads(partial(_call, hook, state, bucket))
                # max-min's CPU-only shortcuts (guarded by the device type) never run on a GPU
                reads = [r for r in reads if 'device.type != "cpu"' not in r]
                assert reads == [], (type(state).__name__, reads)
    engine.check_headers()
    dist.barrier()
    dist.destroy_process_group()


def _call(hook, state, bucket):
    return hook(state, bucket).wait()


def test_hooks_read_nothing_back_on_the_device_plane():
    run_ranks(body_no_host_reads, 2, timeout=180)
