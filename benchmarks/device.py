"""Every compressor's device codec on one device: ``python -m benchmarks.device --device cuda``.

For one fp32 buffer (``--size``, default 64M bytes of ``randn``) on ``--device`` and each
compressor (``--compressors``, default all registered; max-min once per ``--maxmin-bits``), one
run times, in rounds whose order rotates (so that a noisy machine affects all alike):

- ``copy``: ``dst.copy_(x)`` of the same bytes on the same device (the bandwidth to beat);
- ``encode`` / ``decode_add``: the device codec (``torch_cgx.device.codecs``, tensor operations:
  the reference), ``decode_add_`` into a preallocated fp32 tensor;
- ``fused_encode`` / ``fused_decode_add``: the fused kernel where one applies (the Triton
  kernels of max-min, qsgd, terngrad, tbq and the sign codecs on CUDA tensors;
  ``torch_cgx.device.kernels.fused_for``: it passed its self-check), else ``-``;
- ``torch_encode`` / ``torch_decode_add``: the GRACE-style torch-ops peer of
  :mod:`benchmarks.torch_ops_compressors` on the same device (its factories and generator on
  the device through ``with torch.device(...)``; ``-`` where it cannot run there).

Every rate is GB/s of fp32 input (``4 * numel / seconds / 1e9``), the median of ``--rounds`` rounds
of ``--iters`` calls; CUDA rounds are timed with CUDA events after a warm-up and a synchronisation,
CPU rounds with ``perf_counter``. On CUDA the fused calls and the copy are timed once more from
CUDA-graph replays (``graph_fused_*_vs_copy``, a ``#`` line under the row): the device's time
alone, where the events' also hold the host's between launches. Before timing each compressor is
verified (``verify`` column, any failure makes the exit status 1): on a small input (65539 values)
the payload must be the native CPU codec's bytes (dense compressors; for sparse ones a difference,
such as a tie broken otherwise on a GPU, is reported as ``bytes=differ`` and the payload must still
decode within the bound), the fused payload too; on the timed input the decode must meet the
compressor's definition (:mod:`benchmarks.compressor_checks`) and ``decode_add_`` (reference and
fused) must add exactly the decoded values.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence

import torch

from benchmarks.compressor_checks import check
from benchmarks.compressors import default_params, parse_names, parse_size
from benchmarks.torch_ops_compressors import OPS as TORCH_OPS

SEED, STREAM, SHARED = 1, 7, 3  # the encode context of every call (fixed: same bytes)
SMALL = 65539  # values of the byte-comparison input (2^16 + 3: a raw tail for most buckets)
OPS = ("copy", "encode", "decode_add", "fused_encode", "fused_decode_add", "torch_encode",
       "torch_decode_add")  # fmt: skip


class Timer:
    """Seconds per call of ``fn`` on ``device``: CUDA events or ``perf_counter``."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def __call__(self, fn: Callable[[], object], iters: int) -> float:
        self.sync()
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3 / iters
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t) / iters

    def captured(self, fn: Callable[[], object]) -> Optional[Callable[[], object]]:
        """A CUDA graph's replay of one call of ``fn``, to time the device without the host
        (Python, Triton's launcher, the allocator) between launches; None off CUDA or where
        ``fn`` cannot be captured (a host synchronisation, a host-to-device copy)."""
        if not self.cuda:
            return None
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()  # compiled, self-checked, cached before the capture
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g):
                fn()
        except Exception:  # noqa: BLE001 - not capturable: the caller keeps the events' time
            torch.cuda.synchronize()
            return None
        return g.replay


def measure(fns: Dict[str, Callable], timer: Timer, iters: int, rounds: int, warmup: int,
            budget: float) -> Dict[str, float]:  # fmt: skip
    """Median seconds per call of each op; ``iters`` 0: as many as fit ``budget`` s a round."""
    n = {}
    for op, fn in fns.items():
        for _ in range(max(1, warmup)):
            fn()
        n[op] = iters or max(1, min(1000, int(budget / max(timer(fn, 1), 1e-7))))
    secs: Dict[str, List[float]] = {op: [] for op in fns}
    order = list(fns)
    for r in range(rounds):
        for op in order[r % len(order) :] + order[: r % len(order)]:
            secs[op].append(timer(fns[op], n[op]))
    return {op: statistics.median(v) for op, v in secs.items()}


