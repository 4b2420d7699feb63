"""What tests/test_device_engine*.py run on each rank: the device engine beside the native CPU
engine on the same inputs, over real ranks (Gloo carries the device engine's payloads, a cgx
group the native engine's), with the results compared on every rank and written to a JSON file
that the tests read.

Codecs: the device codecs of torch_cgx.device.codecs where their module imports, else
:class:`NativeAdapter` (the native CPU compressor behind the DeviceCodec interface), which kept
the engine testable before the device codecs landed; each case records which one it used.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Dict

import torch
import torch.distributed as dist

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


def _case(name, dtype, numel, average, **changes):
    return name, changes, dtype, numel, average


# pieces of 32768 fp32 values, segments of 16384 (set in bytes on both engines)
SEGMENTS = dict(bucket_size=512, fusion_bytes=1 << 17, segment_bytes=1 << 16)
# (name, config changes, dtype, numel, average)
CASES = [
    _case("maxmin4_sra", F32, 1000, True, bits=4, bucket_size=64),
    _case("maxmin4_sra_sum", F32, 1000, False, bits=4, bucket_size=64),
    _case("maxmin3_ring", F32, 999, True, bits=3, bucket_size=32, algorithm="ring"),
    _case("maxmin4_tree", F32, 777, True, bits=4, bucket_size=64, algorithm="tree"),
    _case("maxmin8_allgather", F32, 500, True, bits=8, bucket_size=128, algorithm="allgather"),
    _case("maxmin4_fp16", F16, 1000, True, bits=4, bucket_size=64),
    _case("maxmin4_bf16_ring", BF16, 600, True, bits=4, bucket_size=64, algorithm="ring"),
    _case(
        "maxmin4_raw_tail", F32, 1037, True, bits=4, bucket_size=100, skip_incomplete_buckets=True
    ),  # fmt: skip
    _case("maxmin2_stochastic", F32, 1000, True, bits=2, bucket_size=64, stochastic=True),
    _case("maxmin4_rotation", F32, 1000, True, bits=4, bucket_size=64, rotation="on"),
    # 2 SRA segments in one piece; 2 pieces of ring, each in 2 lanes' segments
    _case("maxmin4_segments", F32, 30_000, True, bits=4, **SEGMENTS),
    _case("maxmin4_pieces_ring", F32, 60_000, True, bits=4, algorithm="ring", **SEGMENTS),
    _case("maxmin4_pieces_sra_bf16", BF16, 70_000, True, bits=4, **SEGMENTS),
    _case("fp16_sra", F32, 1000, True, compressor="fp16"),
    _case("fp16_tree", F32, 1000, False, compressor="fp16", algorithm="tree"),
    _case("topk", F32, 1000, True, compressor="topk", compressor_params="ratio=0.05"),
    _case("randomk", F32, 1000, True, compressor="randomk", compressor_params="ratio=0.1"),
    _case(
        "randomk_allgather",
        F32,
        1000,
        True,
        compressor="randomk",
        compressor_params="ratio=0.1",
        algorithm="allgather",
    ),  # fmt: skip
    _case("threshold", F32, 1000, True, compressor="threshold", compressor_params="tau=1.0"),
    _case("dgc", F32, 1000, True, compressor="dgc", compressor_params="ratio=0.05"),
    _case("qsgd_sra", F32, 1000, True, compressor="qsgd", compressor_params="bucket_size=128"),
    _case(
        "onebit_ring",
        F32,
        1000,
        True,
        compressor="onebit",
        compressor_params="bucket_size=64",
        algorithm="ring",
    ),  # fmt: skip
    _case("terngrad_tree", BF16, 1000, True, compressor="terngrad", algorithm="tree"),
]
# reduce-scatter cases: (name, config changes, dtype, output numel, average)
RS_CASES = [
    _case("rs_maxmin4", F32, 300, True, bits=4, bucket_size=64),
    _case("rs_fp16", F32, 300, False, compressor="fp16"),
    _case("rs_topk", F32, 300, True, compressor="topk", compressor_params="ratio=0.1"),
    _case("rs_threshold", F32, 300, True, compressor="threshold", compressor_params="tau=1.0"),
]


class NativeAdapter:
    """The native CPU compressor ``torch_cgx.compressors.get(name)`` as a DeviceCodec (CPU
    tensors only)."""

    def __init__(self, name: str, **params) -> None:
        from torch_cgx import compressors

        self.name, self.params = name, params
        self._c = compressors.get(name, **params)
        self.fixed_size = self._c.traits["fixed_size"]

    def encoded_size(self, numel: int, dtype=torch.float32) -> int:
        return self._c.encoded_size(numel, dtype)

    def encode(self, x, *, seed=0, stream=0, shared=0):
        return self._c.encode(x, seed, stream, shared)

    def values(self, payload, numel, dtype):
        out = torch.empty(numel, dtype=torch.float32)
        return self._c.decode(payload, out=out)

    def decode_add_(self, out, payload, dtype=None):
        """``out`` (fp32) += the payload's values (the engine's sums)."""
        return out.add_(self.values(payload, out.numel(), dtype or out.dtype))

    def header_ok(self, payload, numel, dtype):
        return torch.ones((), dtype=torch.bool, device=payload.device)


def codec_factory(kind: str):
    """``kind``: "native" (the adapter) or "device" (torch_cgx.device.codecs, the adapter for
    a name whose module does not import yet)."""
    from torch_cgx.device import codecs

    def make(name, **params):
        if kind == "device":
            try:
                return codecs.get(name, **params)
            except ImportError:
                pass
        return NativeAdapter(name, **params)

    return make


def _inputs(rank: int, dtype, n: int, salt: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * salt + rank)
    x = torch.randn(n, generator=g) * (1 + rank)
    x[:: max(1, n // 7)] *= 8  # a few outliers per bucket range
    return x.to(dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def _same_everywhere(t: torch.Tensor, group) -> bool:
    world = dist.get_world_size(group)
    mine = _bits(t)
    out = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(out, mine, group=group)
    return all(torch.equal(o, mine) for o in out)


def _compare(dev: torch.Tensor, nat: torch.Tensor) -> Dict:
    diff = (dev.float() - nat.float()).abs()
    return {"bitwise": torch.equal(_bits(dev), _bits(nat)),
            "max_diff": float(diff.max()) if diff.numel() else 0.0,
            "scale": float(nat.float().abs().max())}  # fmt: skip


def run_cases(rank: int, world: int, out_path: str, kind: str) -> None:
    import torch_cgx
    from torch_cgx import _C
    from torch_cgx.device.engine import DeviceCall, DeviceEngine
    from torch_cgx.device.transport import GroupTransport

    dist.init_process_group("cgx")
    gloo = dist.new_group(backend="gloo")
    backend = torch_cgx.cgx_backend()
    engine = DeviceEngine(GroupTransport(gloo, rank, world), codecs=codec_factory(kind))
    base = torch_cgx.get_config()
    results: Dict[str, Dict] = {}
    for salt, (name, changes, dtype, n, average) in enumerate(CASES):
        sizes = {k: changes[k] for k in ("fusion_bytes", "segment_bytes") if k in changes}
        config = base.replace(**{k: v for k, v in changes.items() if k not in sizes})
        call = dataclasses.replace(DeviceCall.from_config(config, average), **sizes)
        native = config.to_native()  # byte sizes below the settings' MiB, on both sides
        native.fusion_buffer_bytes = call.fusion_bytes
        native.pipeline_segment_bytes = call.segment_bytes
        x = _inputs(rank, dtype, n, salt)
        stream = 7 + salt
        nat, nres = x.clone(), torch.empty(n)
        options = _C.CallOptions(native).with_stream(stream)
        backend.allreduce_call(nat, options, average, nres).wait()
        dev, dres = x.clone(), torch.empty(n)
        sent = engine.stats()["bytes_sent"]
        engine.allreduce(dev, call, stream=stream, residual=dres)
        r = _compare(dev, nat)
        r["bytes"] = [engine.stats()["bytes_sent"] - sent, backend.last_bytes_sent()]
        r["residual_bitwise"] = torch.equal(_bits(dres), _bits(nres))
        r["residual_max_diff"] = float((dres - nres).abs().max())
        r["replicas"] = _same_everywhere(dev, gloo)
        r["codec"] = type(engine._plan(call).codec).__module__
        results[name] = r
    results.update(_reduce_scatter_cases(rank, world, engine, base, gloo))
    results["header_mismatch"] = _header_mismatch(rank, engine, base)
    results["counters"] = _counters(rank, world, base, kind)
    results["exact"] = _exact_cases(rank, engine, backend, base, gloo)
    results["stats"] = engine.stats()
    results["world"] = world
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    dist.barrier(gloo)
    dist.destroy_process_group()


def _exact_cases(rank, engine, backend, base, gloo) -> Dict[str, bool]:
    """Calls the settings reduce exactly, against the native engine (or Gloo for integers)."""
    from torch_cgx import _C
    from torch_cgx.device.engine import DeviceCall

    out = {}
    config = base.replace(bits=4, bucket_size=64)
    call = DeviceCall.from_config(config, True)
    for name, x in (("below_min_size", _inputs(rank, F16, 10, 60)),
                    ("bf16_exact_config", _inputs(rank, BF16, 100, 61))):  # fmt: skip
        c = call if name == "below_min_size" else None
        options = _C.CallOptions((config if c else base).to_native())
        nat, dev = x.clone(), x.clone()
        backend.allreduce_call(nat, options, True).wait()
        engine.allreduce(dev, c, average=True)
        out[name] = torch.equal(_bits(dev), _bits(nat))
    ints = torch.arange(50) * (rank + 1)
    want = ints.clone()
    dist.all_reduce(want, group=gloo)
    engine.allreduce(ints, None)
    out["int64_sum"] = torch.equal(ints, want)
    # an exact reduce-scatter (mean): chunk `rank` of the fp32 sum, divided by W
    world = dist.get_world_size()
    x = _inputs(rank, BF16, 40 * world, 62)
    whole = x.float()
    dist.all_reduce(whole, group=gloo)
    want = (whole[rank * 40 : (rank + 1) * 40] / world).to(BF16)
    got = torch.empty(40, dtype=BF16)
    engine.reduce_scatter(got, x, None, average=True)
    out["reduce_scatter_mean"] = bool((got.float() - want.float()).abs().max() <= 1e-2)
    return out


def _counters(rank, world, base, kind) -> Dict:
    """Without a stream, the streams and the rotation's seed come from the call counters: a
    fresh cgx group's ``dist.all_reduce`` against a fresh engine's, three calls in a row."""
    import torch_cgx
    from torch_cgx.device.engine import DeviceCall, DeviceEngine
    from torch_cgx.device.transport import GroupTransport

    changes = dict(bits=2, bucket_size=64, stochastic=True, rotation="on")
    sub = dist.new_group(backend="cgx")
    torch_cgx.set_config(sub, **changes)
    gloo = dist.new_group(backend="gloo")
    engine = DeviceEngine(GroupTransport(gloo, rank, world), codecs=codec_factory(kind))
    call = DeviceCall.from_config(base.replace(**changes), True)
    out = {"bitwise": []}
    for i in range(3):
        x = _inputs(rank, torch.float32, 700, 50 + i)
        nat, dev = x.clone(), x.clone()
        dist.all_reduce(nat, op=dist.ReduceOp.AVG, group=sub)
        engine.allreduce(dev, call)
        out["bitwise"].append(torch.equal(_bits(dev), _bits(nat)))
    dist.destroy_process_group(sub)
    dist.destroy_process_group(gloo)
    return out


def _header_mismatch(rank, engine, base) -> str:
    """Rank 0 sends a max-min raw tail, the others not (payloads of one size: 1024 values in
    whole buckets): every receiver's lazy header check raises ValueError at the end."""
    from torch_cgx.device.engine import DeviceCall

    config = base.replace(bits=4, bucket_size=64, skip_incomplete_buckets=rank == 0)
    try:
        engine.allreduce(torch.randn(1024), DeviceCall.from_config(config, True))
    except ValueError as e:
        return str(e)
    return ""


