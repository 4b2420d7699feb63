"""The block rotation in tensor operations (torch_cgx/device/rotation.py) against the native one
(torch_cgx._C.rotate_, csrc/core/rotation.cc): the same bits, forward and inverse."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from codec_testing import rng

from torch_cgx import _C
from torch_cgx.device import rotation

BLOCKS = [2, 4, 8, 16, 32, 64, 128, 512, 1024, 4096, 1 << 15]
SEEDS = [0, 1, 123456789, 2**63 + 5, 2**64 - 1]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)


@pytest.mark.parametrize("block", BLOCKS)
def test_rotation_is_the_native_one_bit_for_bit(block):
    g = rng("device rotation", block)
    for seed, forward in zip(SEEDS, [True, False, True, False, True]):
        blocks = 1 + int(g.integers(4))
        x = torch.from_numpy(
            (g.standard_normal(blocks * block) * 10.0 ** g.integers(-3, 4)).astype(np.float32)
        )
        x[0], x[-1] = -0.0, float("nan")  # signs flip by XOR: NaN and -0.0 keep their bits too
        if x.numel() > 4:
            x[2], x[3] = float("inf"), 1e-41
        want, got = x.clone(), x.clone()
        _C.rotate_(want, block, seed, forward)
        assert rotation.rotate_(got, block, seed, forward) is got
        assert torch.equal(_bits(got), _bits(want)), (seed, forward)


def test_inverse_undoes_forward_within_rounding_and_norm_is_kept():
    g = rng("device rotation inverse")
    x = torch.from_numpy(g.standard_normal(8 * 512).astype(np.float32))
    y = rotation.rotate_(x.clone(), 512, 7, True)
    assert not torch.equal(x, y)
    # orthogonal: the norm is kept up to the fp32 roundings of log2(B) + 1 passes
    assert math.isclose(y.double().norm().item(), x.double().norm().item(), rel_tol=1e-5)
    back = rotation.rotate_(y.clone(), 512, 7, False)
    assert torch.allclose(back, x, rtol=0, atol=1e-5 * x.abs().max().item())


def test_rotate_full_leaves_the_tail_like_with_rotation():
    g = rng("device rotation full")
    x = torch.from_numpy(g.standard_normal(3 * 64 + 17).astype(np.float32))
    want = x.clone()
    _C.rotate_(want[: 3 * 64], 64, 99, True)
    got = rotation.rotate_full_(x.clone(), 64, 99, True)
    assert torch.equal(_bits(got), _bits(want))
    assert torch.equal(got[3 * 64 :], x[3 * 64 :])
    short = torch.randn(10)
    assert torch.equal(rotation.rotate_full_(short.clone(), 64, 1, True), short)
    assert rotation.rotation_seed(5, 2) == 5 * 1000003 + 3
    assert rotation.rotation_seed(2**64 - 1, 0) == (-1000003 + 1) % 2**64


def test_sign_bits_follow_the_generator():
    """Block k's signs are bit j % 32 of rng_bits(rng_key(seed, k), j / 32) (FORMAT.md's
    generator without the final >> 8: the uniform's top 24 bits)."""
    from torch_cgx.device.codecs.base import uniform

    flips = rotation.sign_bits(11, 3, 64)
    for k in range(3):
        u = uniform(11, k, torch.arange(2))  # (h >> 8) * 2^-24 of words 0 and 1
        top = (u * 2**24).to(torch.int64)
        for word in range(2):
            got = flips[k, 32 * word + 8 : 32 * word + 32]  # bits 8..31 of the word
            want = (top[word] >> torch.arange(24)) & 1
            assert torch.equal(got.to(torch.int64), want)


def test_bad_input_raises():
    with pytest.raises(ValueError, match="multiple of the block"):
        rotation.rotate_(torch.zeros(100), 64, 1, True)
    with pytest.raises(ValueError, match="power of two"):
        rotation.rotate_(torch.zeros(96), 96, 1, True)
    with pytest.raises(ValueError, match="power of two"):
        rotation.rotate_(torch.zeros(1 << 21), 1 << 21, 1, True)
    with pytest.raises(ValueError, match="float32"):
        rotation.rotate_(torch.zeros(64, dtype=torch.float16), 64, 1, True)
    with pytest.raises(ValueError, match="not contiguous"):
        rotation.rotate_(torch.zeros(128)[::2], 64, 1, True)
    with pytest.raises(ValueError, match="seed"):
        rotation.rotate_(torch.zeros(64), 64, -1, True)
    assert rotation.rotate_(torch.zeros(0), 64, 1, True).numel() == 0


def test_cuda_rotation_is_the_native_one():
    """On a GPU: the same bits as the CPU's native rotation (every op is one IEEE fp32 add, sub,
    multiply or sign flip, which CUDA rounds the same way)."""
    from test_device_maxmin import cuda_or_skip

    cuda = cuda_or_skip()
    g = rng("device rotation cuda")
    for block, forward in zip([2, 64, 512, 1 << 16], [True, False, True, False]):
        x = torch.from_numpy(g.standard_normal(4 * block).astype(np.float32))
        want = x.clone()
        _C.rotate_(want, block, 42, forward)
        got = rotation.rotate_(x.to(cuda), block, 42, forward).cpu()
        assert torch.equal(_bits(got), _bits(want)), block
