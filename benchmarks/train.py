"""End-to-end DDP training benchmark: step time and loss of each gradient-reduction method.

    torchrun --nproc-per-node 2 -m benchmarks.train --workloads gpt2,digits \\
        --json bench-results/train.json --plot bench-results/train.png
    python -m benchmarks.train ...            # same flags (one process: W = 1)

Initialization is env:// (torchrun's RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; MPI / PMI
variables are mapped by ``import torch_cgx``); without them it runs as one process.

Workloads (offline, random init):
  gpt2    a GPT-2 (transformers' GPT2LMHeadModel, ~19M parameters by default), byte-level
          (256 bytes + a file separator), trained on the Python standard library's own .py files
  lstm    a byte-level LSTM language model on the gpt2 workload's corpus
  digits  a small CNN on scikit-learn's bundled 8x8 digits, fixed train/test split, per-rank
          shards of the training set

Methods, run one after another on the same initial weights and the same batches:
  gloo      DDP's built-in allreduce over a Gloo group (uncompressed)
  fp16      torch's fp16_compress_hook over the Gloo group
  bf16      torch_cgx.hooks.bf16_compress_hook over the Gloo group (DDP refuses torch's on CPU)
  powersgd  torch's powerSGD_hook (PowerSGDState) over the Gloo group, its buckets serialized
            (SerialHook: registered directly it issues collectives out of order on Gloo)
  cgx-powersgd
            torch_cgx.hooks.powerSGD_hook, same parameters and math, two allreduces per step
  cgx-batched-powersgd, cgx-powersgd-q8, policy8  (only when named)
            torch_cgx's batched_powerSGD_hook; powerSGD_hook on the cgx group with P and Q as
            8-bit max-min; torch_cgx.compression.SizeAdaptiveCompression(65536, NoCompression(),
            Uniform8BitQuantization()) as the DDP policy on the cgx group
  cgxN      torch_cgx's cgx_hook on the cgx group, N bits (1..8; default cgx8, cgx4, cgx2)
  c:NAME    torch_cgx's compression_hook on the cgx group with the registered compressor NAME
            (torch_cgx.compressors.names(): maxmin, fp16, bf16, signsgd, ..., topk, dgc, ...)
            at its default parameters; error feedback and momentum as CompressionState
            defaults them (error feedback for biased compressors; momentum 0.9 in the hook for
            signum and dgc, and then the digits workload's SGD runs without its own momentum)
  all-compressors
            c:NAME for every registered compressor, in registry order
  noop      torch's noop_hook: no communication at all (each rank keeps its own gradients);
            the lower bound of the step time

Per method: ``step ms`` is the mean, over the steps after the warm-up, of the slowest rank's
time for zero_grad + forward + backward (which waits for DDP's reductions) + optimizer step;
``comm ms`` is that minus noop's (communication overhead not hidden behind backward);
``vs gloo`` is comm ms over gloo's comm ms; ``samples/s`` counts all ranks; ``wire MB`` is what
one rank sends per step (cgxN, c:NAME: the backend's byte counter; Gloo-based methods: a ring's
2 (W - 1) / W times the reduced bytes); ``final loss`` is the training loss (mean over ranks)
averaged over the last 10% of the steps, and ``delta`` compares it with gloo's. Batches are the
same for every method, so losses compare step by step. Data preparation and the per-step loss
allreduce are outside the timed region.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List, Optional

import torch
import torch.distributed as dist

import torch_cgx  # noqa: F401  (registers the cgx backend)
from benchmarks.train_loop import run, train_one  # noqa: F401  (this module's API)
from benchmarks.train_methods import (  # noqa: F401
    ALL_COMPRESSORS,
    METHODS,
    SerialHook,
    cgx_bits,
    compressor_of,
    error_feedback_of,
    parse_methods,
    serial_hook,
    wrap,
)
from benchmarks.train_report import add_comparisons, table  # noqa: F401
from benchmarks.train_workloads import (  # noqa: F401
    DEFAULTS,
    WORKLOADS,
    DigitsCNN,
    DigitsWorkload,
    GPT2Workload,
    Workload,
    parse_workloads,
    stdlib_corpus,
)


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="benchmarks.train",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--workloads", type=parse_workloads, default=["gpt2", "digits"],
                   help=f"of {', '.join(WORKLOADS)} (default: gpt2,digits)")  # fmt: skip
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
    g.add_argument(
        "--gpt2-optimizer",
        choices=("adamw", "sgd"),
        default="adamw",
        help="AdamW(betas=(0.9, 0.95)) or SGD(momentum=0.9) (--gpt2-lr: its learning rate)",
    )
    g.add_argument("--n-layer", type=int, default=6)
    g.add_argument("--n-embd", type=int, default=512)
    g.add_argument("--n-head", type=int, default=8)
    g.add_argument("--n-positions", type=int, default=256)
    g.add_argument("--corpus-mb", type=float, default=4.0, help="corpus size cap (MiB)")
    g.add_argument("--eval-batches", type=int, default=2, help="held-out batches per rank")
    g = p.add_argument_group("lstm (also --seq-len, --corpus-mb, --eval-batches)")
    g.add_argument("--lstm-embed", type=int, default=128)
    g.add_argument("--lstm-hidden", type=int, default=256)
    g.add_argument("--lstm-layers", type=int, default=2)
    g = p.add_argument_group("methods")
    g.add_argument("--bucket-size", type=int, default=512, help="cgx values per bucket")
    g.add_argument(
        "--layer-min-size", type=int, default=1024, help="cgxN, c:NAME: smaller layers exact"
    )
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


def main(argv: Optional[List[str]] = None) -> int:
    from benchmarks.hosts import maybe_run_on_hosts

    # --hosts W --link RATE: run as W ranks on emulated hosts (docs/hosts.md).
    rc = maybe_run_on_hosts(sys.argv[1:] if argv is None else argv, "benchmarks.train")
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
            from benchmarks.plots import plot_training

            plot_training(records, args.plot)
            print(f"# plot: {args.plot}", flush=True)
    if own:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
