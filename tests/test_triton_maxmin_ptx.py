"""The Triton max-min kernels (torch_cgx/device/triton/maxmin_kernels.py) compiled for sm_90 with
the launch options of ``TritonMaxMin`` (triton's bundled ptxas: no GPU needed), and what the PTX
says about exactness that the interpreter cannot show: no fused multiply-add, no flushed
denormals, IEEE fp64 division and square root, round-to-nearest conversions; and what the memory
accesses are (vector loads of a full tile's input with a warp's threads on consecutive 16-byte
pieces, the decoder's metadata as words). Compiled in subprocesses without TRITON_INTERPRET
(about 5 s each); skipped where triton or its NVIDIA backend is missing."""

import re

from triton_testing import compiled, contractions, require_triton_backend

require_triton_backend()

PTX_SCRIPT = r"""
import json, sys, torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from torch_cgx.device.triton import maxmin_kernels as K
from torch_cgx.device.triton.maxmin import TritonMaxMin

options = TritonMaxMin._options(torch.device("cuda"), 4)  # what a CUDA launch passes
def ptx(fn, sig, consts):
    # arguments fn lacks are dropped: an older copy of the module compiles too
    consts = {k: v for k, v in consts.items() if k in fn.arg_names}
    sig = {k: v for k, v in sig.items() if k in fn.arg_names}
    sig.update({k: "constexpr" for k in consts})
    src = ASTSource(fn, sig, constexprs=consts)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]
scalars = {"x_ptr": "*i16", "meta_ptr": "*i32", "inv_ptr": "*fp64", "sel_ptr": "*fp32",
           "sums_ptr": "*fp64", "nq": "i64", "size": "i32", "span": "i32", "nb": "i64"}
codes = {"x_ptr": "*fp16", "meta_ptr": "*i32", "inv_ptr": "*fp64", "sel_ptr": "*fp32",
         "codes_ptr": "*u8", "nq": "i64", "size": "i32", "nbytes": "i64", "k0": "i64", "k1": "i64",
         "magic": "i64", "shift": "i32"}
encode = {"x_ptr": "*fp16", "meta_ptr": "*i32", "inv_ptr": "*fp64", "sel_ptr": "*fp32",
          "codes_ptr": "*u8", "nq": "i64", "size": "i32", "span": "i32", "nb": "i64",
          "nbytes": "i64", "k0": "i64", "k1": "i64", "magic": "i64", "shift": "i32"}
decode = {"pay_ptr": "*u8", "out_ptr": "*fp16", "n": "i64", "nq": "i64", "size": "i32",
          "codes_at": "i64", "tail_at": "i64", "magic": "i64", "shift": "i32"}
out = {}
for wide in (False, True):  # the int32 index variant (GPUs' default) and the int64 one
    at = "64" if wide else ""
    out["scalars" + at] = ptx(K.scalars_kernel, scalars, dict(LEVELS=7, CLIP=True, C=4.1024,
                              BF16=True, BB=4, CHUNK=512, SUB=128, UNROLL=8, SUMS=False, IDX64=wide,
                              ALIGN=8))
    bits = 4 if wide else 3  # 4 bits: a group is one 32-bit store
    out["codes" + at] = ptx(K.codes_kernel, codes, dict(BITS=bits, STOCH=True, BF16=False, G=128,
                            BP=4, IDX64=wide, GROUP_META=wide, CLIP=wide))
    out["encode" + at] = ptx(K.encode_kernel, encode, dict(LEVELS=7, CLIP=True, C=4.1024,
                             BF16=False, BB=4, CHUNK=512, SUB=128, UNROLL=8, BITS=3, STOCH=True,
                             G=128, BP=4, IDX64=wide, ALIGN=8, GROUP_META=not wide))
    out["decode" + at] = ptx(K.decode_kernel, decode, dict(BITS=5, TAIL_BYTES=2,
                             TAIL_BF16=False, ADD=True, OUT_BF16=False, BLOCK=1024, IDX64=wide,
                             WORD=8 if wide else 4, GROUP_META=wide))
json.dump(out, sys.stdout)
"""
# an integer division or remainder: a 64-bit one is a call to an emulation routine on NVIDIA
# GPUs (with a 32-bit fast path, div.u32, where both operands fit), a 32-bit one a dozen
# instructions; the int32 variants take the bucket index by a multiply-high instead
DIVISION = re.compile(r"\b(?:div|rem)\.[su](?:32|64)\b")


