"""Static counts of the Triton kernels' compiled code for sm_90 (docs/gpu.md), no GPU
needed (triton's bundled ptxas and cuobjdump):

    python -m benchmarks.triton_ptx [--kernels DIR] [--json PATH] [--arch N]

For each kernel of max-min (scalars, codes, the one-launch encode, decode) and of the level and
sign codecs (scalars, codes and decode per kind), in its int32 and int64 index variant (``IDX64``),
the PTX's integer divisions and remainders (``div`` / ``rem``, 64- and 32-bit: a 64-bit one is a
call to an emulation routine on NVIDIA GPUs), its multiply-highs and 64-bit multiplies, its global
loads (scalar, vector) and stores (bytes; 16 bits or more; vector), and the SASS instruction and
call counts, registers a thread and stack bytes (spills). Pointers are compiled as 16-byte aligned
(as a launch from a fresh tensor specialises them), the code stream's as unaligned. A count, not a
time: the speed needs a GPU (``python -m benchmarks.triton_sweep``). ``--kernels DIR``: compile
``maxmin_kernels.py`` and ``levels_kernels.py`` from DIR instead (an older copy, say ``git show
REV:PATH``); arguments a kernel lacks are dropped, and a kernel without ``IDX64`` is compiled once
("-"). ``--arch N``: for sm_N instead (80: an A100, 100: a B200, 120: a GeForce RTX 50).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Dict, List

PTX_OPS = {
    "div64": r"(?:div|rem)\.[su]64",
    "div32": r"(?:div|rem)\.[su]32",
    "mulhi": r"mul\.hi\.",
    "mul64": r"mul\.lo\.[su]64",
    "ld": r"ld\.global(?:\.(?!v[248]\.)[a-z0-9]+)*\.(?:b|u|s|f)(?:8|16|32|64)\b",  # a scalar load
    "ldv": r"ld\.global(?:\.[a-z0-9]+)*\.v[248]\.",  # a vector load (2, 4 or 8 values)
    "st8": r"st\.global(?:\.[a-z]+)*\.b8\b",  # a byte store (the code stream's byte-wise path)
    "st16+": r"st\.global(?:\.[a-z0-9]+)*\.b(?:16|32|64)\b",  # a 16- to 64-bit store (or vector)
    "stv": r"st\.global(?:\.[a-z0-9]+)*\.v[248]\.",  # a vector store
}


UNALIGNED = {"codes_ptr"}


def ints(names: str, **more) -> dict:
    """Integer arguments as a launch types them: i32 below 2^31 (the sizes), i64 above (the
    divisor's multiplier, 2^31 or more for most sizes)."""
    return dict({name: "i32" for name in names.split()}, magic="i64", **more)


MM_PTRS = dict(x_ptr="*fp32", meta_ptr="*i32", inv_ptr="*fp64", sel_ptr="*fp32")
# the default bucket size (512) of an fp32 tensor: buckets 16-byte aligned (ALIGN), a group of
# eight never across two buckets (GROUP_META), a fresh payload 8-aligned (decode's WORD)
MM_SCALARS = dict(
    LEVELS=15, CLIP=False, C=2.0, BF16=False, BB=4, CHUNK=512, UNROLL=8, ALIGN=4, SUB=128
)
MM = {  # name -> (kernel, signature, constexprs)
    "scalars": ("scalars_kernel", dict(MM_PTRS, sums_ptr="*fp64", **ints("nq size span nb")),
                dict(MM_SCALARS, SUMS=False)),
    "codes": ("codes_kernel", dict(MM_PTRS, codes_ptr="*u8", **ints("nq size nbytes k0 k1 shift")),
              dict(BITS=4, STOCH=True, BF16=False, G=128, BP=4, GROUP_META=True, CLIP=False)),
    "encode": ("encode_kernel",
               dict(MM_PTRS, codes_ptr="*u8", **ints("nq size span nb nbytes k0 k1 shift")),
               dict(MM_SCALARS, BITS=4, STOCH=True, G=128, BP=4, GROUP_META=True)),
    "decode": ("decode_kernel",
               dict(pay_ptr="*u8", out_ptr="*fp32", **ints("n nq size codes_at tail_at shift")),
               dict(BITS=4, TAIL_BYTES=0, TAIL_BF16=False, ADD=True, OUT_BF16=False,
                    BLOCK=1024, WORD=8, GROUP_META=True)),
}  # fmt: skip
LEVEL_KINDS = [("qsgd", 0, 4, 7), ("terngrad", 1, 2, 1), ("onebit", 2, 1, 1),
               ("efsignsgd", 3, 1, 1), ("signsgd", 4, 1, 1), ("tbq", 5, 2, 1)]  # fmt: skip


def level_kernels() -> Dict[str, tuple]:
    out = {}
    for name, kind, bits, levels in LEVEL_KINDS:
        meta = dict(KIND=kind, BITS=bits, LEVELS=levels, NEG=levels + 1 if kind == 0 else 1)
        if kind < 4:
            sig = dict(x_ptr="*fp32", pay_ptr="*u8", scal_ptr="*i32", **ints("n size nb"))
            # the host's launch for 512-value buckets: 16 buckets on one warp (vector rows)
            out[f"scalars {name}"] = ("scalars_kernel", sig, dict(KIND=kind, CLIP=False,
                                      BF16=False, BB=16, UNROLL=8, ALIGN=8,
                                      num_warps=1))  # fmt: skip
            sig = dict(x_ptr="*fp32", pay_ptr="*u8", scal_ptr="*i32", codes_ptr="*u8",
                       **ints("n size nb nbytes k0 k1 shift"))  # fmt: skip
            out[f"encode {name}"] = ("encode_kernel", sig, dict(meta, CLIP=False, BF16=False,
                                     BB=16, UNROLL=8, ALIGN=8, G=32, num_warps=1,
                                     BP=1 << (bits - 1).bit_length()))  # fmt: skip
        ptrs = dict(x_ptr="*fp32", pay_ptr="*u8", scal_ptr="*i32", codes_ptr="*u8")
        sig = dict(ptrs, flag_ptr="*i32", **ints("n size nbytes k0 k1 shift"))
        bp = 1 << (bits - 1).bit_length()
        out[f"codes {name}"] = ("codes_kernel", sig, dict(meta, BF16=False, G=128, BP=bp))
        sig = dict(pay_ptr="*u8", out_ptr="*fp32", **ints("n size codes_at shift"))
        out[f"decode {name}"] = ("decode_kernel", sig, dict(meta, BF16=False, BLOCK=1024,
                                 WORDS=True))  # fmt: skip
    return out


L = "*i64"  # the sparse kernels' index and key arrays
SPARSE = {  # name -> (module under torch_cgx.device.triton, kernel, signature, constexprs)
    "keys_rows32": ("sparse_kernels", "keys_kernel", dict(x_ptr="*i16", idx_ptr=L, keys_ptr=L,
                    n="i32", row="i32"), dict(KIND=2, HAS_INDEX=False, ROWS=True, BLOCK=1024,
                    WIDE=False)),
    "mask": ("sparse_kernels", "mask_kernel", dict(x_ptr="*i16", thr_ptr="*i32", out_ptr="*i8",
             n="i32", tau="i32"), dict(KIND=1, FROM_PTR=True, BLOCK=1024)),
    "jump": ("sparse_kernels", "jump_kernel", dict(taken_in="*i8", ptr_in=L, taken_out="*i8",
             ptr_out=L, r_ptr=L, picks_ptr=L, count="i32", base="i32"),
             dict(LAST=False, BLOCK=1024)),
    "pack": ("sparse_kernels", "pack_kernel", dict(head_ptr="*u8", idx_ptr=L, x_ptr="*i32",
             out_ptr="*u8", count="i32", val_off="i32"), dict(INDEX=True, ES=4, BLOCK=1024)),
    "loco_codes": ("sparse_loco_kernels", "loco_codes_kernel", dict(x_ptr="*i32", idx_ptr=L,
                   out_ptr="*u8", kept="i32", chunk="i32", full="i32", k_full="i32",
                   codes_at="i32", nbytes="i32"), dict(KIND=0, BITS=2, LEVELS=1, G=128,
                   WIDE=False)),
}  # fmt: skip


def load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compile_for(target, fn, sig: dict, consts: dict, options: dict):
    """``fn`` compiled by triton for ``target`` (a ``GPUTarget``; no GPU needed); arguments
    ``fn`` does not take are dropped."""
    import triton
    from triton.compiler import ASTSource

    names = set(fn.arg_names)
    consts = {k: v for k, v in consts.items() if k in names}
    sig = {k: v for k, v in sig.items() if k in names}
    sig.update({k: "constexpr" for k in consts})
    # pointers 16-byte aligned, as a launch from a fresh torch tensor specialises them, but for
    # the code stream's (at 24 + 8 nb bytes into the payload: 8-aligned only)
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a, t in sig.items()
             if t.startswith("*") and a not in UNALIGNED}  # fmt: skip
    src = ASTSource(fn, sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=target, options=options)


