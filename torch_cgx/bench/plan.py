"""The planner's acceptance benchmark: ``auto`` against every fixed configuration and Gloo, and
the cost model's predictions against the measured times, per message size.

    torchrun --nproc-per-node 2 -m torch_cgx.bench.plan                # loopback (unlimited)
    python -m torch_cgx.bench.plan --hosts 4 --link 1gbit              # emulated hosts

Methods (all in one job, interleaved per size): ``gloo`` (a Gloo group's own allreduce), the
fixed configurations of the budget (exact through cgx, max-min 4 and 8 bits with SRA, ring and
tree, fp16) through ``allreduce_with``, and ``auto`` (``dist.all_reduce`` on a group set to
``compressor="auto"``, which applies the plan). Times are medians over ``--reps`` calls after
one warm-up; every rank runs the same calls; rank 0 prints. ``pred`` is the model's time for
the same configuration from the plan's own probe and calibration.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Dict, List, Optional

import torch
import torch.distributed as dist

from torch_cgx.plan.model import Option, predict

FIXED = {  # name: (compressor or None, params, algorithm)
    "cgx-exact": (None, {}, "sra"),
    "maxmin4-sra": ("maxmin", {"bits": 4, "bucket_size": 512}, "sra"),
    "maxmin4-ring": ("maxmin", {"bits": 4, "bucket_size": 512}, "ring"),
    "maxmin4-tree": ("maxmin", {"bits": 4, "bucket_size": 512}, "tree"),
    "maxmin8-sra": ("maxmin", {"bits": 8, "bucket_size": 512}, "sra"),
    "fp16": ("fp16", {}, "sra"),
}


def _native(name: str):
    from torch_cgx import get_config

    compressor, params, alg = FIXED[name]
    base = get_config().replace(compressor="maxmin", compressor_params="", algorithm=alg)
    if compressor is None:
        return base.replace(bits=32).to_native()
    if compressor == "maxmin":
        return base.replace(bits=params["bits"], bucket_size=params["bucket_size"]).to_native()
    return base.replace(bits=32, compressor=compressor, compressor_params=params).to_native()


def _option(name: str, n: int) -> Option:
    compressor, params, alg = FIXED[name]
    segments = -(-4 * n // (4 << 20)) if alg == "sra" else 1  # the default 4 MiB segments
    return Option(compressor, tuple(sorted(params.items())), alg, max(1, segments))


def _runner(name: str, gloo, n: int):
    from torch_cgx import cgx_backend

    if name == "gloo":
        return lambda t: dist.all_reduce(t, group=gloo)
    if name == "auto":
        return lambda t: dist.all_reduce(t)
    native = _native(name)
    return lambda t: cgx_backend().allreduce_with(t, native, False).wait()


def measure(sizes: List[int], methods: List[str], reps: int, gloo) -> Dict[int, Dict[str, float]]:
    out: Dict[int, Dict[str, float]] = {}
    for n in sizes:
        x = torch.randn(n, generator=torch.Generator().manual_seed(dist.get_rank()))
        samples: Dict[str, List[float]] = {m: [] for m in methods}
        runs = {m: _runner(m, gloo, n) for m in methods}
        for m in methods:
            runs[m](x.clone())  # warm
        for _ in range(reps if n < (1 << 24) else max(2, reps // 3)):
            for m in methods:  # interleaved: the machine's noise hits every method alike
                t = x.clone()
                dist.barrier(group=gloo)
                t0 = time.perf_counter()
                runs[m](t)
                samples[m].append(time.perf_counter() - t0)
        out[n] = {m: statistics.median(s) for m, s in samples.items()}
    return out


def report(results, predicted, plan_rules) -> None:
    names = list(next(iter(results.values())))
    fixed = [m for m in names if m in FIXED]
    print("| bytes | " + " | ".join(names) + " | best fixed | auto / best | auto / gloo |")
    print("|---:|" + "---:|" * (len(names) + 3))
    worst_best, worst_gloo, errors = 0.0, 0.0, []
    for n, row in results.items():
        best = min(fixed, key=lambda m: row[m])
        vs_best, vs_gloo = row["auto"] / row[best], row["auto"] / row["gloo"]
        worst_best, worst_gloo = max(worst_best, vs_best), max(worst_gloo, vs_gloo)
        cells = " | ".join(f"{row[m] * 1e3:.3f}" for m in names)
        print(f"| {4 * n} | {cells} | {best} | {vs_best:.2f} | {vs_gloo:.2f} |")
        errors += [abs(predicted[n][m] / row[m] - 1) for m in fixed]
    print(f"\nauto vs best fixed: worst {worst_best:.2f}x (target <= 1.10); auto vs Gloo: worst "
          f"{worst_gloo:.2f}x (target <= 1.05)")  # fmt: skip
    print("\nPredicted / measured (ms), fixed configurations:")
    print("| bytes | " + " | ".join(fixed) + " |")
    print("|---:|" + "---:|" * len(fixed))
    for n, row in results.items():
        cells = " | ".join(f"{predicted[n][m] * 1e3:.3f} / {row[m] * 1e3:.3f}" for m in fixed)
        print(f"| {4 * n} | {cells} |")
    print(f"\nprediction error: median {statistics.median(errors):.0%} (target <= 20%), "
          f"max {max(errors):.0%} over {len(errors)} cases")  # fmt: skip
    print(f"plan: {plan_rules}")


def parse_args(argv: Optional[List[str]]):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--min-bytes", type=int, default=4 << 10)
    p.add_argument("--max-bytes", type=int, default=256 << 20)
    p.add_argument("--factor", type=int, default=4)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--bits", type=int, default=4, help="the budget: at least this many bits")
    return p.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    from torch_cgx.bench.hosts import maybe_run_on_hosts

    rc = maybe_run_on_hosts(sys.argv[1:] if argv is None else argv, "torch_cgx.bench.plan")
    if rc is not None:
        return rc
    args = parse_args(argv)
    import torch_cgx
    from torch_cgx.plan import auto

    dist.init_process_group("cgx")
    gloo = dist.new_group(backend="gloo")
    torch_cgx.set_config(compressor="auto", bits=args.bits)
    config = torch_cgx.get_config()
    host = auto.calibrate(auto.codecs_of(auto.budget_of(config)) + [("fp16", {})])
    exact = config.replace(compressor="maxmin", bits=32).to_native()
    link = auto.probe_link(torch_cgx.cgx_backend(), exact, host)
    sizes, n = [], args.min_bytes // 4
    while 4 * n <= args.max_bytes:
        sizes.append(n)
        n *= args.factor
    methods = ["gloo", *FIXED, "auto"]
    results = measure(sizes, methods, args.reps, gloo)
    w = dist.get_world_size()
    predicted = {n: {m: predict(_option(m, n), n, w, link, host) for m in FIXED} for n in sizes}
    if dist.get_rank() == 0:
        print(f"W = {w}; probed link {link.bandwidth / 1e6:.4g} MB/s, "
              f"{link.latency * 1e6:.1f} us a message\n")  # fmt: skip
        report(results, predicted, auto.describe(auto.rules_of(torch_cgx.cgx_backend())))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
