"""Fused device kernels in Triton (docs/gpu.md): one kernel source that GPUs compile at
first use (triton ships with PyTorch's CUDA and ROCm wheels: no CUDA toolkit needed) and that
the CPU test suite runs on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``, set
before triton is imported), against the native codec's bytes.

Importing this package never imports triton; :func:`available` says whether it can run here."""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

__all__ = ["available", "divisor", "index64", "interpreted", "lanes"]

# Kernels whose every index (element, byte, bucket, and the padding lanes past the end) stays
# below this run the int32 variant (``IDX64=False``: no 64-bit integer arithmetic, the bucket
# index by a multiply-high); the others the int64 one. Tests lower it to run the int64 variant.
INDEX32_LIMIT = 2**31


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


def lanes(device: torch.device) -> int:
    """Threads a warp on ``device``: its ``warp_size`` (32 on NVIDIA GPUs, 64 on AMD's CDNA, an
    MI300 say); 32 where torch sees no GPU (a plan made on a CPU machine)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return 32
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _lanes(index)


@functools.cache
def _lanes(index: int) -> int:
    return int(getattr(torch.cuda.get_device_properties(index), "warp_size", 32))


def index64(*extents: int) -> bool:
    """Whether a launch needs the int64 kernel variant: ``extents`` bound every index it forms
    (each kernel's host code lists them), and one reaches :data:`INDEX32_LIMIT`."""
    return max(extents) >= INDEX32_LIMIT


def divisor(size: int) -> tuple:
    """``(magic, shift)`` for the kernels' int32 bucket index, one multiply-high and a shift:
    ``i // size == umulhi(2 i, magic) >> shift`` for every 0 <= i < 2^31 and 1 <= size < 2^31,
    with ``shift = ceil(log2 size)`` and ``magic = ceil(2^(31 + shift) / size) < 2^32``
    (Granlund and Montgomery: ``magic * size - 2^(31 + shift)`` is in [0, size), so
    ``i * magic / 2^(31 + shift)`` exceeds ``i / size`` by less than ``i / 2^31 / size < 1 /
    size``, never reaching the next integer). ``(0, 0)`` where size >= 2^31 (the int64 variant
    runs there)."""
    if not 1 <= size < 2**31:
        return 0, 0
    shift = (size - 1).bit_length()
    return -(-(1 << (31 + shift)) // size), shift
