"""Written by the GPU check (scripts/gpucheck/run.py) into its work folder, first on PYTHONPATH
of every process it starts: at exit, a process that used the fused kernels' selection
(torch_cgx.device.kernels) writes its decisions to $CGX_GPU_CHECK_DECISIONS/<pid>.json, so the
report lists every fallback, also those that ``auto`` mode takes quietly after one warning. Then
it runs the sitecustomize this one shadows, if there is one."""

import atexit
import importlib.util
import json
import os
import sys


def _write_decisions():
    kernels = sys.modules.get("torch_cgx.device.kernels")
    folder = os.environ.get("CGX_GPU_CHECK_DECISIONS")
    if kernels is None or not folder:
        return
    try:
        found = {repr(k): v for k, v in kernels.decisions().items()}
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{os.getpid()}.json"), "w") as f:
            json.dump(found, f)
    except Exception as e:  # noqa: BLE001 - never fail a process at exit for the report
        print(f"[gpu_check] could not record the kernel decisions: {e}", file=sys.stderr)


atexit.register(_write_decisions)


def _run_shadowed():
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if os.path.abspath(entry or ".") == here:
            continue
        path = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(path):
            spec = importlib.util.spec_from_file_location("_shadowed_sitecustomize", path)
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


_run_shadowed()
