"""The Triton kernels of the sparse device codecs (torch_cgx/device/triton/sparse.py launches
them): the elementwise passes around the selection, each one kernel where the tensor-op reference
(torch_cgx/device/codecs/sparse_select.py) runs several to dozens. The selection itself
(``torch.topk``, ``torch.sort``, ``torch.kthvalue``, ``torch.nonzero``) stays in torch.

Input values arrive as their integer bits (``KIND`` 0: fp32 as int32, 1: fp16 as int16, 2: bf16
as int16), so that gathered values move bit for bit and magnitudes are fp32 bit patterns without
a float conversion the interpreter could round. Indices are int64 throughout (the codecs' u32
indices and ``2 t + 1`` draw steps exceed int32). Importing this module imports triton."""

from __future__ import annotations

import triton
import triton.language as tl

from torch_cgx.device.triton.rng import fmix32

INF_BITS = tl.constexpr(0x7F800000)
NAN_RANK = tl.constexpr(0x7F800001)  # above +Inf: NaN first in the top-k order


@triton.jit
def _magnitude(v, KIND: tl.constexpr):
    """uint32 fp32 bits of ``|x|`` for the integer bits ``v`` of a value of KIND."""
    if KIND == 0:
        u = v.to(tl.uint32, bitcast=True)
    elif KIND == 1:
        u = v.to(tl.float16, bitcast=True).to(tl.float32).to(tl.uint32, bitcast=True)
    else:
        u = v.to(tl.uint16, bitcast=True).to(tl.uint32) << 16
    return u & 0x7FFFFFFF


@triton.jit
def _offsets(BLOCK: tl.constexpr):
    return tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)


@triton.jit
def _full(n, BLOCK: tl.constexpr):
    """Whether this program's tile lies entirely below ``n``: its loads and stores go unmasked
    (vector accesses), the last program's masked."""
    return (tl.program_id(0).to(tl.int64) + 1) * BLOCK <= n


@triton.jit
def _load(ptr, i, m, FULL: tl.constexpr):
    if FULL:
        return tl.load(ptr + i)
    else:
        return tl.load(ptr + i, mask=m, other=0)


@triton.jit
def _store(ptr, i, v, m, FULL: tl.constexpr):
    if FULL:
        tl.store(ptr + i, v)
    else:
        tl.store(ptr + i, v, mask=m)


@triton.jit
def _keys_tile(x_ptr, idx_ptr, keys_ptr, i, m, row, KIND: tl.constexpr, HAS_INDEX: tl.constexpr,
               ROWS: tl.constexpr, WIDE: tl.constexpr, FULL: tl.constexpr):  # fmt: skip
    b = tl.minimum(_magnitude(_load(x_ptr, i, m, FULL), KIND), NAN_RANK)
    if HAS_INDEX:
        index = _load(idx_ptr, i, m, FULL)
    elif ROWS and WIDE:
        index = i % row
    elif ROWS:  # every position below 2^31: a 32-bit remainder
        index = (i.to(tl.int32) % row).to(tl.int64)
    else:
        index = i
    _store(keys_ptr, i, (b.to(tl.int64) << 32) | (0xFFFFFFFF - index), m, FULL)


@triton.jit(do_not_specialize=["n", "row"])
def keys_kernel(x_ptr, idx_ptr, keys_ptr, n, row, KIND: tl.constexpr, HAS_INDEX: tl.constexpr,
                ROWS: tl.constexpr, BLOCK: tl.constexpr, WIDE: tl.constexpr = True):  # fmt: skip
    """``order_keys``: ``min(|x| bits, NaN rank) << 32 | (2^32 - 1 - index)``, the index from
    ``idx_ptr`` (HAS_INDEX), the position in its row of ``row`` values (ROWS; a 32-bit remainder
    unless WIDE: a position or ``row`` may reach 2^31), or the position. Full tiles unmasked."""
    i = _offsets(BLOCK)
    m = i < n
    if _full(n, BLOCK):
        _keys_tile(x_ptr, idx_ptr, keys_ptr, i, m, row, KIND, HAS_INDEX, ROWS, WIDE, True)
    else:
        _keys_tile(x_ptr, idx_ptr, keys_ptr, i, m, row, KIND, HAS_INDEX, ROWS, WIDE, False)


@triton.jit
def _mask_tile(x_ptr, out_ptr, i, m, thr, KIND: tl.constexpr, FULL: tl.constexpr):
    mag = tl.minimum(_magnitude(_load(x_ptr, i, m, FULL), KIND), INF_BITS)
    _store(out_ptr, i, (mag.to(tl.int32) >= thr).to(tl.int8), m, FULL)


