"""The GPU check's first step: what the machine has (device, driver, torch / triton / CUDA /
NCCL versions, tools), as JSON to ``--json PATH`` and on stdout. Nothing is installed or built."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys

MIN_TORCH = (2, 11)


def _run(cmd) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        return (done.stdout or done.stderr).strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"unavailable ({type(e).__name__})"


def probe() -> dict:
    import torch
    import torch.distributed as dist

    env = {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "nccl_available": dist.is_nccl_available(),
        "tools": {
            t: shutil.which(t)
            for t in ("nvcc", "cmake", "ninja", "compute-sanitizer", "ncu", "nvidia-smi")
        },  # fmt: skip
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception as e:  # noqa: BLE001 - any import failure: no triton here
        env["triton"] = f"unavailable ({type(e).__name__})"
    if env["tools"]["nvcc"]:
        env["nvcc"] = _run(["nvcc", "--version"]).splitlines()[-1]
    if env["cuda_available"]:
        props = torch.cuda.get_device_properties(0)
        env.update(
            device=torch.cuda.get_device_name(0),
            device_count=torch.cuda.device_count(),
            capability=f"{props.major}.{props.minor}",
            memory_gib=round(props.total_memory / 2**30, 1),
            multiprocessors=props.multi_processor_count,
            nccl=".".join(map(str, torch.cuda.nccl.version())) if env["nccl_available"] else None,
        )
        if env["tools"]["nvidia-smi"]:
            env["driver"] = _run(["nvidia-smi", "--query-gpu=driver_version",
                                  "--format=csv,noheader"])  # fmt: skip
    else:
        env["device"] = platform.processor() or platform.machine()
    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    if version < MIN_TORCH:
        env["problem"] = f"torch {torch.__version__} is older than 2.11"
    return env


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--json", required=True)
    p.add_argument("--device", default="")
    args = p.parse_args()
    env = probe()
    with open(args.json, "w") as f:
        json.dump(env, f, indent=1)
    print(json.dumps(env, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
