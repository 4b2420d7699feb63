"""Soak: many compressed allreduces of varying sizes and settings on 4 ranks, then many cycles of
creating and destroying process groups; resident memory, threads and open file descriptors are
sampled per rank, and a leak fails the run (exit code 1).

    python -m benchmarks.soak                        # 10,000 allreduces, 100 cycles
    python -m benchmarks.soak --calls 600 --cycles 10  # the test's short version

Phase 1: a warm-up that runs every setting (max-min 1-8 bits x buckets 128 / 512 x SRA /
ring / tree / allgather) on every size (1 Ki to 1 Mi values) and dtype (fp32 / fp16 / bf16) once,
so that every buffer has reached its largest; then ``--calls`` random allreduces (the settings
change every 50 calls). Resident memory is taken after the warm-up and at the end.
Phase 2: ``--cycles`` times init_process_group("cgx") + a cgx and a Gloo subgroup + one
allreduce on each + destroy.
The ranks run with glibc's mmap threshold pinned at 128 KiB (``--glibc-default``: not), so
that the allocator's one-off steps do not pass for growth. Limits: threads and descriptors may
not grow; resident memory (after malloc_trim) may grow by at
most ``--max-growth`` (1 % by default) from the middle of phase 1 (the median of the samples at
40-70 % of the calls) to its end (70-100 %): a single sample moves by +-1 % with the heap under
mixed calls, a leak keeps its slope; and by at most 1 % per 10 cycles plus
8 MiB over phase 2.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from typing import Dict, List, Optional


def _trim() -> None:
    """Hands the allocator's free pages back to the system (glibc's malloc_trim), so that the
    resident size measures what is in use, not what malloc keeps cached."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def sample() -> Dict[str, int]:
    _trim()
    with open("/proc/self/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return {"rss_kb": rss, "threads": len(os.listdir("/proc/self/task")),
            "fds": len(os.listdir("/proc/self/fd"))}  # fmt: skip


SETTINGS = [dict(bits=b, bucket_size=q, algorithm=a) for b in range(1, 9) for q in (128, 512)
            for a in ("sra", "ring", "tree", "allgather")]  # fmt: skip


