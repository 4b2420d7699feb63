"""Device codecs of the level quantizers (prim::Levels' rule): terngrad and qsgd (stochastic, the
max-min generator keyed by (seed, stream, element index)) and tbq (a fixed threshold).

The rule, in fp32 and in this order: ``a = min(|x|, clip)`` (NaN: clip), ``f = floor(num * a / den
+ u)``, ``l = min(f, levels)``, code ``l + (x < 0 and l > 0 ? neg : 0)``. Code 3 of the 2-bit
formats decodes to NaN and makes ``header_ok`` False (the native decoder raises instead).

Each may run through a fused kernel (torch_cgx/device/triton/levels.py) where one applies and
passed its self-check (torch_cgx/device/kernels.py: CUDA tensors); the tensor operations here are
the reference, and the path of CPU tensors (but for Triton's interpreter in ``fused`` mode).
"""

from __future__ import annotations

import torch

from torch_cgx.device.codecs.base import pack_bits, uniform
from torch_cgx.device.codecs.dense_common import (
    ENVELOPE_BYTES,
    DenseCodec,
    abs_max,
    as_bytes,
    check_input,
    check_keys,
    f32_bits,
    lane_sum,
    nan_where,
    non_finite_flag,
    to_f32,
    widen,
)
from torch_cgx.device.codecs.fused import Fusable

__all__ = ["QSGD", "TBQ", "TernGrad"]


def level_codes(v, num: float, den, clip, levels: int, neg: int, u=None) -> torch.Tensor:
    """prim::Levels' codes (int32) of the fp32 values ``v``; ``den`` / ``clip``: per element fp32
    tensors or floats; ``u``: the uniforms, or None (0)."""
    a = v.abs()
    a = torch.where(a < clip, a, clip)
    if num != 1.0:
        a = torch.full_like(a, num) * a
    f = a / den
    if u is not None:
        f = f + u
    f = torch.floor(f)
    lvl = torch.where(f < levels, f, torch.full_like(f, float(levels)))
    code = lvl.to(torch.int32)
    return code + torch.where((v < 0) & (lvl > 0), neg, 0).to(torch.int32)


class _Levels(DenseCodec):
    ternary = False  # 2-bit codes where 3 is invalid

    def _prepare(self, x, seed, stream, shared):
        x = check_input(x, self.name)
        check_keys(self.name, seed=seed, stream=stream, shared=shared)
        return x, widen(x)

    def _codes(self, v, scale, ok, seed, stream, num, clip, levels, neg) -> torch.Tensor:
        """Codes of every bucket with ``ok`` (zeros elsewhere), ``den`` = the bucket's scale."""
        layout = self.layout(v.numel())
        b = layout.of_element(v.device)
        u = uniform(seed, stream, torch.arange(v.numel(), device=v.device))
        den = scale[b]
        code = level_codes(v, num, den, den if clip is None else clip, levels, neg, u)
        return torch.where(ok[b], code, torch.zeros_like(code))

    def codes_ok(self, body: torch.Tensor, numel: int) -> torch.Tensor:
        return (
            (self.codes(body, numel) != 3).all() if self.ternary else super().codes_ok(body, numel)
        )


