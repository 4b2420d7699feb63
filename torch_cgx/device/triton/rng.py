"""The stochastic-rounding generator of docs/FORMAT.md in Triton (what
``torch_cgx.device.codecs.base.uniform`` computes in int64 tensor operations): ``u(seed, stream,
i)`` in [0, 1) for element indices ``i``, from the host keys ``(k0, k1) = base.rng_key(seed,
stream)``, over a tile of whole groups of eight elements (the code kernels' (G, 8) tiles).
uint32 arithmetic wraps modulo 2^32 on every backend and in the interpreter (numpy), so the hash
is the native one bit for bit."""

from __future__ import annotations

import triton
import triton.language as tl

SCALE = tl.constexpr(5.9604644775390625e-08)  # 2^-24: u = (h >> 8) * SCALE


@triton.jit
def fmix32(h):
    """MurmurHash3's 32-bit finaliser on uint32 ``h``."""
    h = h ^ (h >> 16)
    return fmix32_tail(h)


@triton.jit
def fmix32_tail(h):
    """fmix32 after its first xor-shift."""
    h = h * 0x85EBCA6B
    h = h ^ (h >> 13)
    h = h * 0xC2B2AE35
    return h ^ (h >> 16)


@triton.jit
def group_uniform(k0, k1, g):
    """The (G, 8) tile of ``u(seed, stream, 8 g + j)`` / SCALE, j = 0..7, for the group indices
    ``g`` (G,): the 24-bit integers ``h >> 8`` of ``h = fmix32(fmix32(lo ^ k0) + (hi *
    0x9E3779B1 ^ k1))`` (``lo`` / ``hi`` the index's low / high 32 bits) in float32, exact.
    Callers add ``r * SCALE`` in one ``tl.fma``: the product by a power of two is exact, so the
    fma rounds once, as adding u would. ``g`` int32 (the kernels' int32 variant: 8 g < 2^31,
    ``hi`` = 0, the same values) or int64. Per group, not per element: 8 g has its low three
    bits clear, so element 8 g + j has ``lo ^ j`` (``lo`` the group's first) and ``hi``, and
    the inner fmix32's first xor-shift of ``lo ^ j ^ k0`` is ``c ^ j`` with ``c = (lo ^ k0) ^
    ((lo ^ k0) >> 16)`` (j < 2^16 leaves the shift alone): one xor an element."""
    if g.dtype == tl.int32:
        lo = (g * 8).to(tl.uint32)
        b = k1.to(tl.uint32)  # (0 * 0x9E3779B1) ^ k1
    else:
        i = g.to(tl.int64) * 8
        lo = (i & 0xFFFFFFFF).to(tl.uint32)
        hi = ((i >> 32) & 0xFFFFFFFF).to(tl.uint32)
        b = ((hi * 0x9E3779B1) ^ k1.to(tl.uint32))[:, None]
    h = lo ^ k0.to(tl.uint32)
    c = h ^ (h >> 16)
    a = fmix32_tail(c[:, None] ^ tl.arange(0, 8).to(tl.uint32)[None, :])
    return (fmix32(a + b) >> 8).to(tl.float32)
