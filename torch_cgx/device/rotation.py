"""The seeded block rotation of csrc/core/rotation.h in tensor operations (any device).

Every block of ``B = 2^k`` consecutive fp32 values becomes ``y = H D x / sqrt(B)`` (forward) or
``x = D H y / sqrt(B)`` (inverse): ``H`` the Walsh-Hadamard matrix in Sylvester order, applied as
``log2(B)`` butterfly passes (``a + c``, ``a - c``; the native order, so the same bits), ``D``
the random signs of block ``k``: bit ``j % 32`` of ``rng_bits(rng_key(seed, k), j / 32)`` flips
the sign of value ``j`` (an XOR of the sign bit, then one multiplication by the fp32 scale
``1 / sqrt(B)``). Bitwise equal to ``torch_cgx._C.rotate_`` on CPU tensors
(tests/test_device_rotation.py); the engine's use is :func:`rotate_full_` (csrc/algorithms/
rotated.cc: the values that fill no whole block stay as they are).

Block keys are computed on the host (numpy, one splitmix64 pair per block) and sent to the
device without blocking the host (``constants.upload``: pinned memory, non-blocking); nothing is
read back.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from torch_cgx import settings
from torch_cgx.device import constants
from torch_cgx.device.codecs.base import _M32, _fmix32

__all__ = ["MAX_BLOCK", "rotate_", "rotate_full_", "rotation_seed", "sign_bits", "valid_block"]

MIN_BLOCK, MAX_BLOCK = settings.ROTATION_BLOCKS  # the table's, csrc/core/rotation.h's
_M64 = (1 << 64) - 1


def valid_block(block: int) -> bool:
    """A power of two in the table's rotation blocks (settings.rotation_block)."""
    return settings.rotation_block(block)


def rotation_seed(group_seed: int, call: int) -> int:
    """The rotation's seed of one call, the same on every rank (csrc/algorithms/rotated.cc)."""
    return (group_seed * 1000003 + call + 1) & _M64


def _splitmix64(x: np.ndarray) -> np.ndarray:
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _block_keys(seed: int, blocks: int) -> np.ndarray:
    """``(2, blocks)`` int64: k0 (row 0) and k1 (row 1) of ``rng_key(seed, k)``, k < blocks."""
    with np.errstate(over="ignore"):
        base = _splitmix64(np.array([seed & _M64], dtype=np.uint64))
        k = _splitmix64(base ^ np.arange(blocks, dtype=np.uint64))
    return np.stack([k & np.uint64(_M32), k >> np.uint64(32)]).astype(np.int64)


def sign_bits(seed: int, blocks: int, block: int, device=None) -> torch.Tensor:
    """``(blocks, block)`` int32 tensor: 1 where ``D`` flips the value's sign."""
    device = torch.device("cpu") if device is None else torch.device(device)
    keys = constants.upload(torch.from_numpy(_block_keys(seed, blocks)), device)  # one copy
    k0, k1 = keys[0].view(-1, 1), keys[1].view(-1, 1)
    words = (block + 31) // 32
    w = torch.arange(words, dtype=torch.int64, device=device).view(1, -1)
    # rng_bits with index < 2^32: fmix32(fmix32(lo ^ k0) + (k1 ^ 0))
    h = _fmix32((_fmix32(w ^ k0) + k1) & _M32)  # (blocks, words)
    j = torch.arange(block, dtype=torch.int64, device=device)
    return ((h[:, j >> 5] >> (j & 31)) & 1).to(torch.int32)


def _hadamard(v: torch.Tensor) -> torch.Tensor:
    """The unnormalised transform of every row of the ``(blocks, B)`` fp32 tensor ``v``."""
    blocks, b = v.shape
    h = 1
    while h < b:
        pairs = v.view(blocks, b // (2 * h), 2, h)
        lo, hi = pairs[:, :, 0, :], pairs[:, :, 1, :]
        v = torch.stack([lo + hi, lo - hi], dim=2).view(blocks, b)
        h *= 2
    return v


def _signs(v: torch.Tensor, flips: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    bits = v.view(torch.int32) ^ (flips * torch.iinfo(torch.int32).min)  # the sign bit
    return bits.view(torch.float32) * scale


def rotate_(x: torch.Tensor, block: int, seed: int, forward: bool) -> torch.Tensor:
    """In place over the contiguous fp32 tensor ``x`` whose numel is a multiple of ``block``
    (a power of two in [2, 2^20]): forward ``H D x / sqrt(B)`` per block, or its inverse."""
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or not x.is_contiguous():
        what = f"{x.dtype} ({'contiguous' if x.is_contiguous() else 'not contiguous'})" if (
            isinstance(x, torch.Tensor)) else type(x).__name__  # fmt: skip
        raise ValueError(f"rotate_: x must be a contiguous float32 tensor, got {what}")
    if not valid_block(block):
        raise ValueError(f"rotation block must be a power of two in [2, {MAX_BLOCK}], got {block}")
    if not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise ValueError(f"rotation seed must be an integer in [0, 2^64), got {seed!r}")
    n = x.numel()
    if n % block:
        raise ValueError(f"rotation: {n} values are not a multiple of the block ({block})")
    if n == 0:
        return x
    v = x.view(-1, block)
    flips = sign_bits(seed, v.shape[0], block, x.device)
    scale = torch.full((), float(np.float32(1.0 / math.sqrt(block))), dtype=torch.float32,
                       device=x.device)  # fmt: skip
    if forward:
        out = _hadamard(_signs(v, flips, scale))
    else:
        out = _signs(_hadamard(v), flips, scale)
    x.view(-1, block).copy_(out)
    return x


def rotate_full_(x: torch.Tensor, block: int, seed: int, forward: bool) -> torch.Tensor:
    """The engine's rotation of a flat buffer (``with_rotation``): every whole block of the
    contiguous fp32 tensor ``x`` rotated in place, the values after the last one unchanged."""
    if not isinstance(x, torch.Tensor) or x.dim() != 1:
        raise ValueError("rotate_full_: x must be a 1-D tensor")
    full = x.numel() // block * block if valid_block(block) else x.numel()
    rotate_(x[:full], block, seed, forward)
    return x
