"""End-to-end DDP training benchmark: step time and loss of each gradient-reduction method.

    torchrun --nproc-per-node 2 -m torch_cgx.bench.train --workloads gpt2,digits \\
        --json bench-results/train.json --plot bench-results/train.png
    python -m torch_cgx.bench train ...            # same flags (one process: W = 1)

Initialization is env:// (torchrun's RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; MPI / PMI
variables are mapped by ``import torch_cgx``); without them it runs as one process.

Workloads (offline, random init):
  gpt2    a GPT-2 (transformers' GPT2LMHeadModel, ~19M parameters by default), byte-level
          (256 bytes + a file separator), trained on the Python standard library's own .py files
  digits  a small CNN on scikit-learn's bundled 8x8 digits, fixed train/test split, per-rank
          shards of the training set

Methods, run one after another on the same initial weights and the same batches:
  gloo      DDP's built-in allreduce over a Gloo group (uncompressed)
  fp16      torch's fp16_compress_hook over the Gloo group
  powersgd  torch's powerSGD_hook (PowerSGDState) over the Gloo group
  cgxN      torch_cgx's cgx_hook on the cgx group, N bits (1..8; default cgx8, cgx4, cgx2)
  noop      torch's noop_hook: no communication at all (each rank keeps its own gradients);
            the lower bound of the step time

Per method: ``step ms`` is the mean, over the steps after the warm-up, of the slowest rank's
time for zero_grad + forward + backward (which waits for DDP's reductions) + optimizer step;
``comm ms`` is that minus noop's (communication overhead not hidden behind backward);
``vs gloo`` is comm ms over gloo's comm ms; ``samples/s`` counts all ranks; ``wire MB`` is what
one rank sends per step (cgx: the backend's byte counter; Gloo-based methods: a ring's
2 (W - 1) / W times the reduced bytes); ``final loss`` is the training loss (mean over ranks)
averaged over the last 10% of the steps, and ``delta`` compares it with gloo's. Batches are the
same for every method, so losses compare step by step. Data preparation and the per-step loss
allreduce are outside the timed region.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import sysconfig
import time
import zlib
from typing import Dict, List, Optional

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_cgx

WORKLOADS = ("gpt2", "digits")
METHODS = ("gloo", "fp16", "powersgd", "cgx8", "cgx4", "cgx2", "noop")

# Per-workload defaults: one method's run of gpt2 at W = 2 takes about half a minute on a
# 2-core CPU; digits steps take milliseconds.
DEFAULTS = {
    "gpt2": {"steps": 12, "batch": 4, "lr": 1e-3, "lr_warmup": 4, "log_every": 3},
    "digits": {"steps": 120, "batch": 32, "lr": 0.05, "lr_warmup": 0, "log_every": 40},
}


def _seed(*parts: int) -> int:
    """A 32-bit seed mixed from integers, the same on every machine and Python version."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


def _rank0_print(*args) -> None:
    if dist.get_rank() == 0:
        print(*args, flush=True)


# ----------------------------------------------------------------------------- workloads


class Workload:
    """A model factory, a deterministic batch per (step, rank), a loss and a final evaluation."""

    name = ""
    batch = 1  # samples per rank per step
    steps = 2
    lr_warmup = 0  # steps of linear learning-rate ramp
    log_every = 1

    def model(self) -> torch.nn.Module:
        raise NotImplementedError

    def optimizer(self, params) -> torch.optim.Optimizer:
        raise NotImplementedError

    def get_batch(self, step: int, rank: int):
        raise NotImplementedError

    def loss(self, model: torch.nn.Module, batch) -> torch.Tensor:
        raise NotImplementedError

    def evaluate(self, model: torch.nn.Module, rank: int) -> Dict[str, float]:
        return {}

    def info(self) -> dict:
        return {}