@triton.jit(do_not_specialize=["n", "tau"])
def mask_kernel(x_ptr, thr_ptr, out_ptr, n, tau, KIND: tl.constexpr, FROM_PTR: tl.constexpr,
                BLOCK: tl.constexpr):  # fmt: skip
    """``magnitude_bits(x) >= thr`` as bytes 0 / 1, the threshold bits ``tau`` or the int32 at
    ``thr_ptr`` (FROM_PTR: a threshold computed on the device). Full tiles unmasked."""
    i = _offsets(BLOCK)
    m = i < n
    if FROM_PTR:
        thr = tl.load(thr_ptr)
    else:
        thr = tau
    if _full(n, BLOCK):
        _mask_tile(x_ptr, out_ptr, i, m, thr, KIND, True)
    else:
        _mask_tile(x_ptr, out_ptr, i, m, thr, KIND, False)


@triton.jit
def _rng_bits(k0, k1, index):
    """``rng_bits(key, index)`` of csrc/core/rng.h (uint32) for int64 ``index``."""
    lo = (index & 0xFFFFFFFF).to(tl.uint32)
    hi = ((index >> 32) & 0xFFFFFFFF).to(tl.uint32)
    return fmix32(fmix32(lo ^ k0) + ((hi * 0x9E3779B1) ^ k1))


@triton.jit
def _key_word(key_ptr, j):
    """Little-endian u32 at bytes 4 j ... 4 j + 3 of ``key_ptr`` (uint8; any alignment)."""
    w = tl.load(key_ptr + 4 * j).to(tl.uint32)
    w |= tl.load(key_ptr + 4 * j + 1).to(tl.uint32) << 8
    w |= tl.load(key_ptr + 4 * j + 2).to(tl.uint32) << 16
    return w | (tl.load(key_ptr + 4 * j + 3).to(tl.uint32) << 24)


