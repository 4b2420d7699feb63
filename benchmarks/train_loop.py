"""The training loop of the training benchmark (benchmarks/train.py): one (workload, method)
run, timed, and the run of every pair."""

from __future__ import annotations

import argparse
import os
import platform
import time
from typing import Dict, List

import numpy as np
import torch
import torch.distributed as dist

import torch_cgx
from benchmarks.train_methods import WireMeter, method_info, nominal_bits, wrap
from benchmarks.train_report import add_comparisons
from benchmarks.train_workloads import Workload, make_workload


def _rank0_print(*args) -> None:
    if dist.get_rank() == 0:
        print(*args, flush=True)


def _timed_steps(wl: Workload, method: str, ddp, opt, sched, meter: WireMeter, warmup: int, gloo):
    """Runs the steps; returns this rank's step times, wall clock and the mean loss per step."""
    rank, world = dist.get_rank(), dist.get_world_size()
    step_s, wall_s, losses = [], [], []
    dist.barrier(group=gloo)
    start = time.perf_counter()
    for step in range(wl.steps):
        if step == warmup:
            meter.start()
        batch = wl.get_batch(step, rank)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = wl.loss(ddp, batch)
        loss.backward()  # returns once DDP's reductions of this step are done
        opt.step()
        step_s.append(time.perf_counter() - t0)
        sched.step()
        mean_loss = loss.detach().reshape(1).double()
        dist.all_reduce(mean_loss, group=gloo)
        losses.append(float(mean_loss) / world)
        wall_s.append(time.perf_counter() - start)
        if rank == 0 and ((step + 1) % wl.log_every == 0 or step + 1 == wl.steps):
            recent = step_s[max(0, step + 1 - wl.log_every) :]
            print(
                f"  {wl.name}/{method}: step {step + 1}/{wl.steps}  loss {losses[-1]:.4f}  "
                f"{1e3 * sum(recent) / len(recent):.0f} ms/step (rank 0)",
                flush=True,
            )
    return step_s, wall_s, losses


def _evaluate(wl: Workload, model: torch.nn.Module, gloo) -> Dict[str, float]:
    """The workload's evaluation, averaged over ranks (noop's replicas differ)."""
    ev = wl.evaluate(model, dist.get_rank())
    if ev:
        vals = torch.tensor([ev[k] for k in sorted(ev)], dtype=torch.float64)
        dist.all_reduce(vals, group=gloo)
        ev = {k: float(v) / dist.get_world_size() for k, v in zip(sorted(ev), vals)}
    return ev


def _record(wl: Workload, method: str, n_params: int, warmup: int, step_s, wall_s, losses,
            wire: float, ev: dict, info: dict) -> dict:  # fmt: skip
    world = dist.get_world_size()
    timed_s = step_s[warmup:]
    mean_s = sum(timed_s) / len(timed_s)
    tail = max(1, wl.steps // 10)
    return {
        "workload": wl.name,
        "method": method,
        "bits": nominal_bits(method),
        **info,
        "world": world,
        "params": n_params,
        "steps": wl.steps,
        "warmup": warmup,
        "batch_per_rank": wl.batch,
        "global_batch": wl.batch * world,
        "step_ms": 1e3 * mean_s,
        "step_ms_median": 1e3 * float(np.median(timed_s)),
        "step_ms_min": 1e3 * min(timed_s),
        "samples_per_s": wl.batch * world / mean_s,
        "wire_bytes_per_step": float(wire),
        "final_loss": sum(losses[-tail:]) / tail,
        "final_loss_steps": tail,
        "last_loss": losses[-1],
        "loadavg_1m": os.getloadavg()[0],  # this machine's load: other work skews the timings
        "eval": ev,
        "losses": losses,
        "step_times_ms": [1e3 * t for t in step_s],
        "wall_s": wall_s,
        "comm_overhead_ms": None,
        "overhead_ratio_vs_gloo": None,
        "loss_delta_vs_gloo_pct": None,
    }


def train_one(workload: Workload, method: str, gloo, args) -> dict:
    world = dist.get_world_size()
    warmup = min(args.warmup, workload.steps - 1)
    torch.manual_seed(args.seed)  # the same initial weights for every method
    model = workload.model()
    n_params = sum(p.numel() for p in model.parameters())
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    ddp, state = wrap(model, method, gloo, args)
    info = method_info(state)
    # A hook that keeps momentum (DGC, Signum) delivers it: SGD then drops its own.
    opt = workload.optimizer(ddp.parameters(), momentum=not info.get("hook_momentum"))
    ramp = workload.lr_warmup
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, ramp)))
    meter = WireMeter(method, state, grad_bytes, world, args)
    step_s, wall_s, losses = _timed_steps(workload, method, ddp, opt, sched, meter, warmup, gloo)
    wire = meter.per_step(workload.steps, warmup)
    # Slowest rank per step, for the step times and the wall clock.
    per_step = torch.tensor([step_s, wall_s], dtype=torch.float64)
    dist.all_reduce(per_step, op=dist.ReduceOp.MAX, group=gloo)
    step_s, wall_s = per_step[0].tolist(), per_step[1].tolist()
    ev = _evaluate(workload, ddp.module, gloo)
    del ddp, opt, model, state, meter
    return _record(workload, method, n_params, warmup, step_s, wall_s, losses, wire, ev, info)


def _describe(wl: Workload, args, gloo) -> dict:
    """The workload's meta record (printed on rank 0); checks every rank has the same corpus."""
    world = dist.get_world_size()
    torch.manual_seed(args.seed)
    n_params = sum(p.numel() for p in wl.model().parameters())
    info = dict(wl.info(), params=n_params, steps=wl.steps, batch_per_rank=wl.batch)
    info["lr_warmup"] = wl.lr_warmup
    if "corpus_crc32" in info:  # every rank must train on the same corpus
        crcs = [None] * world
        dist.all_gather_object(crcs, info["corpus_crc32"], group=gloo)
        if len(set(crcs)) != 1:
            raise RuntimeError(f"the ranks built different stdlib corpora (crc32 {crcs})")
    desc = ", ".join(
        f"{k} {v}" for k, v in info.items() if k not in ("config", "optimizer", "corpus_crc32")
    )
    _rank0_print(f"# {wl.name}: {n_params:,} parameters ({n_params / 1e6:.2f}M); {desc}")
    if "config" in info:
        _rank0_print(f"#   {wl.name} config {info['config']}")
    return info


def run(args: argparse.Namespace) -> tuple:
    """Every (workload, method) on the initialized group; returns (records, meta)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    meta = {
        "world": world,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "codec_threads": torch_cgx.codec.num_threads(),
        "codec_isa": torch_cgx._C.isa(),
        "host": platform.node(),
        "args": {k: v for k, v in vars(args).items()},
        "workloads": {},
    }
    records: List[dict] = []
    for name in args.workloads:
        wl = make_workload(name, args, rank, world)
        meta["workloads"][name] = _describe(wl, args, gloo)
        for method in args.methods:
            _rank0_print(f"# {name}/{method}: {wl.steps} steps, batch {wl.batch} x {world} ranks")
            records.append(train_one(wl, method, gloo, args))
            r = records[-1]
            _rank0_print(
                f"# {name}/{method}: {r['step_ms']:.1f} ms/step, final loss {r['final_loss']:.4f}"
            )
    add_comparisons(records)
    return records, meta
