"""Fused device kernels in Triton (issue 36; docs/gpu.md): one kernel source that GPUs compile at
first use (triton ships with PyTorch's CUDA and ROCm wheels: no CUDA toolkit needed) and that
the CPU test suite runs on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``, set
before triton is imported), against the native codec's bytes.

Importing this package never imports triton; :func:`available` says whether it can run here."""

from __future__ import annotations

import importlib.util
import os

import torch

__all__ = ["available", "interpreted"]


def interpreted() -> bool:
    """Triton's interpreter is on (``TRITON_INTERPRET=1``): kernels run on CPU tensors."""
    return os.environ.get("TRITON_INTERPRET", "") == "1"


def available(device: torch.device) -> bool:
    """Whether a Triton kernel can run on tensors of ``device``: CUDA tensors where triton is
    installed, CPU tensors only under the interpreter."""
    if importlib.util.find_spec("triton") is None:
        return False
    if device.type == "cuda":
        return True
    return device.type == "cpu" and interpreted()
