"""Where the device codecs' GPU time goes, from Nsight Compute's counters:
``python -m benchmarks.device_ncu [--size 64M] [--compressors LIST] [--out DIR]``.

Runs itself under ``ncu`` (``$NCU``, else ``ncu`` on PATH, else ``/usr/local/cuda/bin/ncu``) on
one fp32 ``randn`` buffer (``--size`` bytes, 64M) with ``CGX_DEVICE_KERNELS=fused``: first a
device-to-device copy of the same bytes (the ceiling), then each compressor's encode and
``decode_add_`` through the codec's own dispatch (the fused kernels where one applies), each
call compiled and self-checked first, then profiled alone inside ``cudaProfilerStart`` /
``cudaProfilerStop`` (``--profile-from-start off``) behind a marker kernel
(``torch.cuda._sleep``) that tells the calls apart in the report. ``--clock-control none``:
the card's clocks are left as they are (ncu would lock them to base otherwise).

Per kernel: time, DRAM bytes and throughput (% of peak), SM throughput, issue slots busy,
achieved occupancy, registers, thread instructions per value, the two largest warp stall
reasons (cycles per issued instruction) and the three busiest pipes (% of their peak
instruction rate: integer work runs at half the fp32 rate on sm_90, conversions at 1/8).
Per call, the method's two numbers: the fewest bytes it must move (encode: the input read and
the payload written; ``decode_add_``: the payload and ``out`` read, ``out`` written), the DRAM
bytes it moved over those (re-reads, uncoalesced access, spills), and its speed in those bytes
over the copy's (the issue's ratio, one launch each, caches flushed between ncu's passes).
Where the metrics cannot be collected (a name this ncu lacks), one more run takes them without
the pipes, and then one ncu's standard sections instead; every figure is in ``DIR/ncu.csv``
(the report's details page) and ``DIR/ncu.json``, the report in ``DIR/ncu.ncu-rep``.
``ERR_NVGPUCTRPERM`` in the log: the counters need root on that machine.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
from typing import Dict, List, Optional, Sequence

DEFAULT = "maxmin,qsgd,terngrad,onebit,signsgd,tbq,topk,sparseloco"
SEED, STREAM, SHARED = 1, 7, 3
MARKER = "spin_kernel"  # torch.cuda._sleep's kernel
STALLS = r"regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
# each pipe's instructions over its peak (alu: integer and logic, fma: fp32 and IMAD, xu:
# conversions such as F2I / I2F, lsu: memory): a pipe near 100 % bounds a kernel whose issue
# slots are not all busy (on sm_90 the integer pipes take half the fp32 rate, conversions 1/8)
PIPES = r"regex:sm__inst_executed_pipe_[a-z0-9_]+\.avg\.pct_of_peak_sustained_active"
# key -> (the metric's name under --metrics, its display name in ncu's standard sections)
METRICS = {
    "ns": ("gpu__time_duration.sum", "Duration"),
    "dram_read": ("dram__bytes_read.sum", None),
    "dram_write": ("dram__bytes_write.sum", None),
    "dram_pct": ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM Throughput"),
    "sm_pct": ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "Compute (SM) Throughput"),
    "issue_pct": ("smsp__issue_active.avg.pct_of_peak_sustained_active", "Issue Slots Busy"),
    "occ_pct": ("sm__warps_active.avg.pct_of_peak_sustained_active", "Achieved Occupancy"),
    "regs": ("launch__registers_per_thread", "Registers Per Thread"),
    "thread_inst": ("smsp__thread_inst_executed.sum", None),
    "grid": ("launch__grid_size", "Grid Size"),
    "block": ("launch__block_size", "Block Size"),
}
SECTIONS = ("SpeedOfLight", "LaunchStats", "Occupancy", "WarpStateStats", "SchedulerStats")


# ---- the workload (what ncu runs) -----------------------------------------------------------


def _cases(names: List[str]) -> List[tuple]:
    from benchmarks.compressors import default_params

    return [(n, dict(default_params(n), bits=4) if n == "maxmin" else default_params(n))
            for n in names]  # fmt: skip


def workload(args) -> int:
    """Each call once, alone in a profiled window behind a marker; ``args.manifest``: the calls
    in order with their value counts and fewest bytes."""
    import torch

    from torch_cgx.device import codecs

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    n = args.size // 4
    x = torch.randn(n, generator=torch.Generator().manual_seed(0)).to(device)
    out, dst = torch.zeros_like(x), torch.empty_like(x)
    calls = [("copy", "copy", {}, lambda: dst.copy_(x), 8 * n)]
    for name, params in _cases(args.compressors):
        dc = codecs.get(name, **params)
        payload = dc.encode(x, seed=SEED, stream=STREAM, shared=SHARED)  # compiles, self-checks
        dc.decode_add_(out, payload)
        size = payload.numel()
        calls.append((name, "encode", params,
                      lambda dc=dc: dc.encode(x, seed=SEED, stream=STREAM, shared=SHARED),
                      4 * n + size))  # fmt: skip
        calls.append((name, "decode_add", params,
                      lambda dc=dc, p=payload: dc.decode_add_(out, p), size + 8 * n))  # fmt: skip
    manifest = []
    for case, phase, params, fn, least in calls:
        fn()  # warm: the allocator's blocks, the launch caches
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
            torch.cuda._sleep(1)
        fn()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
        manifest.append(dict(case=case, phase=phase, params=params, numel=n, least_bytes=least))
    with open(args.manifest, "w") as f:
        json.dump(manifest, f, indent=1)
    return 0


# ---- the report -----------------------------------------------------------------------------


def _number(text: str):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return text


def parse_details(text: str) -> List[dict]:
    """The kernels of ncu's details page (``--csv --page details``) in launch order: ``{"id",
    "name", "metrics": {metric name: value}}`` (numbers as floats, thousands separators
    dropped)."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines)
                  if ln.startswith('"') and '"Metric Name"' in ln), None)  # fmt: skip
    if start is None:
        return []
    kernels: Dict[str, dict] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        if not row.get("ID") or not row.get("Metric Name"):
            continue
        k = kernels.setdefault(row["ID"], {"id": int(_number(row["ID"])), "metrics": {},
                                           "name": row.get("Kernel Name", "?")})  # fmt: skip
        k["metrics"][row["Metric Name"]] = _number(row.get("Metric Value", ""))
    return sorted(kernels.values(), key=lambda k: k["id"])


