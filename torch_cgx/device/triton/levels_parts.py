"""Building blocks of the level and sign kernels (``levels_kernels.py``): the kinds, payload
reads (bytes at any alignment, or 32-bit words where the host found the payload 4-aligned),
prim::Levels' code of a value, a whole tile of codes (the codes and encode kernels' body; stored
by bits.py's ``pack_store``), and the decoders' code readers (a block's codes from whole words,
or byte by byte). Exactness as levels_kernels.py says. Importing this module imports triton."""

from __future__ import annotations

import triton
import triton.language as tl

from torch_cgx.device.triton.bits import bf16_bits, bucket_of, group_word, pack_store, widen
from torch_cgx.device.triton.rng import SCALE, group_uniform

NAN_BITS = tl.constexpr(0x7FC00000)

# Kinds (constexpr): signum is signsgd's kernel
QSGD = tl.constexpr(0)
TERNGRAD = tl.constexpr(1)
ONEBIT = tl.constexpr(2)
EFSIGN = tl.constexpr(3)
SIGNSGD = tl.constexpr(4)
TBQ = tl.constexpr(5)
FLAG_WORD = tl.constexpr(1 << 24)  # flag bit 0 (byte 7) in the little-endian word of bytes 4..7


@triton.constexpr_function
def row_len(bits, block):
    """Codes per row of a decode tile: the codes of one 32-bit word (1, 2, 4, 8 bits), else 32
    (``bits`` whole words); at most ``block``."""
    return min(32 // bits if 32 % bits == 0 else 32, block)


@triton.constexpr_function
def or_one(align):
    """A constexpr alignment, 1 where it is unset (None: a compile that does not pass it)."""
    return align or 1


@triton.jit
def scalar_of(ptr, k, m, k0, one, CG: tl.constexpr):
    """The int32 at ``ptr + k`` where ``m``: where ``one`` (every element of the tile in bucket
    ``k0``) one load, broadcast; else a load per element (CG: through L2, the ``.cg`` cache
    modifier, for values this program has just written)."""
    if one:
        if CG:
            s = tl.broadcast_to(tl.load(ptr + k0, cache_modifier=".cg"), k.shape)
        else:
            s = tl.broadcast_to(tl.load(ptr + k0), k.shape)
    else:
        if CG:
            s = tl.load(ptr + k, mask=m, other=0, cache_modifier=".cg")
        else:
            s = tl.load(ptr + k, mask=m, other=0)
    return s


@triton.jit
def u32_at(ptr, off, mask):
    """The little-endian uint32 at byte offsets ``off`` of a uint8 pointer (any alignment)."""
    w = tl.load(ptr + off, mask=mask, other=0).to(tl.uint32)
    w = w | (tl.load(ptr + off + 1, mask=mask, other=0).to(tl.uint32) << 8)
    w = w | (tl.load(ptr + off + 2, mask=mask, other=0).to(tl.uint32) << 16)
    return w | (tl.load(ptr + off + 3, mask=mask, other=0).to(tl.uint32) << 24)


@triton.jit
def f32_at(ptr, off, mask, WORDS: tl.constexpr):
    """The f32 at byte offsets ``off`` (multiples of 4) of a uint8 pointer: one 32-bit load
    where ``WORDS`` (the pointer 4-aligned), else four byte loads."""
    if WORDS:
        w = tl.load(ptr.to(tl.pointer_type(tl.uint32)) + (off >> 2), mask=mask, other=0)
    else:
        w = u32_at(ptr, off, mask)
    return w.to(tl.float32, bitcast=True)


@triton.jit
def nan_or(finite, v):
    """The bits of the f32 scalar ``v``, or of the quiet NaN 0x7fc00000 (explicit bits)."""
    return tl.where(finite, v.to(tl.int32, bitcast=True), NAN_BITS)


@triton.jit
def level_code(v, s, g, k0, k1, LEVELS: tl.constexpr, NEG: tl.constexpr,
               CLIPPED: tl.constexpr, STOCH: tl.constexpr, FINITE: tl.constexpr):  # fmt: skip
    """prim::Levels' code of ``v`` with den = ``s`` (a scalar or per element; clip = s if
    CLIPPED, else +Inf), in fp32 in this order: a = min(|x|, clip); f = floor(num * a / den +
    u); l = min(f, levels); code l + (x < 0 and l > 0 ? neg : 0). 0 where ``s`` is not finite
    and positive. FINITE: every value of a bucket whose ``s`` is finite and positive is finite
    (qsgd's norm and terngrad's scalars are NaN otherwise): no NaN to map to +Inf, f is never
    NaN there (num * a may overflow to +Inf: f = +Inf), so min(f, levels) first, then floor and
    conversion in one instruction (F2I.FLOOR); elsewhere the code is replaced by 0 whatever
    the conversion gave. ``v`` a (G, 8) tile of groups ``g`` (elements 8 g + j: u's indices)."""
    ok = (tl.abs(s) < float("inf")) & (s > 0.0)
    den = tl.where(ok, s, 1.0)
    a = tl.abs(v)
    if CLIPPED:
        a = tl.where(a < den, a, den)
    elif not FINITE:
        a = tl.where(a < float("inf"), a, float("inf"))  # NaN -> +Inf, as native
    num = LEVELS * 1.0
    if LEVELS != 1:  # num = 1: 1 * a == a
        a = num * a
    f = tl.math.div_rn(a, den)
    if STOCH:
        f = tl.fma(group_uniform(k0, k1, g), SCALE, f)  # f + u, rounded once
    if FINITE:
        lvl = tl.floor(tl.minimum(f, num)).to(tl.int32)  # floor(min(f, L)) = min(floor f, L)
        code = lvl + tl.where((v < 0.0) & (lvl > 0), NEG, 0)
    else:
        f = tl.floor(f)
        lvl = tl.where(f < num, f, num)
        code = lvl.to(tl.int32) + tl.where((v < 0.0) & (lvl > 0.0), NEG, 0)
    return tl.where(ok, code, 0)


# ---- a tile of codes (levels_kernels.py's codes and encode kernels) --------------------------


@triton.jit
def code_tile(x_ptr, pay_ptr, scal_ptr, codes_ptr, flag_ptr, g, gm, full, last, n, size, nbytes,
              g_end, k0, k1, magic, shift, KIND: tl.constexpr, BITS: tl.constexpr,
              LEVELS: tl.constexpr, NEG: tl.constexpr, BF16: tl.constexpr, BP: tl.constexpr,
              CG: tl.constexpr):  # fmt: skip
    """The codes of groups ``g`` where ``gm`` (a (G, 8) tile, element 8 g + j): sign bits
    (onebit, efsignsgd, signsgd), or prim::Levels' codes with the bucket's scalar (qsgd,
    terngrad; CG: read through L2, scalars this program has just written) or tbq's tau;
    signsgd / tbq OR the non-finite flag into the envelope. ``full``: every element of the tile
    inside the tensor (and ``gm``): unmasked loads of the input; ``last``: the tile's last
    element inside (the scalar loaded once where it is in the first one's bucket). qsgd /
    terngrad's tile inside the tensor and one bucket (the common one) takes a path of its own:
    no mask per element, the scalar a scalar."""
    i = g[:, None] * 8 + tl.arange(0, 8)[None, :]
    if (KIND == QSGD) or (KIND == TERNGRAD):
        kf = bucket_of((g_end - g.shape[0]) * 8, size, magic, shift)  # the first element's
        one = kf == bucket_of(last, size, magic, shift)
        if full and one:
            v = widen(tl.load(x_ptr + i), BF16)
            if CG:
                s = tl.load(scal_ptr + kf, cache_modifier=".cg")
            else:
                s = tl.load(scal_ptr + kf)
            code = levels_of(v, s.to(tl.float32, bitcast=True), g, k0, k1, KIND, LEVELS, NEG)
            pack_store(codes_ptr, group_word(code, BITS), g, gm, nbytes, g_end, BITS, BP)
        else:
            any_tile(x_ptr, pay_ptr, scal_ptr, codes_ptr, flag_ptr, i, g, gm, full, kf, one, n,
                     size, nbytes, g_end, k0, k1, magic, shift, KIND, BITS, LEVELS, NEG, BF16,
                     BP, CG)  # fmt: skip
    else:
        any_tile(x_ptr, pay_ptr, scal_ptr, codes_ptr, flag_ptr, i, g, gm, full, 0, False, n,
                 size, nbytes, g_end, k0, k1, magic, shift, KIND, BITS, LEVELS, NEG, BF16, BP,
                 CG)  # fmt: skip


@triton.jit
def levels_of(v, s, g, k0, k1, KIND: tl.constexpr, LEVELS: tl.constexpr, NEG: tl.constexpr):
    """qsgd's (stochastic, LEVELS) or terngrad's (clipped, stochastic) codes with scalar(s)
    ``s``: every value finite where ``s`` is finite and positive (level_code's FINITE)."""
    if KIND == QSGD:
        code = level_code(v, s, g, k0, k1, LEVELS, NEG, False, True, True)
    else:
        code = level_code(v, s, g, k0, k1, 1, 1, True, True, True)
    return code


@triton.jit
def any_tile(x_ptr, pay_ptr, scal_ptr, codes_ptr, flag_ptr, i, g, gm, full, kf, one, n, size,
             nbytes, g_end, k0, k1, magic, shift, KIND: tl.constexpr, BITS: tl.constexpr,
             LEVELS: tl.constexpr, NEG: tl.constexpr, BF16: tl.constexpr, BP: tl.constexpr,
             CG: tl.constexpr):  # fmt: skip
    """:func:`code_tile` with a mask per element (``full``: the input's loads unmasked) and,
    for qsgd / terngrad, the scalar loaded once where ``one`` (bucket ``kf``), else per
    element."""
    m = gm[:, None] & (i < n)
    if full:
        raw = tl.load(x_ptr + i)
    else:
        raw = tl.load(x_ptr + i, mask=m, other=0)
    v = widen(raw, BF16)
    if (KIND == ONEBIT) or (KIND == EFSIGN) or (KIND == SIGNSGD):
        code = (v < 0.0).to(tl.int32)  # 1 = negative; NaN: 0
    elif KIND == TBQ:
        tau = f32_at(pay_ptr, 28, True, False)
        code = level_code(v, tau, g, k0, k1, 1, 1, False, False, False)
    else:
        k = bucket_of(i, size, magic, shift)
        s = scalar_of(scal_ptr, k, m, kf, one, CG).to(tl.float32, bitcast=True)
        code = levels_of(v, s, g, k0, k1, KIND, LEVELS, NEG)
    pack_store(codes_ptr, group_word(tl.where(m, code, 0), BITS), g, gm, nbytes, g_end, BITS, BP)
    if (KIND == SIGNSGD) or (KIND == TBQ):
        # v * 0 is 0 for a finite value (masked ones load as 0), NaN for NaN or an infinity
        z = tl.sum(tl.sum(v * 0.0, axis=1), axis=0)
        tl.atomic_or(flag_ptr + 1, FLAG_WORD, mask=z != 0)


# ---- the decoders' code readers ----------------------------------------------------------------


@triton.jit
def byte_codes(codes, i, m, BITS: tl.constexpr):
    """The codes of elements ``i`` where ``m``, byte by byte from ``codes`` (the stream's first
    byte, any alignment): code i at bit i * BITS, two bytes where it straddles one's end."""
    rb = (i & 7).to(tl.int32) * BITS  # bit i * BITS: no product past the stream's bytes
    byte = codes + (i >> 3) * BITS + (rb >> 3)
    shift8 = rb & 7
    two = tl.load(byte, mask=m, other=0).to(tl.int32)
    if (8 % BITS) != 0:  # a code may straddle two bytes (bits 3, 5, 6, 7)
        two = two | (tl.load(byte + 1, mask=m & (shift8 + BITS > 8), other=0).to(tl.int32) << 8)
    return (two >> shift8) & ((1 << BITS) - 1)


@triton.jit
def word_codes(words, row, E: tl.constexpr, BITS: tl.constexpr):
    """The (rows, E) codes of whole rows ``row`` (element row * E + j: code j of the row), from
    the 4-aligned uint32 stream ``words``. 1, 2, 4, 8 bits: a row is one word, one load per
    row; 3, 5, 6, 7 bits: a row of 32 codes is ``BITS`` words, a code's word (and the next one
    where the code straddles it) loaded per element."""
    MASK: tl.constexpr = (1 << BITS) - 1
    bit = (tl.arange(0, E) * BITS).to(tl.uint32)
    if (32 % BITS) == 0:
        w = tl.load(words + row)
        c = (w[:, None] >> bit[None, :]) & MASK
    else:
        at = (row * BITS)[:, None] + (bit >> 5).to(row.dtype)[None, :]
        sh = (bit & 31)[None, :]
        lo = tl.load(words + at)
        over = (sh + BITS) > 32
        hi = tl.load(words + at + 1, mask=over & (at >= 0), other=0)
        c = ((lo >> sh) | tl.where(over, hi << ((32 - sh) & 31), 0)) & MASK
    return c.to(tl.int32)


@triton.jit
def add_store(out_ptr, i, m, val, FULL: tl.constexpr, BF16: tl.constexpr):
    """out[i] += val in fp32, rounded once to out's dtype (bf16 as its int16 bits): the whole
    tile (FULL: unmasked, vector loads and stores) or where ``m``."""
    if FULL:
        o = tl.load(out_ptr + i)
    else:
        o = tl.load(out_ptr + i, mask=m, other=0)
    if BF16:
        r = bf16_bits((o.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32,
                      bitcast=True) + val)  # fmt: skip
    else:
        r = (o.to(tl.float32) + val).to(out_ptr.dtype.element_ty)
    if FULL:
        tl.store(out_ptr + i, r)
    else:
        tl.store(out_ptr + i, r, mask=m)
