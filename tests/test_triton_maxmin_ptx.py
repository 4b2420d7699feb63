"""The Triton max-min kernels (torch_cgx/device/triton/maxmin_kernels.py) compiled for sm_90 with
the launch options of ``TritonMaxMin`` (triton's bundled ptxas: no GPU needed), and what the PTX
says about exactness that the interpreter cannot show: no fused multiply-add, no flushed
denormals, IEEE fp64 division and square root, round-to-nearest conversions. Compiled in a
subprocess without TRITON_INTERPRET (about 5 s); skipped where triton or its NVIDIA backend is
missing."""

import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

# triton is not imported here: a process decorates triton's helpers for the interpreter or the
# compiler at its first import (tests/test_triton_levels.py needs the interpreter)
_SPEC = importlib.util.find_spec("triton")
if _SPEC is None:
    pytest.skip("triton is not installed (pip install triton==3.6.0)", allow_module_level=True)
if not (pathlib.Path(_SPEC.origin).parent / "backends" / "nvidia" / "compiler.py").is_file():
    pytest.skip("triton has no NVIDIA backend here", allow_module_level=True)

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
                              BF16=True, BB=4, CHUNK=512, UNROLL=8, SUMS=False, IDX64=wide,
                              ALIGN=8))
    bits = 4 if wide else 3  # 4 bits: a group is one 32-bit store
    out["codes" + at] = ptx(K.codes_kernel, codes, dict(BITS=bits, STOCH=True, BF16=False, G=128,
                            BP=4, IDX64=wide, GROUP_META=wide))
    out["encode" + at] = ptx(K.encode_kernel, encode, dict(LEVELS=7, CLIP=True, C=4.1024,
                             BF16=False, BB=4, CHUNK=512, UNROLL=8, BITS=3, STOCH=True, G=128,
                             BP=4, IDX64=wide, ALIGN=8, GROUP_META=not wide))
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
    fma: ``enable_fp_fusion=False`` reaches the code), divisions and the square root are the
    IEEE fp64 ones, nothing flushes denormals (no .ftz), no approximate instruction."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # compiled here, whatever ~/.triton holds
    run = subprocess.run([sys.executable, "-c", PTX_SCRIPT], env=env, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    ptx = json.loads(run.stdout)
    for name, code in ptx.items():
        for bad in ("fma.", ".ftz", "div.full", "div.approx", ".approx.", "rcp.", "div.rn.f32"):
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