def compile_cuda(fn, sig: dict, consts: dict, options: dict, arch: int = 90) -> tuple:
    """(PTX, cubin) of ``fn`` for sm_``arch`` (90: an H100 / H200; 80 an A100, 100 a B200)."""
    from triton.backends.compiler import GPUTarget

    k = compile_for(GPUTarget("cuda", arch, 32), fn, sig, consts, options)
    return k.asm["ptx"], k.asm["cubin"]


def compile_gfx942(fn, sig: dict, consts: dict, options: dict) -> tuple:
    """(LLVM IR, AMDGCN assembly) of ``fn`` for gfx942 (an MI300; triton's bundled LLVM and
    linker, no ROCm needed), with the options a ROCm launch passes."""
    from triton.backends.compiler import GPUTarget

    options = {k: v for k, v in options.items() if k != "enable_reflect_ftz"}  # NVIDIA's
    k = compile_for(GPUTarget("hip", "gfx942", 64), fn, sig, consts, options)
    return k.asm["llir"], k.asm["amdgcn"]


def sass_counts(cubin: bytes) -> dict:
    """SASS instructions and calls, and the compiler's resource report: registers a thread and
    stack bytes (spills; METHOD.md's first look: occupancy falls as registers rise)."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
        res = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    ins = [line for line in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", line)]
    regs, stack = re.search(r"REG:(\d+)", res), re.search(r"STACK:(\d+)", res)
    return {"sass": len(ins), "calls": sum(" CALL." in line for line in ins),
            "regs": int(regs.group(1)) if regs else None,
            "stack": int(stack.group(1)) if stack else None}  # fmt: skip


def count(ptx: str, cubin: bytes) -> dict:
    out = {key: len(re.findall(pat, ptx)) for key, pat in PTX_OPS.items()}
    out.update(sass_counts(cubin))
    return out


def rows(kernels_dir: str | None, arch: int = 90) -> List[dict]:
    import torch

    from torch_cgx.device.triton.levels import TritonLevels
    from torch_cgx.device.triton.maxmin import TritonMaxMin

    if kernels_dir:
        mm = load(os.path.join(kernels_dir, "maxmin_kernels.py"), "maxmin_kernels_copy")
        lv = load(os.path.join(kernels_dir, "levels_kernels.py"), "levels_kernels_copy")
    else:
        from torch_cgx.device.triton import levels_kernels as lv
        from torch_cgx.device.triton import maxmin_kernels as mm
    cuda = torch.device("cuda")
    plans = [("maxmin", mm, MM, TritonMaxMin._options(cuda, 4)),
             ("levels", lv, level_kernels(), TritonLevels._options(cuda))]  # fmt: skip
    out = []
    for family, module, table, options in plans:
        for name, (kernel, sig, consts) in table.items():
            fn = getattr(module, kernel, None)
            if fn is None:  # an older copy (without the one-launch encode, say)
                continue
            variants = (False, True) if "IDX64" in fn.arg_names else (None,)
            for wide in variants:
                c = dict(consts) if wide is None else dict(consts, IDX64=wide)
                row = {"family": family, "kernel": name, "index": {None: "-", False: "int32",
                       True: "int64"}[wide]}  # fmt: skip
                opts = dict(options, num_warps=c.pop("num_warps", options.get("num_warps", 4)))
                row.update(count(*compile_cuda(fn, dict(sig), c, opts, arch)))
                out.append(row)
    return out


def table(found: List[dict]) -> str:
    cols = ["family", "kernel", "index", *PTX_OPS, "sass", "calls", "regs", "stack"]
    lines = ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in found]
    return "\n".join(lines)


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", help="a folder with maxmin_kernels.py and levels_kernels.py")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--arch", type=int, default=90, help="compile for sm_ARCH (default 90)")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("triton_ptx: compiles; unset TRITON_INTERPRET", file=sys.stderr)
        return 2
    found = rows(args.kernels, args.arch)
    print(table(found))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(found, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