def test_the_cuda_code_rounds_like_the_reference(tmp_path):
    """The kernels compiled for sm_90 (triton's bundled ptxas; no GPU needed) with the launch's
    options: every fp32 / fp64 add, sub and mul is a separate round-to-nearest instruction (no
    fma but the generator's exact one: ``enable_fp_fusion=False`` reaches the code), divisions
    and the square root are the IEEE fp64 ones, nothing flushes denormals (no .ftz), no
    approximate instruction."""
    ptx = compiled(tmp_path, PTX_SCRIPT)
    for name, code in ptx.items():
        assert contractions(code) == [], name
        for bad in (".ftz", "div.full", "div.approx", ".approx.", "rcp.", "div.rn.f32"):
            assert bad not in code, (name, bad)
        assert "mul.rn.f32" in code or name.startswith("scalars"), name
    assert "div.rn.f64" in ptx["scalars"] and "sqrt.rn.f64" in ptx["scalars"]
    assert "add.rn.f64" in ptx["scalars"] and "cvt.rn.f32.f64" in ptx["scalars"]
    assert "cvt.rn.f16.f32" in ptx["decode"] and "cvt.rmi.f32.f32" in ptx["codes"]
    # the one-launch encode: a CTA barrier between its scalars and its codes, which read the
    # scalars back through L2 (ld.global.cg), not through a possibly stale L1
    encode = ptx["encode"]
    assert "bar.sync" in encode and "ld.global.cg" in encode
    assert "div.rn.f64" in encode and "cvt.rmi.f32.f32" in encode
    # the int32 variants: no integer division anywhere, the bucket index a multiply-high (one
    # per element held: 8 in codes and decode, 1024 values over 128 threads); the int64
    # variants still divide (the path for tensors past 2^31 indices)
    for name in ("scalars", "codes", "encode", "decode"):
        assert not DIVISION.search(ptx[name]), (name, DIVISION.findall(ptx[name])[:4])
    for name in ("codes", "encode", "decode"):
        assert "mul.hi.u32" in ptx[name] and "div.s64" in ptx[name + "64"], name
    # the code stream: 4 bits as a 32-bit store per group (4 bytes, 4-aligned) besides the byte
    # stores of the tile that reaches the stream's end; 3 bits byte-wise only
    assert "st.global.b32" in ptx["codes64"] and "st.global.b8" in ptx["codes64"]
    assert "st.global.b32" not in ptx["codes"] and "st.global.b8" in ptx["codes"]


VECTOR_SCRIPT = r"""
import importlib.util, json, sys, torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from torch_cgx.device.triton.maxmin import TritonMaxMin

if len(sys.argv) > 1:  # another copy of maxmin_kernels.py (an older one: the new tests fail)
    spec = importlib.util.spec_from_file_location("maxmin_kernels_copy", sys.argv[1])
    K = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(K)
else:
    from torch_cgx.device.triton import maxmin_kernels as K
options = TritonMaxMin._options(torch.device("cuda"), 4)
def compile(fn, sig, consts):
    consts = {k: v for k, v in consts.items() if k in fn.arg_names}
    sig = {k: v for k, v in sig.items() if k in fn.arg_names}
    sig.update({k: "constexpr" for k in consts})
    # pointers 16-byte aligned, as a launch from a fresh tensor specialises them (the code
    # stream's not: 24 + 8 nb bytes into the payload)
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a, t in sig.items()
             if t.startswith("*") and a != "codes_ptr"}
    k = triton.compile(ASTSource(fn, sig, constexprs=consts, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options=options)
    return {"ptx": k.asm["ptx"], "ttgir": k.asm["ttgir"]}
def ints(names):
    return dict({n: "i32" for n in names.split()}, magic="i64")
ptrs = dict(meta_ptr="*i32", inv_ptr="*fp64", sel_ptr="*fp32")
scal = dict(LEVELS=15, CLIP=True, C=2.0, BF16=False, BB=4, CHUNK=512, SUB=128, UNROLL=8,
            IDX64=False)
codes = dict(BITS=4, STOCH=True, BF16=False, G=128, BP=4, IDX64=False, GROUP_META=True,
             CLIP=False)
out = {}
for x, align in (("fp32", 4), ("fp16", 8)):
    out["codes " + x] = compile(K.codes_kernel, dict(ptrs, x_ptr="*" + x, codes_ptr="*u8",
                                **ints("nq size nbytes k0 k1 shift")), codes)
out["scalars"] = compile(K.scalars_kernel, dict(ptrs, x_ptr="*fp32", sums_ptr="*fp64",
                         **ints("nq size span nb")), dict(scal, SUMS=False, ALIGN=4))
out["encode"] = compile(K.encode_kernel, dict(ptrs, x_ptr="*fp32", codes_ptr="*u8",
                        **ints("nq size span nb nbytes k0 k1 shift")),
                        dict(scal, **codes, ALIGN=4))  # codes' CLIP=False
for word in (8, 4, 1):  # the payload 8-aligned, 4-aligned, at an odd address
    out[f"decode {word}"] = compile(K.decode_kernel, dict(pay_ptr="*u8", out_ptr="*fp32",
        **ints("n nq size codes_at tail_at shift")), dict(BITS=4, TAIL_BYTES=0,
        TAIL_BF16=False, ADD=True, OUT_BF16=False, BLOCK=1024, IDX64=False, WORD=word,
        GROUP_META=True))
json.dump(out, sys.stdout)
"""
LOAD = r"ld\.global(?:\.(?!v[248]\.)[a-z0-9]+)*"  # before the width: scalar loads only


