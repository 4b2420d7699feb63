"""Every Triton kernel compiled for an AMD MI300 (gfx942) with the options a ROCm launch passes
(triton's bundled LLVM and AMDGPU linker: no ROCm, no GPU), and what the LLVM IR and the
assembly say about the exactness the interpreter cannot show: IEEE fp32 (``denormal-fp-math-f32``
"ieee": nothing flushes), no fast-math flag on any operation, no multiply-add but the
generator's exact one (rng.py), correctly rounded divisions (``fdiv`` lowered with
``v_div_fixup``), NaN-propagating min / max in max-min's scalars, and the one-launch encodes'
barrier a workgroup release / acquire fence pair (the program's global writes visible to its
threads). Nothing here runs on an AMD GPU (none is lent): docs/gpu.md says what only one can
show. Compiled in a subprocess without TRITON_INTERPRET; skipped where triton or its AMD backend
is missing."""

import re

import pytest
from triton_testing import compiled, require_triton_backend

require_triton_backend("amd")

SCRIPT = r"""
import importlib, json, sys, torch
from benchmarks.triton_ptx import MM, SPARSE, compile_gfx942, level_kernels
from torch_cgx.device.triton import levels_kernels, maxmin_kernels
from torch_cgx.device.triton.levels import TritonLevels
from torch_cgx.device.triton.maxmin import TritonMaxMin

rocm = torch.device("cuda")  # the options of a launch on a ROCm build's "cuda" device
plans = [(maxmin_kernels, MM, TritonMaxMin._options(rocm, 4)),
         (levels_kernels, level_kernels(), TritonLevels._options(rocm))]
out = {}
for module, table, options in plans:
    for name, (kernel, sig, consts) in table.items():
        fn, c = getattr(module, kernel), dict(consts, IDX64=False)
        opts = dict(options, num_warps=c.pop("num_warps", options.get("num_warps", 4)))
        out[name] = compile_gfx942(fn, sig, c, opts)
for name, (module, kernel, sig, consts) in SPARSE.items():
    fn = getattr(importlib.import_module("torch_cgx.device.triton." + module), kernel)
    out[name] = compile_gfx942(fn, sig, consts, TritonLevels._options(rocm))
# the scalars kernel as TritonMaxMin plans it for 64 MB of fp32, buckets of 1024 (4 a program),
# on 32- and 64-lane warps
from torch_cgx.device import codecs
from torch_cgx.device.triton import maxmin as M
codec, impl, nq = codecs.get("maxmin", bits=4, bucket_size=1024), TritonMaxMin(), 1 << 24
kernel, sig, consts = MM["scalars"]
planned = {}
for width in (32, 64):
    M.lanes = lambda device: width
    plan = impl.launch(codec, rocm)
    meta = M.TritonMaxMin._scalars_plan(codec, nq, nq // 1024, plan, rocm, 4)["meta"]
    c = dict(consts, **{k: v for k, v in meta.items() if k in consts}, IDX64=False)
    llir, asm = compile_gfx942(maxmin_kernels.scalars_kernel, sig, c,
                               TritonMaxMin._options(rocm, plan["num_warps"]))
    planned[width] = [llir, asm, meta["BB"], meta["SUB"]]
# the level codecs' scalars kernel as TritonLevels plans it (qsgd, buckets of 512), compiled for
# 64 lanes with its plan for 32 and 64 lanes
from torch_cgx.device.triton import levels as L
qsgd = codecs.get("qsgd", bits=4, bucket_size=512)
kernel, sig, consts = level_kernels()["scalars qsgd"]
for width in (32, 64):
    L.lanes = lambda device: width
    sp = TritonLevels()._scalars_plan(qsgd, qsgd.layout(nq), rocm)
    c = dict(consts, BB=sp["bb"], UNROLL=sp["unroll"], ALIGN=sp["align"], IDX64=False)
    c.pop("num_warps")
    llir, asm = compile_gfx942(levels_kernels.scalars_kernel, sig, c,
                               dict(TritonLevels._options(rocm), num_warps=sp["warps"]))
    planned["levels%d" % width] = [llir, asm, sp["bb"], sp["warps"]]
json.dump({"kernels": out, "planned": planned}, sys.stdout)
"""
FAST_MATH = re.compile(r"\b(?:fadd|fsub|fmul|fdiv|frem|fneg|fcmp|call|select|phi)\s+(?:[a-z]+\s+)*?"
                       r"(?:nnan|ninf|nsz|arcp|contract|afn|reassoc|fast)\b")  # fmt: skip
FMA = re.compile(r"call [^@\n]*@llvm\.(?:fma|fmuladd)\.[^(]*\([^)]*\)")
# the generator's: r (a 24-bit integer in fp32) x 2^-24 + t, exact product, one rounding
EXACT_FMA = re.compile(r"call float @llvm\.fma\.f32\(float %[\w.]+, float 0x3E70000000000000, "
                       r"float %[\w.]+\)")  # fmt: skip
# approximate intrinsics (the fast-math flags, ``afn`` among them, are FAST_MATH's)
APPROXIMATE = ("llvm.amdgcn.rcp", "llvm.amdgcn.rsq", "llvm.amdgcn.fdiv.fast", "__ocml_native")


@pytest.fixture(scope="module")
def compiled_amd(tmp_path_factory):
    return compiled(tmp_path_factory.mktemp("triton-cache"), SCRIPT)


@pytest.fixture(scope="module")
def amd(compiled_amd):
    """name -> (LLVM IR, assembly) of every kernel."""
    return compiled_amd["kernels"]


