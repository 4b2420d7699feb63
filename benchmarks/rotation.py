"""Cost of the CGX hook's rotation (csrc/core/rotation.h) and clipped range next to the codec,
in one run.

    python -m benchmarks.rotation [--mib 64] [--bucket 512] [--threads 1]

Best of 5 per row: a copy of the buffer, max-min 4-bit encode (plain and clipped, also at 2 bits)
and decode, the rotation forward and inverse; the ratios are to the 4-bit encode measured in the
same run.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import List, Optional

import torch

from torch_cgx import _C, codec


def best_of(fn, repeats: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.rotation", description=__doc__)
    p.add_argument("--mib", type=int, default=64, help="fp32 buffer size")
    p.add_argument("--bucket", type=int, default=512, help="rotation block = codec bucket")
    p.add_argument("--threads", type=int, default=1, help="codec and rotation threads")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    codec.set_num_threads(args.threads)
    n = args.mib << 18
    x, y = torch.randn(n), torch.empty(n)
    payload, small = codec.encode(x, 4, args.bucket), codec.encode(x, 2, args.bucket)
    rows = {
        "copy": best_of(lambda: y.copy_(x)),
        "encode 4-bit": best_of(lambda: codec.encode(x, 4, args.bucket, out=payload)),
        "encode 4-bit, clip": best_of(
            lambda: codec.encode(x, 4, args.bucket, clip=True, out=payload)
        ),
        "encode 2-bit": best_of(lambda: codec.encode(x, 2, args.bucket, out=small)),
        "encode 2-bit, clip": best_of(
            lambda: codec.encode(x, 2, args.bucket, clip=True, out=small)
        ),
        "decode 4-bit": best_of(lambda: codec.decode(payload, out=y)),
        "rotate forward": best_of(lambda: _C.rotate_(y, args.bucket, 1, True)),
        "rotate inverse": best_of(lambda: _C.rotate_(y, args.bucket, 1, False)),
    }
    base = rows["encode 4-bit"]
    print(f"# {args.mib} MiB fp32, bucket {args.bucket}, {args.threads} thread(s)")
    print("| operation | ms | GB/s | vs encode 4-bit |\n|---|---:|---:|---:|")
    for name, t in rows.items():
        print(f"| {name} | {t * 1e3:.1f} | {4 * n / t / 1e9:.2f} | {t / base:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
