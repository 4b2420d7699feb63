"""Codec throughput on CPU: ``python -m benchmarks.codec [options]``.

For every (size, bits, threads) it times, interleaved in the same loop so that a noisy machine
affects all of them alike:

- ``memcpy``: ``dst.copy_(src)`` of the same fp32 bytes into a preallocated tensor;
- ``encode``: ``torch_cgx.codec.encode(..., out=payload)`` into a preallocated payload (as the
  backend does with its reused buffers);
- ``decode_add``: ``torch_cgx.codec.decode_add_`` into a preallocated fp32 tensor;
- ``torch encode`` / ``torch decode_add``: the pure torch-ops codec of
  :mod:`benchmarks.torch_ops_codec`,

with ``torch.set_num_threads`` and ``torch_cgx.codec.set_num_threads`` both set to the thread
count. Throughput is GB/s of fp32 input: ``4 * numel / median seconds / 1e9``. Before timing,
``--verify`` (the default) checks our decode against the input within the error bound of
docs/FORMAT.md, that ``decode_add_`` adds exactly that decode, that the payload is the same bytes
with every thread count, and the torch-ops codec's own round trip; any failure aborts the run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from functools import partial
from typing import Callable, List, Sequence

import torch

import torch_cgx
from benchmarks import torch_ops_codec
from benchmarks.codec_report import format_table  # noqa: F401  (demo imports it here)
from benchmarks.timing import (
    MB,
    OtherLoad,
    alternate_rounds,
    auto_iters,
    auto_torch_iters,
    cpu_model,
    parse_list,
    resolve_threads,
    set_threads,
)
from torch_cgx import codec

DEFAULT_SIZES_MB = (1, 4, 16, 64, 256)
DEFAULT_BITS = (1, 2, 4, 8)
QUICK_SIZES_MB = (0.0625, 0.25)

OPS = ("memcpy", "encode", "decode_add", "torch_encode", "torch_decode_add")


class VerifyError(AssertionError):
    """The codec's output is outside the documented error bound (or otherwise wrong)."""


def _format_bound(x: torch.Tensor, bits: int, bucket_size: int) -> torch.Tensor:
    """Per-bucket bound on |decode(encode(x)) - x| from docs/FORMAT.md (nearest rounding), fp64."""
    levels = (1 << bits) - 1
    buckets = torch_ops_codec._bucketed(x, bucket_size)  # last bucket padded with its last value
    mn = buckets.amin(dim=1).double()
    mx = buckets.amax(dim=1).double()
    unit = ((mx - mn) / levels).float().double()  # unit = (f32)(range / L), range in fp64
    return (
        unit * (0.5 + 4 * levels * 2.0**-24)
        + 2.0**-23 * torch.maximum(mn.abs(), mx.abs())
        + 2.0**-149 * (levels + 1)
    )


