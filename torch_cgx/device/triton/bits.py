"""Bit-level helpers the Triton kernels share (levels_*.py, maxmin_*.py): bf16 moves as its
int16 bits, widened by a shift and rounded by integer arithmetic (the interpreter's fp32 -> bf16
conversion truncates); the bucket of an element index; the code stream's groups of eight codes
stored as whole 16- / 32-bit words (2, 4 and 8 bits) or byte by byte. Importing this module
imports triton."""

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


@triton.jit
def group_word(code, BITS: tl.constexpr):
    """The (G, 8) codes as one word per group, ``sum(code_k << k * BITS)`` (disjoint bits):
    uint32 where eight codes fit (BITS <= 4: half the shifts and adds of 64-bit words), else
    uint64. Its BITS low bytes are the group's bytes of the stream, little-endian."""
    WT: tl.constexpr = tl.uint32 if BITS <= 4 else tl.uint64
    k = tl.arange(0, 8)
    return tl.sum(code.to(WT) << (k * BITS).to(WT)[None, :], axis=1)


@triton.jit
def store_words(codes_ptr, word, g, gm, BITS: tl.constexpr):
    """Groups ``g``'s BITS bytes (2, 4 or 8) of the code stream at ``codes_ptr`` where ``gm``, as
    one 16- or 32-bit store per group (two for 8 bits) of the low bytes of its ``word``:
    little-endian, the bytes g * BITS ... of the byte-wise stores. ``codes_ptr`` 4-aligned (both
    formats' streams start 4-aligned in a fresh payload); no store spans two groups."""
    if BITS == 2:
        tl.store(codes_ptr.to(tl.pointer_type(tl.uint16)) + g, word.to(tl.uint16), mask=gm)
    elif BITS == 4:
        tl.store(codes_ptr.to(tl.pointer_type(tl.uint32)) + g, word.to(tl.uint32), mask=gm)
    else:
        w32 = codes_ptr.to(tl.pointer_type(tl.uint32)) + 2 * g
        tl.store(w32, (word & 0xFFFFFFFF).to(tl.uint32), mask=gm)
        tl.store(w32 + 1, (word >> 32).to(tl.uint32), mask=gm)


@triton.jit
def store_bytes(codes_ptr, word, g, gm, nbytes, BITS: tl.constexpr, BP: tl.constexpr):
    """The BITS low bytes of groups ``g``'s words where ``gm``, as bytes g * BITS ..., none from
    ``nbytes`` on (BP: a power of two >= BITS)."""
    m = tl.arange(0, BP)
    at = g[:, None] * BITS + m[None, :]
    byte = (word[:, None] >> (m * 8).to(word.dtype)[None, :]) & 0xFF
    ok = gm[:, None] & (m[None, :] < BITS)
    tl.store(codes_ptr + at, byte.to(tl.uint8), mask=ok & (at < nbytes))


@triton.jit
def pack_store(codes_ptr, word, g, gm, nbytes, g_end, BITS: tl.constexpr, BP: tl.constexpr):
    """Stores groups ``g``'s words (:func:`group_word`) where ``gm`` (``g_end``: one past the
    tile's last group) as the code stream's bytes g * BITS ..., none from ``nbytes`` on. 2, 4
    and 8 bits: a group's bytes in one 16- or 32-bit store (two for 8 bits) where the tile ends
    inside the stream; else (and for 1, 3, 5, 6, 7 bits) byte stores."""
    if (BITS == 2) or (BITS == 4) or (BITS == 8):
        if g_end * BITS <= nbytes:  # the tile inside the stream
            store_words(codes_ptr, word, g, gm, BITS)
        else:
            store_bytes(codes_ptr, word, g, gm, nbytes, BITS, BP)
    else:
        store_bytes(codes_ptr, word, g, gm, nbytes, BITS, BP)


@triton.jit
def bucket_of(i, size, magic, shift):
    """The bucket of element indices ``i`` (a tensor or a scalar) in buckets of ``size`` (of
    ``i``'s type): an int64 division (emulated on GPUs), or in the int32 variant a multiply-high
    by ``divisor(size)`` = (``magic``, ``shift``) (triton/__init__.py)."""
    if i.dtype == tl.int64:
        k = i // size
    else:
        q = tl.umulhi(i.to(tl.uint32) << 1, magic.to(tl.uint32))
        k = (q >> shift.to(tl.uint32)).to(tl.int32)
    return k
