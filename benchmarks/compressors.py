"""Every registered compressor side by side: ``python -m benchmarks.codec --compressors all``.

For one fp32 buffer (``--size``, default 64M bytes: 16M values of ``randn``) and each compressor
of ``torch_cgx.compressors`` with its default parameters, interleaved in one loop whose order
rotates every round (the timing helpers of :mod:`benchmarks.codec`), it times the median of:

- ``encode``: ``compressors.get(name).encode(x, seed, stream, shared, out=buf)`` into a
  preallocated payload buffer (as the backend's workspace and a hook reuse theirs; the torch-ops
  peers allocate, as GRACE / HiPress write them); ``--encode-alloc`` times ``encode`` without
  ``out=`` (a new payload per call: page faults of a fresh buffer included);
- ``decode_add``: ``decode_add_(out, payload)`` into a preallocated fp32 tensor;
- ``memcpy``: ``dst.copy_(x)`` of the input bytes, and ``pcpy``: ``copy_`` of as many bytes as
  the payload, between preallocated tensors;
- ``torch_encode`` / ``torch_decode_add``: the torch-ops version of
  :mod:`benchmarks.torch_ops_compressors`,

with ``torch.set_num_threads`` and the codec's thread count both set to ``--threads``. Every rate
is GB/s of fp32 input (``4 * numel / seconds / 1e9``). Before timing, our decode and the torch-ops
decode are judged against the input (:mod:`benchmarks.compressor_checks`) and our
``decode_add_`` must add exactly ``decode``'s values; the ``verify`` column says ``ok``, ``FAIL``
(ours) or ``t-FAIL`` (the torch-ops peer), and the run goes on.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from functools import partial
from typing import Callable, Dict, List, Sequence

import torch

import torch_cgx
from benchmarks.compressor_checks import check
from benchmarks.compressors_report import format_table  # noqa: F401  (this module's API)
from benchmarks.timing import (
    MB,
    OtherLoad,
    alternate_rounds,
    auto_iters,
    auto_torch_iters,
    cpu_model,
    resolve_threads,
    set_threads,
)
from benchmarks.torch_ops_compressors import OPS as TORCH_OPS
from torch_cgx import codec
from torch_cgx import compressors as registry

OPS = ("encode", "decode_add", "memcpy", "pcpy", "torch_encode", "torch_decode_add")
DEFAULT_SIZE = "64M"
SEED, STREAM, SHARED = 1, 7, 3  # the encode context of every timed call (fixed: same bytes)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """Bytes of fp32 input: ``64M`` -> 64 MiB, ``256K``, ``1G``, or a plain number of bytes."""
    t = text.strip().upper().removesuffix("B")
    unit = t[-1:] if t[-1:] in _UNITS else ""
    try:
        value = float(t[: len(t) - len(unit)]) * _UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (e.g. 64M, 256K)") from None
    if value < 4:
        raise argparse.ArgumentTypeError(f"size {text!r} is less than one fp32 value")
    return int(value)


def parse_names(text: str) -> List[str]:
    """``all`` -> every native compressor, else a comma list of their names (those written in
    Python are their own torch-ops code: benchmarks.python_compressors)."""
    known = registry.native.names()
    if text.strip() == "all":
        return known
    wanted = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in wanted if v not in known]
    if unknown or not wanted:
        raise argparse.ArgumentTypeError(
            f"unknown compressors {', '.join(unknown) or '(none given)'}; registered: "
            f"{', '.join(known)} (or all)"
        )
    return list(dict.fromkeys(wanted))


def default_params(name: str) -> Dict[str, float]:
    """The registry's defaults of ``name``'s parameters (what ``compressors.get(name)`` uses)."""
    return {
        s["name"]: (int(s["default"]) if s["integer"] else s["default"])
        for s in registry.params(name)
    }


# ---- one compressor -------------------------------------------------------------------------


def _verify(name: str, comp, x: torch.Tensor, payload, torch_payload, params) -> dict:
    """Our decode and the torch-ops decode judged against ``x``; ``decode_add_`` vs decode."""
    decoded = comp.decode(payload)
    ours = check(name, x, decoded, params)
    verdict, detail = ("ok", "") if ours.ok else ("FAIL", ours.detail)
    base = torch.linspace(-1.0, 1.0, x.numel())
    expect = base + decoded
    comp.decode_add_(base, payload)
    if verdict == "ok" and not torch.equal(base, expect):
        verdict, detail = "FAIL", "decode_add_ does not add exactly decode's values"
    peer = check(
        name, x, TORCH_OPS[name].decode_add_(torch.zeros_like(x), torch_payload, params), params
    )
    if verdict == "ok" and not peer.ok:
        verdict, detail = "t-FAIL", f"torch-ops: {peer.detail}"
    return {
        "verify": verdict,
        "verify_detail": detail,
        "max_err": ours.max_err,
        "torch_max_err": peer.max_err,
    }


def _measure(fns, n_per_op, warmup, log, max_other_load, retries, retry_wait):
    """codec.py's interleaved timing, measured again while other processes load the CPUs."""
    attempts = 0
    while True:
        attempts += 1
        load = OtherLoad()
        secs = alternate_rounds(fns, n_per_op, warmup)
        other = load.fraction()
        if other is None or other <= max_other_load or attempts > retries:
            return secs, other, attempts
        if log is not None:
            log(f"  other processes used {100 * other:.0f}% of the CPUs: measuring again")
        time.sleep(retry_wait)


