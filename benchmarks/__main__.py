"""``python -m benchmarks [<name> [args]]``: lists the entry points, or runs one.

Each entry point is a module of this folder with a ``main(argv)`` function, also runnable as
``python -m benchmarks.<name> [args]``; only the chosen one is imported (some need the
``bench`` extra's packages). To add one, add a line to ``ENTRY_POINTS`` and to
benchmarks/README.md (tests/test_packaging.py checks that both list every module that runs).
"""

from __future__ import annotations

import importlib
import sys
from typing import List

# name -> one line of what it measures (the module is benchmarks.<name>)
ENTRY_POINTS = {
    "demo": "the README's demo: Gloo against cgx at 8 and 4 bits, allreduce and DDP training",
    "codec": "codec throughput on CPU (max-min; --compressors: every registered compressor)",
    "allreduce": "allreduce time per size: Gloo, torch's hook baselines, cgx per algorithm",
    "python_compressors": "Python-written compressors: eager vs torch.compile vs native, vs memcpy",
    "float_formats": "error against bits of FP8 / MX / NVFP4 beside max-min, three inputs",
    "train": "DDP training: step time and loss of each gradient-reduction method",
    "train_report": "the convergence table of a training benchmark's --json records",
    "accuracy": "max-min's error per layer of a training workload's gradients",
    "fsdp": "FSDP2 training: communication time, bytes and loss per method",
    "plan": "the planner's acceptance benchmark: auto against every fixed configuration",
    "rotation": "cost of the rotation and the clipped range next to the codec",
    "soak": "many compressed allreduces and group cycles; fails on a leak",
    "hook_overhead": "each DDP hook's own time per gradient-bucket call, apart from the wire",
    "diloco": "DDP against DiLoCo / Streaming DiLoCo / SparseLoCo on emulated wide-area hosts",
    "diloco_momentum": "DiLoCo by hand: outer momentum against an average applied at once or late",
    "diloco_wire": "low-communication wire formats: INTELLECT-1's int8 vs max-min, sparseloco",
    "collaborative": "collaborative training on an emulated internet: torch_cgx against hivemind",
    "hosts": "emulated hosts (network namespaces, shaped links): build, measure, clean up",
    "device": "every compressor's device codec (tensor ops, fused kernel) vs the device's copy",
    "device_sparse_profile": "where the sparse device codecs' encode time goes: op classes, op "
    "counts, vs a copy",
    "device_ncu": "Nsight Compute's counters per codec call on a GPU: bytes moved over the "
    "fewest, issue slots, instructions per value, stalls",
    "device_allreduce": "allreduce of device tensors: cgx's device plane vs NCCL / Gloo exact",
    "triton_sweep": "launch sizes of the Triton kernels on a GPU, bytes checked, vs a copy",
    "triton_ptx": "the Triton kernels compiled for sm_90 (no GPU): integer divisions, SASS size",
}


def usage() -> str:
    width = max(map(len, ENTRY_POINTS))
    lines = [f"  {name:<{width}}  {what}" for name, what in ENTRY_POINTS.items()]
    return "\n".join(
        [
            "usage: python -m benchmarks <name> [args]   (or python -m benchmarks.<name> [args])",
            "entry points:",
            *lines,
            "run `python -m benchmarks.<name> --help` for one's options",
        ]
    )


def main(argv: List[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in ENTRY_POINTS:
        print(f"unknown entry point {name!r}\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"benchmarks.{name}")
    rc = module.main(rest)
    return 0 if rc is None else int(rc)


if __name__ == "__main__":
    sys.exit(main())
