"""Natural compression (Horvath et al., "Natural Compression for Distributed Deep Learning",
2019), written in Python on :class:`~torch_cgx.compressors.CompressorBase`.

Each value is rounded at random to one of the two powers of two around it, ``2^e <= |x| <
2^(e+1)``, up with probability ``|x| / 2^e - 1``: unbiased, ``|x' - x| <= |x|``. It keeps the
sign and the 8-bit exponent: 9 bits a value. Body: the ``n`` exponent bytes (0: zero, 255: not
finite, decoded as NaN), then the ``n`` sign bits (``pack_bits``). Values at or above 2^127
round down only (no overflow to infinity); subnormals round to 0 or 2^-126.
"""

from __future__ import annotations

import torch

from torch_cgx.compressors.blocks import pack_bits, unpack_bits
from torch_cgx.compressors.python import CompressorBase, Context

__all__ = ["Natural"]


class Natural(CompressorBase):
    fixed_size = True

    def body_size(self, numel: int) -> int:
        return numel + (numel + 7) // 8

    def encode(self, x: torch.Tensor, ctx: Context) -> torch.Tensor:
        bits = x.view(torch.int32)
        exponent = (bits >> 23) & 0xFF
        # up with probability |x| / 2^e - 1 = mantissa / 2^23: a 24-bit draw below twice the
        # mantissa; in integers, as a sign (-1: up), which compilers vectorize
        up = (ctx.uniform24_first(x.numel(), x.device) - ((bits & 0x7FFFFF) << 1)) >> 31
        can = ((exponent + 2) >> 8) - 1  # -1 below 254; 0 at 254 and 255 (not finite): stays
        rounded = exponent - (up & can)
        # through float32: inductor's CPU code converts float32 to uint8 in vectors, int32 not
        signs = pack_bits((bits >> 31) & 1, 1)
        return torch.cat([rounded.to(torch.float32).to(torch.uint8), signs])

    def bound(self, x: torch.Tensor) -> float:
        return float(x.double().norm())  # |x' - x| <= |x| value by value

    def decode(self, body: torch.Tensor, numel: int) -> torch.Tensor:
        exponent = body[:numel].to(torch.int32)
        sign = unpack_bits(body[numel:], numel, 1)
        nan = (exponent == 255).to(torch.int32) << 22  # a quiet NaN, not an infinity
        return ((sign << 31) | (exponent << 23) | nan).view(torch.float32)
