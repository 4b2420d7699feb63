"""The kernels' generator (torch_cgx/device/triton/rng.py's ``group_uniform``) against docs/
FORMAT.md's, literally (tests/codec_oracle.py), under Triton's interpreter: tiles of groups whose
indices fit the kernels' int32 variant, and int64 ones at, across and far past 2^32 (a high word
that the kernels' tests, at small sizes, never reach). The kernels' own tests check the codes it
gives (the native codec's bytes); this one the per-group algebra at every index range."""

import os

import codec_oracle as oracle
import numpy as np
import pytest
import torch
from triton_testing import interpreted_kernels

rng, DEVICE, _interpreter = interpreted_kernels("rng")
G = 16


@pytest.fixture(scope="module")
def tile_kernel(_interpreter):
    """A kernel storing ``group_uniform(k0, k1, g0 + arange(G))`` (decorated while the module's
    fixture has TRITON_INTERPRET set: interpreted, like the kernels)."""
    assert os.environ.get("TRITON_INTERPRET") == "1" or DEVICE.type == "cuda"
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["g0", "k0", "k1"])  # as the kernels take them
    def kernel(out_ptr, g0, k0, k1, WIDE: tl.constexpr, G: tl.constexpr):
        if WIDE:
            g = g0.to(tl.int64) + tl.arange(0, G).to(tl.int64)
        else:
            g = g0.to(tl.int32) + tl.arange(0, G)
        r = rng.group_uniform(k0, k1, g)
        at = tl.arange(0, G)[:, None] * 8 + tl.arange(0, 8)[None, :]
        tl.store(out_ptr + at, r)

    return kernel


CASES = [(False, 0), (False, 12345), (False, 2**28 - G),  # int32: 8 g up to 2^31 - 1
         (True, 0), (True, 2**29 - G // 2),  # int64: the indices cross 2^32
         (True, 2**29 * 7 + 3), (True, 2**59 + 11)]  # fmt: skip


@pytest.mark.parametrize("wide,g0", CASES)
@pytest.mark.parametrize("seed,stream", [(0, 0), (2026, 7), (2**63 + 5, 2**40 + 1)])
def test_group_uniform_is_the_format_generator(tile_kernel, wide, g0, seed, stream):
    k0, k1 = oracle.rng_key(seed, stream)
    out = torch.empty(G * 8, dtype=torch.float32, device=DEVICE)
    tile_kernel[(1,)](out, g0, k0, k1, WIDE=wide, G=G)
    index = np.uint64(8 * g0) + np.arange(G * 8, dtype=np.uint64)
    want = oracle.uniform_array(seed, stream, index)
    got = out.cpu().numpy() * np.float32(2.0**-24)
    assert np.array_equal(got, want), np.flatnonzero(got != want)[:8]
    assert got.min() >= 0.0 and got.max() < 1.0
