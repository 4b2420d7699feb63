"""Allreduce benchmark in the style of nccl-tests' all_reduce_perf, for the cgx backend.

    torchrun --nproc-per-node 4 -m benchmarks.allreduce -b 1M -e 128M -f 2

For every size it times Gloo's uncompressed allreduce, the ``--baselines`` (PyTorch's fp16 / bf16
/ per-channel 8-bit / PowerSGD schemes, see benchmarks/baselines.py; ``all`` for every one)
and cgx at each (algorithm, bits), all in the same run, and checks every cgx result against the
exact sum with the bound of docs/algorithms.md (``#wrong`` counts elements outside it; it must be
0; ``-`` for baselines, which have no such bound).

``--compressors all`` (or ``name,name``; ``torch_cgx.compressors.names()``) adds one row group
per registered compressor at its default parameters (``set_config(compressor=name)``): under each
of ``--algorithms`` for fixed-size dense ones, once under ``allgather`` for sparse and
data-dependent ones (the backend's only path for them). Their ``algo`` cell is
``<compressor>:<algorithm>`` (``ag``: allgather-reduce) and ``bits`` their payload bits per value
(``-`` where the size depends on the data). The ``maxmin`` row is checked against the error
bound above (at its default 4 bits, bucket 512); every other compressor's checked call also
returns each rank's error-feedback residual, and ``#wrong`` counts the elements whose
compressions break the compressor's definition or whose result is off the sum they imply
(:mod:`benchmarks.allreduce_compressors`: rank 0 replays the algorithm). Every timed call of a
compressor row starts again from the same input (data-dependent payloads would otherwise change
as the buffer grows). Every cgx row checks that all ranks hold bit-identical results (``same`` in
the records; a mismatch fails the run). ``--bits none`` leaves out the ``--bits`` rows:

    python -m benchmarks.allreduce --hosts 4 --link 1gbit -b 4M -e 64M --bits none \\
        --algorithms sra --compressors all

``time`` is the slowest rank's mean per call; ``algbw = size / time``,
``busbw = algbw * 2 (W - 1) / W``; ``wire`` is the bytes one rank sends per call (for Gloo, a
ring's ``2 (W - 1) / W * size``); ``speedup`` is Gloo's time over this row's and ``ideal``
Gloo's bytes over this row's (the speedup if only bytes on the wire counted: 32 / bits per value).

Emulated hosts (root, iproute2; docs/hosts.md): ``--hosts W --link RATE [--latency T]`` runs the
benchmark as W ranks, one per network namespace, each behind a link of RATE (tc syntax: 100mbit,
1gbit, 10gbit) in both directions, with ``--latency`` one-way delay (needs netem):

    python -m benchmarks.allreduce --hosts 2 --link 1gbit -b 4M -e 16M -f 4 --bits 4
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import zlib
from typing import List, Optional

import torch
import torch.distributed as dist

import torch_cgx
from benchmarks.allreduce_compressors import verdict
from benchmarks.baselines import METHODS
from benchmarks.hosts import maybe_run_on_hosts
from benchmarks.sizes import parse_size, size_range
from torch_cgx import compressors
from torch_cgx.bounds import bucket_bound, bucket_stats
from torch_cgx.config import ALGORITHMS

COLUMNS = [
    ("size(B)", 10),
    ("count", 10),
    ("type", 6),
    ("algo", 14),
    ("bits", 4),
    ("time(us)", 10),
    ("algbw", 7),
    ("busbw", 7),
    ("wire(B)", 10),
    ("maxerr", 9),
    ("relerr", 9),
    ("#wrong", 6),
    ("speedup", 7),
    ("ideal", 6),
]


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="benchmarks.allreduce",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-b", "--minbytes", default="1M", type=parse_size)
    p.add_argument("-e", "--maxbytes", default="128M", type=parse_size)
    p.add_argument("-f", "--stepfactor", default=2, type=int)
    p.add_argument("-n", "--iters", default=10, type=int, help="timed calls per size (max)")
    p.add_argument("-w", "--warmup", default=2, type=int)
    p.add_argument(
        "--max-seconds",
        default=2.0,
        type=float,
        help="fewer iterations where one measurement would take longer",
    )
    p.add_argument("--bits", default="8,4,2", help="cgx bit widths (comma separated), or none")
    p.add_argument("--algorithms", default="sra,ring")
    p.add_argument("--bucket-size", default=512, type=int)
    p.add_argument("--baselines", default="gloo", help=f"gloo, all, or some of {sorted(METHODS)}")
    p.add_argument(
        "--compressors",
        default="",
        help="every registered compressor (all) or some (name,name) at default parameters, "
        "each result judged by its compressor's definition (#wrong)",
    )
    p.add_argument("--json", default=None, help="write the records here (rank 0)")
    p.add_argument("--quiet", action="store_true", help="no table (records only)")
    return p.parse_args(argv)


def _time_calls(fn, iters: int, warmup: int, max_seconds: float, gloo) -> float:
    """Mean seconds per call on the slowest rank; iterations capped by max_seconds."""
    for _ in range(warmup):
        fn()
    dist.barrier(group=gloo)
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    n = max(1, min(iters - 1, int(max_seconds / max(first, 1e-6))))
    n = torch.tensor([n], dtype=torch.int64)
    dist.all_reduce(n, op=dist.ReduceOp.MIN, group=gloo)  # every rank runs the same count
    dist.barrier(group=gloo)
    start = time.perf_counter()
    for _ in range(int(n)):
        fn()
    t = torch.tensor([(time.perf_counter() - start) / int(n)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
    return float(t)


def _errors(y: torch.Tensor, exact: torch.Tensor, bound: Optional[torch.Tensor]) -> tuple:
    err = (y.double() - exact).abs()
    rel = float(err.norm() / exact.norm().clamp_min(1e-300))
    wrong = -1 if bound is None else int((err > bound).sum())
    return float(err.max()), rel, wrong


def _baselines(spec: str) -> List[str]:
    names = sorted(METHODS) if spec == "all" else [m for m in spec.split(",") if m]
    unknown = [m for m in names if m not in METHODS]
    if unknown:
        raise SystemExit(f"unknown baseline(s) {unknown}; choose from {sorted(METHODS)} or all")
    return ["gloo"] + [m for m in names if m != "gloo"]


def _compressors(spec: str) -> List[str]:
    known = compressors.names()
    names = known if spec == "all" else [c for c in spec.split(",") if c]
    unknown = [c for c in names if c not in known]
    if unknown:
        raise SystemExit(f"unknown compressor(s) {unknown}; choose from {known} or all")
    return list(dict.fromkeys(names))


def _bits(spec: str) -> List[int]:
    return [] if spec.strip() == "none" else [int(b) for b in spec.split(",") if b]


def _same_on_ranks(y: torch.Tensor, gloo) -> bool:
    """Whether every rank holds bit-identical values (crc32 compared through MAX and MIN)."""
    crc = zlib.crc32(y.numpy().tobytes())
    t = torch.tensor([crc, -crc], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
    return int(t[0]) == -int(t[1]) == crc


def _wire(world: int, gloo) -> int:
    """The mean over ranks of the bytes the last cgx allreduce sent."""
    wire = torch.tensor([torch_cgx.cgx_backend().last_bytes_sent()], dtype=torch.float64)
    dist.all_reduce(wire, group=gloo)
    return int(float(wire) / world)


class _Input:
    """One size's input on this rank, its exact sum, and the per-bucket statistics of the bound
    (by bucket size, computed once)."""

    def __init__(self, size: int, rank: int, world: int, gloo) -> None:
        self.count, self.world, self.gloo = size // 4, world, gloo
        self.x = self.input_of(rank)
        self.exact = self.x.double()
        dist.all_reduce(self.exact, group=gloo)
        self.base = {"size": size, "count": self.count, "type": "float", "redop": "sum",
                     "world": world}  # fmt: skip
        self._stats = {}

    def input_of(self, rank: int) -> torch.Tensor:
        return torch.randn(self.count, generator=torch.Generator().manual_seed(1234 + rank))

    def bound(self, bits: int, bucket_size: int, algorithm: str) -> torch.Tensor:
        if bucket_size not in self._stats:
            ranges, mags = bucket_stats(self.x, bucket_size)
            dist.all_reduce(ranges, group=self.gloo)
            dist.all_reduce(mags, group=self.gloo)
            self._stats[bucket_size] = ranges, mags
        ranges, mags = self._stats[bucket_size]
        bound = bucket_bound(ranges, mags, bits, self.world, algorithm)
        return bound.repeat_interleave(bucket_size)[: self.count]


def _baseline_rows(inp: _Input, names: List[str], args) -> List[dict]:
    rows, gloo = [], inp.gloo
    for name in names:
        bits, method, wire_of = METHODS[name]
        y = inp.x.clone()
        method(y, gloo)  # checked call
        maxerr, relerr, _ = _errors(y, inp.exact, None)
        t = _time_calls(
            lambda y=y, m=method: m(y, gloo), args.iters, args.warmup, args.max_seconds, gloo
        )
        rows.append(
            dict(inp.base, algo=name, bits=bits, time_us=t * 1e6,
                 wire=int(wire_of(inp.count, inp.world)), maxerr=maxerr, relerr=relerr,
                 wrong=-1 if name != "gloo" else 0, same=_same_on_ranks(y, gloo))
        )  # fmt: skip
    return rows


def _verdict(inp: _Input, name: str, y: torch.Tensor, residual: torch.Tensor) -> int:
    """#wrong of a compressor's checked call: rank 0 gathers the residuals and replays the
    algorithm (benchmarks.allreduce_compressors); every rank gets the count."""
    gloo, rank = inp.gloo, dist.get_rank()
    gathered = [torch.empty_like(residual) for _ in range(inp.world)] if rank == 0 else None
    dist.gather(residual, gathered, dst=0, group=gloo)
    wrong = torch.zeros(1, dtype=torch.int64)
    if rank == 0:
        c = torch_cgx.cgx_backend().config()
        params = {p["name"]: p["default"] for p in compressors.params(name)}
        algorithm = next(a for a, i in ALGORITHMS.items() if i == c.algorithm)
        v = verdict(name, params, [inp.input_of(r) for r in range(inp.world)], y, gathered,
                    algorithm, fusion=c.fusion_buffer_bytes // 4,
                    segment=c.pipeline_segment_bytes // 4)  # fmt: skip
        wrong[0] = v.wrong
        if v.wrong:
            print(f"# {name}:{algorithm} size {4 * inp.count}: {v.detail}", flush=True)
    dist.broadcast(wrong, 0, group=gloo)
    return int(wrong)


def _cgx_row(inp: _Input, args, bound: Optional[torch.Tensor], fresh: bool, **fields) -> dict:
    """Times the cgx allreduce as configured now; fresh: every call starts from the input.
    Checked against ``bound``, or with none by the verdict of ``fields["compressor"]``."""
    gloo = inp.gloo
    y = inp.x.clone()
    if bound is None:  # checked call with residuals: the compressor's verdict
        backend, residual = torch_cgx.cgx_backend(), torch.zeros(inp.count)
        backend.allreduce_with(y, backend.config(), False, residual).wait()
        maxerr, relerr, _ = _errors(y, inp.exact, None)
        wrong = _verdict(inp, fields["compressor"], y, residual)
    else:
        dist.all_reduce(y)  # checked call
        maxerr, relerr, wrong = _errors(y, inp.exact, bound)
    row = dict(inp.base, wire=_wire(inp.world, gloo), maxerr=maxerr, relerr=relerr, wrong=wrong,
               same=_same_on_ranks(y, gloo), **fields)  # fmt: skip
    if fresh:
        call = lambda: dist.all_reduce(y.copy_(inp.x))  # noqa: E731
    else:
        call = lambda: dist.all_reduce(y)  # noqa: E731
    row["time_us"] = 1e6 * _time_calls(call, args.iters, args.warmup, args.max_seconds, gloo)
    return row


def _maxmin_rows(inp: _Input, bits_list: List[int], algorithms: List[str], args) -> List[dict]:
    rows = []
    for algorithm in algorithms:
        for bits in bits_list:
            torch_cgx.set_config(bits=bits, bucket_size=args.bucket_size, algorithm=algorithm,
                                 compressor="maxmin", compressor_params="")  # fmt: skip
            bound = inp.bound(bits, args.bucket_size, algorithm)
            rows.append(_cgx_row(inp, args, bound, False, algo=algorithm, bits=bits))
    return rows


def gather_only(name: str) -> bool:
    """Compressors the backend always allgather-reduces: sparse or data-dependent sizes."""
    traits = compressors.get(name).traits
    return traits["sparse"] or not traits["fixed_size"]


def _payload_bits(name: str, count: int) -> Optional[float]:
    """Payload bits per value of a fixed-size compressor at its defaults; None otherwise."""
    c = compressors.get(name)
    if not c.traits["fixed_size"] or count == 0:
        return None
    return round(8 * c.encoded_size(count) / count, 3)


def _compressor_rows(inp: _Input, names: List[str], algorithms: List[str], args) -> List[dict]:
    rows = []
    for name in names:
        defaults = {p["name"]: p["default"] for p in compressors.params(name)}
        bits = _payload_bits(name, inp.count)
        for algorithm in ["allgather"] if gather_only(name) else algorithms:
            if name == "maxmin":  # max-min takes the typed settings, not compressor_params
                mm_bits, bucket = int(defaults["bits"]), int(defaults["bucket_size"])
                torch_cgx.set_config(bits=mm_bits, bucket_size=bucket, algorithm=algorithm,
                                     compressor="maxmin", compressor_params="")  # fmt: skip
                bound = inp.bound(mm_bits, bucket, algorithm)
            else:
                torch_cgx.set_config(bits=32, algorithm=algorithm, compressor=name,
                                     compressor_params="")  # fmt: skip
                bound = None
            rows.append(
                _cgx_row(inp, args, bound, True, algo=algorithm, bits=bits, compressor=name)
            )
    return rows


def run(args: argparse.Namespace) -> List[dict]:
    if not dist.is_initialized():
        dist.init_process_group("cgx")
    world, rank = dist.get_world_size(), dist.get_rank()
    gloo = dist.new_group(backend="gloo")
    bits_list = _bits(args.bits)
    algorithms = [a for a in args.algorithms.split(",") if a]
    baselines = _baselines(args.baselines)
    names = _compressors(args.compressors)
    records = []
    for size in size_range(args.minbytes, args.maxbytes, args.stepfactor):
        inp = _Input(size, rank, world, gloo)
        rows = _baseline_rows(inp, baselines, args)
        rows += _maxmin_rows(inp, bits_list, algorithms, args)
        rows += _compressor_rows(inp, names, algorithms, args)
        for r in rows:
            r["speedup"] = rows[0]["time_us"] / r["time_us"]
            r["ideal"] = rows[0]["wire"] / max(r["wire"], 1)
            if rank == 0 and not args.quiet:
                print(format_row(r), flush=True)
        records += rows
    return records


def format_row(r: dict) -> str:
    t = r["time_us"] * 1e-6
    algbw = r["size"] / t / 1e9
    busbw = algbw * 2 * (r["world"] - 1) / r["world"]
    algo = r["algo"]
    if "compressor" in r:
        algo = f"{r['compressor']}:{'ag' if algo == 'allgather' else algo}"
    bits = r["bits"]
    cells = [
        str(r["size"]),
        str(r["count"]),
        r["type"],
        algo,
        "-" if bits is None else f"{bits:.3g}",
        f"{r['time_us']:.1f}",
        f"{algbw:.3f}",
        f"{busbw:.3f}",
        str(r["wire"]),
        f"{r['maxerr']:.2e}",
        f"{r['relerr']:.2e}",
        str(r["wrong"]) if r["wrong"] >= 0 else "-",
        f"{r['speedup']:.2f}",
        f"{r['ideal']:.2f}",
    ]
    return " ".join(c.rjust(w) for c, (_, w) in zip(cells, COLUMNS))


def header(world: int) -> str:
    names = " ".join(n.rjust(w) for n, w in COLUMNS)
    return (
        f"# torch_cgx allreduce benchmark: {world} ranks, torch {torch.__version__}, "
        f"codec ISA {torch_cgx._C.isa()}, {torch_cgx.codec.num_threads()} codec threads\n"
        f"# algbw, busbw in GB/s; wire = bytes sent per rank per call; "
        f"algo <compressor>:<algorithm> (ag: allgather-reduce)\n{names}"
    )


def main(argv: Optional[List[str]] = None) -> int:
    rc = maybe_run_on_hosts(sys.argv[1:] if argv is None else argv, "benchmarks.allreduce")
    if rc is not None:
        return rc
    args = parse_args(argv)
    if not dist.is_initialized():
        dist.init_process_group("cgx")
    if dist.get_rank() == 0 and not args.quiet:
        print(header(dist.get_world_size()), flush=True)
    records = run(args)
    wrong = sum(max(r["wrong"], 0) for r in records)
    differ = [r for r in records if r["algo"] in ALGORITHMS and not r["same"]]
    if dist.get_rank() == 0:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(records, f, indent=1)
        if not args.quiet:
            print(f"# out of bound: {wrong} elements" + ("" if wrong == 0 else "  <-- WRONG"))
        for r in differ:
            print(f"# results differ across ranks: {format_row(r)}  <-- WRONG", flush=True)
    dist.destroy_process_group()
    return 1 if wrong or differ else 0


if __name__ == "__main__":
    sys.exit(main())
