"""16-bit floating point compression (hivemind's ``Float16Compression`` and
``ScaledFloat16Compression``) on torch_cgx's fp16 codec.

``Float16Compression``: finite values are clamped to the fp16 range [-65504, 65504], then
rounded to nearest even (the ``fp16`` codec). Error per value: at most ``|x| * 2^-11`` for
``|x| >= 2^-14``, at most ``2^-25`` below (fp16 subnormals), plus the clamp beyond 65504.
Unlike hivemind's clamp, +-Inf and NaN stay non-finite (an overflow stays visible, e.g. to AMP's
GradScaler). Ratio: 16 / bits of the dtype (0.5 for float32).

``ScaledFloat16Compression``: along the last axis, ``m = mean``, ``s = max(std, fp32 eps)``
(std with ``1/n``), then ``(x - m) / s`` in fp16 and ``m``, ``s`` in fp32; decoded as
``fp16 * s + m``. Error per value about ``|x - m| * 2^-11 + s * 2^-25`` (docs/compression.md),
so small values far from zero keep their relative precision. No allreduce form (the ranks'
scales differ): not usable as a DDP policy choice.
"""

from __future__ import annotations

import torch

from torch_cgx import compressors
from torch_cgx.compression.base import CompressionBase, Payload, bits_of, register_method
from torch_cgx.compression.registered import CGXCompression, compressor_input

__all__ = ["Float16Compression", "ScaledFloat16Compression"]

FP16_MAX = torch.finfo(torch.float16).max
FP32_EPS = torch.finfo(torch.float32).eps


def clamp_finite(x: torch.Tensor, limit: float) -> torch.Tensor:
    """Finite values clamped to [-limit, limit]; +-Inf and NaN kept."""
    return torch.where(torch.isfinite(x), x.clamp(-limit, limit), x)


class Float16Compression(CGXCompression):
    """float16 values (clamped to its range). Allreduce: the ``fp16`` compressor."""

    def __init__(self) -> None:
        super().__init__("fp16")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def compress(self, tensor, info=None, allow_inplace=False) -> Payload:
        x, dtype, requires_grad = compressor_input(tensor, type(self).__name__)
        if x.dtype != torch.float16:
            x = clamp_finite(x.float(), FP16_MAX)
        return self.encode(x, dtype, requires_grad, tensor.shape)

    def estimate_compression_ratio(self, info) -> float:
        return 16.0 / bits_of(info.descriptor.dtype)


class ScaledFloat16Compression(Float16Compression):
    """Mean/std-normalised float16 along the last axis, with fp32 means and stds."""

    def compress(self, tensor, info=None, allow_inplace=False) -> Payload:
        flat, dtype, requires_grad = compressor_input(tensor, type(self).__name__)
        shape = tuple(tensor.shape)
        last = shape[-1] if shape else 1
        rows = flat.numel() // last if last else 0
        x = flat.float().reshape(rows, last)
        if last:
            means = x.mean(dim=1, keepdim=True)
            centered = x - means
            stds = (centered.norm(dim=1, keepdim=True) / last**0.5).clamp_min_(FP32_EPS)
            scaled = clamp_finite(centered / stds, FP16_MAX)
        else:
            means, stds, scaled = torch.zeros(rows, 1), torch.ones(rows, 1), x
        codes = self._codec.encode(scaled.reshape(-1))
        stats = torch.cat([means.reshape(-1), stds.reshape(-1)]).view(torch.uint8)
        data = torch.cat([codes, stats])
        return Payload("meanstd16", data, shape, dtype, requires_grad, {"rows": rows})

    def allreduce_codec(self):
        return CompressionBase.allreduce_codec(self)  # none: the ranks' scales differ


def _extract_meanstd(payload: Payload) -> torch.Tensor:
    rows = int(payload.params["rows"])
    n = 1
    for s in payload.shape:
        n *= s
    size = compressors.get("fp16").encoded_size(n)
    scaled = compressors.get("fp16").decode(payload.data[:size])
    if payload.data.numel() != size + 8 * rows:
        raise ValueError(
            f"meanstd16 payload of {payload.data.numel()} bytes, expected {size + 8 * rows}"
        )
    stats = payload.data[size:].clone().view(torch.float32)
    means, stds = stats[:rows].reshape(rows, 1), stats[rows:].reshape(rows, 1)
    last = n // rows if rows else 0
    return (scaled.reshape(rows, last) * stds + means).reshape(-1)


register_method("meanstd16", _extract_meanstd)
