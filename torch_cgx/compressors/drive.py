"""DRIVE (Vargaftik et al., "DRIVE: One-bit Distributed Mean Estimation", NeurIPS 2021), written
in Python on :class:`~torch_cgx.compressors.CompressorBase`.

The values, zero-padded to whole blocks of ``block`` (a power of two), are rotated per block by
the seeded randomized Hadamard transform ``R = H D / sqrt(B)`` of FORMAT.md's rotation (seed:
the ``seed`` parameter, the same for encoder and decoder), and each block is sent as the signs
of ``R x`` and one fp32 scale ``S = |x|^2 / |R x|_1``: 1 bit a value plus 32 a block. Decoding
rotates ``S sign(R x)`` back. Biased (use error feedback); per block ``|x' - x|^2 = |x|^2 (B
|x|^2 / |R x|_1^2 - 1) <= (B - 1) |x|^2``, about ``(pi/2 - 1) |x|^2`` for Gaussian-like blocks.
"""

from __future__ import annotations

import torch

from torch_cgx.compressors.blocks import pack_bits, rotate_, unpack_bits
from torch_cgx.compressors.python import CompressorBase, Context, Param

__all__ = ["Drive"]


class Drive(CompressorBase):
    params = {
        "block": Param(1024, 2, 1 << 20, integer=True, help="rotation block (a power of two)"),
        "seed": Param(0, 0, 2**53, integer=True, help="the rotation's seed"),
    }
    biased, fixed_size = True, True

    def __init__(self, **given) -> None:
        super().__init__(**given)
        if self.p["block"] & (self.p["block"] - 1):
            raise ValueError(f"{self.name} parameter block must be a power of two, "
                             f"got {self.p['block']}")  # fmt: skip

    def _blocks(self, numel: int) -> int:
        return -(-numel // self.p["block"])

    def body_size(self, numel: int) -> int:
        blocks = self._blocks(numel)
        return 4 * blocks + blocks * self.p["block"] // 8

    def bound(self, x: torch.Tensor) -> float:
        return float(x.double().norm()) * (self.p["block"] - 1) ** 0.5 * (1 + 1e-5)

    def encode(self, x: torch.Tensor, ctx: Context) -> torch.Tensor:
        block, blocks = self.p["block"], self._blocks(x.numel())
        v = torch.zeros(blocks * block, dtype=torch.float32, device=x.device)
        v[: x.numel()] = x
        norms = v.view(blocks, block).square().sum(1)
        rotate_(v, block, self.p["seed"], forward=True)
        l1 = v.view(blocks, block).abs().sum(1)
        scale = torch.where(l1 > 0, norms / l1, torch.zeros_like(l1))
        signs = pack_bits((v < 0).to(torch.int32), 1)
        return torch.cat([scale.view(torch.uint8), signs])

    def decode(self, body: torch.Tensor, numel: int) -> torch.Tensor:
        block, blocks = self.p["block"], self._blocks(numel)
        scale = body[: 4 * blocks].view(torch.float32)
        negative = unpack_bits(body[4 * blocks :], blocks * block, 1).view(blocks, block)
        v = (scale.view(-1, 1) * (1 - 2 * negative).to(torch.float32)).reshape(-1)
        return rotate_(v.contiguous(), block, self.p["seed"], forward=False)[:numel]