class TernGrad(Fusable, _Levels):
    """Per bucket s = max |x| (with clip = c > 0: min(max |x|, c * sqrt(mean x^2)), values clipped
    to s); codes 0 -> 0, 1 -> +s, 2 -> -s (3 invalid)."""

    name, compressor_id, scalars, bits, ternary = "terngrad", 12, 1, 2, True

    def __init__(self, **params) -> None:
        super().__init__(**params)
        self.bucket_size = int(self.config["bucket_size"])
        self.clip = to_f32(self.config["clip"])
        self.param1 = f32_bits(self.clip)

    def lane_sums(self) -> bool:
        return self.clip > 0  # sigma: sum x^2 (max |x| is order-free)

    def reference_encode(self, x, *, seed: int = 0, stream: int = 0, shared: int = 0):
        x, v = self._prepare(x, seed, stream, shared)
        layout = self.layout(v.numel())
        grid = layout.grid(v)
        s = abs_max(grid)
        finite = s < float("inf")
        if self.clip > 0:
            g64 = grid.double()
            sigma = torch.sqrt(lane_sum(g64 * g64) / layout.lengths(v.device))
            s = torch.minimum(s, (self.clip * sigma).to(torch.float32))
        s = nan_where(finite, s)
        ok = torch.isfinite(s) & (s > 0)
        codes = self._codes(v, s, ok, seed, stream, 1.0, None, 1, 1)
        return self.wrap(x, [as_bytes(s), pack_bits(codes, 2)])

    def values(self, payload: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        body = self.body(payload, numel, dtype)
        s = self.bucket_scalars(body, numel)[:, 0]
        zero = nan_where(~torch.isnan(s), torch.zeros_like(s))
        table = torch.stack([zero, s, -s, torch.full_like(s, float("nan"))], 1)  # 3: NaN
        b = self.layout(numel).of_element(payload.device)
        return table[b, self.codes(body, numel).to(torch.int64)]


class QSGD(Fusable, _Levels):
    """Per bucket the l2 norm; code: sign bit (top) and level l of 2^(bits-1) - 1, value
    norm * l / levels."""

    name, compressor_id, scalars = "qsgd", 13, 1

    def __init__(self, **params) -> None:
        super().__init__(**params)
        self.bucket_size = int(self.config["bucket_size"])
        self.bits = self.param1 = int(self.config["bits"])
        self.levels = (1 << (self.bits - 1)) - 1

    def lane_sums(self) -> bool:
        return True  # the norm: sum x^2

    def reference_encode(self, x, *, seed: int = 0, stream: int = 0, shared: int = 0):
        x, v = self._prepare(x, seed, stream, shared)
        layout = self.layout(v.numel())
        grid = layout.grid(v)
        g64 = grid.double()
        norm = nan_where(abs_max(grid) < float("inf"), torch.sqrt(lane_sum(g64 * g64)).float())
        ok = torch.isfinite(norm) & (norm > 0)
        inf = float("inf")
        codes = self._codes(
            v, norm, ok, seed, stream, float(self.levels), inf, self.levels, self.levels + 1
        )
        return self.wrap(x, [as_bytes(norm), pack_bits(codes, self.bits)])

    def values(self, payload: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        body = self.body(payload, numel, dtype)
        norm = self.bucket_scalars(body, numel)[:, 0]
        code = self.codes(body, numel)
        sign = self.levels + 1
        ratio = (code & self.levels).float() / torch.full(
            (1,), float(self.levels), device=code.device
        )
        mag = norm[self.layout(numel).of_element(payload.device)] * ratio
        return torch.where((code & sign) != 0, -mag, mag)


class TBQ(Fusable, _Levels):
    """|x| / tau >= 1 (fp32) -> +-tau by the sign, else 0; NaN or Inf anywhere: flag bit 0 and
    the whole tensor decodes to NaN. Decodes with the tau of the payload's header (as native)."""

    name, compressor_id, bits, flag_mask, ternary = "tbq", 14, 2, 1, True

    def __init__(self, **params) -> None:
        super().__init__(**params)
        self.tau = to_f32(self.config["tau"])
        self.param1 = f32_bits(self.tau)

    def reference_encode(self, x, *, seed: int = 0, stream: int = 0, shared: int = 0):
        x, v = self._prepare(x, seed, stream, shared)
        tau = torch.full((1,), self.tau, device=v.device)
        codes = level_codes(v, 1.0, tau, float("inf"), 1, 1)
        flags = non_finite_flag(v)
        return self.wrap(x, [pack_bits(codes, 2)], flags)

    def values(self, payload: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        body = self.body(payload, numel, dtype)
        tau = payload[ENVELOPE_BYTES - 4 : ENVELOPE_BYTES].clone().view(torch.float32)
        nan = torch.full_like(tau, float("nan"))
        table = torch.cat([torch.zeros_like(tau), tau, -tau, nan])
        table = torch.where(self.flag_nan(payload), nan, table)
        return table[self.codes(body, numel).to(torch.int64)]
