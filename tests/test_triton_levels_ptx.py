"""The Triton kernels of TritonLevels (torch_cgx/device/triton/levels_kernels.py) compiled for
sm_90 with TritonLevels' launch options (triton's bundled LLVM and ptxas: no GPU needed), and what
the PTX says about the exactness the interpreter cannot show: no fused multiply-add, nothing
flushes denormals, no approximate division, IEEE fp64 division and square root, C's negation (a
sign flip, not Triton's 0 - v), the non-finite flag as one atomic OR, bf16 by integer arithmetic.
Every kind compiles (the interpreter does not run the compiler's checks). Compiled in a
subprocess without TRITON_INTERPRET (about 5 s); skipped where triton or its NVIDIA backend is
missing."""

import re

import pytest
from triton_testing import compiled, contractions, require_triton_backend

require_triton_backend()

# kinds: 0 qsgd, 1 terngrad, 2 onebit, 3 efsignsgd, 4 signsgd / signum, 5 tbq
SCRIPT = r"""
import json, sys, torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from torch_cgx.device.triton import levels_kernels as K
from torch_cgx.device.triton.levels import TritonLevels

options = TritonLevels._options(torch.device("cuda"))  # what a CUDA launch passes
def ptx(fn, sig, consts, wide=False, warps=4):
    # IDX64: the int32 index variant (GPUs' default) unless ``wide``; arguments fn lacks are
    # dropped: an older copy of the module compiles too. Pointers 16-byte aligned, as a launch
    # from a fresh tensor specialises them, but for the code stream's (32 + 4 s nb bytes in)
    consts = {k: v for k, v in dict(consts, IDX64=wide).items() if k in fn.arg_names}
    sig = {k: v for k, v in sig.items() if k in fn.arg_names}
    sig = dict(sig, **{k: "constexpr" for k in consts})
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a, t in sig.items()
             if t.startswith("*") and a != "codes_ptr"}
    src = ASTSource(fn, sig, constexprs=consts, attrs=attrs)
    opts = dict(options, num_warps=warps)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts).asm["ptx"]
out = {}
for kind in range(4):
    x = "*i16" if kind == 1 else "*fp16"  # bf16 travels as int16
    sig = {"x_ptr": x, "pay_ptr": "*u8", "scal_ptr": "*i32", "n": "i64", "size": "i32",
           "nb": "i64"}
    out[f"scalars{kind}"] = ptx(K.scalars_kernel, sig, dict(KIND=kind, CLIP=True,
                                BF16=kind == 1, BB=4, UNROLL=8))
for kind, bits, levels in [(0, 3, 3), (1, 2, 1), (2, 1, 1), (3, 1, 1), (4, 1, 1), (5, 2, 1)]:
    meta = dict(KIND=kind, BITS=bits, LEVELS=levels, NEG=levels + 1 if kind == 0 else 1)
    sig = {"x_ptr": "*fp32", "pay_ptr": "*u8", "scal_ptr": "*i32", "codes_ptr": "*u8",
           "flag_ptr": "*i32", "n": "i32", "size": "i32", "nbytes": "i32", "k0": "i32",
           "k1": "i64", "magic": "i64", "shift": "i32"}
    codes = dict(meta, BF16=False, G=128, BP=1 << (bits - 1).bit_length())
    out[f"codes{kind}"] = ptx(K.codes_kernel, sig, codes)
    if kind == 0:  # the int64 variant, for tensors past 2^31 indices
        out["codes0_64"] = ptx(K.codes_kernel, sig, codes, wide=True)
    sig = {"pay_ptr": "*u8", "out_ptr": "*fp16", "n": "i32", "size": "i32", "codes_at": "i32",
           "magic": "i64", "shift": "i32"}
    out[f"decode{kind}"] = ptx(K.decode_kernel, sig, dict(meta, BF16=False, BLOCK=1024))
    if kind == 2:
        out["decode2_64"] = ptx(K.decode_kernel, sig, dict(meta, BF16=False, BLOCK=1024),
                                wide=True)
sig = {"pay_ptr": "*u8", "out_ptr": "*i16", "n": "i64", "size": "i64", "codes_at": "i64",
       "magic": "i64", "shift": "i32"}
out["decode_bf16"] = ptx(K.decode_kernel, sig, dict(KIND=0, BITS=8, LEVELS=127, NEG=128,
                         BF16=True, BLOCK=1024))
# the vector paths: the sums of 16 buckets per program (one warp: the host's plan), fp16 codes,
# decode from a 4-aligned payload (WORDS), the one-launch encode
sig = {"x_ptr": "*fp32", "pay_ptr": "*u8", "scal_ptr": "*i32", "n": "i32", "size": "i32",
       "nb": "i32"}
out["scalars0_bb16"] = ptx(K.scalars_kernel, sig, dict(KIND=0, CLIP=False, BF16=False, BB=16,
                           UNROLL=8, ALIGN=8), warps=1)
sig = {"x_ptr": "*fp16", "pay_ptr": "*u8", "scal_ptr": "*i32", "codes_ptr": "*u8",
       "flag_ptr": "*i32", "n": "i32", "size": "i32", "nbytes": "i32", "k0": "i32",
       "k1": "i64", "magic": "i64", "shift": "i32"}
out["codes4_f16"] = ptx(K.codes_kernel, sig, dict(KIND=4, BITS=1, LEVELS=1, NEG=1, BF16=False,
                        G=128, BP=1))
for kind, bits, levels in [(0, 4, 7), (0, 3, 3), (2, 1, 1), (4, 1, 1)]:
    meta = dict(KIND=kind, BITS=bits, LEVELS=levels, NEG=levels + 1 if kind == 0 else 1)
    sig = {"pay_ptr": "*u8", "out_ptr": "*fp32", "n": "i32", "size": "i32", "codes_at": "i32",
           "magic": "i64", "shift": "i32"}
    out[f"decode{kind}_{bits}_words"] = ptx(K.decode_kernel, sig, dict(meta, BF16=False,
                                            BLOCK=1024, WORDS=True))
if hasattr(K, "encode_kernel"):
    for kind, bits, levels in [(0, 4, 7), (2, 1, 1)]:
        meta = dict(KIND=kind, BITS=bits, LEVELS=levels, NEG=levels + 1 if kind == 0 else 1)
        sig = {"x_ptr": "*fp32", "pay_ptr": "*u8", "scal_ptr": "*i32", "codes_ptr": "*u8",
               "n": "i32", "size": "i32", "nb": "i32", "nbytes": "i32", "k0": "i32",
               "k1": "i64", "magic": "i64", "shift": "i32"}
        bp = 1 << (bits - 1).bit_length()
        out[f"encode{kind}"] = ptx(K.encode_kernel, sig, dict(meta, CLIP=False, BF16=False,
                                   BB=16, UNROLL=8, ALIGN=8, G=32, BP=bp), warps=1)
json.dump(out, sys.stdout)
"""


