"""The Triton kernels of :class:`torch_cgx.device.triton.maxmin.TritonMaxMin`: max-min
(docs/FORMAT.md, "The max-min wire format"), byte for byte the native codec and the tensor
operations of torch_cgx/device/codecs/maxmin.py. Importing this module imports triton.

Four kernels, all launched with ``enable_fp_fusion=False`` on the caller's current stream
(``encode_kernel``: both encode passes in one launch where a program holds whole buckets;
``decode_kernel`` lives in ``maxmin_decode.py``, re-exported here). A tile inside the tensor
(and its buckets) loads the input unmasked, so the compiler emits vector loads (16 bytes a
thread, a warp's threads on consecutive pieces), the tail tile masked ones:

- ``scalars_kernel`` (encode, pass 1): a program takes ``BB`` buckets and loops over them
  CHUNK values at a time, as CHUNK / SUB (BB, SUB) tiles (any bucket size: 2^20 and more is a
  loop of B / CHUNK iterations; ``ALIGN``, a power of two dividing B, the alignment hint of the
  buckets' starts): min, max into accumulators, their order-free trees and the finite check
  after the loop (without ``CLIP`` handed out to one bucket a thread for what follows), with
  ``CLIP`` the lane-ordered fp64 sums of FORMAT.md over
  a (BB, 8) tile, row after row (column j is lane j) - these in ``maxmin_buckets.py`` - then
  FORMAT.md's steps 2-3: metadata (mn, unit) as int32 bits, and per bucket into scratch
  buffers step 4's fp64 ``inv`` and its fp32 selector ``sel``: ``(f32)inv`` for the fp32 path,
  -1 for the fp64 path, 0 where every code is 0.
- ``codes_kernel`` (encode, pass 2): a program codes ``G`` groups of eight values (a group is
  ``BITS`` bytes of the stream, a row of a (G, 8) tile) with the bucket's mn and sel (and inv
  in a program that holds a bucket of the fp64 path; once per group with ``GROUP_META``, B a
  multiple of 8, else per element), nearest or stochastic rounding,
  and stores the packed bytes; elements past ``nq`` code 0 (the stream's unused high bits).
- ``decode_kernel``: ``BLOCK`` values per program, the codes from 32-bit words or bytes and the
  metadata from 64- / 32-bit words or bytes (the payload's address decides), FORMAT.md's fp32
  or fp64 formula per bucket, the raw tail read from its bytes in the source dtype; ``out +=
  value`` in fp32 rounded once to out's dtype (``ADD``), or the fp32 values.

Exactness on a GPU, by construction (docs/gpu.md; the interpreter computes in numpy, IEEE already):
every division is fp64 (``range / L``, ``L / range``, ``S / n``: ``/`` and ``tl.sqrt`` lower to
``div.rn.f64`` / ``sqrt.rn.f64``; Triton's fp32 ``/`` is approximate and there is none); no fused
multiply-add (``enable_fp_fusion=False`` at every launch); the clip constant made in fp64; indices
of the kernel's index type (``IDX64``: int64, or int32 below 2^31 with the bucket index a
multiply-high by ``divisor(size)``) before any product; NaN metadata the explicit bits 0x7fc00000;
bf16 as int16 bits, widened by a shift and rounded by integer arithmetic; order-dependent fp64 sums
never through ``tl.sum`` of more than one nonzero value (a lane is its value plus seven +0.0); min,
max and the integer reductions are order-free.
"""

from __future__ import annotations

import triton
import triton.language as tl

from torch_cgx.device.triton.bits import bucket_of, group_word, pack_store, widen
from torch_cgx.device.triton.maxmin_buckets import bucket_range, bucket_span, clipped, handed_out
from torch_cgx.device.triton.maxmin_decode import decode_kernel  # noqa: F401
from torch_cgx.device.triton.rng import SCALE, group_uniform

NAN_BITS = tl.constexpr(0x7FC00000)
FLT_MAX = tl.constexpr(3.4028234663852886e38)


# ---- pass 1: the bucket scalars --------------------------------------------------------------


