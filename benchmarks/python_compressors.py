"""Compressors written in Python: eager against ``torch.compile`` against the native compressor
nearest in bits, each against memcpy, side by side in one run.

``python -m benchmarks.python_compressors [--size 64M] [--names natural,drive] [--iters 5]``

For each Python compressor: the median seconds of ``encode`` and ``decode_add_`` eager and
compiled (``register(..., compile=True)``; compile time reported apart), of the same calls of
the native compressor nearest in bits (natural, 9 bits: fp16; drive, 1 bit: onebit; the float
formats: max-min at their bits, e.g. maxmin4 for mxfp4), and of a
memcpy of the input (``dst.copy_(x)``), in alternating rounds (benchmarks.timing); the table
shows GB/s of fp32 input and the ratio to memcpy. The compiled encode must give the eager
bytes (checked before timing).
"""

from __future__ import annotations

import argparse
import time
from typing import Dict, List, Optional

import torch

from benchmarks.compressors import parse_size
from benchmarks.timing import alternate_rounds
from torch_cgx import compressors

# the native compressor nearest in bits a value (name, parameters)
NEAREST = {"natural": ("fp16", {}), "drive": ("onebit", {}), "fp8": ("maxmin", {"bits": 8}),
           "mxfp8": ("maxmin", {"bits": 8}), "mxfp6": ("maxmin", {"bits": 6}),
           "mxfp4": ("maxmin", {"bits": 4}), "nvfp4": ("maxmin", {"bits": 4})}  # fmt: skip


def _ops(c, x: torch.Tensor, acc: torch.Tensor) -> Dict[str, object]:
    payload = c.encode(x, seed=1, stream=2)
    return {
        "encode": lambda: c.encode(x, seed=1, stream=2),
        "decode_add": lambda: c.decode_add_(acc, payload),
    }


def measure(name: str, n: int, iters: int) -> List[dict]:
    x = torch.randn(n, generator=torch.Generator().manual_seed(0))
    acc, dst = torch.zeros(n), torch.empty(n)
    compiled_name = f"{name}_compiled"
    compressors.register(compiled_name, type(compressors.get(name).impl), compile=True,
                         replace=True)  # fmt: skip
    try:
        eager, compiled = compressors.get(name), compressors.get(compiled_name)
        t0 = time.perf_counter()
        same = torch.equal(eager.encode(x, seed=1, stream=2)[16:],
                           compiled.encode(x, seed=1, stream=2)[16:])  # fmt: skip
        compiled.decode_add_(acc, compiled.encode(x, seed=1, stream=2))
        compile_s = time.perf_counter() - t0
        if not same:
            raise SystemExit(f"{name}: the compiled encode's bytes differ from the eager one's")
        fns = {"memcpy": lambda: dst.copy_(x)}
        peers = {"eager": eager, "compiled": compiled}
        if name in NEAREST:
            native, params = NEAREST[name]
            label = native + "".join(f"{v}" for v in params.values())
            peers[f"native {label}"] = compressors.get(native, **params)
        for label, c in peers.items():
            for op, fn in _ops(c, x, acc).items():
                fns[f"{label} {op}"] = fn
        secs = alternate_rounds(fns, {k: iters for k in fns}, warmup=1)
    finally:
        compressors.unregister(compiled_name)
    rows = []
    for key, s in secs.items():
        rows.append(dict(compressor=name, op=key, seconds=s, gbps=4 * n / s / 1e9,
                         vs_memcpy=secs["memcpy"] / s, compile_s=compile_s))  # fmt: skip
    return rows


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=parse_size, default=parse_size("64M"), help="input bytes")
    p.add_argument("--names", default="natural,drive", help="Python compressors")
    p.add_argument("--iters", type=int, default=5)
    args = p.parse_args(argv)
    n = args.size // 4
    print(f"# {n} fp32 values ({args.size / 2**20:.0f} MiB), {torch.get_num_threads()} threads")
    print(f"{'compressor':<10} {'op':<26} {'GB/s':>8} {'x memcpy':>9}")
    for name in args.names.split(","):
        rows = measure(name, n, args.iters)
        for r in rows:
            print(f"{name:<10} {r['op']:<26} {r['gbps']:>8.2f} {r['vs_memcpy']:>9.3f}")
        print(f"# {name}: compile (first encode + decode) {rows[0]['compile_s']:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
