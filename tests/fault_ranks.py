"""Fault injection on real ranks (tests/test_faults.py, docs/reliability.md): one rank is killed
(SIGKILL) or stopped (SIGSTOP) in a chosen transport operation of a compressed allreduce, or
just before a forwarded collective; the survivors report when and how they failed and whether
they shut down.

Long run (every algorithm, every transport operation of the call, both signals):
    python tests/fault_ranks.py
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys
import time
from typing import Dict, List, Optional

import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dist_helpers import _entry, context_start_method, free_port  # noqa: E402

GROUP_TIMEOUT_S = 4.0
FORWARDED = ("broadcast", "all_gather", "all_to_all")


def _forwarded(name: str, x):
    import torch
    import torch.distributed as dist

    if name == "broadcast":
        dist.broadcast(x, src=0)
    elif name == "all_gather":
        dist.all_gather_into_tensor(torch.empty(x.numel() * dist.get_world_size()), x)
    else:
        m = x.numel() // dist.get_world_size() * dist.get_world_size()
        dist.all_to_all_single(torch.empty(m), x[:m])


def _faulted_call(case: Dict, rank: int, x) -> int:
    """Arms the fault on the victim; returns the transport operations one call takes here."""
    import torch.distributed as dist

    from torch_cgx import _C

    if case["collective"] != "all_reduce":
        if rank == case["victim"]:
            os.kill(os.getpid(), case["signal"])
        _forwarded(case["collective"], x)
        return 0
    before = _C._transport_ops()
    dist.all_reduce(x.clone())  # the same call once, unfaulted: its operations counted
    per_call = _C._transport_ops() - before
    if rank == case["victim"]:
        _C._fault_after(min(case["op"], per_call - 1), case["signal"])
    dist.all_reduce(x)
    return per_call


def body(rank: int, world: int, case: Dict, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    import torch_cgx

    timeout = datetime.timedelta(seconds=case["timeout_s"])
    dist.init_process_group("cgx", timeout=timeout)
    torch_cgx.set_config(bits=4, bucket_size=128, algorithm=case["algorithm"])
    x = torch.randn(50_000, generator=torch.Generator().manual_seed(rank))
    dist.all_reduce(x.clone())  # connections made before anything is timed
    report = {"rank": rank, "completed": 0}
    start = time.monotonic()
    try:
        report["per_call"] = _faulted_call(case, rank, x)
        for _ in range(100):  # a call may complete before the fault; the next ones cannot
            report["completed"] += 1
            dist.all_reduce(x)
        report["error"] = "no error after 100 calls"
    except Exception as e:  # noqa: BLE001 - the survivor's error is what is measured
        report["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        report["raised"] = True
    report["seconds_to_error"] = time.monotonic() - start
    start = time.monotonic()
    dist.destroy_process_group()
    report["shutdown_s"] = time.monotonic() - start
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)


def _ddp_hook(name: str, model):
    from torch_cgx import compression, hooks

    if name == "cgx":
        return hooks.CGXState(compression_params={"bits": 4}), hooks.cgx_hook
    if name == "compression":
        state = hooks.CompressionState(compressor="topk", params={"ratio": 0.1}, layer_min_size=64)
        return state, hooks.compression_hook
    if name == "policy":
        policy = compression.SizeAdaptiveCompression(
            64, compression.NoCompression(), compression.Uniform8BitQuantization()
        )
        return compression.PolicyState(model, policy), compression.policy_hook
    if name == "powersgd":
        return hooks.PowerSGDState(None, 1, start_powerSGD_iter=2), hooks.powerSGD_hook
    return None, getattr(hooks, name)  # allreduce_hook, fp16_compress_hook


def body_ddp(rank: int, world: int, case: Dict, out_dir: str) -> None:
    """DDP steps with a comm hook; the victim kills itself before step 3's forward: the survivor
    must raise in that step (the unreduced gradients never applied)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torch_cgx  # noqa: F401  (registers the backend)

    dist.init_process_group("cgx", timeout=datetime.timedelta(seconds=case["timeout_s"]))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    ddp = DDP(model, bucket_cap_mb=0.05)  # several buckets
    ddp.register_comm_hook(*_ddp_hook(case["hook"], model))
    report = {"rank": rank, "completed": 0}
    start = time.monotonic()
    try:
        for step in range(6):
            if step == 3:
                if rank == case["victim"]:
                    os.kill(os.getpid(), case["signal"])
                start = time.monotonic()
            ddp(torch.randn(8, 64)).sum().backward()
            report["completed"] += step >= 3
        report["error"] = "no error"
    except Exception as e:  # noqa: BLE001 - the survivor's error is what is measured
        report["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        report["raised"] = True
    report["seconds_to_error"] = time.monotonic() - start
    del ddp, model
    import gc

    gc.collect()
    start = time.monotonic()
    dist.destroy_process_group()
    report["shutdown_s"] = time.monotonic() - start
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)


