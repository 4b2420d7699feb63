"""Device codecs of the sign compressors: signsgd / signum (+-1, flag bit 0 for non-finite input),
onebit (per bucket the means of the negative and of the non-negative values) and efsignsgd (per
bucket the mean magnitude). Codes: one bit per value, 1 = negative (NaN: 0). Each may run
through a fused kernel (codecs/fused.py; torch_cgx/device/triton/levels.py)."""

from __future__ import annotations

import torch

from torch_cgx.device.codecs.base import pack_bits
from torch_cgx.device.codecs.dense_common import (
    DenseCodec,
    abs_max,
    as_bytes,
    check_input,
    check_keys,
    lane_sum,
    nan_where,
    non_finite_flag,
    widen,
)
from torch_cgx.device.codecs.fused import Fusable

__all__ = ["EFSignSGD", "OneBit", "SignSGD", "Signum"]

inf = float("inf")


class _Signs(DenseCodec):
    bits = 1

    def _encode(self, x, seed, stream, shared) -> torch.Tensor:
        x = check_input(x, self.name)
        check_keys(self.name, seed=seed, stream=stream, shared=shared)
        return x

    def _select(self, payload, numel, dtype, neg: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Element i: ``neg[b]`` where its bit is 1, else ``pos[b]`` (b: its bucket)."""
        body = self.body(payload, numel, dtype)
        negative = self.codes(body, numel) == 1
        b = self.layout(numel).of_element(payload.device)
        return torch.where(negative, neg[b], pos[b])


class SignSGD(Fusable, _Signs):
    """x < 0 -> -1, else +1; NaN or Inf anywhere: flag bit 0 and the whole tensor decodes to NaN."""

    name, compressor_id, flag_mask = "signsgd", 3, 1

    def reference_encode(self, x, *, seed: int = 0, stream: int = 0, shared: int = 0):
        x = self._encode(x, seed, stream, shared)
        flags = non_finite_flag(x)
        return self.wrap(x, [pack_bits(x < 0, 1)], flags)

    def values(self, payload: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        device = payload.device
        one = torch.ones(1, device=device)
        v = self._select(payload, numel, dtype, -one, one)
        return nan_where(~self.flag_nan(payload), v)


class Signum(SignSGD):
    """signSGD's code on the caller's momentum."""

    name, compressor_id = "signum", 4


class _Bucketed(_Signs):
    def __init__(self, **params) -> None:
        super().__init__(**params)
        self.bucket_size = int(self.config["bucket_size"])

    def lane_sums(self) -> bool:
        return True  # the means: sum x, sum |x|

    def _stats(self, x: torch.Tensor):
        """Per bucket: finite, sum, sum |x| (fp64 lane sums), the (padded) fp32 grid."""
        layout = self.layout(x.numel())
        grid = layout.grid(widen(x))
        g64 = grid.double()
        return layout, grid, abs_max(grid) < inf, lane_sum(g64), lane_sum(g64.abs())


class OneBit(Fusable, _Bucketed):
    """Per bucket (mean of the negatives, mean of the non-negatives) from the fp64 sums
    (sum x -+ sum |x|) / 2; a bucket without one kind stores 0 for its mean; NaN if non-finite."""

    name, compressor_id, scalars = "onebit", 10, 2

    def reference_encode(self, x, *, seed: int = 0, stream: int = 0, shared: int = 0):
        x = self._encode(x, seed, stream, shared)
        layout, grid, finite, total, magnitude = self._stats(x)
        nneg = (grid < 0).sum(1)
        npos = layout.lengths(x.device).to(torch.int64) - nneg
        means = []
        for half, count in (((total - magnitude) / 2, nneg), ((total + magnitude) / 2, npos)):
            mean = (half / count.to(torch.float64)).to(torch.float32)
            means.append(nan_where(finite, torch.where(count > 0, mean, torch.zeros_like(mean))))
        return self.wrap(x, [as_bytes(torch.stack(means, 1)), pack_bits(x < 0, 1)])

    def values(self, payload: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        means = self.bucket_scalars(self.body(payload, numel, dtype), numel)
        return self._select(payload, numel, dtype, means[:, 0], means[:, 1])


class EFSignSGD(Fusable, _Bucketed):
    """Per bucket the scale sum |x| / length (fp64); values decode to +-scale; NaN if non-finite."""

    name, compressor_id, scalars = "efsignsgd", 11, 1

    def reference_encode(self, x, *, seed: int = 0, stream: int = 0, shared: int = 0):
        x = self._encode(x, seed, stream, shared)
        layout, _, finite, _, magnitude = self._stats(x)
        scale = nan_where(finite, (magnitude / layout.lengths(x.device)).to(torch.float32))
        return self.wrap(x, [as_bytes(scale), pack_bits(x < 0, 1)])

    def values(self, payload: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        scale = self.bucket_scalars(self.body(payload, numel, dtype), numel)[:, 0]
        return self._select(payload, numel, dtype, -scale, scale)
