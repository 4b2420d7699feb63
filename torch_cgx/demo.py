"""The README's demo: 4 local ranks, the allreduce comparison, and training with and without
compression side by side.

    python -m torch_cgx.demo            # starts 4 ranks with torchrun (127.0.0.1)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist

WORLD = 4


def _codec_table() -> None:
    try:
        from torch_cgx.bench.codec import codec_table, format_table
    except ImportError:
        return
    print("== max-min codec, 16 MB of fp32, one thread (GB/s of fp32 input) ==", flush=True)
    print(format_table(codec_table([16], [8, 4, 2], [1], 3)), flush=True)


def _allreduce_table() -> None:
    from torch_cgx.bench import allreduce

    if dist.get_rank() == 0:
        print(f"\n== allreduce, {WORLD} ranks on this machine (loopback) ==", flush=True)
        print(allreduce.header(WORLD), flush=True)
    args = allreduce.parse_args(
        [
            "-b",
            "1M",
            "-e",
            "16M",
            "-f",
            "4",
            "--bits",
            "8,4",
            "--algorithms",
            "sra",
            "-n",
            "5",
            "-w",
            "1",
        ]
    )
    allreduce.run(args)


def _train(hook: str, steps: int) -> tuple:
    """A small MLP regression trained with DDP; returns (losses every 10 steps, s / step)."""
    import torch_cgx

    rank = dist.get_rank()
    torch.manual_seed(0)
    teacher = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 1),
    )
    group = dist.new_group(backend="gloo") if hook == "gloo" else None
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
    if hook.startswith("cgx"):
        bits = int(hook.split("-")[1])
        state = torch_cgx.CGXState(None, compression_params={"bits": bits, "bucket_size": 512})
        ddp.register_comm_hook(state, torch_cgx.cgx_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.02, momentum=0.9)
    sent0 = torch_cgx.cgx_backend().total_bytes_sent()
    losses, start = [], time.perf_counter()
    for step in range(steps):
        g = torch.Generator().manual_seed(step * 100 + rank)
        x = torch.randn(128, 64, generator=g)
        with torch.no_grad():
            y = teacher(x)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 9:
            t = loss.detach().clone()
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            losses.append(t.item())
    seconds = (time.perf_counter() - start) / steps
    if hook == "gloo":  # a ring allreduce of the gradients: 2 (W - 1) / W of their bytes per step
        grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        per_step = 2 * (WORLD - 1) / WORLD * grad_bytes
    else:
        per_step = (torch_cgx.cgx_backend().total_bytes_sent() - sent0) / steps
    return losses, seconds, per_step


def worker() -> None:
    torch.set_num_threads(1)
    import torch_cgx  # noqa: F401  (registers 'cgx')

    dist.init_process_group("cgx")
    if dist.get_rank() == 0:
        _codec_table()
    dist.barrier()
    _allreduce_table()
    runs = {how: _train(how, 60) for how in ("gloo", "cgx-8", "cgx-4")}
    if dist.get_rank() == 0:
        print(f"\n== DDP training, {WORLD} ranks, MLP 0.3M parameters: loss (max over ranks) ==")
        hows = list(runs)
        print("step  " + "".join(f"{h:>12}" for h in hows))
        for i in range(len(runs["gloo"][0])):
            print(f"{(i + 1) * 10:>4}  " + "".join(f"{runs[h][0][i]:>12.7f}" for h in hows))
        print("ms/step" + "".join(f"{runs[h][1] * 1e3:>12.1f}" for h in hows)[1:])
        print("KB/step" + "".join(f"{runs[h][2] / 1e3:>12.1f}" for h in hows)[1:])
        print(
            "\ncgx-b: the CGX hook at b bits per value (layers under 1024 values and biases "
            "exact).\nKB/step: bytes one rank sends per step. On loopback, memory is the "
            "network: compression saves bytes, not time.\nSee docs/benchmarks.md for slow links."
        )
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(prog="torch_cgx.demo")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    if parser.parse_args().worker:
        worker()
        return 0
    env = dict(
        os.environ,
        GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
        OMP_NUM_THREADS="1",
        CGX_CODEC_THREADS=os.environ.get("CGX_CODEC_THREADS", "1"),
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(WORLD),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        os.environ.get("CGX_DEMO_PORT", "29511"),
        "-m",
        "torch_cgx.demo",
        "--worker",
    ]
    return subprocess.call(cmd, env=env)


if __name__ == "__main__":
    sys.exit(main())
