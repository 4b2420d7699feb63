"""The seeded Walsh-Hadamard rotation of csrc/core/rotation.{h,cc}, in tensor operations, and
the rotation lever around an allreduce (csrc/algorithms/rotated.cc).

Forward on every block of ``B = 2^k`` values: flip the sign of value ``j`` where bit ``j % 32``
of ``rng_bits(rng_key(seed, block), j / 32)`` is set, scale by ``float(1 / sqrt(B))``, then the
unnormalised transform in ``log2 B`` butterfly passes (``lo + hi``, ``lo - hi``; h = 1, 2, 4,
...); inverse: the transform, then the signs and the scale. Every pass is the native one's fp32
operation on the same operands, so the bits are the native rotation's.
"""

from __future__ import annotations

import math
import struct
from typing import Callable, Optional

import torch

from torch_cgx.device.codecs import base

_M32 = 0xFFFFFFFF
_M64 = (1 << 64) - 1


def valid_block(block: int) -> bool:
    return 2 <= block <= 1 << 20 and block & (block - 1) == 0


def rotation_seed(group_seed: int, call: int) -> int:
    """rotated.cc: the same on every rank (the group's seed, the call's index)."""
    return (group_seed * 1000003 + call + 1) & _M64


def _keys(seed: int, blocks: int, device) -> tuple:
    """(k0, k1) of ``rng_key(seed, k)`` for every block ``k``, as int64 tensors."""
    s = base._splitmix64(seed & _M64)
    k0, k1 = [], []
    for k in range(blocks):
        v = base._splitmix64(s ^ k)
        k0.append(v & _M32)
        k1.append(v >> 32)
    return (
        torch.tensor(k0, dtype=torch.int64, device=device).view(-1, 1),
        torch.tensor(k1, dtype=torch.int64, device=device).view(-1, 1),
    )


def _sign_flips(seed: int, blocks: int, block: int, device) -> torch.Tensor:
    """(blocks, block) bool: where the sign of a value flips."""
    k0, k1 = _keys(seed, blocks, device)
    words = (block + 31) // 32
    lo = torch.arange(words, dtype=torch.int64, device=device).view(1, -1)
    h = base._fmix32((base._fmix32(lo ^ k0) + k1) & _M32)  # hi word of the index is 0
    shifts = torch.arange(32, dtype=torch.int64, device=device)
    bits = (h.unsqueeze(-1) >> shifts) & 1
    return bits.view(blocks, -1)[:, :block].bool()


def _hadamard(x: torch.Tensor, block: int) -> torch.Tensor:
    h = 1
    while h < block:
        v = x.view(-1, block // (2 * h), 2, h)
        lo, hi = v[:, :, 0, :], v[:, :, 1, :]
        x = torch.stack([lo + hi, lo - hi], dim=2).view(-1, block)
        h *= 2
    return x


def rotate_(x: torch.Tensor, block: int, seed: int, forward: bool) -> None:
    """Rotates the 1-D fp32 ``x`` (a multiple of ``block`` values) in place."""
    if not valid_block(block):
        raise ValueError(f"rotation block must be a power of two in [2, 2^20], got {block}")
    n = x.numel()
    if n % block:
        raise ValueError(f"rotation: {n} values are not a multiple of the block ({block})")
    if n == 0:
        return
    blocks = n // block
    scale = struct.unpack("f", struct.pack("f", 1.0 / math.sqrt(block)))[0]  # float(1/sqrt(B))
    flips = _sign_flips(seed, blocks, block, x.device)
    factor = torch.where(flips, -scale, scale).to(torch.float32)
    v = x.view(blocks, block)
    if forward:
        v = _hadamard(v * factor, block)
    else:
        v = _hadamard(v, block) * factor
    x.copy_(v.view(-1))


def with_rotation(
    data: torch.Tensor,
    block: int,
    seed: int,
    residual: Optional[torch.Tensor],
    reduce: Callable[[torch.Tensor, Optional[torch.Tensor]], None],
) -> None:
    """Rotates every full block of the fp32 ``data``, runs ``reduce(data, residual)``, and
    rotates data and residual back (the tail that fills no block stays as it is)."""
    full = data.numel() // block * block
    rotate_(data[:full], block, seed, True)
    reduce(data, residual)
    rotate_(data[:full], block, seed, False)
    if residual is not None:
        rotate_(residual[:full], block, seed, False)
