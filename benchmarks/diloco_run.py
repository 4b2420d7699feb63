"""Methods and training loop of the wide-area DiLoCo benchmark (benchmarks/diloco.py).

ddp-gloo        DDP's allreduce every step over a Gloo group (uncompressed)
ddp-cgx4        DDP with torch_cgx's cgx_hook on the cgx group, 4-bit max-min every step
diloco-fp32     torch_cgx.diloco.DiLoCo, one fragment, exact fp32 pseudo-gradients
diloco-4bit     the same with 4-bit max-min pseudo-gradients (--bits)
streaming-4bit  Streaming DiLoCo: --fragments fragments synced in turn, each reduction
                overlapped with --delay inner steps, 4-bit max-min
sparseloco      one fragment, the sparseloco compressor (top-k of each chunk, 2-bit values) with
                error feedback
diloco-mxfp4    one fragment, MXFP4 pseudo-gradients (nearest rounding, error feedback)
diloco-nvfp4    the same in NVFP4

Every method trains the same GPT-2 from the same initial weights on the same batches (a pure
function of (seed, step, rank)). Per rank and step it records the local training loss and the
wall clock; the bytes one rank sends per inner step come from the cgx backend's counter for the
methods on the cgx group (DDP cgx, DiLoCo), and from a ring's 2 (W - 1) / W times the gradient
bytes for DDP Gloo.
"""

from __future__ import annotations

import time
from typing import Dict, List

import numpy as np
import torch
import torch.distributed as dist

import torch_cgx

METHODS = ("ddp-gloo", "ddp-cgx4", "diloco-fp32", "diloco-4bit", "streaming-4bit", "sparseloco",
           "diloco-mxfp4", "diloco-nvfp4")  # fmt: skip


def parse_methods(text: str) -> List[str]:
    out = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in out if m not in METHODS]
    if bad or not out:
        raise ValueError(f"unknown method(s) {bad or text!r}; choose from {', '.join(METHODS)}")
    return out


def fragments(model: torch.nn.Module, k: int) -> List[torch.nn.Module]:
    """GPT-2 cut into k fragments of consecutive blocks (the embeddings with the first, the
    final norm with the last; the tied head is the embedding); every parameter in exactly one."""
    tr = model.transformer
    blocks = list(tr.h)
    if not 1 <= k <= len(blocks):
        raise ValueError(f"--fragments must be in [1, {len(blocks)}] (the blocks), got {k}")
    cuts = np.array_split(np.arange(len(blocks)), k)
    out = []
    for i, idx in enumerate(cuts):
        mods = [blocks[j] for j in idx]
        if i == 0:
            mods = [tr.wte, tr.wpe] + mods
        if i == k - 1:
            mods = mods + [tr.ln_f]
        out.append(torch.nn.ModuleList(mods))
    covered = {id(p) for f in out for p in f.parameters()}
    if covered != {id(p) for p in model.parameters()}:
        raise RuntimeError("the fragments do not cover the model's parameters exactly")
    return out


def diloco_kwargs(method: str, args) -> dict:
    """DiLoCo's keyword arguments for a DiLoCo method."""
    kw = {"sync_every": args.sync_every, "compressor": "maxmin",
          "compressor_params": {"bits": args.bits}}  # fmt: skip
    if method == "diloco-fp32":
        kw.update(compressor=None, compressor_params=None)
    elif method in ("diloco-mxfp4", "diloco-nvfp4"):  # nearest rounding, error feedback
        kw.update(compressor=method.split("-")[1], compressor_params={})
    elif method == "streaming-4bit":
        kw["fragment_sync_delay"] = args.delay
    elif method == "sparseloco":
        kw.update(compressor="sparseloco", error_feedback=True, compressor_params={
            "ratio": args.sparseloco_ratio, "chunk": args.sparseloco_chunk,
            "bits": args.sparseloco_bits})  # fmt: skip
    return kw


def _outer_factory(method: str, args):
    """Nesterov SGD (--outer-lr, --outer-momentum); sparseloco: --sparseloco-outer-lr and
    --sparseloco-outer-momentum (default lr 1, no momentum: its error feedback already carries
    what was not sent, and with momentum on top the two overshoot; docs/diloco-wire.md)."""
    lr, momentum = args.outer_lr, args.outer_momentum
    if method == "sparseloco":
        lr, momentum = args.sparseloco_outer_lr, args.sparseloco_outer_momentum

    def make(params):
        return torch.optim.SGD(params, lr=lr, momentum=momentum, nesterov=momentum > 0)

    return make