@pytest.fixture(scope="module")
def ptx(tmp_path_factory):
    return compiled(tmp_path_factory.mktemp("triton-cache"), SCRIPT)


def test_no_fused_flushed_or_approximate_arithmetic(ptx):
    assert len(ptx) == 27
    for name, code in ptx.items():
        assert contractions(code) == [], name
        for bad in (".ftz", "div.full", "div.approx", ".approx.", "rcp."):
            assert bad not in code, (name, bad)


def test_the_bucket_sums_are_ieee_fp64(ptx):
    for kind in range(4):
        code = ptx[f"scalars{kind}"]
        assert "add.rn.f64" in code and "cvt.rn.f32.f64" in code, kind
    for kind in (0, 1):  # sum of squares, sqrt
        assert "mul.rn.f64" in ptx[f"scalars{kind}"] and "sqrt.rn.f64" in ptx[f"scalars{kind}"]
    for kind in (1, 2, 3):  # sigma, the means
        assert "div.rn.f64" in ptx[f"scalars{kind}"], kind


def test_the_level_rule_rounds_once_per_operation(ptx):
    for kind in (0, 1, 5):  # qsgd, terngrad, tbq: div_rn, floor
        assert "div.rn.f32" in ptx[f"codes{kind}"] and "cvt.rmi.f32.f32" in ptx[f"codes{kind}"]
    # num * a; + u as the generator's one exact fma (contractions() allows no other)
    assert "mul.rn.f32" in ptx["codes0"] and "0f33800000" in ptx["codes0"]
    assert "mul.rn.f32" in ptx["decode0"] and "div.rn.f32" in ptx["decode0"]  # s * (l / L)


def test_the_code_stream_of_two_bits_is_stored_by_groups(ptx):
    """2 bits (terngrad, tbq): a group's two bytes in one 16-bit store where the tile ends inside
    the stream, byte stores in the one that reaches its end; 1 and 3 bits byte-wise only."""
    for kind in (1, 5):
        assert "st.global.b16" in ptx[f"codes{kind}"] and "st.global.b8" in ptx[f"codes{kind}"]
    for kind in (0, 2, 3):
        assert "st.global.b16" not in ptx[f"codes{kind}"], kind


def test_negation_flag_and_conversions(ptx):
    for kind in range(6):
        atomic = "atom.global.gpu.acq_rel.or.b32" in ptx[f"codes{kind}"]
        assert atomic == (kind in (4, 5)), kind  # only signsgd / signum / tbq flag
        decode = ptx[f"decode{kind}"]
        assert "sub.rn.f32" not in decode, kind  # -v as a sign flip, never 0 - v
        assert "cvt.rn.f16.f32" in decode, kind  # one rounding to the output
    assert "bf16" not in ptx["decode_bf16"]  # rounded by integer arithmetic


