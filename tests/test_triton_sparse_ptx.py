"""The Triton kernels of TritonSparse (torch_cgx/device/triton/sparse_kernels.py) compiled for
sm_90 (triton's bundled LLVM, ptxas and cuobjdump: no GPU needed): every kernel compiles (the
interpreter runs none of the compiler's checks), full tiles load and store vectors, the
in-chunk position and sparseloco's chunk of a kept value 32-bit in the int32 variants, the
levels an IEEE division. Compiled in a subprocess without
TRITON_INTERPRET (about 5 s); skipped where triton or its
NVIDIA backend is missing."""

import pytest
from triton_testing import compiled, require_triton_backend

require_triton_backend()

SCRIPT = r"""
import importlib, json, sys, torch
from benchmarks.triton_ptx import SPARSE, compile_cuda, count
from torch_cgx.device.triton.sparse import _options
out = {}
for name, (module, kernel, sig, consts) in SPARSE.items():
    fn = getattr(importlib.import_module("torch_cgx.device.triton." + module), kernel)
    ptx, cubin = compile_cuda(fn, sig, consts, _options(torch.device("cuda")))  # a launch's
    out[name] = dict(count(ptx, cubin), ptx=ptx)
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