def run_case(case: Dict, world: int, out_dir: str, limit_s: float = 60, fn=None) -> List[Dict]:
    """Starts `world` ranks running ``fn`` (default ``body``) on `case`; returns the survivors'
    reports (a survivor that hangs or dies shows as a report with "hung" or "exitcode")."""
    case = {"timeout_s": GROUP_TIMEOUT_S, "algorithm": "sra", **case}
    ctx = mp.get_context(context_start_method())
    port, env = free_port(), dict(os.environ)
    procs = [
        ctx.Process(target=_entry, args=(r, fn or body, world, port, env, (case, out_dir)))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + limit_s
    survivors = [r for r in range(world) if r != case["victim"]]
    for r in survivors:
        procs[r].join(max(0.1, deadline - time.monotonic()))
    reports = []
    for r in survivors:
        path = os.path.join(out_dir, f"rank{r}.json")
        hung = procs[r].is_alive()
        report: Dict = {"rank": r}
        if os.path.exists(path):
            with open(path) as f:
                report = json.load(f)
        report["hung"], report["exitcode"] = hung, procs[r].exitcode
        reports.append(report)
    for p in procs:  # the stopped victim, and any hung survivor
        if p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
        p.join(5)
    return reports


def cases(algorithms=("sra", "ring", "allgather", "tree"), ops=(0, 1, 2, 3, 4)):
    """Every algorithm x fault at each transport operation (capped at the call's last) x signal,
    and the forwarded collectives x signal."""
    out = []
    for sig in (signal.SIGKILL, signal.SIGSTOP):
        for alg in algorithms:
            out += [{"collective": "all_reduce", "algorithm": alg, "op": k, "signal": sig}
                    for k in ops]  # fmt: skip
        out += [{"collective": c, "op": 0, "signal": sig} for c in FORWARDED]
    return out


HOOKS = ("allreduce_hook", "fp16_compress_hook", "cgx", "compression", "policy", "powersgd")


def _report(label: str, reports: List[Dict], completed_ok: bool = True) -> tuple:
    ok = all(r.get("raised") and not r["hung"] and r["exitcode"] == 0 for r in reports)
    ok = ok and completed_ok
    t = max(r.get("seconds_to_error", float("inf")) for r in reports)
    print(f"{label:<36} {'ok ' if ok else 'BAD'} error after {t:5.2f} s  "
          f"{reports[0].get('error', '')[:70]}", flush=True)  # fmt: skip
    return ok, t


def main(argv: Optional[List[str]] = None) -> int:
    import tempfile

    results = []
    for case in cases():
        case["victim"] = 1
        with tempfile.TemporaryDirectory() as d:
            reports = run_case(case, 3, d)
        name = signal.Signals(case["signal"]).name
        label = f"{case['collective']} {case.get('algorithm', '')} op {case['op']} {name}"
        results.append(_report(label, reports))
    for hook in HOOKS:
        with tempfile.TemporaryDirectory() as d:
            reports = run_case({"hook": hook, "signal": signal.SIGKILL, "victim": 1}, 2, d,
                               fn=body_ddp)  # fmt: skip
        no_step = all(r["completed"] == 0 for r in reports)
        results.append(_report(f"DDP {hook} SIGKILL", reports, no_step))
    bad = sum(not ok for ok, _ in results)
    print(f"{len(results)} cases, {bad} bad; slowest error {max(t for _, t in results):.2f} s "
          f"(group timeout {GROUP_TIMEOUT_S:g} s)")  # fmt: skip
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