def _phase_calls(rank: int, calls: int) -> Dict:
    """Warm-up: every setting x size x dtype once (every buffer at its largest); then ``calls``
    random ones (the settings change every 50 calls)."""
    import torch
    import torch.distributed as dist

    import torch_cgx

    rng = random.Random(1234)  # the same choices on every rank
    gen = torch.Generator().manual_seed(rank)
    data = {n: torch.randn(n, generator=gen) for n in (1 << 10, 1 << 14, 1 << 17, 1 << 20)}
    dtypes = (torch.float32, torch.float16, torch.bfloat16)
    for setting in SETTINGS:
        torch_cgx.set_config(**setting)
        for x in data.values():
            for dtype in dtypes:
                dist.all_reduce(x.to(dtype, copy=True))
    out = {"warm": sample(), "warmup_calls": len(SETTINGS) * len(data) * len(dtypes), "trend": []}
    start = time.monotonic()
    for k in range(calls):
        if k % 50 == 0:
            torch_cgx.set_config(**rng.choice(SETTINGS))
        # A copy: reduced in place, the same tensor would grow W-fold at every call and be
        # inf / NaN within a hundred calls, which is not the data a training run reduces.
        dist.all_reduce(data[rng.choice(list(data))].to(rng.choice(dtypes), copy=True))
        if (k + 1) % max(1, calls // 10) == 0:
            out["trend"].append({"calls": k + 1, **sample()})
    out["end"] = sample()
    out["seconds"] = time.monotonic() - start
    return out


def _phase_cycles(rank: int, cycles: int, store_dir: str) -> List[Dict]:
    """A FileStore per cycle: re-creating a TCPStore on one port at once races in torch itself
    (a client may reach the previous server while it closes), which is not what is measured."""
    import torch
    import torch.distributed as dist

    import torch_cgx  # noqa: F401

    trend = []
    world = int(os.environ["WORLD_SIZE"])
    for c in range(cycles):
        dist.init_process_group("cgx", init_method=f"file://{store_dir}/store{c}", rank=rank,
                                world_size=world)  # fmt: skip
        sub = dist.new_group([0, 1], backend="cgx")
        gsub = dist.new_group([2, 3], backend="gloo")
        t = torch.ones(4096)
        dist.all_reduce(t)
        if rank in (0, 1):
            dist.all_reduce(t, group=sub)
        if rank in (2, 3):
            dist.all_reduce(t, group=gsub)
        del sub, gsub
        dist.barrier()  # nobody tears the store down under another rank (env:// reuses the port)
        dist.destroy_process_group()
        if c in (0, cycles // 10, cycles - 1) or c % 10 == 9:
            trend.append({"cycle": c + 1, **sample()})
    return trend


def _rank(rank: int, world: int, port: int, args, out_dir: str) -> None:
    # (MALLOC_MMAP_THRESHOLD_ is read by glibc at start-up: run() sets it for the children.)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), GLOO_SOCKET_IFNAME="lo",
                      CGX_CODEC_THREADS="1")  # fmt: skip
    import torch
    import torch.distributed as dist

    import torch_cgx  # noqa: F401

    torch.set_num_threads(1)
    dist.init_process_group("cgx")
    before = sample()
    calls = _phase_calls(rank, args.calls)
    dist.barrier()
    dist.destroy_process_group()
    result = {"start": before, **calls, "cycles": _phase_cycles(rank, args.cycles, out_dir)}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


def _rss_window(res: Dict, lo: float, hi: float) -> float:
    """The median resident size (kB) of the trend samples between fractions lo and hi of the
    measured calls: a single sample moves by +-1 % with glibc's heap under mixed sizes, dtypes
    and settings (measured: no slope with one setting over 16,000 calls), a leak keeps a slope."""
    trend = res["trend"]
    window = [t["rss_kb"] for t in trend[int(lo * len(trend)) : max(int(hi * len(trend)), 1)]]
    return statistics.median(window or [res["end"]["rss_kb"]])


def _growth(res: Dict) -> float:
    """Resident growth from the middle of the calls (40-70 %) to their end (70-100 %)."""
    return _rss_window(res, 0.7, 1.0) / _rss_window(res, 0.4, 0.7) - 1


def verdict(results: List[Dict], max_growth: float) -> List[str]:
    """What leaked, per rank (empty: nothing)."""
    bad = []
    for r, res in enumerate(results):
        warm, end = res["warm"], res["end"]
        growth = _growth(res)
        if growth > max_growth:
            bad.append(f"rank {r}: resident memory grew {growth:.2%} over the second half")
        for key in ("threads", "fds"):
            if end[key] > warm[key]:
                bad.append(f"rank {r}: {key} {warm[key]} -> {end[key]} during the calls")
        cyc = res["cycles"]
        if len(cyc) >= 2:
            first, last = cyc[0], cyc[-1]
            for key in ("threads", "fds"):
                if last[key] > first[key]:
                    bad.append(f"rank {r}: {key} {first[key]} -> {last[key]} over the cycles")
            allowed = first["rss_kb"] * (1 + 0.01 * last["cycle"] / 10) + 8192
            if last["rss_kb"] > allowed:
                bad.append(f"rank {r}: resident memory {first['rss_kb']} -> {last['rss_kb']} "
                           f"kB over {last['cycle']} cycles")  # fmt: skip
    return bad


def report(results: List[Dict], args) -> None:
    r0 = results[0]
    print(f"phase 1: {r0['warmup_calls']} warm-up, then {args.calls} measured compressed "
          f"allreduces per rank, the latter in {r0['seconds']:.1f} s (4 ranks)")  # fmt: skip
    print("| rank | RSS after warm-up MB | middle MB | last third MB | growth | threads | fds |")
    print("|---:|---:|---:|---:|---:|---|---|")
    for r, res in enumerate(results):
        w, e = res["warm"], res["end"]
        mid, last = _rss_window(res, 0.4, 0.7), _rss_window(res, 0.7, 1.0)
        print(f"| {r} | {w['rss_kb'] / 1024:.1f} | {mid / 1024:.1f} | {last / 1024:.1f} | "
              f"{_growth(res):+.2%} | {w['threads']}/{e['threads']} | "
              f"{w['fds']}/{e['fds']} |")  # fmt: skip
    print("\nphase 1, rank 0: calls, RSS MB, threads, fds")
    for s in r0["trend"]:
        print(f"  {s['calls']:>6}  {s['rss_kb'] / 1024:8.1f}  {s['threads']:>3}  {s['fds']:>3}")
    print(f"\nphase 2: {args.cycles} init/destroy cycles (rank 0): cycle, RSS MB, threads, fds")
    for s in r0["cycles"]:
        print(f"  {s['cycle']:>4}  {s['rss_kb'] / 1024:8.1f}  {s['threads']:>3}  {s['fds']:>3}")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(args) -> int:
    import torch.multiprocessing as mp

    world = 4
    if not args.glibc_default:
        # glibc raises its mmap threshold each time a large block is freed, after which large
        # blocks come from the heap and its pages stay resident: one-off steps of a few MB that
        # look like growth. Pinned at its initial 128 KiB, what remains is what is in use.
        os.environ["MALLOC_MMAP_THRESHOLD_"] = "131072"  # for the children; restored below
    with tempfile.TemporaryDirectory() as d:
        ctx = mp.start_processes(_rank, args=(world, _free_port(), args, d), nprocs=world,
                                 join=False, start_method="spawn")  # fmt: skip
        deadline = time.monotonic() + args.timeout
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                print(f"soak: ranks still running after {args.timeout} s (a hang?)")
                return 1
        results = []
        for r in range(world):
            with open(os.path.join(d, f"rank{r}.json")) as f:
                results.append(json.load(f))
    report(results, args)
    bad = verdict(results, args.max_growth)
    print("\n" + ("LEAK: " + "; ".join(bad) if bad else "no leak: threads and descriptors flat, "
                  "memory within the limits"))  # fmt: skip
    return 1 if bad else 0


def parse_args(argv: Optional[List[str]]):
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.soak", description=__doc__.split("\n")[0]
    )
    p.add_argument("--calls", type=int, default=10_000)
    p.add_argument("--cycles", type=int, default=100)
    p.add_argument("--max-growth", type=float, default=0.01)
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--glibc-default", action="store_true",
                   help="keep glibc's dynamic mmap threshold (steps of a few MB)")  # fmt: skip
    return p.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    before = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    try:
        return run(parse_args(argv))
    finally:
        if before is None:
            os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)
        else:
            os.environ["MALLOC_MMAP_THRESHOLD_"] = before


if __name__ == "__main__":
    sys.exit(main())