def _value(metrics: dict, key: str) -> Optional[float]:
    for name in METRICS[key]:
        v = metrics.get(name) if name else None
        if isinstance(v, float):
            return v
    return None


def stalls(metrics: dict, top: int = 2) -> List[tuple]:
    """The ``top`` largest stall reasons: (reason, cycles per issued instruction)."""
    pre, post = "smsp__average_warps_issue_stalled_", "_per_issue_active.ratio"
    found = [(k[len(pre) : -len(post)], v) for k, v in metrics.items()
             if k.startswith(pre) and k.endswith(post) and isinstance(v, float)]  # fmt: skip
    return sorted(found, key=lambda kv: -kv[1])[:top]


def pipes(metrics: dict, top: int = 3) -> List[tuple]:
    """The ``top`` busiest pipes: (pipe, % of its peak instruction rate)."""
    pre, post = "sm__inst_executed_pipe_", ".avg.pct_of_peak_sustained_active"
    found = [(k[len(pre) : -len(post)], v) for k, v in metrics.items()
             if k.startswith(pre) and k.endswith(post) and isinstance(v, float)]  # fmt: skip
    return sorted(found, key=lambda kv: -kv[1])[:top]


def kernel_row(k: dict, numel: int) -> dict:
    m = k["metrics"]
    row = {key: _value(m, key) for key in METRICS}
    row["name"] = k["name"]
    rd, wr = row.pop("dram_read"), row.pop("dram_write")
    row["dram_bytes"] = None if rd is None or wr is None else rd + wr
    ti = row.pop("thread_inst")
    row["inst_per_value"] = None if ti is None else ti / numel
    row["stalls"] = stalls(m)
    row["pipes"] = pipes(m)
    return row