def stdlib_corpus(max_bytes: int) -> tuple:
    """The standard library's .py files (site-packages excluded), in sorted path order, joined
    with the separator token 256 and cut at ``max_bytes`` tokens. Returns (int16 tensor, files)."""
    root = sysconfig.get_paths()["stdlib"]
    chunks, total, files = [], 0, 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(
            d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__")
        )
        for name in sorted(filenames):
            if not name.endswith(".py") or total >= max_bytes:
                continue
            try:
                with open(os.path.join(dirpath, name), "rb") as f:
                    data = f.read()
            except OSError:
                continue
            chunks.append(np.frombuffer(data, dtype=np.uint8).astype(np.int16))
            chunks.append(np.array([256], dtype=np.int16))
            total += len(data) + 1
            files += 1
        if total >= max_bytes:
            break
    if not chunks:
        raise RuntimeError(f"no .py files under {root}")
    tokens = np.concatenate(chunks)[:max_bytes]
    return torch.from_numpy(tokens), files


class GPT2Workload(Workload):
    name = "gpt2"

    def __init__(self, args: argparse.Namespace, seed: int) -> None:
        self.args, self.seed, self.batch = args, seed, args.gpt2_batch
        self.seq_len = args.seq_len
        if self.seq_len > args.n_positions:
            raise ValueError(f"--seq-len {self.seq_len} > --n-positions {args.n_positions}")
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["TRANSFORMERS_OFFLINE"] = "1"
        os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
        from transformers import GPT2Config, GPT2LMHeadModel

        self._model_cls = GPT2LMHeadModel
        self.config = GPT2Config(
            vocab_size=257,  # bytes + the file separator
            n_positions=args.n_positions,
            n_embd=args.n_embd,
            n_layer=args.n_layer,
            n_head=args.n_head,
            resid_pdrop=0.0,  # no dropout: the only randomness is the batch sampling
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=256,
            eos_token_id=256,
        )
        tokens, self.files = stdlib_corpus(int(args.corpus_mb * 2**20))
        split = int(len(tokens) * 0.95)
        self.train, self.val = tokens[:split], tokens[split:]
        if len(self.val) <= self.seq_len + 1:
            raise ValueError("corpus too small for --seq-len")
        self.crc = zlib.crc32(tokens.numpy().tobytes())

    def model(self) -> torch.nn.Module:
        return self._model_cls(self.config)

    def optimizer(self, params) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=self.args.gpt2_lr, betas=(0.9, 0.95), weight_decay=0.0)

    def _windows(self, tokens: torch.Tensor, n: int, gen: torch.Generator) -> torch.Tensor:
        starts = torch.randint(0, len(tokens) - self.seq_len - 1, (n,), generator=gen)
        return torch.stack([tokens[s : s + self.seq_len + 1] for s in starts.tolist()]).long()

    def get_batch(self, step: int, rank: int):
        gen = torch.Generator().manual_seed(_seed(self.seed, step, rank, 1))
        return self._windows(self.train, self.batch, gen)

    def loss(self, model, batch) -> torch.Tensor:
        logits = model(batch[:, :-1]).logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))

    @torch.no_grad()
    def evaluate(self, model, rank: int) -> Dict[str, float]:
        model.eval()
        losses = []
        for i in range(self.args.eval_batches):
            gen = torch.Generator().manual_seed(_seed(self.seed, i, rank, 2))
            losses.append(float(self.loss(model, self._windows(self.val, self.batch, gen))))
        model.train()
        return {"val_loss": sum(losses) / max(1, len(losses))} if losses else {}

    def info(self) -> dict:
        return {
            "config": {
                k: getattr(self.config, k)
                for k in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")
            },
            "seq_len": self.seq_len,
            "corpus_tokens": len(self.train) + len(self.val),
            "corpus_files": self.files,
            "corpus_crc32": self.crc,
            "lr": self.args.gpt2_lr,
            "optimizer": "AdamW(betas=(0.9, 0.95))",
        }


class DigitsCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 32, 3, padding=1)  # 288 weights: exact in cgx
        self.conv2 = torch.nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = torch.nn.Linear(64 * 4 * 4, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class DigitsWorkload(Workload):
    name = "digits"

    def __init__(self, args: argparse.Namespace, seed: int, rank: int, world: int) -> None:
        from sklearn.datasets import load_digits

        self.args, self.seed, self.batch = args, seed, args.digits_batch
        data = load_digits()
        x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
        y = torch.tensor(data.target, dtype=torch.int64)
        perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))  # fixed split
        n_test = len(y) // 5
        test, train = perm[:n_test], perm[n_test:]
        self.x_test, self.y_test = x[test], y[test]
        shard = train[rank::world]  # this rank's shard of the training set
        self.x, self.y = x[shard], y[shard]
        self.n_train, self.n_test = len(train), n_test

    def model(self) -> torch.nn.Module:
        return DigitsCNN()

    def optimizer(self, params) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=self.args.digits_lr, momentum=0.9)

    def get_batch(self, step: int, rank: int):
        gen = torch.Generator().manual_seed(_seed(self.seed, step, rank, 3))
        idx = torch.randperm(len(self.y), generator=gen)[: self.batch]
        return self.x[idx], self.y[idx]

    def loss(self, model, batch) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(model(x), y)

    @torch.no_grad()
    def evaluate(self, model, rank: int) -> Dict[str, float]:
        model.eval()
        logits = model(self.x_test)
        model.train()
        return {
            "test_loss": float(F.cross_entropy(logits, self.y_test)),
            "test_acc": float((logits.argmax(1) == self.y_test).float().mean()),
        }

    def info(self) -> dict:
        return {
            "train_samples": self.n_train,
            "test_samples": self.n_test,
            "lr": self.args.digits_lr,
            "optimizer": "SGD(momentum=0.9)",
        }


# ----------------------------------------------------------------------------- methods


def cgx_bits(method: str) -> Optional[int]:
    if method.startswith("cgx") and method[3:].isdigit() and 1 <= int(method[3:]) <= 8:
        return int(method[3:])
    return None


def parse_methods(text: str) -> List[str]:
    methods = [m.strip() for m in text.split(",") if m.strip()]
    for m in methods:
        if m not in METHODS and cgx_bits(m) is None:
            raise argparse.ArgumentTypeError(
                f"unknown method {m!r} (choose from {', '.join(METHODS)}, or cgx1..cgx8)"
            )
    if len(set(methods)) != len(methods) or not methods:
        raise argparse.ArgumentTypeError(f"methods must be distinct and non-empty: {text!r}")
    return methods


def parse_workloads(text: str) -> List[str]:
    names = [w.strip() for w in text.split(",") if w.strip()]
    bad = [w for w in names if w not in WORKLOADS]
    if bad or not names or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"workloads: distinct names of {WORKLOADS}, got {text!r}")
    return names


class SerialHook:
    """Runs a comm hook on one DDP bucket after another: bucket i starts once bucket i - 1 is
    reduced.

    powerSGD_hook issues its second and third allreduces from the callbacks of the first; with
    several buckets, Gloo's completion threads then issue the collectives of different buckets
    in a different order on each rank (a size mismatch, or a silently wrong sum). Chaining the
    buckets keeps the hook unchanged and backward still overlaps with the reductions.
    """

    def __init__(self, state, hook) -> None:
        self.state, self.hook, self.prev = state, hook, None

    def __call__(self, bucket: dist.GradBucket) -> torch.futures.Future:
        out = torch.futures.Future()

        def finish(inner: torch.futures.Future) -> None:
            try:
                out.set_result(inner.value())
            except Exception as e:  # handed to DDP's wait
                out.set_exception(e)

        def start(_=None) -> None:
            try:
                self.hook(self.state, bucket).add_done_callback(finish)
            except Exception as e:
                out.set_exception(e)

        prev, self.prev = self.prev, out
        if prev is None:
            start()
        else:
            prev.add_done_callback(start)  # runs at once when prev is already done
        return out


def serial_hook(state, bucket):  # no annotations: DDP checks them and this module's are strings
    return state(bucket)


def wrap(model: torch.nn.Module, method: str, gloo, args) -> tuple:
    """(DDP model, PowerSGD state or None) for the method."""
    common = {"bucket_cap_mb": args.bucket_cap_mb}  # the models have no buffers
    bits = cgx_bits(method)
    if bits is not None:
        ddp = DDP(model, process_group=dist.group.WORLD, **common)  # the cgx group
        state = torch_cgx.CGXState(
            dist.group.WORLD,
            layer_min_size=args.layer_min_size,
            compression_params={"bits": bits, "bucket_size": args.bucket_size},
        )
        ddp.register_comm_hook(state, torch_cgx.cgx_hook)
        return ddp, None
    ddp = DDP(model, process_group=gloo, **common)
    if method == "fp16":
        ddp.register_comm_hook(gloo, default_hooks.fp16_compress_hook)
    elif method == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=gloo,
            matrix_approximation_rank=args.powersgd_rank,
            start_powerSGD_iter=args.powersgd_start_iter,
            random_seed=args.seed,
        )
        ddp.register_comm_hook(SerialHook(state, powerSGD_hook.powerSGD_hook), serial_hook)
        return ddp, state
    elif method == "noop":
        ddp.register_comm_hook(None, noop_hook)
    return ddp, None