@triton.jit(do_not_specialize=["nq", "size", "span", "nb"])
def scalars_kernel(x_ptr, meta_ptr, inv_ptr, sel_ptr, sums_ptr, nq, size, span, nb,
                   LEVELS: tl.constexpr, CLIP: tl.constexpr, C: tl.constexpr, BF16: tl.constexpr,
                   BB: tl.constexpr, CHUNK: tl.constexpr, UNROLL: tl.constexpr,
                   SUMS: tl.constexpr, IDX64: tl.constexpr, SUB: tl.constexpr,
                   ALIGN: tl.constexpr = 1):  # fmt: skip
    """Steps 1-3 of FORMAT.md for buckets pid * BB ... pid * BB + BB - 1 (:func:`scalars`)."""
    scalars(x_ptr, meta_ptr, inv_ptr, sel_ptr, sums_ptr, nq, size, span, nb, LEVELS, CLIP, C,
            BF16, BB, CHUNK, UNROLL, SUMS, IDX64, ALIGN, SUB)  # fmt: skip


@triton.jit
def scalars(x_ptr, meta_ptr, inv_ptr, sel_ptr, sums_ptr, nq, size, span, nb,
            LEVELS: tl.constexpr, CLIP: tl.constexpr, C: tl.constexpr, BF16: tl.constexpr,
            BB: tl.constexpr, CHUNK: tl.constexpr, UNROLL: tl.constexpr, SUMS: tl.constexpr,
            IDX64: tl.constexpr, ALIGN: tl.constexpr, SUB: tl.constexpr):  # fmt: skip
    """Steps 1-3 of FORMAT.md for buckets pid * BB ... pid * BB + BB - 1: metadata (mn, unit)
    as int32 bits at ``meta_ptr``, step 4's fp64 ``inv`` and fp32 ``sel``; returns whether one
    takes the fp64 path. ``span``: the longest bucket, min(size, nq), the loops' bound. SUMS (a
    check of the clip's order): S(x), S((x - mean)^2) at ``sums_ptr`` too. ALIGN: a power of
    two dividing ``size`` (the buckets' starts: vector loads of whole chunks and rows)."""
    IT: tl.constexpr = tl.int64 if IDX64 else tl.int32  # the index type
    nq, size, span = nq.to(IT), size.to(IT), span.to(IT)
    b = tl.program_id(0).to(IT) * BB + tl.arange(0, BB)
    valid = b < nb
    lo, hi, run = bucket_span(b, size, nq, ALIGN)
    vmn, vmx, finite = bucket_range(x_ptr, lo, hi, span, run, BF16, BB, CHUNK, SUB)
    if not CLIP:
        vmn, vmx, finite = handed_out(meta_ptr.to(tl.pointer_type(tl.float32)), b, valid, vmn,
                                      vmx, finite)  # fmt: skip
    mn64, mx64 = vmn.to(tl.float64), vmx.to(tl.float64)
    width = mx64 - mn64  # unclipped: chooses the path of step 4
    rng = width
    low = mn64
    if CLIP:
        ok, want, lo_c, total, var = clipped(x_ptr, lo, hi, size, span, run, mn64, mx64, width,
                                             C, BF16, BB, UNROLL)  # fmt: skip
        if SUMS:
            tl.store(sums_ptr + 2 * b, total, mask=valid)
            tl.store(sums_ptr + 2 * b + 1, var, mask=valid)
        ok = ok & finite
        rng = tl.where(ok, want, width)
        low = tl.where(ok, lo_c, mn64)
    levels = tl.full([BB], LEVELS, tl.float64)
    step = (rng / levels).to(tl.float32)  # fp64 division (IEEE), rounded once to fp32
    ok_step = finite & (step <= FLT_MAX)  # 1 bit, range > FLT_MAX: the step overflows
    positive = ok_step & (rng > 0)
    mn = low.to(tl.float32)
    mn = tl.where(mn == 0, 0.0, mn)  # +0.0 whatever the zeros' signs
    unit = tl.where(positive, step, 0.0)
    mn_bits = tl.where(ok_step, mn.to(tl.int32, bitcast=True), NAN_BITS)
    unit_bits = tl.where(ok_step, unit.to(tl.int32, bitcast=True), NAN_BITS)
    inv = tl.where(positive, levels / tl.where(positive, rng, 1.0), 0.0)
    f32 = positive & (width <= FLT_MAX) & (inv <= FLT_MAX)
    tl.store(meta_ptr + 2 * b, mn_bits, mask=valid)
    tl.store(meta_ptr + 2 * b + 1, unit_bits, mask=valid)
    tl.store(inv_ptr + b, inv, mask=valid)
    sel = tl.where(f32, inv.to(tl.float32), tl.where(positive, -1.0, 0.0))  # f32: inv32 > 0
    tl.store(sel_ptr + b, sel, mask=valid)
    return tl.min(tl.where(valid, sel, 0.0)) < 0  # a bucket of the fp64 path


