"""Bit-level helpers the Triton kernels share (levels_kernels.py, maxmin_kernels.py): bf16 moves
as its int16 bits, widened by a shift and rounded by integer arithmetic (the interpreter's
fp32 -> bf16 conversion truncates). Importing this module imports triton."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def widen(v, BF16: tl.constexpr):
    """fp32 of a loaded value (exact); bf16 arrives as its int16 bits (a shift)."""
    if BF16:
        return (v.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        return v.to(tl.float32)


@triton.jit
def bf16_bits(v):
    """int16 bits of fp32 ``v`` rounded to bf16, nearest even (dtype.h: NaN -> (u >> 16) | 0x40)."""
    u = v.to(tl.uint32, bitcast=True)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    r = tl.where(v != v, (u >> 16) | 0x40, r)
    return r.to(tl.uint16).to(tl.int16, bitcast=True)
