"""The low-precision float formats of 2026 as compressors written in Python (tensor operations,
any device): FP8 (E4M3, E5M2) with an fp32 scale per block, OCP Microscaling v1.0 (MXFP8, MXFP6,
MXFP4: blocks of 32 sharing an E8M0 scale) and NVFP4 (blocks of 16 with an E4M3 scale and an
fp32 scale per payload). Elements round to nearest even, or at random (``stochastic=1``: up with
probability the remainder, from FORMAT.md's generator), saturating at the format's largest value.
The scale rules and layouts: docs/FORMAT.md ("Float formats"); for finite input the scales and
elements are torchao's (``to_mx`` in FLOOR mode, ``nvfp4_quantize``) byte for byte.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from torch_cgx.compressors import floats_native as native
from torch_cgx.compressors.blocks import pack_bits, unpack_bits
from torch_cgx.compressors.python import CompressorBase, Context, Param

__all__ = ["FP8", "MXFP4", "MXFP6", "MXFP8", "NVFP4", "Element", "ELEMENTS"]


@dataclasses.dataclass(frozen=True)
class Element:
    """An element format: exponent and mantissa bits, bias, largest finite value, and the
    exponent of its largest power of two (OCP's ``emax``)."""

    ebits: int
    mbits: int
    bias: int
    max: float
    emax: int
    special: str = ""  # "fn": the all-ones code is NaN (E4M3); "ieee": the top exponent is Inf/NaN

    @property
    def bits(self) -> int:
        return 1 + self.ebits + self.mbits

    def quantize(self, v: torch.Tensor, u: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Codes (int32: sign, exponent, mantissa) of the fp32 values ``v``: nearest even, or
        ``floor(v / q + u)`` with ``u`` in [0, 1); saturating; NaN gives the largest code."""
        sign = (v.view(torch.int32) >> 31) & 1
        a = v.abs().clamp(max=self.max).nan_to_num(self.max)
        emin = 1 - self.bias
        e = (torch.frexp(a)[1] - 1).clamp(min=emin)  # floor(log2 a), subnormals at emin
        q = torch.ldexp(torch.ones_like(a), e - self.mbits)  # the quantum: exact
        r = torch.round(a / q) if u is None else torch.floor(a / q + u)
        val = (r * q).clamp(max=self.max)
        normal = val >= 2.0**emin
        ev = (torch.frexp(val)[1] - 1).clamp(min=emin)
        field = torch.where(normal, ev + self.bias, torch.zeros_like(ev))
        mant = torch.where(normal, torch.ldexp(val, -ev) - 1, val * 2.0**-emin)
        m = torch.round(mant * 2.0**self.mbits).to(torch.int32)
        return (sign << (self.ebits + self.mbits)) | (field << self.mbits) | m

    def table(self, device) -> torch.Tensor:
        """Every code's fp32 value (the sign bit highest)."""
        codes = torch.arange(1 << self.bits, device=device, dtype=torch.int32)
        m = (codes & ((1 << self.mbits) - 1)).float()
        field = (codes >> self.mbits) & ((1 << self.ebits) - 1)
        normal = field > 0
        scale = torch.ldexp(torch.ones_like(m), torch.where(normal, field, 1) - self.bias)
        mag = torch.where(normal, 1 + m * 2.0**-self.mbits, m * 2.0**-self.mbits) * scale
        top = field == (1 << self.ebits) - 1
        if self.special == "fn":
            mag = torch.where(top & (m == (1 << self.mbits) - 1), float("nan"), mag)
        elif self.special == "ieee":
            mag = torch.where(top, torch.where(m == 0, float("inf"), float("nan")), mag)
        return torch.where((codes >> (self.bits - 1)) == 1, -mag, mag)


ELEMENTS = {
    "e4m3": Element(4, 3, 7, 448.0, 8, "fn"),
    "e5m2": Element(5, 2, 15, 57344.0, 15, "ieee"),
    "e3m2": Element(3, 2, 3, 28.0, 4),
    "e2m3": Element(2, 3, 1, 7.5, 2),
    "e2m1": Element(2, 1, 1, 6.0, 2),
}
_STOCHASTIC = Param(0, 0, 1, integer=True, help="1: stochastic rounding (unbiased)")


def _blocks(x: torch.Tensor, size: int) -> torch.Tensor:
    """``x`` as (blocks, size), the tail block zero-padded."""
    n = x.numel()
    full = -(-n // size) * size
    if full == n:
        return x.view(-1, size)
    return torch.cat([x, x.new_zeros(full - n)]).view(-1, size)


def _draws(c: CompressorBase, ctx: Context, n: int, device) -> Optional[torch.Tensor]:
    return ctx.uniform_first(n, device) if c.p["stochastic"] else None


def _elements_bound(x: torch.Tensor, scale: torch.Tensor, e: Element) -> float:
    """L2 bound of the elements' rounding at per-value ``scale``: a quantum below the smallest
    normal, one relative quantum above it (nearest or stochastic), and any saturation."""
    a, s = x.double().abs(), scale.double()
    err = s * 2.0 ** (1 - e.bias - e.mbits) + a * 2.0**-e.mbits + (a - e.max * s).clamp(min=0)
    return float(err.norm()) * (1 + 1e-6) + 1e-30


class _MX(CompressorBase):
    """OCP MX: blocks of 32, an E8M0 scale each (FLOOR: the exponent of the block's largest
    magnitude less the element's emax), then the elements."""

    block = 32
    names = ("e4m3",)
    params = {"stochastic": _STOCHASTIC}

    @property
    def element(self) -> Element:
        return ELEMENTS[self.names[int(self.p.get("element", 0))]]

    def body_size(self, numel: int) -> int:
        return -(-numel // self.block) + (numel * self.element.bits + 7) // 8

    @property
    def biased(self) -> bool:  # nearest rounding; stochastic rounding is unbiased
        return not self.p["stochastic"]

    def _scales(self, x: torch.Tensor):
        amax = _blocks(x, self.block).abs().amax(1)
        exp = ((amax.view(torch.int32) >> 23) & 0xFF) - 127 - self.element.emax
        biased = torch.where(amax.isfinite(), exp.clamp(-127, 128) + 127, 255)
        if self.p["stochastic"]:  # one more where FLOOR's would saturate: no clamp, no bias
            over = (amax / self._scale_values(biased) > self.element.max) & (biased < 254)
            biased = biased + over.to(biased.dtype)
        return biased, self._scale_values(biased)

    @staticmethod
    def _scale_values(biased: torch.Tensor) -> torch.Tensor:
        value = (biased.to(torch.int32) << 23).view(torch.float32).clamp(min=2.0**-126)
        return torch.where(biased == 255, float("nan"), value)

    def encode(self, x: torch.Tensor, ctx: Context) -> torch.Tensor:
        if native.usable(self, x.device):
            return native.encode(self, x, ctx)
        return self.reference_encode(x, ctx)

    def reference_encode(self, x: torch.Tensor, ctx: Context) -> torch.Tensor:
        biased, scale = self._scales(x)
        v = (_blocks(x, self.block) / scale.view(-1, 1)).view(-1)[: x.numel()]
        codes = self.element.quantize(v, _draws(self, ctx, x.numel(), x.device))
        return torch.cat([biased.to(torch.uint8), pack_bits(codes, self.element.bits)])

    def decode(self, body: torch.Tensor, numel: int) -> torch.Tensor:
        if native.usable(self, body.device):
            return native.decode(self, body, numel)
        return self.reference_decode(body, numel)

    def decode_add_(self, acc: torch.Tensor, body: torch.Tensor) -> torch.Tensor:
        if native.usable(self, body.device) and acc.device.type == "cpu":
            return native.decode_add_(self, acc, body)
        return acc.add_(self.reference_decode(body, acc.numel()))

    def reference_decode(self, body: torch.Tensor, numel: int) -> torch.Tensor:
        blocks = -(-numel // self.block)
        scale = self._scale_values(body[:blocks].to(torch.int32))
        codes = unpack_bits(body[blocks:], numel, self.element.bits).long()
        values = _blocks(self.element.table(body.device)[codes], self.block)
        return (values * scale.view(-1, 1)).view(-1)[:numel]

    def bound(self, x: torch.Tensor) -> float:
        _, scale = self._scales(x)
        per = _blocks(torch.ones_like(x), self.block) * scale.view(-1, 1)
        return _elements_bound(x, per.view(-1)[: x.numel()], self.element)


class MXFP8(_MX):
    names = ("e4m3", "e5m2")
    params = {"element": Param(0, 0, 1, integer=True, help="0: E4M3, 1: E5M2"),
              "stochastic": _STOCHASTIC}  # fmt: skip


class MXFP6(_MX):
    names = ("e3m2", "e2m3")
    params = {"element": Param(0, 0, 1, integer=True, help="0: E3M2, 1: E2M3"),
              "stochastic": _STOCHASTIC}  # fmt: skip


class MXFP4(_MX):
    names = ("e2m1",)


class NVFP4(CompressorBase):
    """NVFP4: an fp32 scale per payload (its largest magnitude / (448 * 6); 1 for all zeros),
    blocks of 16 with an E4M3 scale each (the block's largest magnitude / 6, relative to the
    payload's scale, clamped to [2^-6, 448], rounded to nearest even), E2M1 elements."""

    block = 16
    params = {"stochastic": _STOCHASTIC}
    element = ELEMENTS["e2m1"]

    def body_size(self, numel: int) -> int:
        return 4 + -(-numel // self.block) + (numel + 1) // 2

    @property
    def biased(self) -> bool:  # nearest rounding; stochastic rounding is unbiased
        return not self.p["stochastic"]

    def _scales(self, x: torch.Tensor):
        amax = x.abs().amax() if x.numel() else x.new_zeros(())
        tensor = torch.where(amax == 0, 1.0, amax / (448.0 * 6.0))
        tensor = torch.where(amax.isfinite(), tensor, float("nan")).float()
        bmax = _blocks(x, self.block).abs().amax(1)
        e4m3 = (bmax / 6.0 / tensor).clamp(2.0**-6, 448.0).to(torch.float8_e4m3fn)
        if self.p["stochastic"]:  # the next E4M3 scale where this one would saturate
            code = e4m3.view(torch.uint8)
            over = (bmax / (e4m3.float() * tensor) > 6.0) & (code < 0x7E)
            e4m3 = (code + over.to(torch.uint8)).view(torch.float8_e4m3fn)
        return tensor, e4m3

    def encode(self, x: torch.Tensor, ctx: Context) -> torch.Tensor:
        tensor, e4m3 = self._scales(x)
        reciprocal = (1.0 / tensor) / e4m3.float()
        v = (_blocks(x, self.block) * reciprocal.view(-1, 1)).clamp(-6.0, 6.0)
        codes = self.element.quantize(v.view(-1)[: x.numel()],
                                      _draws(self, ctx, x.numel(), x.device))  # fmt: skip
        head = tensor.reshape(1).view(torch.uint8)
        return torch.cat([head, e4m3.view(torch.uint8), pack_bits(codes, 4)])

    def decode(self, body: torch.Tensor, numel: int) -> torch.Tensor:
        blocks = -(-numel // self.block)
        tensor = body[:4].view(torch.float32)
        scale = body[4 : 4 + blocks].view(torch.float8_e4m3fn).float() * tensor
        codes = unpack_bits(body[4 + blocks :], numel, 4).long()
        values = _blocks(self.element.table(body.device)[codes], self.block)
        return (values * scale.view(-1, 1)).view(-1)[:numel]

    def bound(self, x: torch.Tensor) -> float:
        tensor, e4m3 = self._scales(x)
        per = _blocks(torch.ones_like(x), self.block) * (e4m3.float() * tensor).view(-1, 1)
        return _elements_bound(x, per.view(-1)[: x.numel()], self.element)


class FP8(CompressorBase):
    """FP8 with an fp32 scale per ``block`` values (0: one per payload): the block's largest
    magnitude over the element's largest value (1 for all zeros)."""

    params = {
        "element": Param(0, 0, 1, integer=True, help="0: E4M3, 1: E5M2"),
        "block": Param(0, 0, 2**31, integer=True, help="values per scale; 0: one per payload"),
        "stochastic": _STOCHASTIC,
    }

    @property
    def element(self) -> Element:
        return ELEMENTS[("e4m3", "e5m2")[self.p["element"]]]

    @property
    def biased(self) -> bool:  # nearest rounding; stochastic rounding is unbiased
        return not self.p["stochastic"]

    def _size(self, numel: int) -> int:
        return self.p["block"] or max(numel, 1)

    def body_size(self, numel: int) -> int:
        return 4 * -(-numel // self._size(numel)) + numel

    def _scales(self, x: torch.Tensor) -> torch.Tensor:
        amax = _blocks(x, self._size(x.numel())).abs().amax(1)
        scale = torch.where(amax == 0, 1.0, amax / self.element.max).float()
        return torch.where(amax.isfinite(), scale, float("nan"))

    def encode(self, x: torch.Tensor, ctx: Context) -> torch.Tensor:
        if x.numel() == 0:
            return x.new_zeros(0, dtype=torch.uint8)
        scale = self._scales(x)
        v = (_blocks(x, self._size(x.numel())) / scale.view(-1, 1)).view(-1)[: x.numel()]
        codes = self.element.quantize(v, _draws(self, ctx, x.numel(), x.device))
        return torch.cat([scale.view(torch.uint8), codes.to(torch.uint8)])

    def decode(self, body: torch.Tensor, numel: int) -> torch.Tensor:
        if numel == 0:
            return torch.zeros(0, device=body.device)
        size = self._size(numel)
        blocks = -(-numel // size)
        scale = body[: 4 * blocks].view(torch.float32)
        values = _blocks(self.element.table(body.device)[body[4 * blocks :].long()], size)
        return (values * scale.view(-1, 1)).view(-1)[:numel]

    def bound(self, x: torch.Tensor) -> float:
        if x.numel() == 0:
            return 0.0
        size = self._size(x.numel())
        per = _blocks(torch.ones_like(x), size) * self._scales(x).view(-1, 1)
        return _elements_bound(x, per.view(-1)[: x.numel()], self.element)
