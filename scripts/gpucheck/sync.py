"""The GPU check's host-synchronisation step: no data path waits for the device.

Two ranks on one device through a cgx world (``--device cuda``: ``device_id`` bound, max-min 4
bits; ``--device cpu``: CPU tensors with ``data_plane="device"``). After warm-up calls (the
fused kernels' one-time self-checks, the constants' first upload, DDP's bucket rebuild), three
data paths run again:

- ``ddp``: a DDP training step (forward, backward with the gradients' allreduce, SGD step);
- ``all_reduce``: ``dist.all_reduce`` of a device tensor;
- ``engine``: the device engine's allreduce with a residual, called directly.

On CUDA each runs under ``torch.cuda.set_sync_debug_mode("error")``, so any synchronising call
(``.item()``, a blocking copy, ``nonzero``) raises; on both devices each runs under the tests'
recorder of host reads of data and host-to-device copies of Python values
(tests/device_engine_reads.py), which must see nothing. Prints one line per path; exit status 1
if any path synchronised or was recorded.

Both ranks on one GPU (a one-GPU machine) cannot share NCCL, so the plane carries their payloads
over Gloo, which stages CUDA tensors through host memory: a synchronisation that belongs to the
carrier, not to the data path. Calls into such a carrier (the transport's collectives) run with
the debug mode off and are counted and printed; everything around them stays checked.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
import tempfile
import traceback
from typing import Callable, Dict

import torch
import torch.distributed as dist

SETTINGS = dict(compressor="maxmin", bits=4, bucket_size=512)


# the carrier's entry points (torch_cgx/device/transport.py) that reach the process group
CARRIER_CALLS = ("allgather", "alltoall_v", "sendrecv", "send", "recv", "allreduce_exact",
                 "reduce_sum", "broadcast", "reduce_scatter_sum")  # fmt: skip


@contextlib.contextmanager
def gloo_carrier_exempt(counts: Dict[str, int], cuda: bool):
    """On CUDA, calls into a Gloo carrier (``GroupTransport._gloo``) run with the sync debug mode
    off (Gloo stages device tensors through host memory); ``counts`` per method."""
    from torch_cgx.device.transport import GroupTransport

    if not cuda:
        yield
        return

    saved = {name: getattr(GroupTransport, name) for name in CARRIER_CALLS}

    def exempt(name, method):
        @functools.wraps(method)
        def call(self, *args, **kwargs):
            if not self._gloo or torch.cuda.get_sync_debug_mode() == 0:
                return method(self, *args, **kwargs)
            counts[name] = counts.get(name, 0) + 1
            torch.cuda.set_sync_debug_mode(0)
            try:
                return method(self, *args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode("error")

        return call

    for name, method in saved.items():
        setattr(GroupTransport, name, exempt(name, method))
    try:
        yield
    finally:
        for name, method in saved.items():
            setattr(GroupTransport, name, method)


def _guarded(fn: Callable[[], None], device: torch.device) -> Dict:
    """Runs ``fn`` under the sync debug mode (CUDA) and the recorders; what each saw."""
    out: Dict = {"sync": None, "recorded": [], "carrier_exempt": {}}
    cuda = device.type == "cuda"
    try:
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.set_sync_debug_mode("error")
        try:
            from device_engine_reads import host_syncs  # tests/ on PYTHONPATH

            with gloo_carrier_exempt(out["carrier_exempt"], cuda):
                seen = host_syncs(fn)  # also inside the calls c10d hands the plane
            # the codecs' CPU-only shortcuts (``device.type != "cpu" or ...``) never run on a GPU
            reads = [r for r in seen["reads"] if 'device.type != "cpu" or' not in r]
            if out["carrier_exempt"]:  # a Gloo carrier's host staging (transport.py) is its own
                reads = [r for r in reads if "transport.py" not in r]
            out["recorded"] = reads + seen["uploads"]
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode(0)
    except Exception as e:  # noqa: BLE001 - the report shows where the sync was
        out["sync"] = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-6:])
    if cuda:
        torch.cuda.synchronize(device)
    return out


def body(rank: int, size: int, device_kind: str, out_path: str) -> None:
    from ranks import init_world  # scripts/gpucheck, beside this script

    import torch_cgx
    from torch_cgx.device import plane
    from torch_cgx.device.engine import DeviceCall

    device = init_world(rank, device_kind)
    torch_cgx.set_config(**SETTINGS)
    engine = plane.plane_of(torch_cgx.cgx_backend()).engines[device.type]
    engine.check = "deferred"  # as on a GPU: the header flag is read where the caller syncs
    call = DeviceCall.from_config(torch_cgx.get_config(), True)

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64))
    ddp = torch.nn.parallel.DistributedDataParallel(
        net.to(device), device_ids=[device.index] if device.type == "cuda" else None
    )
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    batch = torch.randn(32, 256, generator=g).to(device)
    x = torch.randn(1 << 16, generator=g).to(device)
    residual = torch.zeros(1 << 16, device=device)

    def step() -> None:
        opt.zero_grad(set_to_none=False)
        ddp(batch).square().mean().backward()
        opt.step()

    paths = {
        "ddp": step,
        "all_reduce": lambda: dist.all_reduce(x.clone()),
        "engine": lambda: engine.allreduce(x.clone(), call, stream=3, residual=residual),
    }
    for fn in paths.values():  # warm-up: self-checks, constants, DDP's buckets
        fn()
        fn()
    results = {name: _guarded(fn, device) for name, fn in paths.items()}
    engine.check_headers()
    results["calls_compressed"] = engine.stats()["calls_compressed"]
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    from dist_helpers import run_ranks  # tests/ on PYTHONPATH (scripts/gpucheck/run.py sets it)

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("torch sees no CUDA device", file=sys.stderr)
        return 1
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        run_ranks(body, 2, args.device, f.name, timeout=180)
        results = json.load(open(f.name))
    bad = 0
    for name in ("ddp", "all_reduce", "engine"):
        r = results[name]
        ok = r["sync"] is None and not r["recorded"]
        bad += not ok
        exempt = r.get("carrier_exempt") or {}
        note = f"  (Gloo carrier, both ranks on one GPU: {exempt} exempted)" if exempt else ""
        print(f"{name:<11} {'ok' if ok else 'SYNCS'}{note}")
        if r["sync"]:
            print(f"  synchronised:\n{r['sync']}")
        for line in r["recorded"]:
            print(f"  recorded: {line}")
    print(f"compressed calls on the plane: {results['calls_compressed']}")
    if results["calls_compressed"] < 6:
        print("too few compressed calls: the paths did not reach the device plane")
        bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