def _reduce_scatter_cases(rank, world, engine, base, gloo) -> Dict[str, Dict]:
    import torch_cgx
    from torch_cgx.device.engine import DeviceCall

    results = {}
    for salt, (name, changes, dtype, n, average) in enumerate(RS_CASES):
        config = base.replace(**changes)
        sub = dist.new_group(backend="cgx")  # a fresh group: its call counter starts at 0
        torch_cgx.set_config(sub, **changes)
        x = _inputs(rank, dtype, n * world, 100 + salt)
        nat = torch.empty(n, dtype=dtype)
        op = dist.ReduceOp.AVG if average else dist.ReduceOp.SUM
        dist.reduce_scatter_tensor(nat, x.clone(), op=op, group=sub)
        dev = torch.empty(n, dtype=dtype)
        engine.reduce_scatter(dev, x.clone(), DeviceCall.from_config(config, average), stream=0)
        results[name] = _compare(dev, nat)
        dist.destroy_process_group(sub)
    return results


def bench(rank: int, world: int, numel: int, reps: int) -> None:
    """Median time of one allreduce of ``numel`` fp32 values, device engine (CPU tensors over
    Gloo) against the native engine (a cgx group), for a few settings; printed by rank 0."""
    import time

    import torch_cgx
    from torch_cgx import _C
    from torch_cgx.device.engine import DeviceCall, DeviceEngine
    from torch_cgx.device.transport import GroupTransport

    dist.init_process_group("cgx")
    gloo = dist.new_group(backend="gloo")
    backend = torch_cgx.cgx_backend()
    engine = DeviceEngine(GroupTransport(gloo, rank, world))
    for label, changes in (
        ("maxmin 4 bits, sra", dict(bits=4, bucket_size=512)),
        ("maxmin 4 bits, ring", dict(bits=4, bucket_size=512, algorithm="ring")),
        ("fp16, sra", dict(compressor="fp16")),
        ("topk 1 %, allgather", dict(compressor="topk", compressor_params="ratio=0.01")),
        ("randomk 1 %, sum-reduce", dict(compressor="randomk", compressor_params="ratio=0.01")),
    ):
        config = torch_cgx.get_config().replace(**changes)
        options, call = _C.CallOptions(config.to_native()), DeviceCall.from_config(config, True)
        x = torch.randn(numel)
        times = {"native": [], "device": []}
        for _ in range(reps):
            for kind in times:
                y = x.clone()
                dist.barrier(gloo)
                t0 = time.perf_counter()
                if kind == "native":
                    backend.allreduce_call(y, options, True).wait()
                else:
                    engine.allreduce(y, call)
                times[kind].append(time.perf_counter() - t0)
        if rank == 0:
            med = {k: sorted(v)[len(v) // 2] * 1e3 for k, v in times.items()}
            print(f"{label:26s} native {med['native']:8.2f} ms  device {med['device']:8.2f} ms"
                  f"  ({med['device'] / med['native']:.1f}x)", flush=True)  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":  # python tests/device_engine_cases.py [numel] [reps]
    import sys

    from dist_helpers import run_ranks

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 20
    run_ranks(bench, 2, n, int(sys.argv[2]) if len(sys.argv) > 2 else 5, timeout=600)