def assign(kernels: List[dict], manifest: List[dict]) -> List[dict]:
    """The calls of ``manifest`` with their kernels: the report's kernels split at the markers
    (one before each call). A report whose markers do not match the calls gives one row of
    every kernel, unassigned (``case`` "?")."""
    groups: List[List[dict]] = []
    for k in kernels:
        if MARKER in k["name"]:
            groups.append([])
        elif groups:
            groups[-1].append(k)
    if len(groups) != len(manifest):
        numel = manifest[0]["numel"] if manifest else 1
        return [dict(case="?", phase="?", kernels=[kernel_row(k, numel) for k in kernels
                                                   if MARKER not in k["name"]])]  # fmt: skip
    calls = []
    for call, ks in zip(manifest, groups):
        rows = [kernel_row(k, call["numel"]) for k in ks]
        c = dict(call, kernels=rows)
        times = [r["ns"] for r in rows]
        c["ns"] = sum(times) if rows and None not in times else None
        moved = [r["dram_bytes"] for r in rows]
        c["moved_over_least"] = (sum(moved) / call["least_bytes"]
                                 if rows and None not in moved else None)  # fmt: skip
        calls.append(c)
    copy = next((c for c in calls if c["phase"] == "copy" and c["ns"]), None)
    for c in calls:
        ok = copy is not None and c["ns"]
        c["vs_copy"] = (c["least_bytes"] / c["ns"]) / (copy["least_bytes"] / copy["ns"]) if ok \
            else None  # fmt: skip
    return calls


def _f(v, fmt="{:.3g}") -> str:
    return "-" if v is None else fmt.format(v)


def table(calls: List[dict]) -> str:
    """One line per call (its time, speed over the copy's, bytes moved over the fewest), under
    it one per kernel."""
    out = [f"{'call':<24}{'us':>9}{'vs copy':>9}{'moved/least':>12}",
           f"  {'kernel':<30}{'us':>9}{'dram%':>7}{'sm%':>6}{'issue%':>7}{'occ%':>6}{'regs':>5}"
           f"{'inst/v':>8}  stalls (cycles per issue); busiest pipes (% of peak)"]  # fmt: skip
    for c in calls:
        ns = c.get("ns")
        out.append(f"{c['case'] + ' ' + c['phase']:<24}{_f(ns and ns / 1e3):>9}"
                   f"{_f(c.get('vs_copy')):>9}{_f(c.get('moved_over_least')):>12}")  # fmt: skip
        for r in c["kernels"]:
            st = ", ".join(f"{k} {v:.2g}" for k, v in r["stalls"])
            if r.get("pipes"):
                st += "; " + ", ".join(f"{k} {v:.0f}" for k, v in r["pipes"])
            pct = "".join(f"{_f(r[k], '{:.0f}'):>{w}}" for k, w in
                          (("dram_pct", 7), ("sm_pct", 6), ("issue_pct", 7), ("occ_pct", 6),
                           ("regs", 5)))  # fmt: skip
            out.append(f"  {r['name'][:30]:<30}{_f(r['ns'] and r['ns'] / 1e3):>9}{pct}"
                       f"{_f(r['inst_per_value']):>8}  {st}".rstrip())  # fmt: skip
    return "\n".join(out)


# ---- the driver -----------------------------------------------------------------------------


def find_ncu() -> Optional[str]:
    for cand in (os.environ.get("NCU"), shutil.which("ncu"), "/usr/local/cuda/bin/ncu"):
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


# what each profiling run collects, in the order tried: an ncu that refuses one (a metric name
# it lacks) is asked for the next
KINDS = ("metrics and pipes", "metrics", "standard sections")


