"""The stochastic-rounding generator of docs/FORMAT.md in Triton (what
``torch_cgx.device.codecs.base.uniform`` computes in int64 tensor operations): ``u(seed, stream,
i)`` in [0, 1) for the int64 element indices ``i`` (int32 in the kernels' int32 variant: the same
values), from the host keys ``(k0, k1) =
base.rng_key(seed, stream)``. uint32 arithmetic wraps modulo 2^32 on every backend and in the
interpreter (numpy), so the hash is the native one bit for bit."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def fmix32(h):
    """MurmurHash3's 32-bit finaliser on uint32 ``h``."""
    h = h ^ (h >> 16)
    h = h * 0x85EBCA6B
    h = h ^ (h >> 13)
    h = h * 0xC2B2AE35
    return h ^ (h >> 16)


@triton.jit
def uniform(k0, k1, index):
    """float32 in [0, 1): ``(fmix32(fmix32(lo ^ k0) + (hi * 0x9E3779B1 ^ k1)) >> 8) * 2^-24``
    with ``lo`` / ``hi`` the low / high 32 bits of the int64 ``index``. An int32 ``index`` (the
    kernels' int32 variant: 0 <= index < 2^31) is the same value: ``lo`` is its bits, ``hi``
    0, so the second term is ``k1`` (no 64-bit arithmetic, the same bits)."""
    if index.dtype == tl.int32:
        lo = index.to(tl.uint32)
        b = k1.to(tl.uint32)  # (0 * 0x9E3779B1) ^ k1
    else:
        i = index.to(tl.int64)
        lo = (i & 0xFFFFFFFF).to(tl.uint32)
        hi = ((i >> 32) & 0xFFFFFFFF).to(tl.uint32)
        b = (hi * 0x9E3779B1) ^ k1.to(tl.uint32)
    a = fmix32(lo ^ k0.to(tl.uint32))
    h = fmix32(a + b)
    return (h >> 8).to(tl.float32) * 5.9604644775390625e-08
