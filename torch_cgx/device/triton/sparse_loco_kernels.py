"""sparseloco's packing in Triton (torch_cgx/device/triton/sparse.py launches them): after the
per-chunk selection (``torch.topk`` on the order keys, ``torch.sort``), two kernels write the
whole body the tensor-op reference (torch_cgx/device/codecs/sparseloco.py) builds in about 40
ops (gather, abs, isfinite, amin / amax or the fp64 sum, divisions, where, floor, clamp, the
code stream's words, cat):

- ``loco_rows_kernel``, one program per chunk: its scalars ``(a, d)`` (fp32; NaN bits
  0x7fc00000 for both where a kept value is not finite) and its kept indices (u16 / u32);
- ``loco_codes_kernel``, groups of eight kept values: each one's code (the sign on top, the
  level below) from its chunk's scalars, read back from the payload, and the group's ``BITS``
  bytes of the code stream (``maxmin.pack_codes``' layout).

The tail chunk (shorter, ``k_tail`` kept) is row ``full``: a kept value ``j`` belongs to row
``min(j // k_full, full)``, its first kept value is ``row * k_full`` and its first input
``row * chunk`` for every row. Exactness: fp32 divisions ``tl.math.div_rn``, the fp64 mean's
``/`` IEEE, the ``bits = 1`` sum serial in index order (the native loop), launched with
``enable_fp_fusion=False``; min / max of magnitudes exact in any order. Importing this module
imports triton."""

from __future__ import annotations

import triton
import triton.language as tl

from torch_cgx.device.triton.sparse_kernels import INF_BITS, _magnitude

NAN_BITS = tl.constexpr(0x7FC00000)


@triton.jit
def _widen(v, KIND: tl.constexpr):
    """fp32 of the integer bits ``v`` of a value of KIND (exact)."""
    if KIND == 0:
        return v.to(tl.float32, bitcast=True)
    elif KIND == 1:
        return v.to(tl.float16, bitcast=True).to(tl.float32)
    else:
        return (v.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)


@triton.jit
def _store_index(out_ptr, at, ix, m, WIDTH: tl.constexpr):
    if WIDTH == 2:
        tl.store(out_ptr.to(tl.pointer_type(tl.uint16)) + at, ix.to(tl.uint16), mask=m)
    else:
        tl.store(out_ptr.to(tl.pointer_type(tl.uint32)) + at, ix.to(tl.uint32), mask=m)


@triton.jit(do_not_specialize=["chunk", "full", "k_full", "k_tail", "idx_at"])
def loco_rows_kernel(x_ptr, idx_ptr, out_ptr, chunk, full, k_full, k_tail, idx_at,
                     KIND: tl.constexpr, BITS: tl.constexpr, LEVELS: tl.constexpr,
                     WIDTH: tl.constexpr, BK: tl.constexpr):  # fmt: skip
    """Row ``program_id``'s scalars at payload byte ``32 + 8 row`` and its kept indices (the
    int64 ``idx``, in-chunk, ascending) from byte ``idx_at + WIDTH * (row * k_full)``."""
    row = tl.program_id(0).to(tl.int64)
    k = k_tail + (row < full).to(tl.int64) * (k_full - k_tail)  # the tail is row ``full``
    kept0 = row * k_full
    base = row * chunk
    lo = tl.full([], float("inf"), tl.float32)
    hi = tl.full([], 0.0, tl.float32)
    bad = tl.full([], 0, tl.int32)
    t0 = k * 0  # a while loop: the interpreter cannot range() over a kernel argument
    while t0 < k:
        t = t0 + tl.arange(0, BK)
        m = t < k
        ix = tl.load(idx_ptr + kept0 + t, mask=m, other=0)
        _store_index(out_ptr + idx_at, kept0 + t, ix, m, WIDTH)
        mag = _magnitude(tl.load(x_ptr + base + ix, mask=m, other=0), KIND)
        bad = tl.maximum(bad, tl.max(((mag >= INF_BITS) & m).to(tl.int32), 0))
        magf = mag.to(tl.float32, bitcast=True)
        lo = tl.minimum(lo, tl.min(tl.where(m, magf, float("inf")), 0))
        hi = tl.maximum(hi, tl.max(tl.where(m, magf, 0.0), 0))
        t0 += BK
    if BITS == 1:
        acc = tl.full([], 0.0, tl.float64)
        j = k * 0
        while j < k:  # ((v0 + v1) + v2) + ...: the native loop's order
            mag1 = _magnitude(tl.load(x_ptr + base + tl.load(idx_ptr + kept0 + j)), KIND)
            acc += mag1.to(tl.float32, bitcast=True).to(tl.float64)
            j += 1
        a = (acc / k.to(tl.float64)).to(tl.float32)
        d = tl.full([], 0.0, tl.float32)
    else:
        a = lo
        d = tl.math.div_rn(hi - lo, tl.full([], LEVELS, tl.float32))
    words = (out_ptr + 32).to(tl.pointer_type(tl.int32)) + 2 * row
    tl.store(words, tl.where(bad != 0, NAN_BITS, a.to(tl.int32, bitcast=True)))
    tl.store(words + 1, tl.where(bad != 0, NAN_BITS, d.to(tl.int32, bitcast=True)))


@triton.jit(do_not_specialize=["kept", "chunk", "full", "k_full", "codes_at", "nbytes"])
def loco_codes_kernel(x_ptr, idx_ptr, out_ptr, kept, chunk, full, k_full, codes_at, nbytes,
                      KIND: tl.constexpr, BITS: tl.constexpr, LEVELS: tl.constexpr,
                      G: tl.constexpr, WIDE: tl.constexpr = True):  # fmt: skip
    """Groups ``G * program_id ...`` of eight kept values: their codes and the group's BITS
    bytes at ``codes_at + BITS * group`` (the last group's past ``nbytes`` left out). The
    chunk of a kept value by a 32-bit division unless WIDE (an index may reach 2^31)."""
    g = tl.program_id(0).to(tl.int64) * G + tl.arange(0, G)
    c = tl.arange(0, 8)
    j = g[:, None] * 8 + c[None, :]
    m = j < kept
    if WIDE:
        row = tl.minimum(j // k_full, full)
    else:  # every kept index below 2^31: a 32-bit division
        row = tl.minimum(j.to(tl.int32) // k_full, full).to(tl.int64)
    ix = tl.load(idx_ptr + j, mask=m, other=0)
    v = _widen(tl.load(x_ptr + row * chunk + ix, mask=m, other=0), KIND)
    sign = (v < 0).to(tl.int64) << (BITS - 1)
    if BITS == 1:
        code = sign
    else:
        words = (out_ptr + 32).to(tl.pointer_type(tl.float32)) + 2 * row
        a = tl.load(words, mask=m, other=0.0)
        d = tl.load(words + 1, mask=m, other=0.0)
        f = tl.floor(tl.math.div_rn(tl.abs(v) - a, d) + 0.5)
        usable = (d > 0) & (d < float("inf"))
        level = tl.where(usable, tl.minimum(tl.maximum(f, 0.0), LEVELS * 1.0), 0.0)
        code = sign | level.to(tl.int64)
    code = tl.where(m, code, 0)
    word = tl.sum(code << (c[None, :] * BITS), 1)  # disjoint bit fields: the sum is their OR
    for b in tl.static_range(BITS):
        at = g * BITS + b
        tl.store(out_ptr + codes_at + at, ((word >> (8 * b)) & 0xFF).to(tl.uint8), mask=at < nbytes)
