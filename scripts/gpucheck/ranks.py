"""The GPU check's two-rank step: two ranks on one device through the cgx backend.

``--device cuda``: both ranks bind the same GPU (``init_process_group("cgx", device_id=...)``),
so the device plane must pick a carrier that allows it (Gloo: NCCL refuses two ranks of one
communicator on one GPU). ``--device cpu``: CPU tensors with ``data_plane="device"``, the same
Python code. Against a ``data_plane="host"`` cgx group fed CPU copies of the same values (the
native CPU engine), for every registered compressor x algorithm (and max-min's levers, fp16 /
bf16 input): ``all_reduce`` (SUM and AVG), then ``reduce_scatter_tensor`` and a DDP step with
``device_ids``. The device codecs write the native bytes and the device engine mirrors the native
algorithms, so every result must be bitwise the native one (NaN compared as NaN) and the same on
both ranks. Prints a table; exit status 1 on any difference.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Dict, List, Tuple

import torch
import torch.distributed as dist

ALGORITHMS = ("sra", "ring", "tree", "allgather")
MAXMIN = dict(compressor="maxmin", bits=4, bucket_size=512)
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def cases() -> List[Tuple[str, Dict, str]]:
    """(name, settings, input dtype) of every all_reduce case."""
    from torch_cgx import compressors

    out = []
    for name in compressors.names():
        base = dict(MAXMIN) if name == "maxmin" else dict(compressor=name)
        out += [(f"{name}/{a}", {**base, "algorithm": a}, "fp32") for a in ALGORITHMS]
    out += [
        ("maxmin2-stochastic/sra", {**MAXMIN, "bits": 2, "stochastic": True}, "fp32"),
        (
            "maxmin4-raw-tail/ring",
            {**MAXMIN, "skip_incomplete_buckets": True, "algorithm": "ring"},
            "fp32",
        ),  # fmt: skip
        ("maxmin4-rotation/sra", {**MAXMIN, "rotation": "on"}, "fp32"),
        ("maxmin8/sra-fp16", {**MAXMIN, "bits": 8}, "fp16"),
        ("maxmin4/ring-bf16", {**MAXMIN, "algorithm": "ring"}, "bf16"),
        ("qsgd/sra-bf16", dict(compressor="qsgd"), "bf16"),
    ]
    return out


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal, except that any NaN equals any NaN (GPUs write the canonical NaN)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    bits = {4: torch.int32, 2: torch.int16, 8: torch.int64}[a.element_size()]
    same = a.view(bits) == b.view(bits)
    if a.is_floating_point():
        same |= torch.isnan(a) & torch.isnan(b)
    return bool(same.all())


def _inputs(rank: int, n: int, salt: int, dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * salt + rank)
    x = torch.randn(n, generator=g) * (1 + rank)
    x[:: max(1, n // 7)] *= 8  # outliers: wide bucket ranges
    return x.to(dtype)


def _replicas_agree(t: torch.Tensor, group) -> bool:
    mine = t.contiguous().view(torch.uint8)
    out = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, mine, group=group)
    return all(torch.equal(o, mine) for o in out)


def _configure(groups, changes: Dict) -> str:
    """Both groups to ``changes`` (collective); '' or why the settings are refused."""
    import torch_cgx

    full = {"compressor_params": "", "bits": 32, "stochastic": False, "rotation": "off",
            "skip_incomplete_buckets": False, "bucket_size": 512, **changes}  # fmt: skip
    try:
        for g in groups:
            torch_cgx.set_config(group=g, **full)
    except ValueError as e:
        return str(e)
    return ""


def _compare(got: torch.Tensor, want: torch.Tensor, gloo, replicated: bool = True) -> Dict:
    """``replicated``: every rank holds the whole result (not a reduce-scatter's own slice)."""
    got = got.cpu()
    diff = (got.double() - want.double()).abs().nan_to_num(0)
    agree = _replicas_agree(got, gloo) if replicated else None
    return {"bitwise": same_values(got, want), "replicas": agree,
            "max_diff": float(diff.max()) if diff.numel() else 0.0}  # fmt: skip


def _python_case(world, a: torch.Tensor, b: torch.Tensor, op, stream: int) -> None:
    """A compressor written in Python has no host engine: its CPU run is the same group's
    plane, both calls with one given stream."""
    import torch_cgx

    backend, config = torch_cgx.cgx_backend(world), torch_cgx.get_config(world).to_native()
    config.stream = stream
    for t in (a, b):
        backend.allreduce_with(t, config, op == dist.ReduceOp.AVG).wait()


def _allreduce_cases(rank, device, world, host, gloo, n: int, python: bool = False) -> Dict:
    """The cases of native compressors, or (``python``) of those written in Python: run last,
    since their reference calls advance the world group's call counter alone."""
    from torch_cgx import compressors

    results = {}
    for salt, (name, changes, dt) in enumerate(cases()):
        if compressors.is_python(changes.get("compressor", "")) != python:
            continue
        refused = _configure((world, host), changes)
        if refused:
            results[name] = {"refused": refused}
            continue
        op = dist.ReduceOp.AVG if salt % 2 else dist.ReduceOp.SUM
        x = _inputs(rank, n, salt, DTYPES[dt])
        a, b = x.to(device), x.clone()
        if python:
            _python_case(world, a, b, op, 1000 + salt)
        else:
            dist.all_reduce(a, op=op, group=world)
            dist.all_reduce(b, op=op, group=host)
        results[name] = _compare(a, b, gloo)
    return results


def _reduce_scatter_cases(rank, device, world, host, gloo, n: int) -> Dict:
    results = {}
    for name in ("maxmin", "fp16", "qsgd", "onebit", "topk", "randomk", "threshold"):
        changes = dict(MAXMIN) if name == "maxmin" else dict(compressor=name)
        refused = _configure((world, host), changes)
        if refused:
            results[f"rs/{name}"] = {"refused": refused}
            continue
        x = _inputs(rank, 2 * n, 77, torch.float32)
        a, b = torch.empty(n, device=device), torch.empty(n)
        dist.reduce_scatter_tensor(a, x.to(device), op=dist.ReduceOp.AVG, group=world)
        dist.reduce_scatter_tensor(b, x.clone(), op=dist.ReduceOp.AVG, group=host)
        results[f"rs/{name}"] = _compare(a, b, gloo, replicated=False)
    return results


def _ddp_grads(rank, group, device, device_ids):
    torch.manual_seed(0)  # the same initial weights on every rank and device
    net = torch.nn.Linear(64, 300).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(net, device_ids=device_ids,
                                                    process_group=group)  # fmt: skip
    g = torch.Generator().manual_seed(rank)
    x, c = torch.randn(1, 64, generator=g), torch.randn(1, 300, generator=g)
    # one exactly rounded product per gradient (c_i x_j): equal on every device
    (ddp(x.to(device)) * c.to(device)).sum().backward()
    return torch.cat([p.grad.detach().reshape(-1) for p in net.parameters()])


def init_world(rank: int, device_kind: str) -> torch.device:
    """The cgx world of this rank and its device: ``cuda``, the GPU bound with ``device_id`` (all
    ranks share one on a one-GPU machine); ``cpu``, CPU tensors on the device plane."""
    import torch_cgx

    if device_kind == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        dist.init_process_group("cgx", device_id=device)
        return device
    dist.init_process_group("cgx", pg_options=torch_cgx.Options(data_plane="device"))
    return torch.device("cpu")


def body(rank: int, size: int, device_kind: str, out_path: str, n: int) -> None:
    import torch_cgx
    from torch_cgx.device import plane

    device = init_world(rank, device_kind)
    world = dist.group.WORLD
    host = dist.new_group(backend="cgx", pg_options=torch_cgx.Options(data_plane="host"))
    gloo = dist.new_group(backend="gloo")
    p = plane.plane_of(torch_cgx.cgx_backend(world))
    assert p is not None and device.type in p.engines, "the world's device plane is missing"
    results = _allreduce_cases(rank, device, world, host, gloo, n)
    results.update(_reduce_scatter_cases(rank, device, world, host, gloo, n // 2))
    _configure((world, host), MAXMIN)
    ids = [device.index] if device.type == "cuda" else None
    on_device = _ddp_grads(rank, world, device, ids)
    results["ddp/maxmin4"] = _compare(on_device, _ddp_grads(rank, host, torch.device("cpu"), None),
                                      gloo)  # fmt: skip
    results.update(_allreduce_cases(rank, device, world, host, gloo, n, python=True))
    engine = p.engines[device.type]
    engine.check_headers()
    summary = {"carrier": type(engine.t.pg).__name__, "stats": engine.stats(), "cases": results}
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(summary, f, indent=1)
    dist.barrier(gloo)
    dist.destroy_process_group()


def table(summary: Dict) -> Tuple[str, int]:
    """The printed table and the number of failing cases."""
    rows, bad = [f"carrier {summary['carrier']}; engine counters {summary['stats']}"], 0
    rows.append(f"{'case':<28} {'result':<10} {'max_diff':>10} replicas")
    for name, r in summary["cases"].items():
        if "refused" in r:
            rows.append(f"{name:<28} {'refused':<10} {'':>10} {r['refused'][:60]}")
            continue
        ok = r["bitwise"] and r["replicas"] is not False
        bad += not ok
        verdict = "bitwise" if r["bitwise"] else "DIFFERS"
        agree = "-" if r["replicas"] is None else r["replicas"]
        rows.append(f"{name:<28} {verdict:<10} {r['max_diff']:>10.3g} {agree}")
    return "\n".join(rows), bad


def main() -> int:
    from dist_helpers import run_ranks  # tests/ on PYTHONPATH (scripts/gpucheck/run.py sets it)

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--numel", type=int, default=0, help="values per case (default by device)")
    p.add_argument("--out", default="", help="write the JSON summary here too")
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("torch sees no CUDA device", file=sys.stderr)
        return 1
    n = args.numel or (100_003 if args.device == "cuda" else 4_099)
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        run_ranks(body, 2, args.device, f.name, n, timeout=240)
        summary = json.load(open(f.name))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)
    text, bad = table(summary)
    print(text)
    print(f"{bad} failing cases of {len(summary['cases'])}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