@triton.jit(do_not_specialize=["k0", "k1", "count", "base"])
def draw_kernel(key_ptr, k0, k1, r_ptr, ptr_ptr, x_ptr, count, base, KEY_PTR: tl.constexpr,
                SAMPLE: tl.constexpr, KIND: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    """Draw ``t`` of ``count``: ``r64 % m`` with ``r64 = rng_bits(2 t) << 32 | rng_bits(2 t +
    1)`` (the u64 remainder). random_k (not SAMPLE): ``m = t + base + 1`` (``base = n - k``),
    ``r`` to ``r_ptr`` and Floyd's link ``r - base`` where ``base <= r < t + base``, else -1, to
    ``ptr_ptr``. SAMPLE: ``m = base`` (``n``), the magnitude bits of ``x[r]`` (int32) to
    ``r_ptr``. The key: host words ``k0``, ``k1`` or the 8 bytes at ``key_ptr`` (KEY_PTR)."""
    t = _offsets(BLOCK)
    m = t < count
    if KEY_PTR:
        a0 = _key_word(key_ptr, 0)
        a1 = _key_word(key_ptr, 1)
    else:
        a0 = k0.to(tl.uint32)
        a1 = k1.to(tl.uint32)
    hi = _rng_bits(a0, a1, 2 * t)
    lo = _rng_bits(a0, a1, 2 * t + 1)
    r64 = (hi.to(tl.uint64) << 32) | lo.to(tl.uint64)
    if SAMPLE:
        pos = (r64 % base.to(tl.uint64)).to(tl.int64)
        v = tl.load(x_ptr + pos, mask=m, other=0)
        mag = tl.minimum(_magnitude(v, KIND), INF_BITS)
        tl.store(r_ptr + t, mag.to(tl.int32), mask=m)
    else:
        r = (r64 % (t + base + 1).to(tl.uint64)).to(tl.int64)
        tl.store(r_ptr + t, r, mask=m)
        link = tl.where((r >= base) & (r < t + base), r - base, -1)
        tl.store(ptr_ptr + t, link, mask=m)


@triton.jit(do_not_specialize=["count"])
def repeat_kernel(sorted_ptr, order_ptr, taken_ptr, count, BLOCK: tl.constexpr):
    """``taken[order[i]] = sorted[i] == sorted[i - 1]`` (``i > 0``; 0 for ``i = 0``): a draw equal
    to an earlier one (the stable sort keeps the earliest first)."""
    i = _offsets(BLOCK)
    m = i < count
    v = tl.load(sorted_ptr + i, mask=m, other=0)
    prev = tl.load(sorted_ptr + i - 1, mask=m & (i > 0), other=-1)
    dst = tl.load(order_ptr + i, mask=m, other=0)
    tl.store(taken_ptr + dst, ((i > 0) & (v == prev)).to(tl.int8), mask=m)


@triton.jit
def _jump_tile(taken_in, ptr_in, taken_out, ptr_out, r_ptr, picks_ptr, t, m, base,
               LAST: tl.constexpr, FULL: tl.constexpr):  # fmt: skip
    p = tl.where(m, _load(ptr_in, t, m, FULL), -1)
    linked = p >= 0
    at = tl.maximum(p, 0)
    tk = _load(taken_in, t, m, FULL)
    tk = tk | (linked & (tl.load(taken_in + at, mask=linked, other=0) != 0)).to(tl.int8)
    if LAST:
        _store(picks_ptr, t, tl.where(tk != 0, t + base, _load(r_ptr, t, m, FULL)), m, FULL)
    else:
        _store(taken_out, t, tk, m, FULL)
        nxt = tl.load(ptr_in + at, mask=linked, other=-1)
        _store(ptr_out, t, tl.where(linked, nxt, -1), m, FULL)


@triton.jit(do_not_specialize=["count", "base"])
def jump_kernel(taken_in, ptr_in, taken_out, ptr_out, r_ptr, picks_ptr, count, base,
                LAST: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    """One pointer-jumping round of random_k: ``taken |= linked & taken[at]``, ``pointer =
    pointer[at]`` (into the other buffers). LAST: the picks ``t + base`` where taken, else
    ``r``. Full tiles unmasked."""
    t = _offsets(BLOCK)
    m = t < count
    if _full(count, BLOCK):
        _jump_tile(taken_in, ptr_in, taken_out, ptr_out, r_ptr, picks_ptr, t, m, base, LAST, True)
    else:
        _jump_tile(taken_in, ptr_in, taken_out, ptr_out, r_ptr, picks_ptr, t, m, base, LAST, False)


@triton.jit
def _pack_tile(idx_ptr, x_ptr, out_ptr, i, m, val_off, INDEX: tl.constexpr, ES: tl.constexpr,
               FULL: tl.constexpr):  # fmt: skip
    pos = _load(idx_ptr, i, m, FULL)
    if INDEX:
        _store((out_ptr + 32).to(tl.pointer_type(tl.uint32)), i, pos.to(tl.uint32), m, FULL)
    v = tl.load(x_ptr + pos, mask=m, other=0)  # a gather: a tail lane reads x[0]
    if ES == 4:
        _store((out_ptr + val_off).to(tl.pointer_type(tl.int32)), i, v, m, FULL)
    else:
        _store((out_ptr + val_off).to(tl.pointer_type(tl.int16)), i, v, m, FULL)


@triton.jit(do_not_specialize=["count", "val_off"])
def pack_kernel(head_ptr, idx_ptr, x_ptr, out_ptr, count, val_off, INDEX: tl.constexpr,
                ES: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    """The payload: the 32 envelope bytes of ``head_ptr`` (program 0), the ``count`` indices as
    u32 from byte 32 (INDEX), the values ``x[idx]`` (ES bytes each, their bits) from byte
    ``val_off``. ``out_ptr`` 4-aligned (a fresh payload); ``val_off`` a multiple of ES. Full
    tiles store unmasked."""
    if tl.program_id(0) == 0:
        hb = tl.arange(0, 32)
        tl.store(out_ptr + hb, tl.load(head_ptr + hb))
    i = _offsets(BLOCK)
    m = i < count
    if _full(count, BLOCK):
        _pack_tile(idx_ptr, x_ptr, out_ptr, i, m, val_off, INDEX, ES, True)
    else:
        _pack_tile(idx_ptr, x_ptr, out_ptr, i, m, val_off, INDEX, ES, False)


@triton.jit
def flagged_nan_kernel(pay_ptr, out_ptr, n, KIND: tl.constexpr, BLOCK: tl.constexpr):
    """Elements BLOCK pid ... of ``out`` (its integer bits, KIND as above) set to NaN where the
    payload's flags byte (7) has the non-finite bit (2); nothing read or written otherwise.
    ``out + NaN`` is NaN whatever ``out`` holds: the dtype's quiet NaN (0x7fc00000, 0x7e00,
    0x7fc0), the NaN a GPU writes too."""
    flags = tl.load(pay_ptr + 7).to(tl.int32)
    if (flags & 2) != 0:
        i = _offsets(BLOCK)
        if KIND == 0:
            nan = tl.full([BLOCK], 0x7FC00000, tl.int32)
        elif KIND == 1:
            nan = tl.full([BLOCK], 0x7E00, tl.int16)
        else:
            nan = tl.full([BLOCK], 0x7FC0, tl.int16)
        if _full(n, BLOCK):
            tl.store(out_ptr + i, nan)
        else:
            tl.store(out_ptr + i, nan, mask=i < n)