def _peer(name: str, x: torch.Tensor, params: dict):
    """The torch-ops peer's (encode, decode_add) calls on ``x``'s device, or None."""
    peer = TORCH_OPS.get(name)
    if peer is None:
        return None
    gen = torch.Generator(device=x.device).manual_seed(0)
    out = torch.zeros_like(x)

    def encode():
        with torch.device(x.device):  # the peers' torch.rand(shape, generator=gen) etc.
            return peer.encode(x, params, gen)

    def decode_add():
        with torch.device(x.device):
            return peer.decode_add_(out, enc, params)

    try:
        enc = encode()
        decode_add()
    except Exception:  # noqa: BLE001 - a peer that cannot run on this device: no column
        return None
    return encode, decode_add


def _reference(dc):
    """(encode(x), decode_add_(out, payload)) of the tensor operations, whatever kernels say."""
    if hasattr(dc, "reference_encode"):  # its encode / decode_add_ may go fused
        return (lambda x: dc.reference_encode(x, seed=SEED, stream=STREAM, shared=SHARED)), (
            dc.reference_decode_add_)  # fmt: skip
    return (lambda x: dc.encode(x, seed=SEED, stream=STREAM, shared=SHARED)), dc.decode_add_


def _fused(dc, device: torch.device):
    """The fused implementation that passed its self-check for ``dc`` (a codec with a fused
    dispatch: max-min, the level and sign codecs, the sparse ones), else None."""
    if not hasattr(dc, "reference_encode"):
        return None
    from torch_cgx.device import kernels

    return kernels.fused_for(dc, device, torch.float32)


def verify(name: str, dc, fused, x: torch.Tensor, payload: torch.Tensor, params: dict) -> tuple:
    """(verdict, detail, bytes): see the module; ``x`` and ``payload`` on the device."""
    from torch_cgx import compressors as registry

    native = registry.get(name, **params)
    small = torch.randn(SMALL, generator=torch.Generator().manual_seed(5))
    want = native.encode(small, SEED, STREAM, SHARED)
    dev = small.to(x.device)
    encode, decode_add = _reference(dc)
    got = encode(dev).cpu()
    same = torch.equal(got, want)
    sparse = registry.get(name).traits["sparse"]
    if not same and not sparse:
        return "FAIL", "device payload is not the native codec's bytes (small input)", "differ"
    fused_small = None if fused is None else fused.encode(dc, dev, SEED, STREAM, SHARED).cpu()
    if fused_small is not None and not torch.equal(fused_small, got):  # got: native for dense
        return "FAIL", "fused payload differs from the reference's (small input)", "differ"
    if not same:
        ok = check(name, small, dc.decode(got.to(x.device), SMALL).cpu(), params)
        if not ok.ok:
            return "FAIL", f"small input: {ok.detail}", "differ"
    decoded = dc.decode(payload, x.numel())
    res = check(name, x.cpu(), decoded.cpu(), params)
    if not res.ok:
        return "FAIL", res.detail, "=" if same else "differ"
    base = torch.linspace(-1.0, 1.0, x.numel(), device=x.device)
    for what, add in (("reference", decode_add), ("fused", None)):
        if what == "fused":
            if fused is None:
                continue
            if not torch.equal(fused.encode(dc, x, SEED, STREAM, SHARED), payload):
                return "FAIL", "fused payload differs from the reference's", "="
            add = lambda o, p: fused.decode_add_(dc, o, p)  # noqa: E731
        out = base.clone()
        add(out, payload)
        if not torch.equal(out, base + decoded):
            return "FAIL", f"{what} decode_add_ does not add exactly the decoded values", "="
    return "ok", "", "=" if same else "differ"


