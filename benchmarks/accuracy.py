"""Where max-min's error comes from, per layer (docs/accuracy.md).

    python -m benchmarks.accuracy --workloads gpt2 --n-layer 2 --n-embd 128 --n-head 4 \
        --seq-len 64 --at 0,100,300

Trains the training benchmark's model in one process (same workload, flags and data), and at
the given steps quantizes each rank's gradient (2 ranks' batches) once, as the CGX hook would
send it: the compressible layers (``dim() > 1``, >= ``--layer-min-size`` values) concatenated in
DDP's bucket order (``concat``: buckets straddle layers), or each layer on its own buckets
(``layer``), rotated (``rot``), with stochastic rounding (``sr``). Per layer it prints the
gradient's norm, the share of exact zeros, and the relative error ``|Q(g) - g| / |g|`` of each
setting; ``zeros`` is the part of the error on the values that were exactly zero (rows of the
embedding no token of the batch used, which max-min turns into noise).
"""

from __future__ import annotations

import argparse
import sys
from typing import Dict, List, Optional

import torch

from benchmarks.train import parse_args
from benchmarks.train_workloads import make_workload
from torch_cgx import codec
from torch_cgx.hooks import levers

SETTINGS = ("concat", "layer", "layer+rot", "layer+sr")


def _quantize(flat: List[torch.Tensor], bits: int, bucket: int, setting: str) -> List[torch.Tensor]:
    """Each layer of ``flat`` after one encode + decode under ``setting``."""
    sizes = [t.numel() for t in flat]
    spans, o = [], 0
    for n in sizes:
        spans.append((o, n, None))
        o += n
    buf = torch.cat(flat)
    split = setting != "concat"
    seeds = list(range(1, len(flat) + 1)) if "rot" in setting else []
    st = levers.stage(buf, spans, bucket, split, torch.float32, [None] * len(flat), seeds)
    st.tensor = codec.decode(codec.encode(st.tensor, bits, bucket, stochastic="sr" in setting))
    out = torch.empty_like(buf)
    levers.unstage(st, out, bucket)
    return [out[s[0] : s[0] + s[1]] for s in spans]


def layer_errors(model, grads: List[torch.Tensor], bits: int, bucket: int, min_size: int):
    """Rows: name, numel, norm, zero share, per setting (relative error, zeros' share of it)."""
    named = [(n, p, g) for (n, p), g in zip(model.named_parameters(), grads)]
    comp = [
        (n, g.reshape(-1)) for n, p, g in reversed(named) if p.dim() > 1 and p.numel() >= min_size
    ]
    rows = {n: {"numel": g.numel(), "norm": float(g.norm()),
                "zeros": float((g == 0).float().mean())} for n, g in comp}  # fmt: skip
    for setting in SETTINGS:
        q = _quantize([g for _, g in comp], bits, bucket, setting)
        for (n, g), qg in zip(comp, q):
            err = qg - g
            norm = max(float(g.norm()), 1e-30)
            rows[n][setting] = float(err.norm()) / norm
            rows[n][setting + ":zeros"] = float(err[g == 0].norm()) / norm
    return rows


def report(rows: Dict[str, dict], step: int, bits: int) -> None:
    head = "| step | bits | layer | values | norm | zeros | " + " | ".join(SETTINGS) + " |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for n, r in rows.items():
        cells = [f"{r[s]:.3f} ({r[s + ':zeros']:.3f})" for s in SETTINGS]
        print(f"| {step} | {bits} | {n} | {r['numel']} | {r['norm']:.3g} | {r['zeros']:.0%} | "
              + " | ".join(cells) + " |")  # fmt: skip


def main(argv: Optional[List[str]] = None) -> int:
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--at", default="0,100,300", help="steps to analyse")
    extra.add_argument("--bits-list", default="4,2,1")
    ours, rest = extra.parse_known_args(argv)
    args = parse_args(rest)
    at = sorted(int(s) for s in ours.at.split(","))
    for name in args.workloads:
        torch.manual_seed(args.seed)
        wl = make_workload(name, args, 0, 2)
        model = wl.model()
        opt = wl.optimizer(model.parameters())
        print(f"# {name}: relative error |Q(g) - g| / |g| per layer, one quantization, bucket "
              f"{args.bucket_size}; in brackets the part on exact zeros")  # fmt: skip
        for step in range(at[-1] + 1):
            grads = []
            for rank in range(2):
                model.zero_grad()
                wl.loss(model, wl.get_batch(step, rank)).backward()
                grads.append([p.grad.detach().clone() for p in model.parameters()])
            if step in at:
                for bits in (int(b) for b in ours.bits_list.split(",")):
                    report(layer_errors(model, grads[0], bits, args.bucket_size,
                                        args.layer_min_size), step, bits)  # fmt: skip
            for p, a, b in zip(model.parameters(), *grads):
                p.grad = (a + b) / 2
            opt.step()
    return 0


if __name__ == "__main__":
    sys.exit(main())
