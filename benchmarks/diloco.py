"""Low-communication training on emulated wide-area hosts: DDP against DiLoCo.

    python -m benchmarks.diloco --hosts 4 --link 100mbit [--latency 20ms] \\
        --json bench-results/diloco.json --plot bench-results/diloco.png
    torchrun --nproc-per-node 2 -m benchmarks.diloco ...     # loopback, no shaped link

Methods (benchmarks/diloco_run.py): ddp-gloo, ddp-cgx4, diloco-fp32, diloco-4bit,
streaming-4bit, sparseloco; all train the GPT-2 of the training benchmark (byte-level, on the
standard library's .py files) from the same weights on the same batches, for --steps inner
steps. DiLoCo syncs every --sync-every inner steps (outer Nesterov SGD, --outer-lr,
--outer-momentum); Streaming DiLoCo syncs --fragments fragments in turn, each overlapped with
--delay inner steps.

Columns: ``train`` the training loss (mean over ranks of each replica's own loss) over the last
10 % of the steps and ``held-out`` the loss of the final model (DiLoCo: after a last sync of
every fragment) on held-out windows, both at equal tokens; ``vs ddp`` the held-out loss against
ddp-gloo's; ``wall s`` the slowest rank's time for all steps; ``to target`` the wall time at which
the training loss, averaged over a window of 10 % of the steps, first reaches the target (default:
ddp-gloo's final training loss; '-' never); ``bytes/step`` what one rank sends per inner step
(the cgx backend's counter; ddp-gloo: a ring's 2 (W - 1) / W times the gradient bytes);
``util`` compute time / wall time, compute time = steps x the median time of a local step
without communication (measured first, on all ranks at once).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List, Optional

import numpy as np
import torch
import torch.distributed as dist

from benchmarks.diloco_run import METHODS, calibrate, parse_methods, train_method


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.diloco", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--methods", type=parse_methods, default=list(METHODS),
                   help=f"comma-separated, of {', '.join(METHODS)} (default: all)")  # fmt: skip
    p.add_argument("--steps", type=int, default=200, help="inner steps of every method")
    p.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    p.add_argument("--lr", type=float, default=2e-3, help="inner AdamW learning rate")
    p.add_argument("--lr-warmup", type=int, default=10, help="linear ramp, inner steps")
    p.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("DiLoCo")
    g.add_argument("--sync-every", type=int, default=50, help="H: inner steps between syncs")
    g.add_argument("--outer-lr", type=float, default=0.7)
    g.add_argument("--outer-momentum", type=float, default=0.9)
    g.add_argument("--bits", type=int, default=4, help="max-min bits of the 4-bit methods")
    g.add_argument("--fragments", type=int, default=2, help="streaming-4bit: fragments")
    g.add_argument("--delay", type=int, default=5, help="streaming-4bit: fragment_sync_delay")
    g.add_argument("--sparseloco-ratio", type=float, default=0.03)
    g.add_argument("--sparseloco-chunk", type=int, default=4096)
    g.add_argument("--sparseloco-bits", type=int, default=2)
    g.add_argument("--sparseloco-outer-lr", type=float, default=1.0)
    g.add_argument("--sparseloco-outer-momentum", type=float, default=0.0)
    g = p.add_argument_group("GPT-2 (the training benchmark's workload)")
    g.add_argument("--n-layer", type=int, default=2)
    g.add_argument("--n-embd", type=int, default=128)
    g.add_argument("--n-head", type=int, default=4)
    g.add_argument("--seq-len", type=int, default=64)
    g.add_argument("--corpus-mb", type=float, default=1.0, help="corpus size cap (MiB)")
    g.add_argument("--eval-batches", type=int, default=4, help="held-out batches per rank")
    g = p.add_argument_group("DDP")
    g.add_argument("--bucket-size", type=int, default=512, help="cgx values per bucket")
    g.add_argument("--layer-min-size", type=int, default=1024, help="smaller layers exact")
    g.add_argument("--bucket-cap-mb", type=float, default=25.0)
    g = p.add_argument_group("output")
    g.add_argument("--target-loss", type=float, default=None, help="default: ddp-gloo's final")
    g.add_argument("--calib", type=int, default=8, help="local steps timed for the compute")
    g.add_argument("--log-every", type=int, default=50)
    g.add_argument("--json", default=None, help="records (rank 0)")
    g.add_argument("--plot", default=None, help="loss vs wall time and vs tokens, PNG (rank 0)")
    g.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    args = p.parse_args(argv)
    if args.steps < 2 or args.batch < 1 or args.sync_every < 1:
        p.error("need --steps >= 2, --batch >= 1, --sync-every >= 1")
    if "streaming-4bit" in args.methods and not 0 <= args.delay < args.sync_every // args.fragments:
        p.error("--delay must be in [0, sync_every // fragments)")
    # what the training benchmark's GPT-2 workload and DDP wrapper read
    args.n_positions, args.gpt2_batch, args.gpt2_lr = args.seq_len, args.batch, args.lr
    args.gpt2_optimizer = "adamw"
    return args


def time_to(losses: List[float], wall: List[float], target: float, window: int) -> Optional[float]:
    """Wall time at which the mean loss of the last ``window`` steps first reaches ``target``."""
    for i in range(window - 1, len(losses)):
        if np.mean(losses[i - window + 1 : i + 1]) <= target:
            return wall[i]
    return None


def add_comparisons(records: List[dict], target: Optional[float]) -> Optional[float]:
    by = {r["method"]: r for r in records}
    base = by.get("ddp-gloo")
    if target is None and base is not None:
        target = base["train_loss"]
    cgx4 = by.get("ddp-cgx4")
    for r in records:
        window = max(1, r["steps"] // 10)
        r["target_loss"] = target
        hit = None if target is None else time_to(r["losses"], r["wall_s"], target, window)
        r["time_to_target_s"] = hit
        r["val_vs_ddp_pct"] = None if base is None else 100 * (r["val_loss"] / base["val_loss"] - 1)
        b = r["bytes_per_rank_per_step"]
        ratio = None if cgx4 is None or b == 0 else cgx4["bytes_per_rank_per_step"] / b
        r["fewer_bytes_than_ddp_cgx4"] = ratio
    return target


def table(records: List[dict]) -> str:
    head = ("| method | train | held-out | vs ddp % | wall s | to target s | bytes/step | "
            "x fewer than ddp-cgx4 | util |")  # fmt: skip
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in records:

        def f(v, fmt):  # noqa: E306
            return "-" if v is None else format(v, fmt)

        lines.append(
            f"| {r['method']} | {r['train_loss']:.4f} | {r['val_loss']:.4f} | "
            f"{f(r['val_vs_ddp_pct'], '+.2f')} | {r['wall_s'][-1]:.1f} | "
            f"{f(r['time_to_target_s'], '.1f')} | {r['bytes_per_rank_per_step']:,.0f} | "
            f"{f(r['fewer_bytes_than_ddp_cgx4'], '.1f')} | {r['utilisation']:.2f} |"
        )
    return "\n".join(lines)


def plot(records: List[dict], path: str) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4.5), layout="constrained")
    ax_wall, ax_tok = fig.subplots(1, 2)
    window = 1
    for r in records:
        window = max(1, len(r["losses"]) // 20)
        smooth = np.convolve(r["losses"], np.ones(window) / window, mode="valid")
        tokens = np.arange(window, len(r["losses"]) + 1) * r["tokens_per_step"]
        ax_wall.plot(r["wall_s"][window - 1 :], smooth, label=r["method"], linewidth=1)
        ax_tok.plot(tokens, smooth, label=r["method"], linewidth=1)
    for ax, xl in ((ax_wall, "wall time (s)"), (ax_tok, "tokens (all ranks)")):
        ax.set_xlabel(xl)
        ax.set_ylabel(f"training loss (mean over ranks, last {window} steps)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)


def run(args: argparse.Namespace) -> List[dict]:
    from benchmarks.train_workloads import GPT2Workload

    gloo = dist.new_group(backend="gloo")
    wl = GPT2Workload(args, args.seed)
    rank, world = dist.get_rank(), dist.get_world_size()
    n = sum(p.numel() for p in wl.model().parameters())
    compute_s = calibrate(wl, args)
    if rank == 0:
        print(f"# GPT-2 {n:,} parameters ({4 * n / 2**20:.2f} MiB fp32), {world} ranks x batch "
              f"{args.batch} x {args.seq_len} tokens; local step {1e3 * compute_s:.1f} ms "
              f"(rank 0, median of {args.calib})", flush=True)  # fmt: skip
    records = []
    for method in args.methods:
        records.append(train_method(method, wl, gloo, args, compute_s))
        r = records[-1]
        if rank == 0:
            print(f"# {method}: {r['wall_s'][-1]:.1f} s, train {r['train_loss']:.4f}, held-out "
                  f"{r['val_loss']:.4f}", flush=True)  # fmt: skip
    return records


def main(argv: Optional[List[str]] = None) -> int:
    from benchmarks.hosts import maybe_run_on_hosts

    rc = maybe_run_on_hosts(sys.argv[1:] if argv is None else argv, "benchmarks.diloco")
    if rc is not None:
        return rc
    args = parse_args(argv)
    torch.set_num_threads(max(1, args.threads))
    from benchmarks.train import _init

    own = _init()
    records = run(args)
    if dist.get_rank() == 0:
        target = add_comparisons(records, args.target_loss)
        print(f"# target loss {target}" if target is not None else "# no target loss", flush=True)
        print(table(records), flush=True)
        for path in (args.json, args.plot):
            if path and os.path.dirname(path):
                os.makedirs(os.path.dirname(path), exist_ok=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"args": {k: v for k, v in vars(args).items()}, "records": records}, f)
        if args.plot:
            plot(records, args.plot)
            print(f"# plot: {args.plot}", flush=True)
    if own:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
