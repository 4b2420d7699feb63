"""Where the sparse device codecs' time goes:
``python3 -m benchmarks.device_sparse_profile [--device cpu|cuda] [--size 64M] [--json PATH]``.

For one fp32 ``randn`` buffer (``--size`` bytes, default 64M on CUDA, 4M on a CPU) and each of
topk, randomk, threshold, dgc, graddrop and sparseloco at their default parameters, one run:

- times ``copy`` (``dst.copy_(x)``, the same bytes), ``encode`` and ``decode_add`` (into an fp32
  tensor), the median of ``--rounds`` rounds in rotating order; the ratios are ``copy`` time over
  the op's (the fraction of a copy's speed, as docs/gpu.md reports it). ``encode`` goes through
  the codec's dispatch (a fused kernel where ``torch_cgx.device.kernels`` selected one: the
  ``path`` column), ``ref_encode`` is the tensor-op reference where a fused path exists;
- profiles one more encode (reference and, where one applies, fused) with ``torch.profiler``
  and splits its op time (device time on CUDA, CPU time on a CPU) into classes:
  ``select`` (topk, sort, kthvalue, nonzero), ``elementwise`` (the RNG, the index arithmetic,
  the order keys, comparisons: int and float pointwise ops), ``gather`` (index, gather,
  scatter, index_put), ``pack`` (copies, cat, fills, arange), ``triton`` (a fused kernel),
  ``other``; per class the number of kernels (CUDA) or work ops (CPU) and the share of time;
- counts the tensor ops of one encode at the dispatcher by class, and the Triton launches (the
  op structure, identical on every device: ``TRITON_INTERPRET=1 CGX_DEVICE_KERNELS=fused`` on
  a CPU runs the fused path under Triton's interpreter, so that its counts show there too;
  its times are then the interpreter's).

CPU figures show the op structure (each work op is one kernel on a GPU), not GPU speed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Callable, Dict, List

import torch
import torch.profiler as tprof
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.compressors import parse_size
from benchmarks.device import Timer

NAMES = ("topk", "randomk", "threshold", "dgc", "graddrop", "sparseloco")
SEED, STREAM, SHARED = 1, 7, 3
TRITON_KERNELS = ("keys_kernel", "mask_kernel", "draw_kernel", "repeat_kernel", "jump_kernel",
                  "pack_kernel")  # fmt: skip
CLASSES = ("select", "elementwise", "gather", "pack", "triton", "other")
_SELECT = ("topk", "sort", "kthvalue", "nonzero", "argsort", "msort")
_GATHER = ("index", "index_put_", "_index_put_impl_", "gather", "scatter", "index_select", "take")
_PACK = ("copy_", "cat", "fill_", "zero_", "arange", "stack", "clone", "full", "zeros")
# metadata and allocation: no kernel of their own (their host time is in 'other' on a CPU)
_META = ("view", "slice", "as_strided", "empty", "empty_like", "empty_strided", "reshape", "to",
         "_to_copy", "expand", "unsqueeze", "select", "alias", "detach", "lift_fresh", "t",
         "contiguous", "_reshape_alias", "resolve_conj", "resolve_neg", "item", "narrow",
         "_local_scalar_dense", "record_stream", "resize_", "split", "unbind")  # fmt: skip


def op_class(name: str) -> str:
    """The class of a profiled op (an ``aten::`` name; a Triton kernel's)."""
    base = name.split("::")[-1]
    if not name.startswith("aten::"):
        return "triton" if name in TRITON_KERNELS else "other"
    if base in _META:
        return "meta"
    if any(base == s or base.startswith(s + "_") for s in _SELECT):
        return "select"
    if base in _GATHER or base.startswith("index_put"):
        return "gather"
    if base in _PACK:
        return "pack"
    return "elementwise"


def _cpu_rows(prof) -> List[tuple]:
    """(class, count, us, name) per CPU op of the profile: its self CPU time (a CPU run)."""
    rows = []
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CPU:
            continue
        cls = op_class(e.name)
        n = int(cls not in ("meta", "other"))
        rows.append(("other" if cls == "meta" else cls, n, e.self_cpu_time_total, e.name))
    return rows


def _cuda_rows(prof) -> List[tuple]:
    """(class, 1, us, name) per kernel, memcpy or memset the device ran: a kernel's class is that
    of the aten op that launched it (its name seen in that op's kernels), a Triton kernel's
    ``triton`` (launched from Python: no aten op), a memcpy / memset ``pack``."""
    launched: Dict[str, str] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CPU:
            cls = op_class(e.name)
            for k in getattr(e, "kernels", None) or []:
                launched.setdefault(k.name, "other" if cls == "meta" else cls)
    rows = []
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if e.name.endswith("_kernel") and e.name in TRITON_KERNELS:
            cls = "triton"
        elif e.name.startswith(("Memcpy", "Memset")):
            cls = "pack"
        else:
            cls = launched.get(e.name, "other")
        rows.append((cls, 1, e.time_range.elapsed_us(), e.name[:70]))
    return rows


def breakdown(fn: Callable[[], object], cuda: bool) -> Dict[str, dict]:
    """Per class of one call of ``fn``: ``{"n": kernels / work ops, "ms": time, "share": ...}``
    and ``"ops"``: the five costliest op (CUDA: kernel) names with their counts and times."""
    acts = [tprof.ProfilerActivity.CPU] + ([tprof.ProfilerActivity.CUDA] if cuda else [])
    fn()
    if cuda:
        torch.cuda.synchronize()
    with tprof.profile(activities=acts) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    out = {c: {"n": 0, "ms": 0.0} for c in CLASSES}
    per_op: Dict[str, List[float]] = {}
    for cls, n, us, name in _cuda_rows(prof) if cuda else _cpu_rows(prof):
        out[cls]["n"] += n
        out[cls]["ms"] += us / 1e3
        rec = per_op.setdefault(name, [0, 0.0])
        rec[0] += 1
        rec[1] += us / 1e3
    total = sum(v["ms"] for v in out.values()) or 1.0
    for v in out.values():
        v["share"] = v["ms"] / total
    top = sorted(per_op.items(), key=lambda kv: -kv[1][1])[:5]
    out["ops"] = {name: {"n": n, "ms": round(ms, 3)} for name, (n, ms) in top}
    return out


class _Counter(TorchDispatchMode):
    """Tensor ops at the dispatcher by class (work ops only: each is about one kernel on a GPU)
    and Triton launches (their own tensor ops, the interpreter's, left out)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts = {c: 0 for c in CLASSES}
        self.inside = 0
        self.patched: List[tuple] = []

    def __enter__(self):
        for mod, cls in (("triton.runtime.jit", "JITFunction"),
                         ("triton.runtime.interpreter", "InterpretedFunction")):  # fmt: skip
            owner = getattr(sys.modules.get(mod), cls, None)
            if owner is not None and "run" in vars(owner):
                self.patched.append((owner, owner.run))
                owner.run = self._launch(owner.run)
        return super().__enter__()

    def __exit__(self, *exc):
        for owner, run in self.patched:
            owner.run = run
        return super().__exit__(*exc)

    def _launch(self, run):
        def counted(fn_self, *args, **kwargs):
            self.counts["triton"] += 1
            self.inside += 1
            try:
                return run(fn_self, *args, **kwargs)
            finally:
                self.inside -= 1

        return counted

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.inside:
            cls = op_class("aten::" + func.__name__.split(".")[0])
            if cls not in ("meta", "other", "triton"):
                self.counts[cls] += 1
        return func(*args, **(kwargs or {}))


def op_counts(fn: Callable[[], object]) -> Dict[str, int]:
    """Per class the tensor ops (and ``triton``: the Triton launches) of one call of ``fn``."""
    with _Counter() as c:
        fn()
    return {k: v for k, v in c.counts.items() if v}


def measure(fns: Dict[str, Callable], timer: Timer, rounds: int, budget: float) -> Dict[str, float]:
    iters = {}
    for op, fn in fns.items():
        fn()
        iters[op] = max(1, min(200, int(budget / max(timer(fn, 1), 1e-7))))
    secs: Dict[str, List[float]] = {op: [] for op in fns}
    order = list(fns)
    for r in range(rounds):
        for op in order[r % len(order) :] + order[: r % len(order)]:
            secs[op].append(timer(fns[op], iters[op]))
    return {op: statistics.median(v) for op, v in secs.items()}


def profile_one(name: str, x: torch.Tensor, timer: Timer, rounds: int, budget: float) -> dict:
    from torch_cgx.device import codecs, kernels

    codec = codecs.get(name)
    dst = torch.empty_like(x)
    out = torch.zeros_like(x)
    payload = codec.encode(x, seed=SEED, stream=STREAM, shared=SHARED)
    fused = kernels.fused_for(codec, x.device, x.dtype)
    fns = {
        "copy": lambda: dst.copy_(x),
        "encode": lambda: codec.encode(x, seed=SEED, stream=STREAM, shared=SHARED),
        "decode_add": lambda: codec.decode_add_(out, payload),
    }
    if fused is not None:
        fns["ref_encode"] = lambda: codec.reference_encode(
            x, seed=SEED, stream=STREAM, shared=SHARED
        )
    secs = measure(fns, timer, rounds, budget)
    row = {"compressor": name, "path": "fused" if fused is not None else "reference"}
    row.update({f"{op}_ms": s * 1e3 for op, s in secs.items()})
    row.update({f"{op}_ratio": secs["copy"] / s for op, s in secs.items() if op != "copy"})
    cuda = x.device.type == "cuda"
    row["profile"] = {"encode": breakdown(fns["encode"], cuda)}
    row["ops"] = {"encode": op_counts(fns["encode"])}
    if fused is not None:
        row["profile"]["ref_encode"] = breakdown(fns["ref_encode"], cuda)
        row["ops"]["ref_encode"] = op_counts(fns["ref_encode"])
    return row


def _fmt_profile(p: dict) -> str:
    parts = [f"{c} {p[c]['n']}/{100 * p[c]['share']:.0f}%" for c in CLASSES if p[c]["ms"] > 0]
    return ", ".join(parts)


def report(rows: List[dict], device: str, size: int) -> str:
    unit = "kernels" if device == "cuda" else "work ops"
    lines = [f"device {device}, {size // 4} fp32 values ({size / 2**20:g} MiB); ratio = copy "
             f"time / op time; profile: class {unit}/share of the encode's op time",  # fmt: skip
             f"{'compressor':<11} {'path':<9} {'copy ms':>8} {'encode':>8} {'ratio':>7} "
             f"{'dec_add':>8} {'ratio':>7}  profile of one encode"]  # fmt: skip
    for r in rows:
        lines.append(
            f"{r['compressor']:<11} {r['path']:<9} {r['copy_ms']:8.3f} {r['encode_ms']:8.2f} "
            f"{r['encode_ratio']:7.4f} {r['decode_add_ms']:8.2f} {r['decode_add_ratio']:7.4f}  "
            + _fmt_profile(r["profile"]["encode"])
        )
        if "ref_encode" in r["profile"]:
            lines.append(
                f"{'':<11} {'reference':<9} {'':>8} {r['ref_encode_ms']:8.2f} "
                f"{r['ref_encode_ratio']:7.4f} {'':>8} {'':>7}  "
                + _fmt_profile(r["profile"]["ref_encode"])
            )
    lines.append("tensor ops at the dispatcher per encode, by class (triton: launches):")
    for r in rows:
        for which, counts in r["ops"].items():
            text = ", ".join(f"{k} {v}" for k, v in counts.items())
            lines.append(f"  {r['compressor']} {which}: {sum(counts.values())} ({text})")
    lines.append("costliest ops per encode (count, ms):")
    for r in rows:
        for which, p in r["profile"].items():
            ops = "; ".join(f"{k} x{v['n']} {v['ms']:.2f}" for k, v in p["ops"].items())
            lines.append(f"  {r['compressor']} {which}: {ops}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--size", type=parse_size, default=None, help="bytes of fp32 (64M, 4M)")
    ap.add_argument("--compressors", default=",".join(NAMES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget", type=float, default=None, help="seconds per timed round and op")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    size = args.size or (64 << 20 if cuda else 4 << 20)
    budget = args.budget if args.budget is not None else (0.05 if cuda else 0.3)
    names = [n for n in args.compressors.split(",") if n]
    bad = [n for n in names if n not in NAMES]
    if bad:
        ap.error(f"unknown sparse compressor(s) {bad}; choose from {', '.join(NAMES)}")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(size // 4, generator=g).to(device)
    timer = Timer(device)
    rows = [profile_one(n, x, timer, args.rounds, budget) for n in names]
    print(report(rows, device.type, size))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device.type, "size": size, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
