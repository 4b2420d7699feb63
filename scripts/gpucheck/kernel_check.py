"""The GPU check's kernel step (run under compute-sanitizer's memcheck on a GPU): every codec
with a fused kernel (the dense ones, and the sparse ones' Triton passes around their selection),
through the codecs' one dispatch (``CGX_DEVICE_KERNELS=fused`` there: a kernel that falls back
raises), on small buffers whose sizes cross bucket and byte boundaries: the payload must be the
native CPU codec's bytes and ``decode_add_`` the native decode added (NaN as NaN). On CPU
tensors the same script runs the reference (the kernels' CPU form). Prints one line per
configuration; exit status 1 on any difference."""

from __future__ import annotations

import argparse
import sys
from typing import Dict, List, Tuple

import torch

SEED, STREAM, SHARED = 11, 5, 3
# (compressor, parameters) of every configuration a fused kernel serves
CONFIGS: List[Tuple[str, Dict]] = [
    ("maxmin", dict(bits=4, bucket_size=512)),
    ("maxmin", dict(bits=1, bucket_size=64)),
    ("maxmin", dict(bits=3, bucket_size=100, skip_incomplete_buckets=1)),
    ("maxmin", dict(bits=8, bucket_size=512, stochastic=1)),
    ("qsgd", dict(bits=4, bucket_size=512)),
    ("terngrad", dict(bucket_size=128)),
    ("onebit", dict(bucket_size=64)),
    ("efsignsgd", dict(bucket_size=256)),
    ("signsgd", {}),
    ("signum", {}),
    ("tbq", dict(tau=0.5)),
    ("topk", dict(ratio=0.1)),
    ("randomk", dict(ratio=0.1)),
    ("threshold", dict(tau=1.0)),
    ("dgc", dict(ratio=0.1)),
    ("graddrop", {}),
    ("sparseloco", {}),
]
SIZES = (1, 7, 513, 4099)


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal, any NaN equal to any NaN (GPUs write the canonical NaN)."""
    kind = torch.int32 if a.element_size() == 4 else torch.int16
    bits = a.view(kind) == b.view(kind)
    return bool((bits | (torch.isnan(a) & torch.isnan(b))).all())


def check(name: str, params: Dict, n: int, dtype, device) -> str:
    """'' or what differs from the native codec for one configuration and size."""
    from torch_cgx import compressors as native
    from torch_cgx.device import codecs

    g = torch.Generator().manual_seed(n)
    x = (torch.randn(n, generator=g) * 10.0 ** (torch.arange(n) // 97 % 5 - 2)).to(dtype)
    if n > 100:
        x[n // 3] = float("nan")  # one non-finite bucket (and the flag of the sign codecs)
    ref = native.get(name, **params)
    want = ref.encode(x, SEED, STREAM, SHARED)
    dc = codecs.get(name, **params)
    got = dc.encode(x.to(device), seed=SEED, stream=STREAM, shared=SHARED)
    if not torch.equal(got.cpu(), want):
        diff = (got.cpu() != want).nonzero()
        return f"encode: {len(diff)} bytes differ from the native payload, first {int(diff[0])}"
    base = torch.randn(n, generator=g).to(dtype)  # decode_add into the payload's dtype
    expect = base.clone()
    ref.decode_add_(expect, want)
    out = base.to(device)
    dc.decode_add_(out, got)
    if not same_values(out.cpu(), expect):
        return "decode_add differs from the native decode added"
    return ""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument(
        "--quick",
        action="store_true",
        help="sizes 7 and 4099 only (under compute-sanitizer, which slows every kernel)",
    )
    args = p.parse_args()
    sizes = (7, 4099) if args.quick else SIZES
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("torch sees no CUDA device", file=sys.stderr)
        return 1
    from torch_cgx.device import kernels

    bad = 0
    for name, params in CONFIGS:
        for dtype in (torch.float32, torch.float16):
            whys = [w for n in sizes if (w := check(name, params, n, dtype, device))]
            bad += bool(whys)
            dt = str(dtype).replace("torch.", "")
            print(f"{name:<10} {str(params):<52} {dt:<8} {'ok' if not whys else whys[0]}")
    if device.type == "cuda":
        torch.cuda.synchronize()
    fused = [k for k, v in kernels.decisions().items() if v == "fused"]
    print(f"{len(fused)} configurations ran fused; mode {kernels.mode()}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