def test_every_kernel_compiles_for_gfx942(amd):
    from benchmarks.triton_ptx import MM, SPARSE, level_kernels

    assert set(amd) == set(MM) | set(level_kernels()) | set(SPARSE)
    for name, (llir, asm) in amd.items():
        assert "amdgpu_kernel" in llir and "s_endpgm" in asm, name


def test_ieee_arithmetic_and_no_contraction(amd):
    for name, (llir, _) in amd.items():
        assert '"denormal-fp-math-f32"="ieee"' in llir, name
        assert FAST_MATH.search(llir) is None, (name, FAST_MATH.search(llir))
        assert [f for f in FMA.findall(llir) if not EXACT_FMA.fullmatch(f)] == [], name
        for bad in APPROXIMATE:
            assert bad not in llir, (name, bad)
    for name in ("codes", "encode", "codes qsgd", "codes terngrad"):  # stochastic rounding
        assert EXACT_FMA.search(amd[name][0]), name


def test_no_contraction_in_the_assembly(amd):
    """AMDGPU contracts a multiply and an add at instruction selection, which the IR does not
    show (with ``enable_fp_fusion`` on, max-min's decode gets 10 and its codes 16 where they
    have 0 and 8). Kernels without a division or a square root (whose correctly rounded
    expansions use fma) have at most the generator's fmas: one per ``llvm.fma`` call."""
    plain = [name for name, (llir, _) in amd.items()
             if "fdiv " not in llir and "llvm.sqrt" not in llir]  # fmt: skip
    assert {"decode", "codes", "decode terngrad", "mask"} <= set(plain)
    for name in plain:
        llir, asm = amd[name]
        found = len(re.findall(r"\bv_(?:pk_)?(?:fma|fmac|mad|mac)_(?:f|legacy|mix)\w*", asm))
        assert found <= len(EXACT_FMA.findall(llir)), (name, found)


def test_divisions_are_correctly_rounded(amd):
    """fp64 for max-min's scalars (FORMAT.md), fp32 ``div_rn`` for the level rule: LLVM's
    ``fdiv`` without flags, which the AMDGPU backend expands to the correctly rounded sequence
    ending in ``v_div_fixup``."""
    for name, kind in (("scalars", "double"), ("codes qsgd", "float"), ("codes tbq", "float"),
                       ("loco_codes", "float")):  # fmt: skip
        llir, asm = amd[name]
        assert f"fdiv {kind}" in llir, name
        assert ("v_div_fixup_f64" if kind == "double" else "v_div_fixup_f32") in asm, name


def test_maxmin_min_max_propagate_nan(amd):
    """The scalars' accumulators take a NaN and keep it (a non-finite bucket is found after
    the loop): ``propagate_nan=ALL`` lowers to ``minnum`` / ``maxnum`` (which drop a NaN) with
    an unordered compare and select. Without it the kernels have no such compare (tried); the
    trees after the loop need none (a non-finite bucket's min and max are never used)."""
    for name in ("scalars", "encode"):
        llir = amd[name][0]
        calls = len(re.findall(r"@llvm\.(?:minnum|maxnum)\.f32\(", llir))
        lanes = sum(int(w or 1) for w in re.findall(r"fcmp uno (?:<(\d+) x )?float", llir))
        assert 0 < lanes <= calls, (name, lanes, calls)


def test_the_one_launch_encode_fences_its_barrier(amd):
    """The scalars written by the program's threads are read back by others after
    ``tl.debug_barrier``: a workgroup-scope release fence before ``s_barrier``, an acquire
    fence after (the AMDGPU memory model then makes the writes visible)."""
    for name in ("encode", "encode qsgd"):
        llir = amd[name][0]
        pair = re.search(r'fence syncscope\("workgroup"\) release[^\n]*\n[^\n]*'
                         r'@llvm\.amdgcn\.s\.barrier\(\)[^\n]*\n[^\n]*'
                         r'fence syncscope\("workgroup"\) acquire', llir)  # fmt: skip
        assert pair is not None, name


def test_the_scalars_rows_fit_the_warp_width(compiled_amd):
    """The scalars loop's (BB, SUB) tiles take a warp's row of 16 bytes of fp32 a thread: SUB
    from the device's warp width (``triton.lanes``), 256 on a 64-lane MI300, so its loads are
    ``<4 x float>`` (``global_load_dwordx4``); planned for 32 lanes, as on NVIDIA, a program of
    4 buckets of 1024 loads 8 bytes a thread there."""
    llir32, _, bb32, sub32 = compiled_amd["planned"]["32"]
    llir64, asm64, bb64, sub64 = compiled_amd["planned"]["64"]
    assert (bb32, sub32, bb64, sub64) == (4, 128, 4, 256)
    assert "load <4 x float>" in llir64 and "global_load_dwordx4" in asm64
    assert "load <4 x float>" not in llir32 and "load <2 x float>" in llir32


def test_the_level_scalars_rows_fit_the_warp_width(compiled_amd):
    """The level codecs' scalars tile (bb, 8) at four values a thread: 32 buckets a warp on a
    64-lane MI300, ``<4 x float>`` loads (``global_load_dwordx4``); their plan for 32 lanes (16
    buckets a warp, as on NVIDIA) would load 8 bytes a thread there."""
    llir32, _, bb32, warps32 = compiled_amd["planned"]["levels32"]
    llir64, asm64, bb64, warps64 = compiled_amd["planned"]["levels64"]
    assert (bb32, warps32, bb64, warps64) == (16, 1, 32, 1)
    assert "load <4 x float>" in llir64 and "global_load_dwordx4" in asm64
    assert "load <4 x float>" not in llir32 and "load <2 x float>" in llir32
