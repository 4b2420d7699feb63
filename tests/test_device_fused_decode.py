"""Every decode of the device engine and of FSDP2's device path goes through the codec's
``decode_add_`` dispatch, so a fused kernel that passed its self-check decodes every payload.

A counting fake fused max-min implementation on CPU tensors (the native codec of
``torch_cgx.codec``: another implementation than the device codec's tensor operations, as the
CUDA kernels are) is injected with ``kernels.use_implementations``. After a warm-up call (the
self-checks), an allreduce (SRA and ring, max-min 4 bits, fp32 and fp16 input, with a residual)
and FSDP2's compressed reduce-scatter (fp32, fp16) and all-gather must decode every payload
through it -- 16-bit payloads into fp32 sums with the payload's dtype -- and never call the
codec's tensor-op ``values``; the results and residuals are bitwise those of the reference run
(``CGX_DEVICE_KERNELS=reference``). One spawn of 2 ranks."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from dist_helpers import run_ranks

from torch_cgx.device import kernels


class NativeMaxMin(kernels.FusedMaxMin):
    """A 'fused kernel' on CPU tensors: the native max-min codec, counting its calls and the
    (output dtype, payload dtype) of each decode."""

    name = "native maxmin (test fake)"

    def __init__(self) -> None:
        self.encodes, self.decodes = 0, []

    def applies(self, device) -> bool:
        return device.type == "cpu"

    def encode(self, codec, x, seed, stream, shared=0):
        from torch_cgx import codec as native

        self.encodes += 1
        return native.encode(x, codec.bits, codec.bucket_size, stochastic=codec.stochastic,
                             seed=seed, stream=stream,
                             skip_incomplete_buckets=codec.raw_tail)  # fmt: skip

    def decode_add_(self, codec, out, payload, dtype=None):
        from torch_cgx import codec as native

        self.decodes.append((out.dtype, out.dtype if dtype is None else dtype))
        return native.decode_add_(out, payload)  # the payload's dtype is in its header


def _set_mode(value: str) -> None:
    os.environ["CGX_DEVICE_KERNELS"] = value
    kernels.reset()


def _engine_cases(rank, world, gloo):
    """{case: (result, residual, decodes, values calls)} for each allreduce case."""
    import torch_cgx
    from torch_cgx.device.engine import DeviceCall, DeviceEngine
    from torch_cgx.device.transport import GroupTransport

    engine = DeviceEngine(GroupTransport(gloo, rank, world))
    out = {}
    for algorithm in ("sra", "ring"):
        config = torch_cgx.CGXConfig().replace(bits=4, bucket_size=64, algorithm=algorithm)
        call = DeviceCall.from_config(config, True)
        for dtype in (torch.float32, torch.float16):
            g = torch.Generator().manual_seed(10 * rank + 1)
            warm, x = (torch.randn(1000, generator=g).to(dtype) for _ in range(2))
            engine.allreduce(warm, call, stream=1, residual=torch.empty(1000))
            res = torch.empty(1000)
            out[f"{algorithm} {dtype}"] = _counted(_allreduce, engine, x, call, res)
    engine.check_headers()
    return out


def _fsdp_cases(rank, world, gloo):
    """FSDP2's reduce-scatter (fp32, fp16) and all-gather on the device codecs."""
    from torch_cgx import fsdp

    out = {}
    g = torch.Generator().manual_seed(rank)
    for dtype in (torch.float32, torch.float16):
        rs = fsdp.CompressedReduceScatter("maxmin", 16, data_plane="device", bits=4)
        x = torch.randn(world * 3000, generator=g).to(dtype)
        rs(torch.empty(3000, dtype=dtype), x, gloo, dist.ReduceOp.AVG)  # warm-up
        res = torch.empty(3000, dtype=dtype)
        out[f"fsdp reduce_scatter {dtype}"] = _counted(_reduce_scatter, rs, res, x, gloo)
        rs.check_headers()
    ag = fsdp.CompressedAllGather(4, 64, min_size=16, data_plane="device")
    shard, got = torch.randn(2000, generator=g), torch.empty(world * 2000)
    ag(got, shard, gloo)
    out["fsdp all_gather"] = _counted(_all_gather, ag, got, shard, gloo)
    return out


def _allreduce(engine, x, call, res):
    engine.allreduce(x, call, stream=2, residual=res)
    return x, res


def _reduce_scatter(rs, out, x, group):
    rs(out, x, group, dist.ReduceOp.AVG)
    return (out,)


def _all_gather(ag, out, shard, group):
    ag(out, shard, group)
    return (out,)


def _counted(fn, *args):
    """(fn(*args)'s tensors, cloned; the fake's decodes; calls of the codec's tensor-op
    values)."""
    from torch_cgx.device.codecs.maxmin import MaxMin

    fake = kernels.implementations()[0] if kernels.implementations() else None
    values, calls = MaxMin.values, []
    MaxMin.values = lambda self, *a, **k: calls.append(1) or values(self, *a, **k)
    if isinstance(fake, NativeMaxMin):
        fake.decodes = []
    try:
        tensors = [t.clone() for t in fn(*args)]
    finally:
        MaxMin.values = values
    return tensors, list(fake.decodes) if isinstance(fake, NativeMaxMin) else [], len(calls)


def body_fused_decode(rank, world):
    import torch_cgx  # noqa: F401  (registers the backend)

    # a cgx world and a Gloo group for the payloads: a Gloo-only world that ran FSDP's paths
    # sometimes aborts at exit ("terminate called without an active exception"), before too
    dist.init_process_group("cgx")
    gloo = dist.new_group(backend="gloo")
    _set_mode("reference")
    want = {**_engine_cases(rank, world, gloo), **_fsdp_cases(rank, world, gloo)}
    _set_mode("auto")
    fake = NativeMaxMin()
    with kernels.use_implementations([fake]):
        got = {**_engine_cases(rank, world, gloo), **_fsdp_cases(rank, world, gloo)}
        assert set(kernels.decisions().values()) == {"fused"}, kernels.decisions()
    assert fake.encodes > 0
    f32, f16 = torch.float32, torch.float16
    for name, (tensors, decodes, values) in got.items():
        ref_tensors, _, ref_values = want[name]
        assert ref_values > 0, name  # the reference run does decode with the tensor operations
        assert values == 0, f"{name}: the codec's tensor-op values ran {values} times"
        for a, b in zip(tensors, ref_tensors):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name
        if name.startswith(("sra", "ring")):
            # W = 2: 1 received chunk payload + 2 gathered final ones, and 2 residual decodes
            # (the sent chunk, the reduced one); fp16 input: the chunk payloads are fp16
            source = f16 if "float16" in name else f32
            want_decodes = [(f32, source)] * 2 + [(f32, f32)] * 3
            assert sorted(decodes, key=str) == sorted(want_decodes, key=str), (name, decodes)
        elif "reduce_scatter" in name:  # the one payload from the other rank, into fp32
            assert decodes == [(f32, f16 if "float16" in name else f32)], (name, decodes)
        else:  # the all-gather: the other rank's shard, straight into its fp32 slot
            assert decodes == [(f32, f32)], (name, decodes)
    dist.destroy_process_group()


def test_engine_and_fsdp_decode_every_payload_through_the_fused_kernel():
    run_ranks(body_fused_decode, 2, timeout=180)
