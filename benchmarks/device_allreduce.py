"""Allreduce of device tensors through a cgx group: ``python -m benchmarks.device_allreduce``.

    python -m benchmarks.device_allreduce --device cuda -b 1M -e 64M -f 4 --bits 4,8
    torchrun --nproc-per-node 8 -m benchmarks.device_allreduce --device cuda

Without ``torchrun`` it starts ``--ranks`` processes itself (default: one per GPU, at least 2);
rank ``r`` uses GPU ``r % device_count``, so with one GPU the ranks share it and the cgx group's
device plane carries its payloads over its own Gloo group (NCCL needs a GPU per rank). For each
size it times, on the same device tensors (every call starts again from the input):

- the exact allreduce of the carrier torch would use: NCCL where every rank has a GPU of its
  own, else Gloo (which stages CUDA tensors through the host itself);
- a cgx group (``data_plane="auto"``: CUDA tensors go through the device plane) per
  ``--algorithms`` x ``--bits`` (max-min, ``--bucket-size``).

``--device cpu`` runs the same on CPU tensors with ``data_plane="device"`` (the code a CUDA tensor
takes, over Gloo): a smoke test, not a speed figure. ``time`` is the slowest rank's mean per
call after a synchronisation, ``algbw = size / time``; every cgx result is checked against the
exact fp64 sum with the bound of docs/algorithms.md (``#wrong`` must be 0) and must be
bit-identical on every rank; otherwise the exit status is 1.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from typing import List, Optional, Sequence

import torch
import torch.distributed as dist

from benchmarks.allreduce import _errors, _Input, _same_on_ranks
from benchmarks.sizes import parse_size, size_range

COLUMNS = [("size(B)", 10), ("count", 10), ("algo", 12), ("bits", 4), ("time(us)", 10),
           ("algbw", 8), ("maxerr", 9), ("relerr", 9), ("#wrong", 6), ("same", 5),
           ("speedup", 7)]  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.device_allreduce",
                                description=__doc__.split("\n")[0])  # fmt: skip
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--ranks", type=int, default=0, help="processes to start (0: GPUs, >= 2)")
    p.add_argument("-b", "--minbytes", default="1M", type=parse_size)
    p.add_argument("-e", "--maxbytes", default="64M", type=parse_size)
    p.add_argument("-f", "--stepfactor", default=4, type=int)
    p.add_argument("--bits", default="4,8", help="max-min bit widths, comma list (4,8)")
    p.add_argument("--algorithms", default="sra", help="cgx algorithms, comma list (sra)")
    p.add_argument("--bucket-size", default=512, type=int)
    p.add_argument("-n", "--iters", default=20, type=int, help="timed calls per row (max)")
    p.add_argument("-w", "--warmup", default=2, type=int)
    p.add_argument("--max-seconds", default=2.0, type=float, help="timed seconds per row (max)")
    p.add_argument("--timeout", default=600.0, type=float, help="seconds for the whole run")
    return p


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn, device, args, gloo) -> float:
    """Mean seconds per call on the slowest rank, the device synchronised around the loop."""
    for _ in range(max(1, args.warmup)):
        fn()
    _sync(device)
    dist.barrier(group=gloo)
    t = time.perf_counter()
    fn()
    _sync(device)
    first = time.perf_counter() - t
    n = torch.tensor([max(1, min(args.iters, int(args.max_seconds / max(first, 1e-6))))])
    dist.all_reduce(n, op=dist.ReduceOp.MIN, group=gloo)  # every rank runs the same count
    dist.barrier(group=gloo)
    t = time.perf_counter()
    for _ in range(int(n)):
        fn()
    _sync(device)
    secs = torch.tensor([(time.perf_counter() - t) / int(n)], dtype=torch.float64)
    dist.all_reduce(secs, op=dist.ReduceOp.MAX, group=gloo)
    return float(secs)


def _row(inp: _Input, group, device, args, gloo, bound, **fields) -> dict:
    x = inp.x.to(device)
    y = x.clone()
    dist.all_reduce(y, group=group)  # the checked call
    host = y.cpu()
    maxerr, relerr, wrong = _errors(host, inp.exact, bound)
    same = _same_on_ranks(host, gloo)
    t = _time(lambda: dist.all_reduce(y.copy_(x), group=group), device, args, gloo)
    return dict(size=inp.base["size"], count=inp.count, time_us=t * 1e6, maxerr=maxerr,
                relerr=relerr, wrong=wrong, same=same, **fields)  # fmt: skip


def format_row(r: dict, exact_us: float) -> str:
    cells = [str(r["size"]), str(r["count"]), r["algo"], str(r["bits"]), f"{r['time_us']:.1f}",
             f"{r['size'] / r['time_us'] / 1e3:.3f}", f"{r['maxerr']:.2e}", f"{r['relerr']:.2e}",
             "-" if r["wrong"] < 0 else str(r["wrong"]), "yes" if r["same"] else "NO",
             f"{exact_us / r['time_us']:.2f}"]  # fmt: skip
    return " ".join(c.rjust(w) for c, (_, w) in zip(cells, COLUMNS))


def _groups(args, device, world):
    """(exact group and its name, {(algorithm, bits): cgx group}); collective."""
    import torch_cgx

    own_gpu = device.type == "cuda" and int(os.environ.get("LOCAL_WORLD_SIZE", world)) <= (
        torch.cuda.device_count())  # fmt: skip
    if own_gpu and dist.is_nccl_available():
        exact, name = dist.new_group(backend="nccl"), "nccl"
    else:
        exact, name = dist.new_group(backend="gloo"), "gloo"
    plane = "auto" if device.type == "cuda" else "device"
    cgx = {}
    for algorithm in [a for a in args.algorithms.split(",") if a]:
        for bits in [int(b) for b in args.bits.split(",") if b]:
            opts = torch_cgx.Options(data_plane=plane, bits=bits, bucket_size=args.bucket_size,
                                     algorithm=algorithm)  # fmt: skip
            cgx[algorithm, bits] = dist.new_group(backend="cgx", pg_options=opts)
    return exact, name, cgx


def rank_main(args) -> int:
    import torch_cgx  # noqa: F401  (registers the cgx backend)

    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    gloo = dist.group.WORLD
    exact, exact_name, cgx = _groups(args, device, world)
    if rank == 0:
        gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
        print(f"# device allreduce: {world} ranks on {device} ({gpu}), torch {torch.__version__}"
              f"; algbw GB/s; speedup = {exact_name} time / this row's\n"
              + " ".join(n.rjust(w) for n, w in COLUMNS), flush=True)  # fmt: skip
    bad = 0
    for size in size_range(args.minbytes, args.maxbytes, args.stepfactor):
        inp = _Input(size, rank, world, gloo)
        rows = [_row(inp, exact, device, args, gloo, None, algo=exact_name, bits=32)]
        for (algorithm, bits), group in cgx.items():
            bound = inp.bound(bits, args.bucket_size, algorithm)
            rows.append(_row(inp, group, device, args, gloo, bound, algo=f"cgx:{algorithm}",
                             bits=bits))  # fmt: skip
        for r in rows:
            bad += r["wrong"] > 0 or not r["same"]
            if rank == 0:
                print(format_row(r, rows[0]["time_us"]), flush=True)
    dist.destroy_process_group()
    return 1 if bad else 0


def _spawned(rank: int, world: int, port: int, argv: List[str]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", "lo"))  # fmt: skip
    if rank_main(build_parser().parse_args(argv)) != 0:
        raise SystemExit(1)


def _launch(args, argv: List[str]) -> int:
    import torch.multiprocessing as mp

    world = args.ranks or max(2, torch.cuda.device_count() if args.device == "cuda" else 2)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.start_processes(_spawned, args=(world, port, argv), nprocs=world, join=False,
                             start_method="spawn")  # fmt: skip
    deadline = time.monotonic() + args.timeout
    try:
        while not ctx.join(timeout=5.0):
            if time.monotonic() > deadline:
                print(f"benchmarks.device_allreduce: still running after {args.timeout:g} s",
                      file=sys.stderr)  # fmt: skip
                return 1
    except Exception as e:  # noqa: BLE001 - a rank failed: its message, then exit status 1
        print(f"benchmarks.device_allreduce: {e}", file=sys.stderr)
        return 1
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
                p.join(5)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("benchmarks.device_allreduce: --device cuda, but torch sees no CUDA device "
              "(use --device cpu)", file=sys.stderr)  # fmt: skip
        return 2
    if args.ranks < 0 or args.ranks == 1:
        print("benchmarks.device_allreduce: --ranks must be 0 or >= 2", file=sys.stderr)
        return 2
    if "RANK" in os.environ:  # under torchrun
        return rank_main(args)
    return _launch(args, argv)


if __name__ == "__main__":
    sys.exit(main())