# ----------------------------------------------------------------------------- the run


def train_one(workload: Workload, method: str, gloo, args) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    steps, warmup = workload.steps, min(args.warmup, workload.steps - 1)
    torch.manual_seed(args.seed)  # the same initial weights for every method
    model = workload.model()
    n_params = sum(p.numel() for p in model.parameters())
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    ddp, psgd = wrap(model, method, gloo, args)
    opt = workload.optimizer(ddp.parameters())
    ramp = workload.lr_warmup
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, ramp)))
    bits = cgx_bits(method)
    ring = 2 * (world - 1) / world
    cgx_counter = torch_cgx.cgx_backend() if bits is not None else None
    bytes_at_warmup = psgd_at_warmup = 0

    step_s, wall_s, losses = [], [], []
    dist.barrier(group=gloo)
    start = time.perf_counter()
    for step in range(steps):
        if step == warmup:
            if cgx_counter is not None:
                bytes_at_warmup = cgx_counter.total_bytes_sent()
            if psgd is not None:
                psgd_at_warmup = psgd.total_numel_after_compression
        batch = workload.get_batch(step, rank)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = workload.loss(ddp, batch)
        loss.backward()  # returns once DDP's reductions of this step are done
        opt.step()
        step_s.append(time.perf_counter() - t0)
        sched.step()
        mean_loss = loss.detach().reshape(1).double()
        dist.all_reduce(mean_loss, group=gloo)
        losses.append(float(mean_loss) / world)
        wall_s.append(time.perf_counter() - start)
        if rank == 0 and ((step + 1) % workload.log_every == 0 or step + 1 == steps):
            recent = step_s[max(0, step + 1 - workload.log_every) :]
            print(
                f"  {workload.name}/{method}: step {step + 1}/{steps}  loss {losses[-1]:.4f}  "
                f"{1e3 * sum(recent) / len(recent):.0f} ms/step (rank 0)",
                flush=True,
            )
    timed = steps - warmup
    if bits is not None:
        wire = (cgx_counter.total_bytes_sent() - bytes_at_warmup) / timed
    elif method == "noop":
        wire = 0.0
    elif method == "fp16":
        wire = ring * grad_bytes / 2
    elif method == "powersgd":
        # PowerSGDState counts the elements reduced once compression has started; steps before
        # start_powerSGD_iter reduce every gradient uncompressed.
        plain = max(0, min(args.powersgd_start_iter, steps) - warmup)
        numel = psgd.total_numel_after_compression - psgd_at_warmup
        wire = ring * (4 * numel + plain * grad_bytes) / timed
    else:
        wire = ring * grad_bytes

    # Slowest rank per step, for the step times and the wall clock.
    per_step = torch.tensor([step_s, wall_s], dtype=torch.float64)
    dist.all_reduce(per_step, op=dist.ReduceOp.MAX, group=gloo)
    step_s, wall_s = per_step[0].tolist(), per_step[1].tolist()
    ev = workload.evaluate(ddp.module, rank)
    if ev:  # noop's replicas differ across ranks: report the mean
        vals = torch.tensor([ev[k] for k in sorted(ev)], dtype=torch.float64)
        dist.all_reduce(vals, group=gloo)
        ev = {k: float(v) / world for k, v in zip(sorted(ev), vals)}
    timed_s = step_s[warmup:]
    mean_s = sum(timed_s) / len(timed_s)
    tail = max(1, steps // 10)
    del ddp, opt, model, psgd
    return {
        "workload": workload.name,
        "method": method,
        "bits": bits if bits is not None else (16 if method == "fp16" else 32),
        "world": world,
        "params": n_params,
        "steps": steps,
        "warmup": warmup,
        "batch_per_rank": workload.batch,
        "global_batch": workload.batch * world,
        "step_ms": 1e3 * mean_s,
        "step_ms_median": 1e3 * float(np.median(timed_s)),
        "step_ms_min": 1e3 * min(timed_s),
        "samples_per_s": workload.batch * world / mean_s,
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


def add_comparisons(records: List[dict]) -> None:
    """comm_overhead_ms (vs noop), overhead_ratio_vs_gloo and loss_delta_vs_gloo_pct."""
    by = {(r["workload"], r["method"]): r for r in records}
    for r in records:
        noop, gloo = by.get((r["workload"], "noop")), by.get((r["workload"], "gloo"))
        if noop is not None:
            r["comm_overhead_ms"] = r["step_ms"] - noop["step_ms"]
        if gloo is not None:
            mine, ref = r["comm_overhead_ms"], gloo["comm_overhead_ms"]
            # A negative overhead is noise (slower noop steps): no ratio.
            if mine is not None and ref is not None and mine >= 0 and ref > 0:
                r["overhead_ratio_vs_gloo"] = mine / ref
            if gloo["final_loss"] != 0:
                delta = (r["final_loss"] - gloo["final_loss"]) / abs(gloo["final_loss"])
                r["loss_delta_vs_gloo_pct"] = 100 * delta


def _fmt(v, spec: str, suffix: str = "") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:{spec}}{suffix}"


def table(records: List[dict]) -> str:
    head = (
        "| workload | method | step ms | comm ms | vs gloo | samples/s | wire MB/step "
        "| final loss | delta vs gloo | eval |"
    )
    lines = [head, "|" + "---|" * 2 + "---:|" * 7 + "---|"]
    for r in records:
        ev = ", ".join(f"{k} {v:.4g}" for k, v in sorted(r["eval"].items()))
        cells = [
            r["workload"],
            r["method"],
            _fmt(r["step_ms"], ".1f"),
            _fmt(r["comm_overhead_ms"], ".1f"),
            _fmt(r["overhead_ratio_vs_gloo"], ".2f", "x"),
            _fmt(r["samples_per_s"], ".1f"),
            _fmt(r["wire_bytes_per_step"] / 1e6, ".3f"),
            _fmt(r["final_loss"], ".4f"),
            _fmt(r["loss_delta_vs_gloo_pct"], "+.2f", "%"),
            ev or "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="torch_cgx.bench train",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--workloads", type=parse_workloads, default=list(WORKLOADS))
    p.add_argument("--methods", type=parse_methods, default=list(METHODS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=None, help="steps of every workload")
    p.add_argument("--batch", type=int, default=None, help="per-rank batch of every workload")
    p.add_argument("--warmup", type=int, default=3, help="first steps left out of the timings")
    p.add_argument("--log-every", type=int, default=None, help="progress line every N steps")
    for name, d in DEFAULTS.items():
        p.add_argument(f"--{name}-steps", type=int, default=d["steps"])
        p.add_argument(f"--{name}-batch", type=int, default=d["batch"], help="per rank")
        p.add_argument(f"--{name}-lr", type=float, default=d["lr"])
        p.add_argument(
            f"--{name}-lr-warmup", type=int, default=d["lr_warmup"], help="linear, in steps"
        )
    g = p.add_argument_group("gpt2")
    g.add_argument("--seq-len", type=int, default=128)
    g.add_argument("--n-layer", type=int, default=6)
    g.add_argument("--n-embd", type=int, default=512)
    g.add_argument("--n-head", type=int, default=8)
    g.add_argument("--n-positions", type=int, default=256)
    g.add_argument("--corpus-mb", type=float, default=4.0, help="corpus size cap (MiB)")
    g.add_argument("--eval-batches", type=int, default=2, help="held-out batches per rank")
    g = p.add_argument_group("methods")
    g.add_argument("--bucket-size", type=int, default=512, help="cgx values per bucket")
    g.add_argument("--layer-min-size", type=int, default=1024, help="cgx: smaller layers exact")
    g.add_argument("--powersgd-rank", type=int, default=1)
    g.add_argument("--powersgd-start-iter", type=int, default=2)
    g.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP bucket size")
    g = p.add_argument_group("output")
    g.add_argument("--json", default=None, help="write every record here (rank 0)")
    g.add_argument("--plot", default=None, help="loss curves PNG (rank 0)")
    g.add_argument("--threads", type=int, default=0, help="torch threads per rank (0: as is)")
    args = p.parse_args(argv)
    for name in DEFAULTS:
        if args.steps is not None:
            setattr(args, f"{name}_steps", args.steps)
        if args.batch is not None:
            setattr(args, f"{name}_batch", args.batch)
        if getattr(args, f"{name}_steps") < 2 or getattr(args, f"{name}_batch") < 1:
            p.error(f"{name}: need at least 2 steps and a batch of at least 1")
    return args


def _init() -> bool:
    """env:// init with backend cgx; one local process when no launcher variables are set."""
    if dist.is_initialized():
        return False
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(
            {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
        )
        os.environ.setdefault("MASTER_PORT", str(port))
    dist.init_process_group("cgx")
    return True


def _make_workload(name: str, args, rank: int, world: int) -> Workload:
    if name == "gpt2":
        w = GPT2Workload(args, args.seed)
    else:
        w = DigitsWorkload(args, args.seed, rank, world)
    w.steps = getattr(args, f"{name}_steps")
    w.lr_warmup = getattr(args, f"{name}_lr_warmup")
    w.log_every = args.log_every or DEFAULTS[name]["log_every"]
    return w


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
    records = []
    for name in args.workloads:
        wl = _make_workload(name, args, rank, world)
        torch.manual_seed(args.seed)
        n_params = sum(p.numel() for p in wl.model().parameters())
        info = dict(wl.info(), params=n_params, steps=wl.steps, batch_per_rank=wl.batch)
        info["lr_warmup"] = wl.lr_warmup
        if name == "gpt2":  # every rank must train on the same corpus
            crcs = [None] * world
            dist.all_gather_object(crcs, info["corpus_crc32"], group=gloo)
            if len(set(crcs)) != 1:
                raise RuntimeError(f"the ranks built different stdlib corpora (crc32 {crcs})")
        meta["workloads"][name] = info
        desc = ", ".join(
            f"{k} {v}" for k, v in info.items() if k not in ("config", "optimizer", "corpus_crc32")
        )
        _rank0_print(f"# {name}: {n_params:,} parameters ({n_params / 1e6:.2f}M); {desc}")
        if name == "gpt2":
            _rank0_print(f"#   GPT2Config {info['config']}")
        for method in args.methods:
            _rank0_print(f"# {name}/{method}: {wl.steps} steps, batch {wl.batch} x {world} ranks")
            records.append(train_one(wl, method, gloo, args))
            r = records[-1]
            _rank0_print(
                f"# {name}/{method}: {r['step_ms']:.1f} ms/step, final loss {r['final_loss']:.4f}"
            )
    add_comparisons(records)
    return records, meta


def main(argv: Optional[List[str]] = None) -> int:
    from torch_cgx.bench.hosts import maybe_run_on_hosts

    # --hosts W --link RATE: run as W ranks on emulated hosts (docs/hosts.md).
    rc = maybe_run_on_hosts(sys.argv[1:] if argv is None else argv, "torch_cgx.bench.train")
    if rc is not None:
        return rc
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    own = _init()
    rank = dist.get_rank()
    if rank == 0:
        print(
            f"# torch_cgx training benchmark: {dist.get_world_size()} ranks, torch "
            f"{torch.__version__}, {torch.get_num_threads()} torch threads per rank, "
            f"python {sys.version.split()[0]}, load average {os.getloadavg()[0]:.2f} "
            f"on {os.cpu_count()} cores",
            flush=True,
        )
    records, meta = run(args)
    if rank == 0:
        print(table(records), flush=True)
        for path in (args.json, args.plot):
            if path and os.path.dirname(path):
                os.makedirs(os.path.dirname(path), exist_ok=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"meta": meta, "records": records}, f, indent=1)
            print(f"# records: {args.json}", flush=True)
        if args.plot:
            from torch_cgx.bench.plots import plot_training

            plot_training(records, args.plot)
            print(f"# plot: {args.plot}", flush=True)
    if own:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
