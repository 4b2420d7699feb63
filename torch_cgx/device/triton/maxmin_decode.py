"""The max-min decode kernel of :class:`torch_cgx.device.triton.maxmin.TritonMaxMin`
(docs/FORMAT.md, "The max-min wire format"), and the helpers it shares with the encode kernels
(``maxmin_kernels.py``, which re-exports ``decode_kernel``). Importing this module imports triton.

``decode_kernel`` takes ``BLOCK`` values per program as a (BLOCK / 8, 8) tile, a row per group of
eight codes (``BITS`` bytes of the stream). What it reads depends on the payload's address, a
host constexpr (``WORD``: 8 where the payload is 8-byte aligned, 4 where 4-byte aligned, 1
otherwise, say a view at an odd offset of a receive buffer): each bucket's metadata (mn, unit)
as one 64-bit load, two 32-bit loads, or eight byte loads; and a group's codes from the one to
three aligned 32-bit words that hold its bytes in a block whose codes and words lie inside the
payload (``WORD >= 4``), else its BITS bytes one by one (a group's codes are one word either
way). With ``GROUP_META`` (the bucket size a multiple of 8: a group never straddles a bucket) the
bucket index and metadata once per group, else per element. A block inside ``out`` loads and
stores ``out`` unmasked (vector accesses; the tile's rows are eight consecutive elements), the
last block masked.
"""

from __future__ import annotations

import triton
import triton.language as tl

from torch_cgx.device.triton.bits import bf16_bits, bucket_of, widen


@triton.jit
def le_bytes(ptr, off, mask, NBYTES: tl.constexpr):
    """The little-endian unsigned integer (uint32) of ``NBYTES`` bytes at byte offsets ``off``
    of a uint8 pointer (any alignment)."""
    w = tl.load(ptr + off, mask=mask, other=0).to(tl.uint32)
    for k in tl.static_range(1, NBYTES):
        w = w | (tl.load(ptr + off + k, mask=mask, other=0).to(tl.uint32) << (8 * k))
    return w


@triton.jit
def meta_of(pay_ptr, k, mask, WORD: tl.constexpr):
    """(mn, unit) in fp32 of buckets ``k``, the 8 bytes at 24 + 8 k of the payload: one 64-bit
    load (WORD 8: the payload 8-aligned), two 32-bit ones (4), or byte by byte (1)."""
    if WORD == 8:
        w = tl.load(pay_ptr.to(tl.pointer_type(tl.uint64)) + 3 + k, mask=mask, other=0)
        mn_bits = (w & 0xFFFFFFFF).to(tl.uint32)
        unit_bits = (w >> 32).to(tl.uint32)
    elif WORD == 4:
        p = pay_ptr.to(tl.pointer_type(tl.uint32)) + 6 + 2 * k
        mn_bits = tl.load(p, mask=mask, other=0)
        unit_bits = tl.load(p + 1, mask=mask, other=0)
    else:
        mn_bits = le_bytes(pay_ptr, 24 + 8 * k, mask, 4)
        unit_bits = le_bytes(pay_ptr, 28 + 8 * k, mask, 4)
    return mn_bits.to(tl.float32, bitcast=True), unit_bits.to(tl.float32, bitcast=True)


@triton.jit
def group_word(pay_ptr, at, BITS: tl.constexpr):
    """uint64 whose low 8 BITS bits are the BITS bytes at payload byte offsets ``at`` (a group of
    eight codes; ``at`` and the pointer 4-aligned up to ``at % 4``), from the one to three
    aligned 32-bit words that hold them: none read past the word of the group's last byte."""
    p = pay_ptr.to(tl.pointer_type(tl.uint32)) + (at >> 2)
    sh = ((at & 3) * 8).to(tl.uint32)  # 0 where BITS is 4 or 8 (the stream starts 8-aligned)
    w = tl.load(p).to(tl.uint64)
    if (BITS == 1) or (BITS == 2) or (BITS == 4):  # never across a 32-bit word
        return w >> sh.to(tl.uint64)
    elif BITS == 8:
        return w | (tl.load(p + 1).to(tl.uint64) << 32)
    else:
        w1 = tl.load(p + 1, mask=sh + 8 * BITS > 32, other=0).to(tl.uint64)
        w2 = tl.load(p + 2, mask=sh + 8 * BITS > 64, other=0).to(tl.uint64)
        s = sh.to(tl.uint64)
        return ((w | (w1 << 32)) >> s) | ((w2 << 32) << (32 - s))  # shifts below 64


@triton.jit
def group_bytes(pay_ptr, at, gq, end, BITS: tl.constexpr):
    """uint64 whose low 8 BITS bits are the BITS bytes at payload byte offsets ``at`` (any
    alignment) where ``gq``, byte by byte; bytes from ``end`` (the stream's end) on read 0."""
    w = tl.load(pay_ptr + at, mask=gq & (at < end), other=0).to(tl.uint64)
    for j in tl.static_range(1, BITS):
        byte = tl.load(pay_ptr + at + j, mask=gq & (at + j < end), other=0).to(tl.uint64)
        w = w | (byte << (8 * j))
    return w