def measure_compressor(
    name: str,
    x: torch.Tensor,
    bufs: dict,
    iters: int,
    torch_iters: int,
    *,
    warmup: int = 1,
    verify: bool = True,
    seed: int = 0,
    log=None,
    max_other_load: float = 0.15,
    retries: int = 2,
    retry_wait: float = 2.0,
    alloc: bool = False,
) -> dict:
    """One record: the timings of ``name`` on ``x``; ``bufs`` holds the preallocated ``out``,
    ``dst`` (like ``x``) and ``tout`` tensors, reused across compressors."""
    comp, params, peer = registry.get(name), default_params(name), TORCH_OPS[name]
    # Not the input's seed: draws from x's own stream (randn's uniforms) bias stochastic rounding.
    gen = torch.Generator().manual_seed(seed + 0x5EED)
    payload = comp.encode(x, SEED, STREAM, SHARED)
    torch_payload = peer.encode(x, params, gen)
    result = {"verify": "-", "verify_detail": "", "max_err": None, "torch_max_err": None}
    if verify:
        result = _verify(name, comp, x, payload, torch_payload, params)
    psrc, pdst = payload.clone(), torch.empty_like(payload)
    encode_out = (
        {} if alloc else {"out": torch.empty(comp.encoded_size(x.numel()), dtype=torch.uint8)}
    )
    fns = {
        "encode": partial(comp.encode, x, SEED, STREAM, SHARED, **encode_out),
        "decode_add": partial(comp.decode_add_, bufs["out"], payload),
        "memcpy": partial(bufs["dst"].copy_, x),
        "pcpy": partial(pdst.copy_, psrc),
        "torch_encode": partial(peer.encode, x, params, gen),
        "torch_decode_add": partial(peer.decode_add_, bufs["tout"], torch_payload, params),
    }
    n_per_op = {op: torch_iters if op.startswith("torch") else iters for op in OPS}
    secs, other, attempts = _measure(
        fns, n_per_op, warmup, log, max_other_load, retries, retry_wait
    )
    nbytes = 4 * x.numel()
    gbps = {op: nbytes / secs[op] / 1e9 for op in OPS}
    rec = {
        "name": name,
        "params": params,
        "numel": x.numel(),
        "input_bytes": nbytes,
        "payload_bytes": payload.numel(),
        "torch_payload_bytes": torch_payload.nbytes,
        "ratio": nbytes / payload.numel(),
        "traits": comp.traits,
        "iters": iters,
        "torch_iters": torch_iters,
        "warmup": warmup,
        "encode_includes_alloc": alloc,
        "other_load": other,
        "attempts": attempts,
        **result,
    }
    for op in OPS:
        rec[f"{op}_s"], rec[f"{op}_gbps"] = secs[op], gbps[op]
    for op in ("encode", "decode_add"):
        rec[f"{op}_vs_memcpy"] = gbps[op] / gbps["memcpy"]
        rec[f"{op}_vs_torch"] = gbps[op] / gbps[f"torch_{op}"]
    return rec