# ---- pass 2: the codes -----------------------------------------------------------------------


@triton.jit
def quantize(v, mn, sel, inv_ptr, k, km, g, k0, k1, wide, LEVELS: tl.constexpr,
             STOCH: tl.constexpr, CG: tl.constexpr, CLIP: tl.constexpr,
             PER_GROUP: tl.constexpr):  # fmt: skip
    """Step 4: q = clamp(floor(t + r), 0, L) as int32 for the (G, 8) tile ``v`` of groups ``g``
    (elements 8 g + j: the generator's indices): the fp32 path with ``sel`` = (f32)inv
    where ``sel > 0``, the fp64 one with bucket ``k``'s fp64 inv where ``sel < 0``, 0 where
    ``sel == 0``. The fp64 path runs only in a program that holds such a bucket (a branch on a
    reduction, no host: ``wide``, the encode kernel's from its scalars; over the tile without
    CG). ``mn``, ``sel``, ``k``, ``km`` (where to load bucket k's inv, on the fp64 path): per
    element, or per group (a (G, 1) column). Without CLIP the fp32 path needs no clamp below
    and, rounding to nearest, none above: mn is the bucket's minimum, so 0 <= v - mn <= range
    rounded once, and sel is L / range rounded twice, so 0 <= t <= L (1 + 2^-22) and
    floor(t + 1/2) is in [0, L] (a stochastic r < 1 can reach L + 1: clamped); the floor and
    the conversion are then one instruction (F2I.FLOOR). Elsewhere (a masked element, a
    non-finite bucket) the conversion may see anything: those codes are replaced. PER_GROUP
    (``sel`` a (G, 1) column): the codes where ``sel == 0`` are left for the caller to replace
    (a group's word at a time), not zeroed here."""
    top = LEVELS * 1.0
    t = (v - mn) * sel  # fp32, one rounding per operation
    if STOCH:  # r = u / SCALE (exact): t + u in one fma, rounded once
        r = group_uniform(k0, k1, g)
        tr = tl.fma(r, SCALE, t)
    else:
        tr = t + 0.5
    if CLIP:  # t anywhere: clamped in fp32, then converted
        q = tl.minimum(tl.maximum(tl.floor(tr), 0.0), top).to(tl.int32)
    else:
        q = tl.floor(tr).to(tl.int32)
        if STOCH:
            q = tl.minimum(q, LEVELS)
    if not PER_GROUP:
        q = tl.where(sel > 0, q, 0)
    if not CG:
        wide = tl.min(sel) < 0
    if wide:
        if CG:  # written by this program: through L2
            inv = tl.load(inv_ptr + k, mask=km, other=0.0, cache_modifier=".cg")
        else:
            inv = tl.load(inv_ptr + k, mask=km, other=0.0)
        t64 = (v.to(tl.float64) - mn.to(tl.float64)) * inv
        if STOCH:
            t64 = t64 + (r * SCALE).to(tl.float64)  # u, exact in fp32
        else:
            t64 = t64 + 0.5
        q64 = tl.minimum(tl.maximum(tl.floor(t64), 0.0), top)
        q = tl.where(sel < 0, q64.to(tl.int32), q)
    return q


