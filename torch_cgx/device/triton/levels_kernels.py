"""The Triton kernels of :class:`torch_cgx.device.triton.levels.TritonLevels`: qsgd,
terngrad, onebit, efsignsgd, signsgd / signum and tbq, byte for byte the native compressors
(docs/FORMAT.md, "Compressor payloads"). Importing this module imports triton.

Four kernels, all launched with ``enable_fp_fusion=False`` on the caller's current stream:

- ``scalars_kernel`` (bucketed codecs): a program sums ``BB`` buckets, as a (BB, 8) tile whose
  column j is prim::stats' lane j (element lo + 8q + j); each lane adds its rows in order q = 0,
  1, ... from +0.0 in fp64 (``UNROLL`` rows per loop iteration, their loads independent of the
  sums), then the lanes are added as ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)): the
  native fp64 bits. A lane's sum is serial, so a bucket of B values costs its program B / 64
  dependent iterations (UNROLL = 8), bucket size 0 (the whole tensor) included. The iterations
  whose rows lie inside every bucket of the tile load without a mask (vector loads where
  ``ALIGN``, a power of two dividing every bucket's start, allows), the rest masked.
- ``codes_kernel``: a program codes ``G`` groups of eight values (a group: ``BITS`` bytes of
  the stream), prim::Levels' rule or the sign bit per value; signsgd / signum / tbq OR the
  envelope's non-finite flag with one atomic (an OR does not depend on the order). A tile
  inside the tensor loads without a mask (16-byte vector loads), the last one masked; a tile
  inside one bucket loads its scalar once.
- ``encode_kernel``: both in one launch where a program's buckets end on a group of eight (or
  there is one program): the scalars of its buckets, a barrier, then their codes, the scalars
  read back through L2 (``.cg``).
- ``decode_kernel``: ``out += value`` in fp32 rounded once to out's dtype, a (rows, E) tile
  (E: the codes of a 32-bit word; 32 for 3, 5, 6, 7 bits); a full block reads its codes and
  scalars as words where the payload is 4-aligned (``WORDS``), out with vector loads and
  stores; the tail block masked. A block inside one bucket reads its scalar(s) once, others
  one per value.

Exactness on a GPU, by construction (the interpreter computes in numpy, IEEE already): fp32
divisions are ``tl.math.div_rn`` (Triton's ``/`` is an approximate division for fp32); fp64
``/`` and ``sqrt`` lower to the IEEE ``div.rn.f64`` / ``sqrt.rn.f64``; no multiply-add is fused
(``enable_fp_fusion=False`` at every launch: ``out + s * r`` and ``sq + d * d`` stay two
roundings), and on NVIDIA ``enable_reflect_ftz=False`` (libdevice keeps fp32 denormals); indices
are of the kernel's index type before any product (``IDX64``: int64, or int32 where the host
found every index below 2^31, the bucket index then a multiply-high by ``divisor(size)``
instead of an int64 division, which GPUs emulate); NaN scalars are written as the explicit bits
0x7fc00000; bf16 is converted by integer arithmetic (round to nearest even, NaN as
native's ``(u >> 16) | 0x40``), since the interpreter's bf16 cast truncates.
"""

from __future__ import annotations

import triton
import triton.language as tl

from torch_cgx.device.triton.bits import bucket_of
from torch_cgx.device.triton.levels_parts import (
    EFSIGN,
    ONEBIT,
    QSGD,
    SIGNSGD,
    TBQ,
    TERNGRAD,
    add_store,
    byte_codes,
    code_tile,
    f32_at,
    nan_or,
    or_one,
    row_len,
    word_codes,
)

# ---- shared helpers ------------------------------------------------------------------------


@triton.jit
def neg(v):
    """-v as C's unary minus: the sign bit flipped (Triton's ``-v`` is 0 - v: +0.0 for +0.0)."""
    return (v.to(tl.uint32, bitcast=True) ^ 0x80000000).to(tl.float32, bitcast=True)


# ---- pass 1: the bucket scalars --------------------------------------------------------------