def verify_codec(
    x: torch.Tensor, payload: torch.Tensor, bits: int, bucket_size: int, chunk: int = 1 << 22
) -> None:
    """Raises :class:`VerifyError` unless ``payload`` (``codec.encode(x, bits, bucket_size)``)
    decodes within the FORMAT.md bound of ``x`` and ``decode_add_`` adds exactly that decode."""
    n = x.numel()
    want = codec.encoded_size(n, bits, bucket_size)
    if payload.numel() != want:
        raise VerifyError(f"payload has {payload.numel()} bytes, encoded_size says {want}")
    info = codec.inspect(payload)
    if (info["bits"], info["bucket_size"], info["count"]) != (bits, bucket_size, n):
        raise VerifyError(f"payload header {info} does not match bits={bits}, n={n}")
    decoded = codec.decode(payload)
    chunk = max(bucket_size, chunk // bucket_size * bucket_size)  # whole buckets per chunk
    for s in range(0, n, chunk):
        xs, ds = x[s : s + chunk], decoded[s : s + chunk]
        # The error is computed in fp32: one more rounding, relative 2^-24 of the error itself.
        err = torch_ops_codec.bucket_max((ds - xs).abs_(), bucket_size).double()
        bound = _format_bound(xs, bits, bucket_size) * (1 + 2.0**-22)
        bad = ~(err <= bound)  # also catches NaN
        if bool(bad.any()):
            k = int(bad.nonzero()[0])
            lo = k * bucket_size
            i = lo + int((ds[lo : lo + bucket_size] - xs[lo : lo + bucket_size]).abs().argmax())
            raise VerifyError(
                f"bits={bits} n={n}: element {s + i} decodes to {float(ds[i])!r}, input "
                f"{float(xs[i])!r}, error {float(err[k]):.3g} > bound {float(bound[k]):.3g} "
                f"({int(bad.sum())} buckets out of bound)"
            )
    base = torch.linspace(-1.0, 1.0, n, dtype=torch.float32)
    expect = base + decoded
    codec.decode_add_(base, payload)
    if not torch.equal(base, expect):
        i = int((base != expect).nonzero()[0])
        raise VerifyError(
            f"bits={bits} n={n}: decode_add_ gives {float(base[i])!r} at {i}, "
            f"expected out + decode = {float(expect[i])!r}"
        )


def verify_torch_ops(x: torch.Tensor, bits: int, bucket_size: int) -> None:
    if not torch_ops_codec.max_abs_error_ok(x, bits, bucket_size):
        raise VerifyError(f"torch-ops codec: bits={bits} n={x.numel()} error exceeds unit / 2")


def codec_table(
    sizes_mb: Sequence[float] = DEFAULT_SIZES_MB,
    bits: Sequence[int] = DEFAULT_BITS,
    threads: Sequence[int] = (1,),
    iters: int | None = None,
    *,
    bucket_size: int = 512,
    warmup: int = 1,
    verify: bool = True,
    seed: int = 0,
    log: Callable[[str], None] | None = None,
    max_other_load: float = 0.15,
    retries: int = 2,
    retry_wait: float = 2.0,
) -> List[dict]:
    """Measures every (size, bits, threads) and returns one record (a dict) per combination.

    A row during which other processes used more than ``max_other_load`` of the CPUs (see
    :class:`OtherLoad`) is measured again, up to ``retries`` times, after ``retry_wait`` seconds;
    the record keeps the last attempt, its ``other_load`` and the number of ``attempts``.

    ``iters=None`` picks the iterations per size (:func:`auto_iters`, half for the torch-ops
    codec); an int uses that many for every operation. Thread settings are restored afterwards.
    """
    saved = (torch.get_num_threads(), codec.num_threads())
    gen = torch.Generator().manual_seed(seed)
    records: List[dict] = []
    try:
        for size_mb in sizes_mb:
            numel = max(1, int(round(size_mb * MB / 4)))
            x = torch.randn(numel, generator=gen)
            dst = torch.zeros_like(x)
            out = torch.zeros_like(x)
            torch_out = torch.zeros_like(x)
            n_iters = auto_iters(size_mb) if iters is None else int(iters)
            n_torch = auto_torch_iters(n_iters) if iters is None else int(iters)
            for b in bits:
                reference = None
                verified = False
                for th in threads:
                    set_threads(th)
                    payload = codec.encode(x, b, bucket_size)
                    if verify:
                        if reference is None:
                            verify_codec(x, payload, b, bucket_size)
                            verify_torch_ops(x, b, bucket_size)
                            reference = payload
                        elif not torch.equal(payload, reference):
                            raise VerifyError(
                                f"bits={b} n={numel}: encode with {th} threads gives other bytes"
                                f" than with {threads[0]}"
                            )
                        verified = True
                    torch_payload = torch_ops_codec.encode(x, b, bucket_size)
                    enc_out = torch.empty_like(payload)
                    fns = {
                        "memcpy": partial(dst.copy_, x),
                        "encode": partial(codec.encode, x, b, bucket_size, out=enc_out),
                        "decode_add": partial(codec.decode_add_, out, payload),
                        "torch_encode": partial(torch_ops_codec.encode, x, b, bucket_size),
                        "torch_decode_add": partial(
                            torch_ops_codec.decode_add_, torch_out, torch_payload, b, bucket_size
                        ),
                    }
                    n_per_op = {op: n_iters if op in OPS[:3] else n_torch for op in OPS}
                    attempts = 0
                    while True:  # re-measure a row that other processes disturbed
                        attempts += 1
                        load = OtherLoad()
                        secs = alternate_rounds(fns, n_per_op, warmup)
                        other_load = load.fraction()
                        if other_load is None or other_load <= max_other_load:
                            break
                        if attempts > retries:
                            break
                        if log is not None:
                            log(
                                f"  other processes used {100 * other_load:.0f}% of the CPUs: "
                                f"measuring again ({attempts}/{retries})"
                            )
                        time.sleep(retry_wait)
                    nbytes = 4 * numel
                    gbps = {op: nbytes / secs[op] / 1e9 for op in OPS}
                    rec = {
                        "size_mb": size_mb,
                        "numel": numel,
                        "bits": b,
                        "bucket_size": bucket_size,
                        "threads": th,
                        "isa": torch_cgx._C.isa(),
                        "torch_version": torch.__version__,
                        "iters": n_iters,
                        "torch_iters": n_torch,
                        "warmup": warmup,
                        "verified": verified,
                        "encode_includes_alloc": False,
                        "payload_bytes": payload.numel(),
                        "torch_payload_bytes": torch_payload.numel(),
                        "compression_ratio": nbytes / payload.numel(),
                        "other_load": other_load,
                        "attempts": attempts,
                    }
                    for op in OPS:
                        rec[f"{op}_s"] = secs[op]
                        rec[f"{op}_gbps"] = gbps[op]
                    for op in ("encode", "decode_add"):
                        rec[f"{op}_vs_memcpy"] = gbps[op] / gbps["memcpy"]
                        rec[f"{op}_vs_torch"] = gbps[op] / gbps[f"torch_{op}"]
                    records.append(rec)
                    if log is not None:
                        log(
                            f"{size_mb:g} MB, {b} bits, {th} threads: encode "
                            f"{gbps['encode']:.2f} GB/s, decode_add {gbps['decode_add']:.2f} GB/s,"
                            f" memcpy {gbps['memcpy']:.2f} GB/s"
                        )
                    del payload, torch_payload, fns
            del x, dst, out, torch_out
    finally:
        torch.set_num_threads(saved[0])
        if codec.num_threads() != saved[1]:
            codec.set_num_threads(saved[1])
    return records


# ---- output ---------------------------------------------------------------------------------

# ---- command line ---------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.codec",
        description="Throughput of the max-min codec vs memcpy and a pure torch-ops codec (CPU).",
        epilog="--compressors all|NAME,...: measure every registered compressor (or those named)"
        " instead, with --size (default 64M), --threads (default 1), --iters, --json; see"
        " `codec --compressors all --help` (benchmarks/compressors.py).",
    )
    p.add_argument("--bits", default="1,2,4,8", help="comma-separated bits (default 1,2,4,8)")
    p.add_argument(
        "--sizes",
        default=None,
        help="comma-separated buffer sizes in MB of fp32 (default 1,4,16,64,256; with --quick "
        "0.0625,0.25)",
    )
    p.add_argument("--bucket-size", type=int, default=512, help="values per bucket (512)")
    p.add_argument(
        "--threads",
        default="1,all",
        help='comma-separated thread counts; "all" = the codec\'s thread count at startup '
        "(default 1,all)",
    )
    p.add_argument(
        "--iters",
        type=int,
        default=None,
        help="timed iterations per operation (default: by size, 40 at <= 4 MB down to 6 at "
        "256 MB, half of that (at least 3) for the torch-ops codec)",
    )
    p.add_argument("--warmup", type=int, default=1, help="untimed calls per operation (1)")
    p.add_argument("--json", metavar="PATH", help="also write the records as a JSON list")
    p.add_argument(
        "--quick", action="store_true", help="small sizes and few iterations (smoke test)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random input (0)")
    p.add_argument(
        "--max-other-load",
        type=float,
        default=0.15,
        help="measure a row again when other processes used more than this fraction of the "
        "CPUs during it (0.15)",
    )
    p.add_argument(
        "--retries", type=int, default=2, help="at most this many re-measurements per row (2)"
    )
    v = p.add_mutually_exclusive_group()
    v.add_argument("--verify", dest="verify", action="store_true", default=True, help="(default)")
    v.add_argument("--no-verify", dest="verify", action="store_false", help="skip verification")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a == "--compressors" or a.startswith("--compressors=") for a in argv):
        from benchmarks import compressors  # every compressor: its own options

        return compressors.main(argv)
    all_threads = codec.num_threads()  # "all": the codec's thread count at startup
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        bits = parse_list(args.bits, int, "bits")
        default_sizes = QUICK_SIZES_MB if args.quick else DEFAULT_SIZES_MB
        sizes = parse_list(args.sizes or ",".join(map(str, default_sizes)), float, "sizes")
        threads = resolve_threads(args.threads, all_threads)
    except (argparse.ArgumentTypeError, ValueError) as e:
        parser.error(str(e))
    for b in bits:
        if b not in torch_ops_codec.SUPPORTED_BITS:
            parser.error(f"bits must be in {torch_ops_codec.SUPPORTED_BITS} (torch-ops baseline)")
    if args.bucket_size < 1:
        parser.error("--bucket-size must be >= 1")
    iters = args.iters
    if args.quick and iters is None:
        iters = 3
    if iters is not None and iters < 1:
        parser.error("--iters must be >= 1")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    log(
        f"codec benchmark: torch_cgx from {os.path.dirname(torch_cgx.__file__)}, "
        f"isa {torch_cgx._C.isa()}, cpu {cpu_model()}, {os.cpu_count()} cpus"
    )
    try:
        records = codec_table(
            sizes,
            bits,
            threads,
            iters,
            bucket_size=args.bucket_size,
            warmup=args.warmup,
            verify=args.verify,
            seed=args.seed,
            log=log,
            max_other_load=args.max_other_load,
            retries=max(0, args.retries),
        )
    except VerifyError as e:
        print(f"VERIFY FAILED: {e}", file=sys.stderr)
        return 1
    print(format_table(records))
    if args.json:
        parent = os.path.dirname(os.path.abspath(args.json))
        os.makedirs(parent, exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
        log(f"wrote {len(records)} records to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