def calibrate(wl, args) -> float:
    """Median seconds of one local step (forward, backward, inner optimizer step) without any
    communication, measured on every rank at once (the compute a step costs on this machine)."""
    torch.manual_seed(args.seed)
    model = wl.model()
    opt = wl.optimizer(model.parameters())
    times = []
    for step in range(args.calib + 2):
        batch = wl.get_batch(10_000 + step, dist.get_rank())
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        wl.loss(model, batch).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return float(np.median(times[2:]))


class _Setup:
    """The model as trained (DDP wrapper or plain module), its optimizer, the DiLoCo object and
    how bytes are counted."""

    def __init__(self, method: str, wl, gloo, args) -> None:
        from benchmarks.train_methods import wrap

        torch.manual_seed(args.seed)  # the same initial weights for every method
        self.method, self.model = method, wl.model()
        self.grad_bytes = sum(p.numel() * 4 for p in self.model.parameters())
        self.diloco = None
        world = dist.get_world_size()
        if method.startswith("ddp-"):
            self.net, _ = wrap(self.model, "gloo" if method == "ddp-gloo" else "cgx4", gloo, args)
            self.opt = wl.optimizer(self.net.parameters())
        else:
            from torch_cgx.diloco import DiLoCo

            self.net = self.model
            self.opt = wl.optimizer(self.model.parameters())
            k = args.fragments if method == "streaming-4bit" else 1
            frags = fragments(self.model, k) if k > 1 else self.model
            self.diloco = DiLoCo(
                frags, self.opt, _outer_factory(method, args), **diloco_kwargs(method, args)
            )
        # the cgx group's counters: the native engine's and the device plane's
        self.counter = method != "ddp-gloo"
        self.ring = 2 * (world - 1) / world
        self.bytes0 = torch_cgx.stats().bytes_sent if self.counter else 0

    def bytes_sent(self, steps: int) -> float:
        if not self.counter:
            return self.ring * self.grad_bytes * steps
        return float(torch_cgx.stats().bytes_sent - self.bytes0)


def _loop(wl, s: _Setup, args, gloo) -> tuple:
    rank = dist.get_rank()
    losses, wall = [], []
    ramp = max(1, args.lr_warmup)
    sched = torch.optim.lr_scheduler.LambdaLR(s.opt, lambda i: min(1.0, (i + 1) / ramp))
    dist.barrier(group=gloo)
    start = time.perf_counter()
    for step in range(args.steps):
        batch = wl.get_batch(step, rank)
        s.opt.zero_grad(set_to_none=True)
        loss = wl.loss(s.net, batch)
        loss.backward()
        s.opt.step()  # DiLoCo: counts the step, syncs when due
        sched.step()
        losses.append(float(loss.detach()))
        wall.append(time.perf_counter() - start)
        if rank == 0 and args.log_every and (step + 1) % args.log_every == 0:
            print(f"  {s.method}: step {step + 1}/{args.steps}  loss {losses[-1]:.4f}  "
                  f"{wall[-1]:.1f} s (rank 0)", flush=True)  # fmt: skip
    return losses, wall


def train_method(method: str, wl, gloo, args, compute_s: float) -> Dict:
    """One method's run; the record is the same on every rank."""
    world = dist.get_world_size()
    s = _Setup(method, wl, gloo, args)
    if s.diloco is not None:
        with s.diloco:
            losses, wall = _loop(wl, s, args, gloo)
    else:
        losses, wall = _loop(wl, s, args, gloo)
    sent = torch.tensor([s.bytes_sent(args.steps)], dtype=torch.float64)
    if s.diloco is not None:  # the last fragments' syncs, outside the timed run, then evaluate
        s.diloco.sync_now()
    per_step = torch.tensor([losses, wall], dtype=torch.float64)
    summed = per_step.clone()
    dist.all_reduce(summed, group=gloo)  # mean loss over ranks
    dist.all_reduce(per_step, op=dist.ReduceOp.MAX, group=gloo)  # slowest rank's clock
    dist.all_reduce(sent, group=gloo)
    ev = wl.evaluate(s.model, dist.get_rank())
    val = torch.tensor([ev.get("val_loss", float("nan"))], dtype=torch.float64)
    dist.all_reduce(val, group=gloo)
    losses = (summed[0] / world).tolist()
    wall = per_step[1].tolist()
    tail = max(1, args.steps // 10)
    return {
        "method": method,
        "world": world,
        "steps": args.steps,
        "tokens_per_step": world * wl.batch * wl.seq_len,
        "losses": losses,
        "wall_s": wall,
        "train_loss": float(np.mean(losses[-tail:])),
        "val_loss": float(val) / world,
        "bytes_per_rank_per_step": float(sent) / world / args.steps,
        "compute_s_per_step": compute_s,
        "utilisation": compute_s * args.steps / wall[-1],
        "diloco": None if s.diloco is None else diloco_kwargs(method, args),
    }