@triton.jit
def scalars_of(meta_ptr, sel_ptr, k, m, CG: tl.constexpr):
    """Buckets ``k``'s fp32 mn and sel where ``m`` (CG: through L2, the ``.cg`` cache modifier,
    for scalars this program has just written)."""
    if CG:
        mn = tl.load(meta_ptr + 2 * k, mask=m, other=0, cache_modifier=".cg")
        sel = tl.load(sel_ptr + k, mask=m, other=0.0, cache_modifier=".cg")
    else:
        mn = tl.load(meta_ptr + 2 * k, mask=m, other=0)
        sel = tl.load(sel_ptr + k, mask=m, other=0.0)
    return mn.to(tl.float32, bitcast=True), sel


@triton.jit
def group_codes(x_ptr, meta_ptr, inv_ptr, sel_ptr, g, gm, nq, size, k0, k1, magic, shift, wide,
                BITS: tl.constexpr, STOCH: tl.constexpr, BF16: tl.constexpr, CG: tl.constexpr,
                GROUP_META: tl.constexpr, CLIP: tl.constexpr, FULL: tl.constexpr):  # fmt: skip
    """The (G, 8) int32 codes of groups ``g`` (rows of eight elements) where ``gm``, and per
    group whether they stand (else the group's word is 0: its bucket's sel is 0): FULL, every
    element of the tile is coded (unmasked loads: vector loads; no mask per element), else 0
    past ``nq``. The buckets' scalars once per group with GROUP_META (the bucket size a
    multiple of 8), else per element (each code zeroed where it must be)."""
    i = g[:, None] * 8 + tl.arange(0, 8)[None, :]
    if FULL:
        m = gm[:, None]
        v = widen(tl.load(x_ptr + i), BF16)
    else:
        m = gm[:, None] & (i < nq)
        v = widen(tl.load(x_ptr + i, mask=m, other=0), BF16)
    if GROUP_META:  # a group never straddles a bucket
        k = bucket_of(g * 8, size, magic, shift)
        km = gm & (g * 8 < nq)
        k, km = k[:, None], km[:, None]  # (G, 1) columns: one layout for the tile
        mn, sel = scalars_of(meta_ptr, sel_ptr, k, km, CG)
        km = km & (sel < 0)  # the fp64 path's buckets
        keep = tl.sum(sel, axis=1) != 0  # (G,): the column's one value
    else:
        k = bucket_of(i, size, magic, shift)
        mn, sel = scalars_of(meta_ptr, sel_ptr, k, m, CG)
        km = m & (sel < 0)
        keep = gm
    code = quantize(v, mn, sel, inv_ptr, k, km, g, k0, k1, wide, (1 << BITS) - 1, STOCH, CG,
                    CLIP, GROUP_META)  # fmt: skip
    if not FULL:
        code = tl.where(m, code, 0)
    return code, keep


@triton.jit
def code_groups(x_ptr, meta_ptr, inv_ptr, sel_ptr, codes_ptr, g, gm, full, nq, size, nbytes, k0,
                k1, magic, shift, g_end, wide, BITS: tl.constexpr, STOCH: tl.constexpr,
                BF16: tl.constexpr, BP: tl.constexpr, CG: tl.constexpr,
                GROUP_META: tl.constexpr, CLIP: tl.constexpr):  # fmt: skip
    """The code stream of groups ``g`` (eight elements each, a row of the (G, 8) tile: a warp's
    threads read consecutive 16-byte pieces) where ``gm``; ``full``: every element of the tile
    is coded (:func:`group_codes`' FULL). ``nq``, ``size``, ``nbytes`` in ``g``'s index type;
    ``magic``, ``shift``: ``divisor(size)`` (int32 variant's bucket index)."""
    if full:
        code, keep = group_codes(x_ptr, meta_ptr, inv_ptr, sel_ptr, g, gm, nq, size, k0, k1,
                                 magic, shift, wide, BITS, STOCH, BF16, CG, GROUP_META, CLIP,
                                 True)  # fmt: skip
    else:
        code, keep = group_codes(x_ptr, meta_ptr, inv_ptr, sel_ptr, g, gm, nq, size, k0, k1,
                                 magic, shift, wide, BITS, STOCH, BF16, CG, GROUP_META, CLIP,
                                 False)  # fmt: skip
    word = tl.where(keep, group_word(code, BITS), 0)  # a group of a sel-0 bucket: zeros
    pack_store(codes_ptr, word, g, gm, nbytes, g_end, BITS, BP)


