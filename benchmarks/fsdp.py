"""FSDP2 benchmark: communication time, bytes and loss of fully_shard training per method.

    python -m benchmarks.fsdp --hosts 2 --link 1gbit        # emulated hosts (docs/hosts.md)
    torchrun --nproc-per-node 2 -m benchmarks.fsdp           # loopback

The model is a stack of ``--layers`` residual blocks x + GELU(Linear(d, d) x) (``--dim``), each
block and the whole model ``fully_shard``-ed, trained with Adam on a fixed random
linear regression task, the same batches for every method. Methods (one after another, from the same
initial weights):

  gloo       FSDP2's own reduce-scatter and all-gather in fp32
  bf16       the same with MixedPrecisionPolicy(reduce_dtype=bfloat16)
  rs8, rs4   torch_cgx.fsdp's compressed reduce-scatter, max-min 8 / 4 bits (buckets of 512)
  rs8+ag8, rs4+ag8
             the same and the 8-bit block-quantized parameter all-gather

``RS ms`` / ``AG ms`` are the time one rank spends per step inside FSDP2's reduce-scatter /
all-gather calls (every method runs through a custom comm object, the exact ones calling torch's
collectives, so they are timed alike); ``MB`` the bytes one rank sends per step in them (exact
ones: (W - 1) / W of the buffer); ``loss`` the mean over ranks of the last 10 steps' loss.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from typing import List, Optional

import torch
import torch.distributed as dist

from torch_cgx import fsdp

METHODS = ("gloo", "bf16", "rs8", "rs4", "rs8+ag8", "rs4+ag8")


class _Timed:
    """Time and bytes of one kind of FSDP2 comm (reduce-scatter or all-gather)."""

    def __init__(self) -> None:
        self.seconds, self.bytes = 0.0, 0


class _Meters:
    def __init__(self) -> None:
        self.rs, self.ag = _Timed(), _Timed()


def _exact_comms(meters: _Meters):
    class RS(fsdp._ReduceScatter):
        def allocate(self, size, *, dtype, device):
            return torch.empty(size, dtype=dtype, device=device)

        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            t0 = time.perf_counter()
            dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group)
            meters.rs.seconds += time.perf_counter() - t0
            w = group.size()
            meters.rs.bytes += (w - 1) * output_tensor.numel() * output_tensor.element_size()

    class AG(fsdp._AllGather):
        def allocate(self, size, *, dtype, device):
            return torch.empty(size, dtype=dtype, device=device)

        def __call__(self, output_tensor, input_tensor, group, async_op=False):
            t0 = time.perf_counter()
            dist.all_gather_into_tensor(output_tensor, input_tensor, group=group)
            meters.ag.seconds += time.perf_counter() - t0
            n = input_tensor.numel() * input_tensor.element_size()
            meters.ag.bytes += (group.size() - 1) * n

    return RS(), AG()


class _Block(torch.nn.Module):
    """x + GELU(Linear(x)): a residual block, so that a deep stack learns from the first step."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(dim, dim)

    def forward(self, x):
        return x + torch.nn.functional.gelu(self.linear(x))


def build(method: str, args, meters: _Meters):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[_Block(args.dim) for _ in range(args.layers)])
    mp = MixedPrecisionPolicy(reduce_dtype=torch.bfloat16 if method == "bf16" else None)
    # a CPU mesh, named: FSDP2's default mesh is CUDA's wherever a GPU is
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for block in model:
        fully_shard(block, mp_policy=mp, mesh=mesh)
    fully_shard(model, mp_policy=mp, mesh=mesh)
    rs, ag = _exact_comms(meters)
    if method not in ("gloo", "bf16"):
        bits = int(method[2])
        rs = _metered(fsdp.CompressedReduceScatter("maxmin", min_numel=4096, bits=bits), meters.rs)
        if "ag8" in method:
            ag = _metered(fsdp.CompressedAllGather(8), meters.ag)
    for m in model.modules():
        if hasattr(m, "set_custom_reduce_scatter"):
            m.set_custom_reduce_scatter(rs)
            m.set_custom_all_gather(ag)
    return model


def _metered(comm, meter: _Timed):
    """A subclass instance of comm's class whose calls are timed and whose bytes are counted."""
    base = type(comm)

    class Metered(base):
        def __call__(self, *a, **k):
            t0, b0 = time.perf_counter(), self.bytes_sent
            out = base.__call__(self, *a, **k)
            meter.seconds += time.perf_counter() - t0
            meter.bytes += self.bytes_sent - b0
            return out

    comm.__class__ = Metered
    return comm


def run_method(method: str, args) -> dict:
    meters = _Meters()
    model = build(method, args, meters)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    rank, world = dist.get_rank(), dist.get_world_size()
    target = torch.randn(args.dim, args.dim, generator=torch.Generator().manual_seed(7))
    target /= args.dim**0.5
    losses, start = [], None
    for step in range(args.steps):
        if step == args.warmup:
            start = [(m.seconds, m.bytes) for m in (meters.rs, meters.ag)]
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(args.batch, args.dim, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), x @ target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t = loss.detach().clone()
        dist.all_reduce(t)
        losses.append(t.item() / world)
    timed = args.steps - args.warmup
    tail = losses[-10:]
    row = {"method": method, "loss": sum(tail) / len(tail), "first": losses[0]}
    for name, m, (s0, b0) in zip(("rs", "ag"), (meters.rs, meters.ag), start):
        row[f"{name}_ms"] = (m.seconds - s0) / timed * 1e3
        row[f"{name}_mb"] = (m.bytes - b0) / timed / 1e6
    return row


def parse_args(argv: Optional[List[str]]):
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.fsdp", description=__doc__.split("\\n")[0]
    )
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-3)
    args = p.parse_args(argv)
    args.methods = [m for m in args.methods.split(",") if m]
    bad = [m for m in args.methods if m not in METHODS]
    if bad or not args.methods:
        p.error(f"unknown method(s) {bad} (choose from {', '.join(METHODS)})")
    return args


def main(argv: Optional[List[str]] = None) -> int:
    from benchmarks.hosts import maybe_run_on_hosts

    rc = maybe_run_on_hosts(sys.argv[1:] if argv is None else argv, "benchmarks.fsdp")
    if rc is not None:
        return rc
    args = parse_args(argv)
    dist.init_process_group("gloo")
    rows = [run_method(m, args) for m in args.methods]
    if dist.get_rank() == 0:
        ref = next((r for r in rows if r["method"] == "gloo"), None)
        print("| method | RS ms | RS vs gloo | RS MB | AG ms | AG MB | loss | loss vs gloo |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            ratio = f"{r['rs_ms'] / ref['rs_ms']:.2f}x" if ref else "-"
            gap = f"{r['loss'] / ref['loss'] - 1:+.2%}" if ref else "-"
            print(f"| {r['method']} | {r['rs_ms']:.1f} | {ratio} | {r['rs_mb']:.2f} | "
                  f"{r['ag_ms']:.1f} | {r['ag_mb']:.2f} | {r['loss']:.5f} | {gap} |",
                  flush=True)  # fmt: skip
        firsts = ", ".join(f"{r['method']} {r['first']:.5f}" for r in rows)
        print(f"loss at step 0 (before any update): {firsts}", flush=True)
    # FSDP2's modules hold the group in reference cycles: free them while the interpreter is
    # alive (Gloo's threads may hold tensors; tests/test_hooks.py has the story).
    gc.collect()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
