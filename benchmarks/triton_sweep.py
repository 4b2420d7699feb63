"""Launch-size sweep of the Triton kernels on a GPU (docs/gpu.md).

    python -m benchmarks.triton_sweep [--size 64M] [--json PATH]

For max-min (4 bits, buckets of 512: the default) each encode variant (scalars ``tile`` x codes
``codes`` x ``num_warps``) and decode variant (``decode`` x ``num_warps``), and for qsgd / onebit
each ``block`` x ``buckets_per_program``: the payload compared with the default launch's bytes
(a launch size must never change them) and the time, median of CUDA-event timings, beside a
device-to-device copy of the same buffer in the same run. Times are CUDA-graph replays (the
device's time: the host's launch cost left out) where the calls can be captured, and each row
also gives ``host_ms``, the same calls timed with events, host gaps included. Ratios are in
time (copy time over the kernel's time), as benchmarks.device prints them. The best variant of
each table is marked.
The level codecs' rows also compare the one-launch encode (``one_launch=None``: the host's
choice, one launch for qsgd's buckets of 512) with the two launches (``False``), and decode from
the fresh payload (32-bit word reads) with decode from a copy at an odd address (bytes).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
from typing import Callable, Dict, List

import torch

from benchmarks.compressors import parse_size
from benchmarks.device import Timer

SEED, STREAM = 1, 7


ITERS, ROUNDS = 20, 5


HOST: Dict[int, float] = {}  # id of a timed call -> its seconds with the host's gaps


def timed(fn: Callable[[], object]) -> float:
    """Median seconds per call over ROUNDS rounds of ITERS calls, replayed from a CUDA graph
    (benchmarks.device.Timer.captured: the kernels without the host's launch cost, which at 64 MB
    is of the order of a kernel and would hide the variants' differences), else timed with CUDA
    events; on a CPU, under Triton's interpreter, the host clock (a check of this script).
    The events' time, host included, is kept in HOST."""
    timer = Timer(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    fn()
    iters = ITERS if timer.cuda else 1
    host = statistics.median(timer(fn, iters) for _ in range(ROUNDS if timer.cuda else 1))
    HOST[id(fn)] = host
    replay = timer.captured(fn)
    if replay is None:
        return host
    return statistics.median(timer(replay, iters) for _ in range(ROUNDS))


def maxmin_rows(x: torch.Tensor, copy_s: float) -> List[Dict]:
    from torch_cgx.device import codecs
    from torch_cgx.device.triton.maxmin import TritonMaxMin

    codec = codecs.get("maxmin", bits=4, bucket_size=512)
    want = TritonMaxMin().encode(codec, x, SEED, STREAM)
    out = torch.randn_like(x)
    rows = []
    for tile, codes, warps in itertools.product((1024, 2048, 4096, 8192), (1024, 2048, 4096),
                                                (4, 8)):  # fmt: skip
        k = TritonMaxMin(tile=tile, codes=codes, num_warps=warps)
        same = torch.equal(k.encode(codec, x, SEED, STREAM), want)
        fn = lambda k=k, c=codec: k.encode(c, x, SEED, STREAM)  # noqa: E731
        s = timed(fn)
        rows.append({"table": "maxmin-encode", "tile": tile, "codes": codes, "num_warps": warps,
                     "same_bytes": same, "ms": s * 1e3, "host_ms": HOST[id(fn)] * 1e3,
                     "vs_copy": copy_s / s})  # fmt: skip
    for dec, warps in itertools.product((1024, 2048, 4096, 8192), (4, 8)):
        k = TritonMaxMin(decode=dec, num_warps=warps)
        ref = TritonMaxMin().decode_add_(codec, out.clone(), want)
        same = torch.equal(k.decode_add_(codec, out.clone(), want), ref)
        fn = lambda k=k, c=codec, o=out, w=want: k.decode_add_(c, o, w)  # noqa: E731
        s = timed(fn)
        rows.append({"table": "maxmin-decode_add", "decode": dec, "num_warps": warps,
                     "same_values": same, "ms": s * 1e3, "host_ms": HOST[id(fn)] * 1e3,
                     "vs_copy": copy_s / s})  # fmt: skip
    return rows


def levels_rows(x: torch.Tensor, copy_s: float) -> List[Dict]:
    from torch_cgx.device import codecs
    from torch_cgx.device.triton.levels import TritonLevels

    rows = []
    for name, params in (("qsgd", {"bits": 4, "bucket_size": 512}), ("onebit", {}),
                         ("signsgd", {})):  # fmt: skip
        codec = codecs.get(name, **params)
        want = TritonLevels().encode(codec, x, SEED, STREAM)
        out, acc = torch.randn_like(x), torch.randn_like(x)  # out: the timings add into it
        odd = torch.empty(want.numel() + 1, dtype=torch.uint8, device=x.device)[1:]
        odd.copy_(want)  # a payload at an odd address: decode's byte path
        ref = TritonLevels().decode_add_(codec, acc.clone(), want)
        one = (None, False) if codec.scalars else (None,)  # the one-launch encode (default) or not
        for block, bb, fused in itertools.product((1024, 4096, 8192), (None, 4, 64), one):
            k = TritonLevels(block=block, buckets_per_program=bb, one_launch=fused)
            same = torch.equal(k.encode(codec, x, SEED, STREAM), want)
            same = same and torch.equal(k.decode_add_(codec, acc.clone(), odd), ref)
            fn = lambda k=k, c=codec: k.encode(c, x, SEED, STREAM)  # noqa: E731
            enc = timed(fn)
            dec = timed(lambda k=k, c=codec, o=out, w=want: k.decode_add_(c, o, w))
            dec_odd = timed(lambda k=k, c=codec, o=out, w=odd: k.decode_add_(c, o, w))
            rows.append({"table": f"{name}", "block": block, "buckets_per_program": bb,
                         "one_launch": fused, "same_bytes": same, "encode_ms": enc * 1e3,
                         "encode_host_ms": HOST[id(fn)] * 1e3,
                         "enc_vs_copy": copy_s / enc, "dec_vs_copy": copy_s / dec,
                         "dec_odd_vs_copy": copy_s / dec_odd})  # fmt: skip
    return rows


def print_table(rows: List[Dict]) -> None:
    for table in dict.fromkeys(r["table"] for r in rows):
        part = [r for r in rows if r["table"] == table]
        key = "vs_copy" if "vs_copy" in part[0] else "enc_vs_copy"
        best = max(part, key=lambda r: r[key])
        print(f"# {table}")
        for r in part:
            cells = " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                             for k, v in r.items() if k != "table")  # fmt: skip
            print(("* " if r is best else "  ") + cells)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", default="64M", help="bytes of the fp32 input (default 64M)")
    p.add_argument("--json", default="", help="write every row here")
    args = p.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        print("triton_sweep: needs a CUDA device (or TRITON_INTERPRET=1: a check)", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    x = torch.randn(parse_size(args.size) // 4, device=device)
    dst = torch.empty_like(x)
    copy_s = timed(lambda: dst.copy_(x))
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (interpreter)"
    print(f"# {name} copy of {x.numel() * 4} B: {copy_s * 1e3:.4f} ms "
          f"({2 * x.numel() * 4 / copy_s / 1e9:.0f} GB/s read + written)")  # fmt: skip
    rows = maxmin_rows(x, copy_s) + levels_rows(x, copy_s)
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_ms": copy_s * 1e3, "rows": rows}, f, indent=1)
    return 0 if all(r.get("same_bytes", True) and r.get("same_values", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