def measure_one(name: str, params: dict, x: torch.Tensor, bufs: dict, args, timer) -> dict:
    from torch_cgx.device import codecs

    dc = codecs.get(name, **params)
    device = x.device
    fused = _fused(dc, device)
    encode, decode_add = _reference(dc)
    payload = encode(x)
    rec = {"name": name, "params": params, "numel": x.numel(), "device": str(device),
           "payload_bytes": payload.numel(), "fused": getattr(fused, "name", None)}  # fmt: skip
    verdict, detail, same = ("-", "", "-")
    if args.verify:
        verdict, detail, same = verify(name, dc, fused, x, payload, params)
    rec.update(verify=verdict, verify_detail=detail, native_bytes=same)
    out = bufs["out"]
    fns = {
        "copy": lambda: bufs["dst"].copy_(x),
        "encode": lambda: encode(x),
        "decode_add": lambda: decode_add(out, payload),
    }
    if fused is not None:
        fns["fused_encode"] = lambda: fused.encode(dc, x, SEED, STREAM, SHARED)
        fns["fused_decode_add"] = lambda: fused.decode_add_(dc, out, payload)
    peer = _peer(name, x, params) if args.torch_ops else None
    if peer is not None:
        fns["torch_encode"], fns["torch_decode_add"] = peer
    secs = measure(fns, timer, args.iters, args.rounds, args.warmup, args.budget)
    graphed = {op: timer.captured(fns[op]) for op in ("copy", "fused_encode", "fused_decode_add")
               if op in fns and timer.cuda}  # fmt: skip
    graphed = {op: fn for op, fn in graphed.items() if fn is not None}
    if "copy" in graphed and len(graphed) > 1:  # the device's time alone, the host's left out
        g = measure(graphed, timer, args.iters, args.rounds, args.warmup, args.budget)
        for op in ("fused_encode", "fused_decode_add"):
            rec[f"graph_{op}_vs_copy"] = g["copy"] / g[op] if op in g else None
    nbytes = 4 * x.numel()
    for op in OPS:
        rec[f"{op}_gbps"] = nbytes / secs[op] / 1e9 if op in secs else None
    for op in ("encode", "decode_add"):
        ref, fu, pe = (rec[f"{k}{op}_gbps"] for k in ("", "fused_", "torch_"))
        rec[f"{op}_vs_copy"] = ref / rec["copy_gbps"]
        rec[f"fused_{op}_vs_copy"] = None if fu is None else fu / rec["copy_gbps"]
        rec[f"fused_{op}_vs_reference"] = None if fu is None else fu / ref
        best = fu if fu is not None else ref
        rec[f"{op}_vs_torch"] = None if pe is None else best / pe
    return rec


def _f(v: Optional[float], fmt: str = "{:.3g}") -> str:
    return "-" if v is None else fmt.format(v)


COLUMNS = [("compressor", 14), ("verify", 6), ("bytes", 6)] + [
    (c, 9) for c in ("copy", "enc", "dec", "f.enc", "f.dec", "t.enc", "t.dec", "enc/cp", "dec/cp",
                     "fe/cp", "fd/cp", "fe/e", "fd/d", "e/t", "d/t")]  # fmt: skip


def format_row(r: dict) -> str:
    label = r["name"] + (f"{r['params']['bits']}b" if r["name"] == "maxmin" else "")
    cells = [label, r["verify"], r["native_bytes"]] + [
        _f(r[k])
        for k in (
            "copy_gbps",
            "encode_gbps",
            "decode_add_gbps",
            "fused_encode_gbps",
            "fused_decode_add_gbps",
            "torch_encode_gbps",
            "torch_decode_add_gbps",
            "encode_vs_copy",
            "decode_add_vs_copy",
            "fused_encode_vs_copy",
            "fused_decode_add_vs_copy",
            "fused_encode_vs_reference",
            "fused_decode_add_vs_reference",
            "encode_vs_torch",
            "decode_add_vs_torch",
        )  # fmt: skip
    ]
    return " ".join(c.rjust(w) for c, (_, w) in zip(cells, COLUMNS))


