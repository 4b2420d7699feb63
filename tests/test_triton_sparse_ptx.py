"""The Triton kernels of TritonSparse (torch_cgx/device/triton/sparse_kernels.py) compiled for
sm_90 (triton's bundled LLVM, ptxas and cuobjdump: no GPU needed): every kernel compiles (the
interpreter runs none of the compiler's checks), full tiles load and store vectors, the
in-chunk position and sparseloco's chunk of a kept value 32-bit in the int32 variants, the
levels an IEEE division. Compiled in a subprocess without
TRITON_INTERPRET (about 5 s); skipped where triton or its
NVIDIA backend is missing."""

import pytest
from triton_testing import compiled, require_nvidia_triton

require_nvidia_triton()

SCRIPT = r"""
import json, sys, torch
from benchmarks.triton_ptx import compile_sm90, count
from torch_cgx.device.triton.sparse import _options
from torch_cgx.device.triton import sparse_kernels as K
L = "*i64"
def go(fn, sig, consts):
    ptx, cubin = compile_sm90(fn, sig, consts, _options(torch.device("cuda")))  # a launch's
    return dict(count(ptx, cubin), ptx=ptx)
keys = dict(idx_ptr=L, keys_ptr=L, n="i32", row="i32")
out = {
    "keys_rows32": go(K.keys_kernel, dict(keys, x_ptr="*i16"), dict(KIND=2, HAS_INDEX=False,
                      ROWS=True, BLOCK=1024, WIDE=False)),
    "mask": go(K.mask_kernel, dict(x_ptr="*i16", thr_ptr="*i32", out_ptr="*i8", n="i32",
               tau="i32"), dict(KIND=1, FROM_PTR=True, BLOCK=1024)),
    "jump": go(K.jump_kernel, dict(taken_in="*i8", ptr_in=L, taken_out="*i8", ptr_out=L,
               r_ptr=L, picks_ptr=L, count="i32", base="i32"), dict(LAST=False, BLOCK=1024)),
    "pack": go(K.pack_kernel, dict(head_ptr="*u8", idx_ptr=L, x_ptr="*i32", out_ptr="*u8",
               count="i32", val_off="i32"), dict(INDEX=True, ES=4, BLOCK=1024)),
}
from torch_cgx.device.triton import sparse_loco_kernels as LK
out["loco_codes"] = go(LK.loco_codes_kernel, dict(x_ptr="*i32", idx_ptr=L, out_ptr="*u8",
                       kept="i32", chunk="i32", full="i32", k_full="i32", codes_at="i32",
                       nbytes="i32"), dict(KIND=0, BITS=2, LEVELS=1, G=128, WIDE=False))
json.dump(out, sys.stdout)
"""


@pytest.fixture(scope="module")
def ptx(tmp_path_factory):
    return compiled(tmp_path_factory.mktemp("triton-cache"), SCRIPT)


def test_full_tiles_move_vectors(ptx):
    """The input-sized passes (keys, mask) and the k-sized ones (jump, pack) load or store
    vectors in their unmasked full tiles (scalar accesses only in the last, masked tile)."""
    for name in ("keys_rows32", "mask", "jump"):
        assert ptx[name]["ldv"] >= 1, (name, ptx[name]["ldv"])
    for name in ("keys_rows32", "jump", "pack"):
        assert ptx[name]["stv"] >= 1, (name, ptx[name]["stv"])


def test_no_64_bit_division(ptx):
    """No 64-bit division (an emulation call): the chunk position of the int32 variant a 32-bit
    remainder. (The draws' u64 remainder ``r64 % m``, one per draw, is the format's: not
    compiled here.)"""
    for name in ("keys_rows32", "mask", "jump", "pack", "loco_codes"):
        assert ptx[name]["div64"] == 0, name
    assert ptx["keys_rows32"]["div32"] >= 1 and ptx["loco_codes"]["div32"] >= 1
    for code in (v["ptx"] for v in ptx.values()):
        assert "fma." not in code and ".ftz" not in code


def test_sparseloco_levels_round_once(ptx):
    """sparseloco's level ``floor((|v| - a) / d + 0.5)``: an IEEE division, no multiply-add."""
    code = ptx["loco_codes"]["ptx"]
    assert "div.rn.f32" in code and "cvt.rmi.f32.f32" in code and "div.approx" not in code


def test_indices_stored_as_words(ptx):
    """The payload's u32 indices and fp32 values: 32-bit stores, no byte store but the
    envelope's 32 bytes (one per thread of program 0)."""
    assert ptx["pack"]["st8"] <= 1 and ptx["pack"]["st16+"] >= 2
