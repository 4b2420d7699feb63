"""The README's demo: the allreduce comparison and training with and without compression side by
side, ending with a one-line takeaway.

    python -m benchmarks.demo            # 2 emulated hosts behind a 1 Gbit/s link, else loopback
    python -m benchmarks.demo --loopback # 4 ranks on 127.0.0.1
    python -m benchmarks.demo --loopback --quick  # its smoke test: 2 ranks, small sizes, 20 steps

Where this machine allows it (root, network namespaces, tc: benchmarks.hosts), the ranks
run on 2 emulated hosts linked at 1 Gbit/s, the setting compression is made for; elsewhere on
loopback, where memory is the network and compression saves bytes but not time (it says why).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from typing import List, Optional

import torch
import torch.distributed as dist

LOOPBACK_WORLD = 4
HIDDEN = 1024  # the MLP's width: 1.12M parameters, 4.5 MB of fp32 gradients per step
STEPS = 60
HOSTS, LINK = 2, "1gbit"
# --quick (tests/test_demo.py): the same runs, smaller: 2 ranks, 256 KB of codec input, the
# allreduce at 64-256 KB, 20 steps of a 256-wide MLP (82k parameters).
QUICK = {"world": 2, "codec_mb": 0.25, "sizes": ("64K", "256K"), "hidden": 256, "steps": 20}


def _codec_table(mb: float = 16) -> None:
    try:
        from benchmarks.codec import codec_table, format_table
    except ImportError:
        return
    print(f"== max-min codec, {mb:g} MB of fp32, one thread (GB/s of fp32 input) ==", flush=True)
    print(format_table(codec_table([mb], [8, 4, 2], [1], 3)), flush=True)


def _where() -> str:
    world = dist.get_world_size()
    if os.environ.get("CGX_DEMO_HOSTS"):
        return f"{world} emulated hosts, {LINK}/s link each"
    return f"{world} ranks on this machine (loopback)"


def _allreduce_table(sizes=("1M", "16M")) -> None:
    from benchmarks import allreduce

    if dist.get_rank() == 0:
        print(f"\n== allreduce, {_where()} ==", flush=True)
        print(allreduce.header(dist.get_world_size()), flush=True)
    args = allreduce.parse_args(
        [
            "-b",
            sizes[0],
            "-e",
            sizes[1],
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


def _train(hook: str, steps: int, hidden: int = HIDDEN) -> tuple:
    """A small MLP regression trained with DDP; returns (losses every 10 steps, s / step)."""
    import torch_cgx

    rank = dist.get_rank()
    torch.manual_seed(0)
    teacher = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    model = torch.nn.Sequential(
        torch.nn.Linear(64, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, 1),
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
        world = dist.get_world_size()
        per_step = 2 * (world - 1) / world * grad_bytes
    else:
        per_step = (torch_cgx.cgx_backend().total_bytes_sent() - sent0) / steps
    return losses, seconds, per_step


def _params(hidden: int = HIDDEN) -> float:
    return (64 * hidden + hidden + hidden * hidden + hidden + hidden + 1) / 1e6


def _takeaway(runs: dict) -> str:
    gloo, cgx4 = runs["gloo"], runs["cgx-4"]
    speed = gloo[1] / cgx4[1]
    loss = 100 * (cgx4[0][-1] - gloo[0][-1]) / gloo[0][-1]
    where = "on this link" if os.environ.get("CGX_DEMO_HOSTS") else "on loopback"
    return (
        f"Takeaway {where}: 4-bit cgx sends {gloo[2] / cgx4[2]:.1f}x fewer bytes per step than "
        f"Gloo, steps {speed:.2f}x {'faster' if speed >= 1 else 'as fast'}, and ends at a loss "
        f"{loss:+.1f}% from Gloo's."
    )


def worker(quick: bool = False) -> None:
    torch.set_num_threads(1)
    import torch_cgx  # noqa: F401  (registers 'cgx')

    size = dict(QUICK) if quick else {}
    hidden, steps = size.get("hidden", HIDDEN), size.get("steps", STEPS)
    dist.init_process_group("cgx")
    if dist.get_rank() == 0 and not os.environ.get("CGX_DEMO_HOSTS"):
        _codec_table(size.get("codec_mb", 16))
    dist.barrier()
    _allreduce_table(size.get("sizes", ("1M", "16M")))
    runs = {how: _train(how, steps, hidden) for how in ("gloo", "cgx-8", "cgx-4")}
    if dist.get_rank() == 0:
        print(
            f"\n== DDP training, {_where()}, MLP {_params(hidden):.2f}M parameters: "
            "loss (max over ranks) =="
        )
        hows = list(runs)
        print("step  " + "".join(f"{h:>12}" for h in hows))
        for i in range(len(runs["gloo"][0])):
            print(f"{(i + 1) * 10:>4}  " + "".join(f"{runs[h][0][i]:>12.7f}" for h in hows))
        print("ms/step" + "".join(f"{runs[h][1] * 1e3:>12.1f}" for h in hows)[1:])
        print("KB/step" + "".join(f"{runs[h][2] / 1e3:>12.1f}" for h in hows)[1:])
        print(
            "\ncgx-b: the CGX hook at b bits per value (layers under 1024 values and biases "
            "exact).\nKB/step: bytes one rank sends per step. See docs/benchmarks.md for more."
        )
        print("\n" + _takeaway(runs), flush=True)
    dist.destroy_process_group()


def _on_hosts(quick: bool = False) -> int:
    from benchmarks import hosts

    print(
        f"torch_cgx demo: {HOSTS} emulated hosts (network namespaces), {LINK}/s links", flush=True
    )
    env = {"OMP_NUM_THREADS": "1", "CGX_CODEC_THREADS": "1", "CGX_DEMO_HOSTS": "1"}
    args = ["--worker"] + (["--quick"] if quick else [])
    return hosts.run_on_hosts(HOSTS, LINK, None, "benchmarks.demo", args, 600, env)


def _on_loopback(quick: bool = False) -> int:
    from benchmarks.hosts_run import repo_pythonpath

    env = dict(
        os.environ,
        PYTHONPATH=repo_pythonpath(os.environ),
        GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
        OMP_NUM_THREADS="1",
        CGX_CODEC_THREADS=os.environ.get("CGX_CODEC_THREADS", "1"),
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(QUICK["world"] if quick else LOOPBACK_WORLD),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        os.environ.get("CGX_DEMO_PORT", "29511"),
        "-m",
        "benchmarks.demo",
        "--worker",
    ]
    return subprocess.call(cmd + (["--quick"] if quick else []), env=env)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.demo")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--loopback", action="store_true", help="4 ranks on 127.0.0.1")
    parser.add_argument(
        "--quick", action="store_true", help="2 ranks, small sizes, 20 steps (its smoke test)"
    )
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.quick)
        return 0
    if not args.loopback:
        from benchmarks.hosts_net import HostsUnavailable, check_prerequisites

        try:
            check_prerequisites()
            return _on_hosts(args.quick)
        except HostsUnavailable as e:
            print(
                f"torch_cgx demo: on loopback ({e.reason}); on loopback memory is the network, "
                "so compression saves bytes, not time",
                flush=True,
            )
    return _on_loopback(args.quick)


if __name__ == "__main__":
    sys.exit(main())