@triton.jit
def lane_total(t, col):
    """The eight columns (lanes) of a (BB, 8) fp64 tile added in prim::stats' order; a column is
    extracted exactly as one value plus seven +0.0."""
    return combine8(
        tl.sum(tl.where(col[None, :] == 0, t, 0.0), axis=1),
        tl.sum(tl.where(col[None, :] == 1, t, 0.0), axis=1),
        tl.sum(tl.where(col[None, :] == 2, t, 0.0), axis=1),
        tl.sum(tl.where(col[None, :] == 3, t, 0.0), axis=1),
        tl.sum(tl.where(col[None, :] == 4, t, 0.0), axis=1),
        tl.sum(tl.where(col[None, :] == 5, t, 0.0), axis=1),
        tl.sum(tl.where(col[None, :] == 6, t, 0.0), axis=1),
        tl.sum(tl.where(col[None, :] == 7, t, 0.0), axis=1),
    )


@triton.jit
def combine8(l0, l1, l2, l3, l4, l5, l6, l7):
    """prim::stats' order of the lane sums."""
    return ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))


@triton.jit
def add_rows(x_ptr, base, end, q, s, a, sq, neg, amax, KIND: tl.constexpr, BF16: tl.constexpr,
             UNROLL: tl.constexpr, FULL: tl.constexpr):  # fmt: skip
    """Rows q .. q + UNROLL - 1 of the (BB, 8) tile added to the lane sums (FULL: every row
    inside every bucket, no mask)."""
    for k in tl.static_range(UNROLL):
        at = base + (q + k) * 8
        if FULL:
            v = tl.load(x_ptr + at)
        else:
            v = tl.load(x_ptr + at, mask=at < end, other=0)
        if BF16:  # widen(), inline: the interpreter pays ~0.5 ms per jit call
            v = (v.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        v = v.to(tl.float32)
        d = v.to(tl.float64)
        if KIND == ONEBIT:
            s = s + d
        if (KIND == ONEBIT) or (KIND == EFSIGN):
            a = a + tl.abs(d)
        if (KIND == QSGD) or (KIND == TERNGRAD):
            sq = sq + d * d
        if KIND == ONEBIT:
            neg = neg + (v < 0.0).to(neg.dtype)
        if KIND == TERNGRAD:
            amax = tl.maximum(amax, tl.abs(v))
    return s, a, sq, neg, amax


@triton.jit
def bucket_sums(x_ptr, lo, hi, rows, KIND: tl.constexpr, BF16: tl.constexpr, BB: tl.constexpr,
                UNROLL: tl.constexpr, ALIGN: tl.constexpr):  # fmt: skip
    """prim::stats of the buckets [lo, hi) ((BB,) each): (sum x, sum |x|, sum x^2, negatives,
    max |x|), each computed only where KIND uses it. Lane j (column j of a (BB, 8) tile) adds
    elements lo + 8q + j for q = 0, 1, ... in order, from +0.0, in fp64; UNROLL rows per
    iteration (their loads do not depend on the sums): first the iterations inside every
    bucket (no mask: vector loads where ``lo`` is a multiple of 4), then the rest masked.
    Outside a bucket the tile holds +0.0, which leaves a lane as it is (a lane that starts at
    +0.0 is never -0.0)."""
    col = tl.arange(0, 8)
    base = lo[:, None] + col[None, :]
    end = hi[:, None]
    s = tl.zeros([BB, 8], tl.float64)
    a = tl.zeros([BB, 8], tl.float64)
    sq = tl.zeros([BB, 8], tl.float64)
    neg = tl.zeros([BB, 8], lo.dtype)
    amax = tl.zeros([BB, 8], tl.float32)
    # rows inside every bucket of the tile (padding buckets: none), whole iterations of them
    full = tl.min(tl.maximum(hi - lo, 0), axis=0) // (8 * UNROLL) * UNROLL
    q = (
        rows * 0
    )  # the index type; a while loop: the interpreter cannot range() over a kernel argument
    while q < full:
        s, a, sq, neg, amax = add_rows(x_ptr, base, end, q, s, a, sq, neg, amax, KIND, BF16,
                                       UNROLL, True)  # fmt: skip
        q += UNROLL
    while q < rows:
        s, a, sq, neg, amax = add_rows(x_ptr, base, end, q, s, a, sq, neg, amax, KIND, BF16,
                                       UNROLL, False)  # fmt: skip
        q += UNROLL
    return (lane_total(s, col), lane_total(a, col), lane_total(sq, col), tl.sum(neg, axis=1),
            tl.max(amax, axis=1))  # fmt: skip


@triton.jit
def bucket_scalars(x_ptr, pay_ptr, scal_ptr, n, size, nb, KIND: tl.constexpr, CLIP: tl.constexpr,
                   BF16: tl.constexpr, BB: tl.constexpr, UNROLL: tl.constexpr,
                   ALIGN: tl.constexpr):  # fmt: skip
    """The f32 scalars (int32 bits at ``scal_ptr``) of buckets pid * BB .. pid * BB + BB - 1 of
    ``size`` values (the last one shorter); terngrad's clip from the envelope's param1. ``n``,
    ``size`` in the index type."""
    lo0 = tl.program_id(0).to(n.dtype) * BB * size
    b = tl.program_id(0).to(n.dtype) * BB + tl.arange(0, BB)
    valid = b < nb
    lo = b * (size // ALIGN * ALIGN)  # = b * size, its alignment visible to the compiler
    hi = tl.minimum(b * size + size, n)
    rows = (tl.minimum(size, n - lo0) + 7) // 8  # the program's longest bucket: its first
    total, mag, sq, neg, amax = bucket_sums(x_ptr, lo, hi, rows, KIND, BF16, BB, UNROLL, ALIGN)
    # all values finite <=> their fp64 sum of squares (or magnitudes) is: finite fp32 values
    # cannot overflow it (2^48 * FLT_MAX^2 < DBL_MAX), NaN / Inf make it NaN / Inf
    if (KIND == ONEBIT) or (KIND == EFSIGN):
        finite = mag < float("inf")
    else:
        finite = sq < float("inf")
    length = tl.where(valid, hi - lo, 1)
    count = length.to(tl.float64)
    if KIND == QSGD:
        v0 = tl.sqrt(sq).to(tl.float32)
    elif KIND == TERNGRAD:
        v0 = amax
        if CLIP:
            clip = f32_at(pay_ptr, 28, True, False).to(tl.float64)
            c = (clip * tl.sqrt(sq / count)).to(tl.float32)
            v0 = tl.where(c < amax, c, amax)  # std::min(abs_max, c)
    elif KIND == ONEBIT:
        npos = length - neg
        nm = ((total - mag) / 2.0 / tl.maximum(neg, 1).to(tl.float64)).to(tl.float32)
        pm = ((total + mag) / 2.0 / tl.maximum(npos, 1).to(tl.float64)).to(tl.float32)
        tl.store(scal_ptr + 2 * b, nan_or(finite, tl.where(neg > 0, nm, 0.0)), mask=valid)
        tl.store(scal_ptr + 2 * b + 1, nan_or(finite, tl.where(npos > 0, pm, 0.0)), mask=valid)
    else:  # EFSIGN
        v0 = (mag / count).to(tl.float32)
    if KIND != ONEBIT:
        tl.store(scal_ptr + b, nan_or(finite, v0), mask=valid)


@triton.jit(do_not_specialize=["n", "size", "nb"])
def scalars_kernel(x_ptr, pay_ptr, scal_ptr, n, size, nb, KIND: tl.constexpr, CLIP: tl.constexpr,
                   BF16: tl.constexpr, BB: tl.constexpr, UNROLL: tl.constexpr,
                   IDX64: tl.constexpr, ALIGN: tl.constexpr = 1):  # fmt: skip
    """The scalars of buckets pid * BB ... (``bucket_scalars``). ``ALIGN``: a power of two that
    divides ``size`` (or any, where there is one bucket and BB = 1: its start is 0), which
    lets the unmasked rows load as vectors."""
    IT: tl.constexpr = tl.int64 if IDX64 else tl.int32  # the index type
    bucket_scalars(x_ptr, pay_ptr, scal_ptr, n.to(IT), size.to(IT), nb, KIND, CLIP, BF16, BB,
                   UNROLL, or_one(ALIGN))  # fmt: skip


# ---- pass 2: the codes ------------------------------------------------------------------------


@triton.jit(do_not_specialize=["n", "size", "nbytes", "k0", "k1", "magic", "shift"])
def codes_kernel(x_ptr, pay_ptr, scal_ptr, codes_ptr, flag_ptr, n, size, nbytes, k0, k1, magic,
                 shift, KIND: tl.constexpr, BITS: tl.constexpr, LEVELS: tl.constexpr,
                 NEG: tl.constexpr, BF16: tl.constexpr, G: tl.constexpr, BP: tl.constexpr,
                 IDX64: tl.constexpr):  # fmt: skip
    """The codes of elements 8 G pid .. 8 G (pid + 1) - 1 (``code_tile``). ``magic``,
    ``shift``: ``divisor(size)`` (the int32 variant's bucket index)."""
    IT: tl.constexpr = tl.int64 if IDX64 else tl.int32  # the index type
    g0 = tl.program_id(0).to(IT) * G
    g = g0 + tl.arange(0, G)
    full = (g0 + G) * 8 <= n.to(IT)
    last = tl.minimum((g0 + G) * 8, n.to(IT)) - 1
    code_tile(x_ptr, pay_ptr, scal_ptr, codes_ptr, flag_ptr, g, g >= 0, full, last, n.to(IT),
              size.to(IT), nbytes.to(IT), g0 + G, k0, k1, magic, shift, KIND, BITS, LEVELS, NEG,
              BF16, BP, False)  # fmt: skip


@triton.jit(do_not_specialize=["n", "size", "nb", "nbytes", "k0", "k1", "magic", "shift"])
def encode_kernel(x_ptr, pay_ptr, scal_ptr, codes_ptr, n, size, nb, nbytes, k0, k1, magic, shift,
                  KIND: tl.constexpr, CLIP: tl.constexpr, BITS: tl.constexpr,
                  LEVELS: tl.constexpr, NEG: tl.constexpr, BF16: tl.constexpr, BB: tl.constexpr,
                  UNROLL: tl.constexpr, G: tl.constexpr, BP: tl.constexpr, IDX64: tl.constexpr,
                  ALIGN: tl.constexpr = 1):  # fmt: skip
    """Both passes of the bucketed codecs in one launch, where every program's buckets end on a
    group of eight (``BB * size`` a multiple of 8, or one program): the scalars of buckets pid *
    BB ..., a barrier (the program's global writes visible to all its threads), then the codes
    of their elements, G groups at a time, the scalars read back through L2. The codes' input
    reads hit the cache the sums filled."""
    IT: tl.constexpr = tl.int64 if IDX64 else tl.int32  # the index type
    n, size, nbytes = n.to(IT), size.to(IT), nbytes.to(IT)
    bucket_scalars(x_ptr, pay_ptr, scal_ptr, n, size, nb, KIND, CLIP, BF16, BB, UNROLL,
                   or_one(ALIGN))  # fmt: skip
    tl.debug_barrier()
    e0 = tl.program_id(0).to(IT) * BB * size
    e1 = tl.minimum(e0 + BB * size, n)
    g1 = (e1 + 7) // 8
    gg = e0 // 8
    while gg < g1:
        g = gg + tl.arange(0, G)
        code_tile(x_ptr, pay_ptr, scal_ptr, codes_ptr, pay_ptr, g, g < g1, (gg + G) * 8 <= e1,
                  tl.minimum((gg + G) * 8, e1) - 1, n, size, nbytes, gg + G, k0, k1, magic, shift,
                  KIND, BITS, LEVELS, NEG, BF16, BP, True)  # fmt: skip
        gg += G


# ---- decode_add ------------------------------------------------------------------------------


@triton.jit
def value_of(pay_ptr, c, k, m, k0, one, LEVELS: tl.constexpr, NEG: tl.constexpr,
             KIND: tl.constexpr, WORDS: tl.constexpr):  # fmt: skip
    """The fp32 value code ``c`` of an element of bucket ``k`` decodes to (the native decoders'
    tables); the payload's scalars read as words where ``WORDS``, else byte by byte; once
    where ``one`` (every element in bucket ``k0``), else per element."""
    nan = float("nan")
    if KIND == SIGNSGD:
        flagged = (tl.load(pay_ptr + 7) & 1) != 0
        val = tl.where(flagged, nan, tl.where(c != 0, -1.0, 1.0))
    elif KIND == TBQ:
        flagged = (tl.load(pay_ptr + 7) & 1) != 0
        tau = f32_at(pay_ptr, 28, True, WORDS)
        val = tl.where(c == 0, 0.0, tl.where(c == 1, tau, tl.where(c == 2, neg(tau), nan)))
        val = tl.where(flagged, nan, val)
    elif KIND == ONEBIT:  # the scalars (negatives, others)
        if one:
            val = tl.where(c != 0, f32_at(pay_ptr, 32 + 8 * k0, True, WORDS),
                           f32_at(pay_ptr, 36 + 8 * k0, True, WORDS))  # fmt: skip
        else:
            val = f32_at(pay_ptr, 32 + 4 * (2 * k + 1 - c), m, WORDS)
    else:
        if one:
            s = tl.broadcast_to(f32_at(pay_ptr, 32 + 4 * k0, True, WORDS), c.shape)
        else:
            s = f32_at(pay_ptr, 32 + 4 * k, m, WORDS)
        if KIND == EFSIGN:
            val = tl.where(c != 0, neg(s), s)
        elif KIND == TERNGRAD:
            zero = tl.where(s != s, nan, 0.0)
            val = tl.where(c == 0, zero, tl.where(c == 1, s, tl.where(c == 2, neg(s), nan)))
        else:  # QSGD: norm * (l / levels), the sign bit
            ratio = tl.math.div_rn((c & (NEG - 1)).to(tl.float32), LEVELS * 1.0)
            mag = s * ratio
            val = tl.where((c & NEG) != 0, neg(mag), mag)
    return val


@triton.jit(do_not_specialize=["n", "size", "codes_at", "magic", "shift"])
def decode_kernel(pay_ptr, out_ptr, n, size, codes_at, magic, shift, KIND: tl.constexpr,
                  BITS: tl.constexpr, LEVELS: tl.constexpr, NEG: tl.constexpr,
                  BF16: tl.constexpr, BLOCK: tl.constexpr, IDX64: tl.constexpr,
                  WORDS: tl.constexpr = False):  # fmt: skip
    """out[i] += value(i) for i in BLOCK pid .. BLOCK (pid + 1) - 1, in fp32, rounded once to
    out's dtype (bf16 ``out`` as its int16 bits), as a (BLOCK / E, E) tile (E codes per word).
    ``codes_at``: the stream's byte offset; ``magic``, ``shift``: ``divisor(size)`` (the int32
    variant's bucket index). ``WORDS``: the payload and ``codes_at`` 4-aligned and BLOCK >= 32
    (whole rows of 32 codes): a full block reads whole words of codes, every block its scalars
    as words; else byte by byte. A full block adds to ``out`` without a mask (vector accesses)."""
    IT: tl.constexpr = tl.int64 if IDX64 else tl.int32  # the index type
    E: tl.constexpr = row_len(BITS, BLOCK)
    row = tl.program_id(0).to(IT) * (BLOCK // E) + tl.arange(0, BLOCK // E)
    i = row[:, None] * E + tl.arange(0, E)[None, :]
    m = i < n.to(IT)
    full = tl.program_id(0).to(IT) * BLOCK + BLOCK <= n.to(IT)
    if WORDS:
        if full:
            words = pay_ptr.to(tl.pointer_type(tl.uint32)) + (codes_at.to(IT) >> 2)
            c = word_codes(words, row, E, BITS)
        else:
            c = byte_codes(pay_ptr + codes_at.to(IT), i, m, BITS)
    else:
        c = byte_codes(pay_ptr + codes_at.to(IT), i, m, BITS)
    k, kf, one = i, 0, False  # the buckets: only where the value reads a bucket's scalar
    if (KIND == QSGD) or (KIND == TERNGRAD) or (KIND == ONEBIT) or (KIND == EFSIGN):
        first = tl.program_id(0).to(IT) * BLOCK
        k = bucket_of(i, size.to(IT), magic, shift)
        kf = bucket_of(first, size.to(IT), magic, shift)
        last = tl.minimum(first + BLOCK, n.to(IT)) - 1
        one = kf == bucket_of(last, size.to(IT), magic, shift)
    val = value_of(pay_ptr, c, k, m, kf, one, LEVELS, NEG, KIND, WORDS)
    if full:
        add_store(out_ptr, i, m, val, True, BF16)
    else:
        add_store(out_ptr, i, m, val, False, BF16)