def ncu_command(ncu: str, report: str, kind: str, inner: List[str]) -> List[str]:
    """The profiling run: only the windows, the clocks as found, and the ``kind`` of KINDS: the
    metrics of METRICS and the stall reasons (and the pipes' utilisation), or ncu's standard
    sections."""
    cmd = [ncu, "--profile-from-start", "off", "--clock-control", "none", "-f", "-o", report]
    if kind != KINDS[-1]:
        names = [m[0] for m in METRICS.values()] + [STALLS]
        cmd += ["--metrics", ",".join(names + ([PIPES] if kind == KINDS[0] else []))]
    else:
        for s in SECTIONS:
            cmd += ["--section", s]
    return cmd + inner


def profile(args) -> int:
    ncu = find_ncu()
    if ncu is None:
        print("benchmarks.device_ncu: no ncu ($NCU, PATH, /usr/local/cuda/bin)", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    report, manifest = os.path.join(args.out, "ncu"), os.path.join(args.out, "ncu_calls.json")
    inner = [sys.executable, "-m", "benchmarks.device_ncu", "--workload", "--manifest", manifest,
             "--size", str(args.size), "--compressors", ",".join(args.compressors),
             "--device", args.device]  # fmt: skip
    env = dict(os.environ, CGX_DEVICE_KERNELS="fused")
    with open(os.path.join(args.out, "ncu_profile.log"), "w") as log:
        for kind in KINDS:
            for stale in (report + ".ncu-rep", manifest):  # a run's files are its own
                if os.path.exists(stale):
                    os.remove(stale)
            cmd = ncu_command(ncu, report, kind, inner)
            print("$ " + " ".join(cmd), file=log, flush=True)
            try:
                rc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    timeout=args.timeout).returncode  # fmt: skip
            except subprocess.TimeoutExpired:
                print(f"benchmarks.device_ncu: ncu ran past --timeout {args.timeout:g} s",
                      file=sys.stderr)  # fmt: skip
                return 1
            if rc == 0 and os.path.exists(report + ".ncu-rep") and os.path.exists(manifest):
                break
            then = KINDS.index(kind) + 1
            print(f"# ncu exit {rc}" + (f"; again for the {KINDS[then]}" if then < len(KINDS)
                                        else ""), file=log, flush=True)  # fmt: skip
        else:
            print(f"benchmarks.device_ncu: ncu failed (exit {rc}); see {log.name}", file=sys.stderr)
            return 1
    details = [ncu, "--import", report + ".ncu-rep", "--csv", "--page", "details",
               "--print-units", "base"]  # fmt: skip
    text = subprocess.run(details, capture_output=True, text=True, timeout=args.timeout,
                          env=dict(os.environ, LC_ALL="C")).stdout  # fmt: skip
    with open(os.path.join(args.out, "ncu.csv"), "w") as f:
        f.write(text)
    with open(manifest) as f:
        calls = assign(parse_details(text), json.load(f))
    print(f"{kind} of {ncu}:\n" + table(calls))
    with open(os.path.join(args.out, "ncu.json"), "w") as f:
        json.dump(calls, f, indent=1)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from benchmarks.compressors import parse_names, parse_size

    p = argparse.ArgumentParser(prog="python -m benchmarks.device_ncu",
                                description=__doc__.split("\n\n")[0])  # fmt: skip
    p.add_argument("--size", type=parse_size, default=parse_size("64M"), help="fp32 bytes (64M)")
    p.add_argument("--compressors", type=parse_names, default=parse_names(DEFAULT),
                   help=f"a comma list ({DEFAULT})")  # fmt: skip
    p.add_argument("--out", default=".", help="where the ncu files go (.)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per ncu run (300)")
    p.add_argument("--workload", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--manifest", help=argparse.SUPPRESS)
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # cpu: the tests
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return workload(args) if args.workload else profile(args)


if __name__ == "__main__":
    sys.exit(main())
