"""The Triton kernels of :class:`torch_cgx.device.triton.levels.TritonLevels` (issue 36): qsgd,
terngrad, onebit, efsignsgd, signsgd / signum and tbq, byte for byte the native compressors
(docs/FORMAT.md, "Compressor payloads"). Importing this module imports triton.

Three kernels, all launched with ``enable_fp_fusion=False`` on the caller's current stream:

- ``scalars_kernel`` (bucketed codecs): a program sums ``BB`` buckets, as a (BB, 8) tile whose
  column j is prim::stats' lane j (element lo + 8q + j); each lane adds its rows in order q = 0,
  1, ... from +0.0 in fp64 (``UNROLL`` rows per loop iteration, their loads independent of the
  sums), then the lanes are added as ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)): the
  native fp64 bits. A lane's sum is serial, so a bucket of B values costs its program B / 64
  dependent iterations (UNROLL = 8), bucket size 0 (the whole tensor) included.
- ``codes_kernel``: a program codes ``G`` groups of eight values (a group: ``BITS`` bytes of
  the stream), prim::Levels' rule or the sign bit per value; signsgd / signum / tbq OR the
  envelope's non-finite flag with one atomic (an OR does not depend on the order).
- ``decode_kernel``: one value per lane, ``out += value`` in fp32 rounded once to out's dtype.

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

from torch_cgx.device.triton.bits import bf16_bits, store_words, widen
from torch_cgx.device.triton.rng import uniform

# Kinds (constexpr): signum is signsgd's kernel
QSGD = tl.constexpr(0)
TERNGRAD = tl.constexpr(1)
ONEBIT = tl.constexpr(2)
EFSIGN = tl.constexpr(3)
SIGNSGD = tl.constexpr(4)
TBQ = tl.constexpr(5)
NAN_BITS = tl.constexpr(0x7FC00000)
FLAG_WORD = tl.constexpr(1 << 24)  # flag bit 0 (byte 7) in the little-endian word of bytes 4..7


# ---- shared helpers ------------------------------------------------------------------------


@triton.jit
def neg(v):
    """-v as C's unary minus: the sign bit flipped (Triton's ``-v`` is 0 - v: +0.0 for +0.0)."""
    return (v.to(tl.uint32, bitcast=True) ^ 0x80000000).to(tl.float32, bitcast=True)


@triton.jit
def u32_at(ptr, off, mask):
    """The little-endian uint32 at byte offsets ``off`` of a uint8 pointer (any alignment)."""
    w = tl.load(ptr + off, mask=mask, other=0).to(tl.uint32)
    w = w | (tl.load(ptr + off + 1, mask=mask, other=0).to(tl.uint32) << 8)
    w = w | (tl.load(ptr + off + 2, mask=mask, other=0).to(tl.uint32) << 16)
    return w | (tl.load(ptr + off + 3, mask=mask, other=0).to(tl.uint32) << 24)


@triton.jit
def f32_at(ptr, off, mask):
    return u32_at(ptr, off, mask).to(tl.float32, bitcast=True)


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
def bucket_sums(x_ptr, lo, hi, rows, KIND: tl.constexpr, BF16: tl.constexpr, BB: tl.constexpr,
                UNROLL: tl.constexpr):  # fmt: skip
    """prim::stats of the buckets [lo, hi) ((BB,) each): (sum x, sum |x|, sum x^2, negatives,
    max |x|), each computed only where KIND uses it. Lane j (column j of a (BB, 8) tile) adds
    elements lo + 8q + j for q = 0, 1, ... in order, from +0.0, in fp64; UNROLL rows per
    iteration (their loads do not depend on the sums). Outside a bucket the tile holds +0.0,
    which leaves a lane as it is (a lane that starts at +0.0 is never -0.0)."""
    SUM: tl.constexpr = KIND == ONEBIT
    ABS: tl.constexpr = (KIND == ONEBIT) or (KIND == EFSIGN)
    SQ: tl.constexpr = (KIND == QSGD) or (KIND == TERNGRAD)
    col = tl.arange(0, 8)
    base = lo[:, None] + col[None, :]
    end = hi[:, None]
    s = tl.zeros([BB, 8], tl.float64)
    a = tl.zeros([BB, 8], tl.float64)
    sq = tl.zeros([BB, 8], tl.float64)
    neg = tl.zeros([BB, 8], lo.dtype)
    amax = tl.zeros([BB, 8], tl.float32)
    q = (
        rows * 0
    )  # the index type; a while loop: the interpreter cannot range() over a kernel argument
    while q < rows:
        for k in tl.static_range(UNROLL):
            at = base + (q + k) * 8
            v = tl.load(x_ptr + at, mask=at < end, other=0)
            if BF16:  # widen(), inline: the interpreter pays ~0.5 ms per jit call
                v = (v.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
            v = v.to(tl.float32)
            d = v.to(tl.float64)
            if SUM:
                s = s + d
            if ABS:
                a = a + tl.abs(d)
            if SQ:
                sq = sq + d * d
            if KIND == ONEBIT:
                neg = neg + (v < 0.0).to(neg.dtype)
            if KIND == TERNGRAD:
                amax = tl.maximum(amax, tl.abs(v))
        q += UNROLL
    return (lane_total(s, col), lane_total(a, col), lane_total(sq, col), tl.sum(neg, axis=1),
            tl.max(amax, axis=1))  # fmt: skip


@triton.jit
def nan_or(finite, v):
    """The bits of the f32 scalar ``v``, or of the quiet NaN 0x7fc00000 (explicit bits)."""
    return tl.where(finite, v.to(tl.int32, bitcast=True), NAN_BITS)


@triton.jit(do_not_specialize=["n", "size", "nb"])
def scalars_kernel(x_ptr, pay_ptr, scal_ptr, n, size, nb, KIND: tl.constexpr, CLIP: tl.constexpr,
                   BF16: tl.constexpr, BB: tl.constexpr, UNROLL: tl.constexpr,
                   IDX64: tl.constexpr):  # fmt: skip
    """The f32 scalars (int32 bits at ``scal_ptr``) of buckets pid * BB .. pid * BB + BB - 1 of
    ``size`` values (the last one shorter); terngrad's clip from the envelope's param1."""
    IT: tl.constexpr = tl.int64 if IDX64 else tl.int32  # the index type
    n, size = n.to(IT), size.to(IT)
    lo0 = tl.program_id(0).to(IT) * BB * size
    b = tl.program_id(0).to(IT) * BB + tl.arange(0, BB)
    valid = b < nb
    lo = b * size
    hi = tl.minimum(lo + size, n)
    rows = (tl.minimum(size, n - lo0) + 7) // 8  # the program's longest bucket: its first
    total, mag, sq, neg, amax = bucket_sums(x_ptr, lo, hi, rows, KIND, BF16, BB, UNROLL)
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
            clip = f32_at(pay_ptr, 28, True).to(tl.float64)
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


# ---- pass 2: the codes ------------------------------------------------------------------------


@triton.jit
def level_code(v, s, index, k0, k1, LEVELS: tl.constexpr, NEG: tl.constexpr,
               CLIPPED: tl.constexpr, STOCH: tl.constexpr):  # fmt: skip
    """prim::Levels' code of ``v`` with den = ``s`` (clip = s if CLIPPED, else +Inf), in fp32 in
    this order: a = min(|x|, clip); f = floor(num * a / den + u); l = min(f, levels); code
    l + (x < 0 and l > 0 ? neg : 0). 0 where ``s`` is not finite and positive."""
    ok = (tl.abs(s) < float("inf")) & (s > 0.0)
    den = tl.where(ok, s, 1.0)
    a = tl.abs(v)
    if CLIPPED:
        a = tl.where(a < den, a, den)
    else:
        a = tl.where(a < float("inf"), a, float("inf"))  # NaN -> +Inf, as native
    num = LEVELS * 1.0
    if LEVELS != 1:  # num = 1: 1 * a == a
        a = num * a
    f = tl.math.div_rn(a, den)
    if STOCH:
        f = f + uniform(k0, k1, index)
    f = tl.floor(f)
    lvl = tl.where(f < num, f, num)
    code = lvl.to(tl.int32) + tl.where((v < 0.0) & (lvl > 0.0), NEG, 0)
    return tl.where(ok, code, 0)


@triton.jit
def pack_store(codes_ptr, code, g, nbytes, g_end, BITS: tl.constexpr, BP: tl.constexpr):
    """Stores the (G, 8) codes of groups ``g`` (``g_end``: one past the last) as the bit stream:
    group g's eight codes are the ``BITS`` bytes from g * BITS (code k at bits [k * BITS, (k + 1)
    * BITS)); bytes past ``nbytes`` are not written. 2, 4 and 8 bits: a group's bytes in one 16-
    or 32-bit store (two for 8 bits; the stream starts at 32 + 4 s nb) where the tile ends inside
    the stream; else (and for 1, 3, 5, 6, 7 bits) byte stores."""
    k = tl.arange(0, 8)
    word = tl.sum(code.to(tl.uint64) << (k * BITS).to(tl.uint64)[None, :], axis=1)  # disjoint bits
    if (BITS == 2) or (BITS == 4) or (BITS == 8):
        if g_end * BITS <= nbytes:  # the tile inside the stream
            store_words(codes_ptr, word, g, g >= 0, BITS)
        else:
            store_bytes(codes_ptr, word, g, nbytes, BITS, BP)
    else:
        store_bytes(codes_ptr, word, g, nbytes, BITS, BP)


@triton.jit
def store_bytes(codes_ptr, word, g, nbytes, BITS: tl.constexpr, BP: tl.constexpr):
    """The BITS low bytes of groups ``g``'s words as bytes g * BITS ..., none past ``nbytes`` (BP:
    a power of two >= BITS)."""
    m = tl.arange(0, BP)
    at = g[:, None] * BITS + m[None, :]
    byte = (word[:, None] >> (m * 8).to(tl.uint64)[None, :]) & 0xFF
    tl.store(codes_ptr + at, byte.to(tl.uint8), mask=(m[None, :] < BITS) & (at < nbytes))


@triton.jit(do_not_specialize=["n", "size", "nbytes", "k0", "k1", "magic", "shift"])
def codes_kernel(x_ptr, pay_ptr, scal_ptr, codes_ptr, flag_ptr, n, size, nbytes, k0, k1, magic,
                 shift, KIND: tl.constexpr, BITS: tl.constexpr, LEVELS: tl.constexpr,
                 NEG: tl.constexpr, BF16: tl.constexpr, G: tl.constexpr, BP: tl.constexpr,
                 IDX64: tl.constexpr):  # fmt: skip
    """The codes of elements 8 G pid .. 8 G (pid + 1) - 1: sign bits (onebit, efsignsgd,
    signsgd), or prim::Levels' codes with the bucket's scalar (qsgd, terngrad) or tbq's tau
    (envelope param1); signsgd / tbq OR the non-finite flag into the envelope. ``magic``,
    ``shift``: ``divisor(size)`` (the int32 variant's bucket index)."""
    IT: tl.constexpr = tl.int64 if IDX64 else tl.int32  # the index type
    g = tl.program_id(0).to(IT) * G + tl.arange(0, G)
    i = g[:, None] * 8 + tl.arange(0, 8)[None, :]
    m = i < n.to(IT)
    v = widen(tl.load(x_ptr + i, mask=m, other=0), BF16)
    if (KIND == ONEBIT) or (KIND == EFSIGN) or (KIND == SIGNSGD):
        code = (v < 0.0).to(tl.int32)  # 1 = negative; NaN: 0
    elif KIND == TBQ:
        tau = f32_at(pay_ptr, 28, True)
        code = level_code(v, tau, i, k0, k1, 1, 1, False, False)
    else:
        if IDX64:
            k = i // size.to(IT)  # emulated on GPUs: int64 only
        else:  # int32: a multiply-high by divisor(size) (triton/__init__.py)
            q = tl.umulhi(i.to(tl.uint32) << 1, magic.to(tl.uint32))
            k = (q >> shift.to(tl.uint32)).to(tl.int32)
        s = tl.load(scal_ptr + k, mask=m, other=0).to(tl.float32, bitcast=True)
        if KIND == QSGD:
            code = level_code(v, s, i, k0, k1, LEVELS, NEG, False, True)
        else:
            code = level_code(v, s, i, k0, k1, 1, 1, True, True)
    pack_store(codes_ptr, tl.where(m, code, 0), g, nbytes.to(IT), tl.program_id(0).to(IT) * G + G,
               BITS, BP)  # fmt: skip
    if (KIND == SIGNSGD) or (KIND == TBQ):
        bad = tl.max(tl.max(tl.where(m & ~(tl.abs(v) < float("inf")), 1, 0), axis=1), axis=0)
        tl.atomic_or(flag_ptr + 1, FLAG_WORD, mask=bad > 0)


# ---- decode_add ------------------------------------------------------------------------------


@triton.jit
def value_of(pay_ptr, c, k, m, LEVELS: tl.constexpr, NEG: tl.constexpr, KIND: tl.constexpr):
    """The fp32 value code ``c`` of an element of bucket ``k`` decodes to (the native decoders'
    tables)."""
    nan = float("nan")
    if KIND == SIGNSGD:
        flagged = (tl.load(pay_ptr + 7) & 1) != 0
        val = tl.where(flagged, nan, tl.where(c != 0, -1.0, 1.0))
    elif KIND == TBQ:
        flagged = (tl.load(pay_ptr + 7) & 1) != 0
        tau = f32_at(pay_ptr, 28, True)
        val = tl.where(c == 0, 0.0, tl.where(c == 1, tau, tl.where(c == 2, neg(tau), nan)))
        val = tl.where(flagged, nan, val)
    elif KIND == ONEBIT:
        val = f32_at(pay_ptr, 32 + 4 * (2 * k + 1 - c), m)  # (negatives, others)
    else:
        s = f32_at(pay_ptr, 32 + 4 * k, m)
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
                  BF16: tl.constexpr, BLOCK: tl.constexpr, IDX64: tl.constexpr):  # fmt: skip
    """out[i] += value(i) for i in BLOCK pid .. BLOCK (pid + 1) - 1, in fp32, rounded once to
    out's dtype (bf16 ``out`` as its int16 bits). ``codes_at``: the stream's byte offset;
    ``magic``, ``shift``: ``divisor(size)`` (the int32 variant's bucket index)."""
    IT: tl.constexpr = tl.int64 if IDX64 else tl.int32  # the index type
    i = tl.program_id(0).to(IT) * BLOCK + tl.arange(0, BLOCK)
    m = i < n.to(IT)
    rb = (i & 7).to(tl.int32) * BITS  # bit i * BITS: no product past the stream's bytes
    byte = pay_ptr + codes_at.to(IT) + (i >> 3) * BITS + (rb >> 3)
    shift8 = rb & 7
    two = tl.load(byte, mask=m, other=0).to(tl.int32)
    if (8 % BITS) != 0:  # a code may straddle two bytes (bits 3, 5, 6, 7)
        two = two | (tl.load(byte + 1, mask=m & (shift8 + BITS > 8), other=0).to(tl.int32) << 8)
    c = (two >> shift8) & ((1 << BITS) - 1)
    k = i  # the bucket: only where the value reads a bucket's scalar
    if (KIND == QSGD) or (KIND == TERNGRAD) or (KIND == ONEBIT) or (KIND == EFSIGN):
        if IDX64:
            k = i // size.to(IT)  # emulated on GPUs: int64 only
        else:  # int32: a multiply-high by divisor(size) (triton/__init__.py)
            q = tl.umulhi(i.to(tl.uint32) << 1, magic.to(tl.uint32))
            k = (q >> shift.to(tl.uint32)).to(tl.int32)
    val = value_of(pay_ptr, c, k, m, LEVELS, NEG, KIND)
    o = tl.load(out_ptr + i, mask=m, other=0)
    r = widen(o, BF16) + val
    if BF16:
        tl.store(out_ptr + i, bf16_bits(r), mask=m)
    else:
        tl.store(out_ptr + i, r.to(out_ptr.dtype.element_ty), mask=m)