@triton.jit(do_not_specialize=["nq", "size", "nbytes", "k0", "k1", "magic", "shift"])
def codes_kernel(x_ptr, meta_ptr, inv_ptr, sel_ptr, codes_ptr, nq, size, nbytes, k0, k1, magic,
                 shift, BITS: tl.constexpr, STOCH: tl.constexpr, BF16: tl.constexpr,
                 G: tl.constexpr, BP: tl.constexpr, IDX64: tl.constexpr, CLIP: tl.constexpr,
                 GROUP_META: tl.constexpr = False):  # fmt: skip
    """The code stream of elements 8 G pid ... 8 G (pid + 1) - 1 (groups of eight)."""
    IT: tl.constexpr = tl.int64 if IDX64 else tl.int32  # the index type
    g = tl.program_id(0).to(IT) * G + tl.arange(0, G)
    g_end = tl.program_id(0).to(IT) * G + G
    code_groups(x_ptr, meta_ptr, inv_ptr, sel_ptr, codes_ptr, g, g >= 0, g_end * 8 <= nq.to(IT),
                nq.to(IT), size.to(IT), nbytes.to(IT), k0, k1, magic, shift, g_end, False, BITS,
                STOCH, BF16, BP, False, GROUP_META, CLIP)  # fmt: skip


@triton.jit(do_not_specialize=["nq", "size", "span", "nb", "nbytes", "k0", "k1", "magic", "shift"])
def encode_kernel(x_ptr, meta_ptr, inv_ptr, sel_ptr, codes_ptr, nq, size, span, nb, nbytes, k0,
                  k1, magic, shift, LEVELS: tl.constexpr, CLIP: tl.constexpr, C: tl.constexpr,
                  BF16: tl.constexpr, BB: tl.constexpr, CHUNK: tl.constexpr,
                  UNROLL: tl.constexpr, BITS: tl.constexpr, STOCH: tl.constexpr,
                  G: tl.constexpr, BP: tl.constexpr, IDX64: tl.constexpr, SUB: tl.constexpr,
                  ALIGN: tl.constexpr = 1, GROUP_META: tl.constexpr = False):  # fmt: skip
    """Both passes in one launch for buckets that fit a program (``BB``, ``BB * size`` a
    multiple of 8 or one program): the scalars of buckets pid * BB ... (``wide``: any on the
    fp64 path), a barrier (the program's global writes visible to its threads), the codes of
    their elements G groups at a time. The input is read from memory once (the second read
    hits the cache), the scalars never leave it."""
    IT: tl.constexpr = tl.int64 if IDX64 else tl.int32  # the index type
    nq, size, nbytes = nq.to(IT), size.to(IT), nbytes.to(IT)
    wide = scalars(x_ptr, meta_ptr, inv_ptr, sel_ptr, inv_ptr, nq, size, span, nb, LEVELS, CLIP,
                   C, BF16, BB, CHUNK, UNROLL, False, IDX64, ALIGN, SUB)  # fmt: skip
    tl.debug_barrier()
    e0 = tl.program_id(0).to(IT) * BB * size
    e1 = tl.minimum(e0 + BB * size, nq)
    g1 = (e1 + 7) // 8
    gg = e0 // 8
    while gg < g1:
        g = gg + tl.arange(0, G)
        code_groups(x_ptr, meta_ptr, inv_ptr, sel_ptr, codes_ptr, g, g < g1, (gg + G) * 8 <= e1,
                    nq, size, nbytes, k0, k1, magic, shift, gg + G, wide, BITS, STOCH, BF16, BP,
                    True, GROUP_META, CLIP)  # fmt: skip
        gg += G