def header(device: torch.device, numel: int) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    names = " ".join(n.rjust(w) for n, w in COLUMNS)
    return (
        f"# device codecs on {device} ({name}), torch {torch.__version__}, {numel} fp32 values; "
        f"GB/s of fp32 input; enc/dec: tensor ops (reference), f.: fused kernel, t.: torch-ops "
        f"peer; x/cp: ratio to the copy; fe/e, fd/d: fused / reference; e/t, d/t: best / peer"
        f"\n{names}"
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.device", description=__doc__.split(
        "\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    p.add_argument("--size", type=parse_size, default=parse_size("64M"),
                   help="fp32 bytes (64M; 256K, 1G, ...)")  # fmt: skip
    p.add_argument("--compressors", type=parse_names, default=parse_names("all"),
                   help="all (default) or a comma list of registered compressors")  # fmt: skip
    p.add_argument("--maxmin-bits", default="4", help="max-min rows' bits, comma list (4)")
    p.add_argument("--iters", type=int, default=0, help="calls per round (0: auto)")
    p.add_argument("--rounds", type=int, default=5, help="rounds; the median is reported (5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per op first (2)")
    p.add_argument("--budget", type=float, default=0.05, help="seconds per auto round (0.05)")
    p.add_argument("--no-torch-ops", dest="torch_ops", action="store_false",
                   help="leave out the torch-ops peers")  # fmt: skip
    p.add_argument("--no-verify", dest="verify", action="store_false", help="skip checks")
    p.add_argument("--json", metavar="PATH", help="also write the records as a JSON list")
    return p


def _device(text: str) -> torch.device:
    try:
        device = torch.device(text)
    except RuntimeError as e:
        raise ValueError(f"--device: {e}") from None
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"--device must be cuda or cpu, got {text!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: torch sees no CUDA device (use --device cpu)")
    return device


def run(args) -> List[dict]:
    device = _device(args.device)
    bits = [int(b) for b in args.maxmin_bits.split(",") if b.strip()]
    numel = args.size // 4
    x = torch.randn(numel, generator=torch.Generator().manual_seed(0)).to(device)
    bufs = {"out": torch.zeros_like(x), "dst": torch.empty_like(x)}
    timer = Timer(device)
    print(header(device, numel), flush=True)
    records = []
    for name in args.compressors:
        if name not in _device_codecs():
            print(f"{name:>14} (no device codec)", flush=True)
            continue
        variants = [dict(default_params(name), bits=b) for b in bits] if name == "maxmin" else [
            default_params(name)]  # fmt: skip
        for params in variants:
            rec = measure_one(name, params, x, bufs, args, timer)
            records.append(rec)
            print(format_row(rec), flush=True)
            if rec.get("graph_fused_encode_vs_copy") or rec.get("graph_fused_decode_add_vs_copy"):
                print(f"#   {name}: CUDA-graph replays (no host between launches): fe/cp "
                      f"{_f(rec.get('graph_fused_encode_vs_copy'))}, fd/cp "
                      f"{_f(rec.get('graph_fused_decode_add_vs_copy'))}", flush=True)  # fmt: skip
            if rec["verify"] == "FAIL":
                print(f"#   {name}: {rec['verify_detail']}  <-- FAIL", flush=True)
    return records


def _device_codecs() -> List[str]:
    """The native compressors' device codecs (those written in Python have no native bytes to
    verify against: benchmarks.python_compressors)."""
    from torch_cgx import compressors
    from torch_cgx.device import codecs

    return [n for n in codecs.names() if not compressors.is_python(n)]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        records = run(args)
    except ValueError as e:
        print(f"benchmarks.device: {e}", file=sys.stderr)
        return 2
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
    return 1 if any(r["verify"] == "FAIL" for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
