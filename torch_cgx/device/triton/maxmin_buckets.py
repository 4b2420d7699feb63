"""A bucket's statistics for max-min's encode (pass 1 of torch_cgx/device/triton/maxmin_kernels.py):
its span in the input, min, max and finiteness (CHUNK values of BB buckets per iteration), the
clipped range's lane-ordered fp64 sums of FORMAT.md, and the hand-out of min and max to one
bucket a thread for the scalar arithmetic that follows. Exactness as the kernels module says.
Importing this module imports triton."""

from __future__ import annotations

import triton
import triton.language as tl

from torch_cgx.device.triton.bits import widen

# ---- pass 1: the bucket ranges and sums ------------------------------------------------------


@triton.jit
def bucket_span(b, size, nq, ALIGN: tl.constexpr):
    """Elements ``[lo, hi)`` of buckets ``b`` (the last one may be shorter), and the shortest
    ``hi - lo`` of the tile (<= 0 where it has a padding bucket): the chunks and rows below it
    are in every bucket. ``lo``: a multiple of ALIGN (a power of two dividing the size), the
    hint that lets the compiler vectorise the unmasked loads."""
    lo = tl.multiple_of(b * size, ALIGN)
    hi = tl.minimum(lo + size, nq)
    return lo, hi, tl.min(hi - lo)