@triton.jit
def codes_of(pay_ptr, g, gq, codes_at, tail_at, words, BITS: tl.constexpr, WORD: tl.constexpr):
    """The (G, 8) codes of groups ``g`` where ``gq`` (a group with coded elements), from each
    group's BITS bytes: read as 32-bit words where ``words`` (a block of coded elements whose
    words lie in the payload) and ``WORD >= 4``, else byte by byte: both a (G, 1) column of
    words, split into the tile after the branch (one layout for the tile's arithmetic; one
    conversion to ``out``'s vector layout at the end)."""
    at = codes_at + g * BITS
    if WORD >= 4:
        if words:
            grp = group_word(pay_ptr, at[:, None], BITS)
        else:
            grp = group_bytes(pay_ptr, at[:, None], gq[:, None], tail_at, BITS)
    else:
        grp = group_bytes(pay_ptr, at[:, None], gq[:, None], tail_at, BITS)
    col = (tl.arange(0, 8) * BITS).to(tl.uint64)
    return ((grp >> col[None, :]) & ((1 << BITS) - 1)).to(tl.int32)


@triton.jit
def dequantize(c, mn, unit, LEVELS: tl.constexpr):
    """FORMAT.md "Decoding one element": ``mn + q * unit`` in fp32 where ``|mn| + L |unit| <=
    FLT_MAX`` (fp64), else in fp64 then rounded (NaN metadata: either gives NaN)."""
    q = c.to(tl.float32)
    v = mn + q * unit  # product rounded, then the sum: no fused multiply-add
    mn64, unit64 = mn.to(tl.float64), unit.to(tl.float64)
    fast = tl.abs(mn64) + LEVELS * tl.abs(unit64) <= 3.4028234663852886e38
    if tl.min(fast.to(tl.int32)) == 0:
        v = tl.where(fast, v, (mn64 + q.to(tl.float64) * unit64).to(tl.float32))
    return v


@triton.jit
def raw_tail(pay_ptr, i, nq, mt, tail_at, TAIL_BYTES: tl.constexpr, TAIL_BF16: tl.constexpr):
    """fp32 of the raw tail's values of elements ``i`` where ``mt`` (TAIL_BYTES each)."""
    at = tail_at + tl.maximum(i - nq, 0) * TAIL_BYTES  # no product below -2^31
    raw = le_bytes(pay_ptr, at, mt, TAIL_BYTES)
    if TAIL_BYTES == 4:
        tail = raw.to(tl.float32, bitcast=True)
    elif TAIL_BF16:
        tail = (raw << 16).to(tl.float32, bitcast=True)
    else:
        tail = raw.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    return tail


@triton.jit
def put(out_ptr, i, m, val, full, ADD: tl.constexpr, OUT_BF16: tl.constexpr):
    """``out[i] += val`` rounded once to out's dtype (ADD) or ``out[i] = val``, where ``m``;
    unmasked (vector accesses) where ``full``."""
    if ADD:
        if full:
            o = tl.load(out_ptr + i)
        else:
            o = tl.load(out_ptr + i, mask=m, other=0)
        r = widen(o, OUT_BF16) + val
        if OUT_BF16:
            val = bf16_bits(r)
        else:
            val = r.to(out_ptr.dtype.element_ty)
    if full:
        tl.store(out_ptr + i, val)
    else:
        tl.store(out_ptr + i, val, mask=m)


@triton.jit(do_not_specialize=["n", "nq", "size", "codes_at", "tail_at", "magic", "shift"])
def decode_kernel(pay_ptr, out_ptr, n, nq, size, codes_at, tail_at, magic, shift,
                  BITS: tl.constexpr, TAIL_BYTES: tl.constexpr, TAIL_BF16: tl.constexpr,
                  ADD: tl.constexpr, OUT_BF16: tl.constexpr, BLOCK: tl.constexpr,
                  IDX64: tl.constexpr, WORD: tl.constexpr = 1,
                  GROUP_META: tl.constexpr = False):  # fmt: skip
    """Values of elements BLOCK pid ... BLOCK (pid + 1) - 1: ``out[i] += value`` in fp32 rounded
    once to out's dtype (bf16 ``out`` as its int16 bits) with ADD, else ``out[i] = value``
    (fp32). ``codes_at`` / ``tail_at``: byte offsets of the code stream and of the raw tail
    (TAIL_BYTES per value: 4 fp32, 2 fp16 or bf16; 0: no raw tail)."""
    IT: tl.constexpr = tl.int64 if IDX64 else tl.int32  # the index type
    G: tl.constexpr = BLOCK // 8
    g = tl.program_id(0).to(IT) * G + tl.arange(0, G)
    i = g[:, None] * 8 + tl.arange(0, 8)[None, :]
    n, nq, codes_at, tail_at = n.to(IT), nq.to(IT), codes_at.to(IT), tail_at.to(IT)
    end = tl.program_id(0).to(IT) * BLOCK + BLOCK
    m = i < n
    mq = i < nq
    pay_end = tail_at + (n - nq) * TAIL_BYTES
    words = (end <= nq) & (codes_at + ((G * tl.program_id(0).to(IT) + G) * BITS + 3) // 4 * 4
                           <= pay_end)  # fmt: skip
    c = codes_of(pay_ptr, g, g * 8 < nq, codes_at, tail_at, words, BITS, WORD)
    if GROUP_META:  # size % 8 == 0: a group's eight elements share their bucket
        k = bucket_of(g * 8, size.to(IT), magic, shift)
        mn, unit = meta_of(pay_ptr, k[:, None], (g * 8 < nq)[:, None], WORD)  # (G, 1)
    else:
        k = bucket_of(i, size.to(IT), magic, shift)
        mn, unit = meta_of(pay_ptr, k, mq, WORD)
    val = dequantize(c, mn, unit, (1 << BITS) - 1)
    if TAIL_BYTES > 0:  # the raw tail (skip_incomplete_buckets with n % B != 0)
        tail = raw_tail(pay_ptr, i, nq, m & ~mq, tail_at, TAIL_BYTES, TAIL_BF16)
        val = tl.where(mq, val, tail)
    put(out_ptr, i, m, val, end <= n, ADD, OUT_BF16)