def loads(ptx: str, kind: str) -> int:
    """Global loads of one kind: ``v4`` / ``v2`` (vector), ``b8`` ... ``b64`` (scalar)."""
    return len(re.findall(LOAD + r"\." + kind + r"\b", ptx))


def load_layouts(ttgir: str, elem: str, warps: bool = False) -> list:
    """The layouts (sizePerThread, threadsPerWarp; ``warps``: and warpsPerCTA) of the unmasked
    ``tt.load`` of a 2-D tile of ``elem`` pointers (a load without a mask has one operand)."""
    layouts = dict(re.findall(r"^#(\w+) = #ttg\.blocked<\{(.*?)\}>", ttgir, re.M))
    found = re.findall(r"tt\.load %[\w.]+ : tensor<\d+x\d+x!tt\.ptr<" + elem + r">, #(\w+)>",
                       ttgir)  # fmt: skip
    names = "sizePerThread|threadsPerWarp" + ("|warpsPerCTA" if warps else "")
    return [re.findall(rf"(?:{names}) = (\[[\d, ]+\])", layouts[f]) for f in found]


def check_vector_accesses(found: dict) -> None:
    """What the new memory accesses must look like (fails on the kernels before them: no
    vector load or store anywhere, 72 byte loads per decode thread)."""
    ptx = {name: v["ptx"] for name, v in found.items()}
    # codes: the input of a full tile as 16-byte vector loads, a warp's threads on consecutive
    # 16-byte pieces (fp32: four values a thread, two threads a group; fp16: a group a thread);
    # the tail tile's masked scalar loads still there
    assert loads(ptx["codes fp32"], "v4") >= 2 and loads(ptx["codes fp32"], "b32") >= 8
    assert load_layouts(found["codes fp32"]["ttgir"], "f32") == [["[1, 4]", "[16, 2]"]]
    assert loads(ptx["codes fp16"], "v4") >= 1 and loads(ptx["codes fp16"], "b16") >= 8
    assert load_layouts(found["codes fp16"]["ttgir"], "f16") == [["[1, 8]", "[32, 1]"]]
    # scalars: the min / max loop's (BB, SUB) tiles as v4, a warp on 512 consecutive bytes of
    # one bucket and the four warps on four buckets (the trees after the loop: shuffles, no
    # shared memory), the clip's rows as one (BB, 8 UNROLL) tile of v2 (a warp per bucket); the
    # one-launch encode (no clip) its chunks and its codes
    assert loads(ptx["scalars"], "v2") >= 1
    for name in ("scalars", "encode"):
        assert loads(ptx[name], "v4") >= 4, name
        layouts = load_layouts(found[name]["ttgir"], "f32", warps=True)
        assert ["[1, 4]", "[1, 32]", "[4, 1]"] in layouts, name
    assert ["[1, 4]", "[16, 2]"] in load_layouts(found["encode"]["ttgir"], "f32")
    # decode: out loaded and stored as v4 in a full block; the metadata one 64-bit load per
    # group (8-aligned payload) or two 32-bit ones (4-aligned), a full block's codes one
    # 32-bit word per group (4 bits), so the only byte loads left are the tail block's (its
    # group's 4 bytes: one group a thread; 8 a thread before, one per element, and 64 for the
    # metadata); at an odd address the metadata's 8 bytes too
    for word in (8, 4, 1):
        code = ptx[f"decode {word}"]
        assert loads(code, "v4") == 2 and len(re.findall(r"st\.global\.v4\.", code)) == 2
        assert loads(code, "b8") == (4 if word > 1 else 12), (word, loads(code, "b8"))
        assert len(re.findall(r"ld\.global\.", code)) <= (24 if word > 1 else 28), word  # 80 before
    assert loads(ptx["decode 8"], "b64") == 1 and loads(ptx["decode 4"], "b64") == 0


def test_full_tiles_load_vectors_and_decode_reads_words(tmp_path):
    """The fp32 / fp16 kernels with 16-byte aligned pointers, as a launch from fresh tensors
    specialises them, and a bucket size that is a multiple of 8 (check_vector_accesses)."""
    check_vector_accesses(compiled(tmp_path, VECTOR_SCRIPT))