@triton.jit
def bucket_range(x_ptr, lo, hi, span, run, BF16: tl.constexpr, BB: tl.constexpr,
                 CHUNK: tl.constexpr, SUB: tl.constexpr):  # fmt: skip
    """(min, max, finite) of the buckets ``[lo, hi)``, CHUNK values per iteration (unmasked
    below ``run``) as CHUNK / SUB (BB, SUB) tiles (on a GPU SUB = 4 x lanes x warps / BB, at
    least 4 x lanes: a warp's threads on 16-byte pieces of one bucket, the warps on buckets):
    per value two NaN-propagating min / max into accumulators of the tile's shape, their trees
    (shuffles, and shared memory where a bucket spans warps) once at the end. Finite where the
    sum of the accumulators' ``a * 0`` is 0 (a NaN or an infinity stays in one of them; a
    non-finite bucket's min and max are never used). The accumulators start from the bucket's
    first value, which a masked element repeats. Order and the signs of zeros do not matter
    (the range, the +0.0 minimum and the clip are the same for -0.0 and +0.0)."""
    ALL: tl.constexpr = tl.PropagateNan.ALL
    cols = tl.arange(0, SUB)[None, :]
    first = widen(tl.load(x_ptr + lo, mask=lo < hi, other=0), BF16)[:, None]  # in the bucket
    amn = tl.zeros([BB, SUB], tl.float32) + first
    amx = amn
    it = span * 0  # the index type; a while loop: the interpreter cannot range() over an argument
    while it * CHUNK < span:
        at = lo[:, None] + it * CHUNK + cols
        if it * CHUNK + CHUNK <= run:  # in every bucket: unmasked vector loads
            for j in tl.static_range(CHUNK // SUB):
                v = widen(tl.load(x_ptr + at + j * SUB), BF16)
                amn = tl.minimum(amn, v, propagate_nan=ALL)
                amx = tl.maximum(amx, v, propagate_nan=ALL)
        else:
            for j in tl.static_range(CHUNK // SUB):
                m = at + j * SUB < hi[:, None]
                v = widen(tl.load(x_ptr + at + j * SUB, mask=m, other=0), BF16)
                v = tl.where(m, v, first)
                amn = tl.minimum(amn, v, propagate_nan=ALL)
                amx = tl.maximum(amx, v, propagate_nan=ALL)
        it += 1
    z = tl.sum(amn * 0.0 + amx * 0.0, axis=1)
    return tl.min(amn, axis=1), tl.max(amx, axis=1), z == 0


@triton.jit
def lane_total(acc, col):
    """FORMAT.md's last step of ``S``: the eight lanes (columns of the (BB, 8) fp64 ``acc``)
    added to +0.0, lane 0 first. A column is extracted exactly (its value plus seven +0.0)."""
    total = tl.sum(tl.where(col[None, :] == 0, acc, 0.0), axis=1)  # +0.0 + lane 0 == lane 0
    for j in tl.static_range(1, 8):
        total = total + tl.sum(tl.where(col[None, :] == j, acc, 0.0), axis=1)
    return total


@triton.jit
def lane_rows(x_ptr, lo, hi, q, mean, acc, FULL: tl.constexpr, SQUARES: tl.constexpr,
              BF16: tl.constexpr, BB: tl.constexpr, UNROLL: tl.constexpr):  # fmt: skip
    """``acc`` plus rows q ... q + UNROLL - 1 of :func:`lane_sum` in order, loaded as one
    (BB, 8 UNROLL) tile (FULL: the rows are in every bucket, unmasked: vector loads; a warp per
    bucket), then seen as (BB, UNROLL, 8): row r extracted exactly (its value plus UNROLL - 1
    zeros, a warp's shuffles: a -0.0 becomes +0.0, which adds the same to a lane, never -0.0)."""
    at = lo[:, None] + q * 8 + tl.arange(0, 8 * UNROLL)[None, :]
    if FULL:
        d = widen(tl.load(x_ptr + at), BF16).to(tl.float64)
        if SQUARES:
            e = d - mean[:, None]
            d = e * e  # two roundings: no fused multiply-add
    else:
        m = at < hi[:, None]
        d = widen(tl.load(x_ptr + at, mask=m, other=0), BF16).to(tl.float64)
        if SQUARES:
            e = d - mean[:, None]
            d = tl.where(m, e * e, 0.0)
    d = tl.reshape(d, (BB, UNROLL, 8))
    r = tl.arange(0, UNROLL)[None, :, None]
    for k in tl.static_range(UNROLL):
        acc = acc + tl.sum(tl.where(r == k, d, 0.0), axis=1)
    return acc


@triton.jit
def lane_sum(x_ptr, lo, hi, rows, run, mean, SQUARES: tl.constexpr, BF16: tl.constexpr,
             BB: tl.constexpr, UNROLL: tl.constexpr):  # fmt: skip
    """FORMAT.md's ``S`` over the buckets ``[lo, hi)`` in fp64: of ``x`` or, with SQUARES, of
    ``(x - mean)^2``. Lane j (column j) adds the elements lo + 8q + j for q = 0, 1, ... in order
    from +0.0, UNROLL rows per iteration (unmasked where the rows end below ``run``). Past a
    bucket the tile adds +0.0, which leaves a lane as it is (a lane that starts at +0.0 is never
    -0.0), as the reference's padding."""
    acc = tl.zeros([BB, 8], tl.float64)
    q = rows * 0
    while q < rows:
        if (q + UNROLL) * 8 <= run:
            acc = lane_rows(x_ptr, lo, hi, q, mean, acc, True, SQUARES, BF16, BB, UNROLL)
        else:
            acc = lane_rows(x_ptr, lo, hi, q, mean, acc, False, SQUARES, BF16, BB, UNROLL)
        q += UNROLL
    return lane_total(acc, tl.arange(0, 8))


@triton.jit
def clipped(x_ptr, lo, hi, size, span, run, vmn, vmx, width, C: tl.constexpr, BF16: tl.constexpr,
            BB: tl.constexpr, UNROLL: tl.constexpr):  # fmt: skip
    """FORMAT.md "Clipped range" for the buckets ``[lo, hi)``: (ok, want, lo) in fp64, ok only
    for a full bucket with 0 < want < range (the caller adds finiteness), and the two sums
    S(x), S((x - mean)^2)."""
    rows = (span + 7) // 8
    n = size.to(tl.float64)
    zero = tl.zeros([BB], tl.float64)
    total = lane_sum(x_ptr, lo, hi, rows, run, zero, False, BF16, BB, UNROLL)
    mean = total / n
    var = lane_sum(x_ptr, lo, hi, rows, run, mean, True, BF16, BB, UNROLL)
    want = tl.full([BB], C, tl.float64) * tl.sqrt(var / n)  # C made in fp64, never via fp32
    ok = ((hi - lo) == size) & (width > 0) & (want > 0) & (want < width)
    lo_c = tl.maximum(vmn, tl.minimum(mean - want / 2.0, vmx - want))
    return ok, want, lo_c, total, var


@triton.jit
def handed_out(meta_ptr, b, valid, vmn, vmx, finite):
    """(min, max, finite) of buckets ``b``, one bucket a thread (the reductions leave each
    thread all BB, each would do every bucket's fp64 arithmetic): through the metadata words
    (fp32 at ``meta_ptr``), a barrier, L2 and a barrier (copies in several warps read before the
    words are written over); a non-finite bucket's min goes as NaN."""
    tl.store(meta_ptr + 2 * b, tl.where(finite, vmn, float("nan")), mask=valid)
    tl.store(meta_ptr + 2 * b + 1, vmx, mask=valid)
    tl.debug_barrier()
    lo = tl.load(meta_ptr + 2 * b, mask=valid, other=0, cache_modifier=".cg")
    hi = tl.load(meta_ptr + 2 * b + 1, mask=valid, other=0, cache_modifier=".cg")
    tl.debug_barrier()  # every copy read before the metadata is written over
    return lo, hi, lo == lo
