"""Building blocks of the level and sign kernels (``levels_kernels.py``): payload reads (bytes
at any alignment, or 32-bit words where the host found the payload 4-aligned), prim::Levels'
code of a value, the code stream's stores, and the decoders' code readers (a block's codes from
whole words, or byte by byte). Importing this module imports triton."""

from __future__ import annotations

import triton
import triton.language as tl

from torch_cgx.device.triton.bits import bf16_bits, group_word, store_words
from torch_cgx.device.triton.rng import uniform

NAN_BITS = tl.constexpr(0x7FC00000)


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
def bucket_of(i, size, magic, shift):
    """The bucket of element indices ``i`` (a tensor or a scalar) in buckets of ``size`` (of
    ``i``'s type): an int64 division (emulated on GPUs), or in the int32 variant a
    multiply-high by ``divisor(size)`` = (``magic``, ``shift``) (triton/__init__.py)."""
    if i.dtype == tl.int64:
        k = i // size
    else:
        q = tl.umulhi(i.to(tl.uint32) << 1, magic.to(tl.uint32))
        k = (q >> shift.to(tl.uint32)).to(tl.int32)
    return k


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
def pack_store(codes_ptr, code, g, gm, nbytes, g_end, BITS: tl.constexpr, BP: tl.constexpr):
    """Stores the (G, 8) codes of groups ``g`` where ``gm`` (``g_end``: one past the tile's last)
    as the bit stream: group g's eight codes are the ``BITS`` bytes from g * BITS (code k at bits
    [k * BITS, (k + 1) * BITS)); bytes past ``nbytes`` are not written. 2, 4 and 8 bits: a
    group's bytes in one 16- or 32-bit store (two for 8 bits; the stream starts at 32 + 4 s nb)
    where the tile ends inside the stream; else (and for 1, 3, 5, 6, 7 bits) byte stores."""
    word = group_word(code, BITS)
    if (BITS == 2) or (BITS == 4) or (BITS == 8):
        if g_end * BITS <= nbytes:  # the tile inside the stream
            store_words(codes_ptr, word, g, gm, BITS)
        else:
            store_bytes(codes_ptr, word, g, gm, nbytes, BITS, BP)
    else:
        store_bytes(codes_ptr, word, g, gm, nbytes, BITS, BP)


@triton.jit
def store_bytes(codes_ptr, word, g, gm, nbytes, BITS: tl.constexpr, BP: tl.constexpr):
    """The BITS low bytes of groups ``g``'s words as bytes g * BITS ... where ``gm``, none past
    ``nbytes`` (BP: a power of two >= BITS)."""
    m = tl.arange(0, BP)
    at = g[:, None] * BITS + m[None, :]
    byte = (word[:, None] >> (m * 8).to(word.dtype)[None, :]) & 0xFF
    ok = gm[:, None] & (m[None, :] < BITS)
    tl.store(codes_ptr + at, byte.to(tl.uint8), mask=ok & (at < nbytes))


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