def compressor_table(
    names: Sequence[str],
    numel: int,
    threads: Sequence[int] = (1,),
    iters: int | None = None,
    *,
    warmup: int = 1,
    verify: bool = True,
    seed: int = 0,
    log: Callable[[str], None] | None = None,
    max_other_load: float = 0.15,
    retries: int = 2,
    retry_wait: float = 2.0,
    alloc: bool = False,
) -> List[dict]:
    """One record per (thread count, compressor) on ``numel`` values of ``randn``. ``iters=None``
    picks iterations by size as the max-min benchmark does (half, at least 3, for torch ops)."""
    size_mb = 4 * numel / MB
    n_iters = auto_iters(size_mb) if iters is None else int(iters)
    n_torch = auto_torch_iters(n_iters) if iters is None else int(iters)
    x = torch.randn(numel, generator=torch.Generator().manual_seed(seed))
    bufs = {key: torch.zeros_like(x) for key in ("out", "dst", "tout")}
    saved = (torch.get_num_threads(), codec.num_threads())
    records: List[dict] = []
    try:
        for th in threads:
            set_threads(th)
            for name in names:
                rec = measure_compressor(
                    name,
                    x,
                    bufs,
                    n_iters,
                    n_torch,
                    warmup=warmup,
                    verify=verify,
                    seed=seed,
                    log=log,
                    max_other_load=max_other_load,
                    retries=retries,
                    retry_wait=retry_wait,
                    alloc=alloc,
                )
                rec.update(threads=th, isa=torch_cgx._C.isa(), torch_version=torch.__version__)
                records.append(rec)
                if log is not None:
                    log(
                        f"{name} ({th} thr): encode {rec['encode_gbps']:.2f} GB/s, decode_add "
                        f"{rec['decode_add_gbps']:.2f} GB/s, verify {rec['verify']}"
                    )
    finally:
        torch.set_num_threads(saved[0])
        if codec.num_threads() != saved[1]:
            codec.set_num_threads(saved[1])
    return records


# ---- command line ---------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.codec",
        description="Encode / decode_add speed of every registered compressor (default "
        "parameters) vs memcpy and a torch-ops version of each (CPU).",
    )
    p.add_argument(
        "--compressors",
        required=True,
        metavar="NAMES",
        help=f"all, or a comma list of: {', '.join(registry.native.names())}",
    )
    p.add_argument(
        "--size",
        default=DEFAULT_SIZE,
        help="fp32 input bytes: 64M (default), 256K, 1G ... (randn values)",
    )
    p.add_argument(
        "--threads",
        default="1",
        help='comma-separated thread counts; "all" = the codec\'s thread count at '
        "startup (default 1)",
    )
    p.add_argument(
        "--iters",
        type=int,
        default=None,
        help="timed iterations per operation (default: by size as in the max-min "
        "benchmark, 12 at 64 MB; half of that, at least 3, for torch ops)",
    )
    p.add_argument("--warmup", type=int, default=1, help="untimed calls per operation (1)")
    p.add_argument("--json", metavar="PATH", help="also write the records as a JSON list")
    p.add_argument("--seed", type=int, default=0, help="seed of the random input (0)")
    p.add_argument(
        "--max-other-load",
        type=float,
        default=0.15,
        help="measure a compressor again when other processes used more than this "
        "fraction of the CPUs (0.15)",
    )
    p.add_argument("--retries", type=int, default=2, help="re-measurements per compressor (2)")
    p.add_argument(
        "--encode-alloc", action="store_true", help="time encode without out= (new payloads)"
    )
    p.add_argument(
        "--no-verify",
        dest="verify",
        action="store_false",
        help="skip the checks of the decoded values",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    all_threads = codec.num_threads()
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        names = parse_names(args.compressors)
        numel = parse_size(args.size) // 4
        threads = resolve_threads(args.threads, all_threads)
    except (argparse.ArgumentTypeError, ValueError) as e:
        parser.error(str(e))
    if args.iters is not None and args.iters < 1:
        parser.error("--iters must be >= 1")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    log(
        f"compressor benchmark: torch_cgx from {os.path.dirname(torch_cgx.__file__)}, isa "
        f"{torch_cgx._C.isa()}, cpu {cpu_model()}, {os.cpu_count()} cpus"
    )
    records = compressor_table(
        names,
        numel,
        threads,
        args.iters,
        warmup=max(0, args.warmup),
        verify=args.verify,
        seed=args.seed,
        log=log,
        max_other_load=args.max_other_load,
        retries=max(0, args.retries),
        alloc=args.encode_alloc,
    )
    print(format_table(records))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
        log(f"wrote {len(records)} records to {args.json}")
    return 0 if all(r["verify"] in ("ok", "-") for r in records) else 1