def test_the_int32_variants_never_divide(ptx):
    """No integer division or remainder in the int32 index variants (a 64-bit one is a call to
    an emulation routine on NVIDIA GPUs, with a 32-bit fast path ``div.u32`` where both
    operands fit; a 32-bit one a dozen instructions): the bucket index of codes and decode is
    a multiply-high (one per element held: 8, 1024 values over 128 threads; and the tile's
    first and last elements', whose buckets tell whether it reads one scalar). The int64
    variants, for tensors past 2^31 indices, still divide."""
    division = re.compile(r"\b(?:div|rem)\.[su](?:32|64)\b")
    for name, code in ptx.items():
        if not name.endswith("_64"):
            assert not division.search(code), (name, division.findall(code)[:4])
    for name in ("codes0", "codes1", "decode0", "decode1", "decode2", "decode3"):
        assert ptx[name].count("mul.hi.u32") == 8 + 2, name  # the buckets' codecs
    assert "div.s64" in ptx["codes0_64"] and "div.s64" in ptx["decode2_64"]


def loads(code: str, what: str) -> int:
    """Global loads of ``what`` (``b8``, ``b32``, ``v4.b32`` ...), any cache modifier."""
    return len(re.findall(r"ld\.global(?:\.[a-z]+)*\." + re.escape(what) + r"\s", code))


def test_full_tiles_load_the_input_as_vectors(ptx):
    """A codes tile inside the tensor loads its input without a mask: 16-byte vector loads, a
    warp's threads on consecutive 16-byte pieces (fp32: two per thread of 8 values; fp16: one);
    the masked scalar loads remain for the tail tile. The sums of 16 buckets of a multiple of
    8 values (one warp, the host's plan for them) load each row of an unrolled iteration inside
    every bucket as one vector per thread (eight), masked scalars for the rest."""
    for kind in range(6):
        # qsgd, terngrad: a full tile inside one bucket has a path of its own (two more vectors)
        assert loads(ptx[f"codes{kind}"], "v4.b32") == (4 if kind in (0, 1) else 2), kind
        # and the buckets' scalars: per element (8), once (1), once on their own path (1)
        scalars = 8 + 1 + 1 if kind in (0, 1) else 0
        assert loads(ptx[f"codes{kind}"], "b32") == 8 + scalars, kind  # and the tail tile's
    assert loads(ptx["codes4_f16"], "v4.b32") == 1 and loads(ptx["codes4_f16"], "b16") == 8
    assert loads(ptx["scalars0_bb16"], "v4.b32") == 8
    assert loads(ptx["scalars0_bb16"], "b32") == 32


def test_decode_reads_words_and_adds_by_vectors(ptx):
    """From a 4-aligned payload (WORDS), a full block reads its codes as 32-bit words (one per
    thread for 1 and 4 bits; 3 bits: a word per value and the next where a code straddles),
    the scalars as words (no byte loads but the tail block's codes and signsgd's flag byte),
    and adds to ``out`` by 16-byte vectors (two loads, two stores per thread)."""
    cases = [("decode0_4_words", 8, 29), ("decode0_3_words", 16, 53),
             ("decode2_1_words", 8, 30), ("decode4_1_words", 9, 22)]  # fmt: skip
    for name, tail_bytes, most in cases:
        code = ptx[name]
        assert loads(code, "v4.b32") == 2 and "st.global.v4.b32" in code, name
        assert loads(code, "b8") == tail_bytes, name
        assert loads(code, "b8") + loads(code, "b32") + 2 <= most, name  # 48+ before


def test_the_one_launch_encode(ptx):
    """encode_kernel as the host launches it for 16 buckets of 512 (one warp, tiles of 32
    groups): the sums (a vector load per row of the unrolled iteration: eight), a barrier, then
    the codes, whose scalars (this program's own writes) are read through L2
    (``ld.global.cg``: per element, once, once on the one-bucket path) and whose full tiles
    load vectors (two, and two on qsgd's one-bucket path); sign codes read no scalar."""
    code = ptx["encode0"]  # qsgd: a full tile inside one bucket on a path of its own
    assert "bar.sync" in code and loads(code, "v4.b32") == 8 + 2 + 2
    assert loads(code, "b32") >= 8 and len(re.findall(r"ld\.global\.cg\.b32", code)) == 10
    between = code[code.index("st.global.b32") : code.index("ld.global.cg")]
    assert "bar.sync" in between  # the scalars' stores, a barrier, their reads
    assert "ld.global.cg" not in ptx["encode2"] and loads(ptx["encode2"], "v4.b32") == 8 + 2


def test_a_tile_in_one_bucket_reads_its_scalar_once(ptx):
    """Codes and decode branch on the tile's first and last elements' buckets: one scalar load
    where they are the same (qsgd's buckets of 512 in tiles of 1024: nearly always for larger
    buckets), a load per element otherwise (8 per thread); a full tile in one bucket has a
    path of its own (its one load)."""
    for name in ("codes0", "codes1"):
        assert loads(ptx[name], "b32") == 8 + 8 + 1 + 1, name  # the tail tile's, the scalars
    assert loads(ptx["decode0_4_words"], "b32") == 1 + 8 + 1 + 8  # a word; scalars; the tail
    assert loads(ptx["encode0"], "cg.b32") == 8 + 1 + 1
