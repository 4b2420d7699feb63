"""8-bit quantization (hivemind's ``Uniform8BitQuantization``, ``BlockwiseQuantization`` and
``Quantile8BitQuantization``) on torch_cgx's codecs.

``Uniform8BitQuantization``: the max-min codec with 8 bits and one bucket per tensor (hivemind:
one scale per tensor), or per ``bucket_size`` values. The grid spans the tensor's range, so every
value is within ``unit / 2`` of its code, ``unit = (max - min) / 255`` (plus fp32 rounding:
docs/FORMAT.md "Error bound"). hivemind's grid spans 6 standard deviations instead and clips the
values beyond (unbounded error for outliers).

``BlockwiseQuantization``: the same codec, one (min, unit) per block of ``block_size`` values
(default 4096, hivemind's block). hivemind's is bitsandbytes' dynamic (non-uniform, absmax)
8-bit code; this one is uniform within each block's range, with the same bound as above per
block, and needs no bitsandbytes.

``Quantile8BitQuantization``: no codec fits (its codebook is data-dependent), so it is written
in torch ops: 255 borders at the tensor's exact quantiles ``k / 256`` (sorted values), 8-bit codes
by ``torch.bucketize`` and a codebook of the mean of each bin's values (fp64 sums). Each value is
decoded to the mean of its bin, so its error is at most the spread (max - min) of that bin's
values; equal values share a bin. Payload data: 256 fp32 codebook entries, then one code byte per
value. Non-finite values make their bin's mean non-finite.

``estimate_compression_ratio``: 8 / bits of the dtype (hivemind's value; 0.25 for float32). The
exact size is ``payload.nbytes``.
"""

from __future__ import annotations

from typing import Optional

import torch

from torch_cgx import compressors, settings
from torch_cgx.compression.base import CompressionBase, Payload, bits_of, register_method
from torch_cgx.compression.registered import CGXCompression, compressor_input

__all__ = ["BlockwiseQuantization", "Quantile8BitQuantization", "Uniform8BitQuantization"]

_BUCKET = settings.BY_NAME["bucket_size"].check  # the table's: the max-min header's u32 size


def _check_size(name: str, value) -> None:
    if not _BUCKET.ok(value):
        raise ValueError(f"{name} {_BUCKET.text}, got {value!r}")


class Uniform8BitQuantization(CGXCompression):
    """8-bit uniform codes over the tensor's range: one bucket per tensor (``bucket_size=None``)
    or per ``bucket_size`` values. Allreduce: max-min, 8 bits, ``bucket_size`` values a bucket
    (None: the group's bucket size, as the concatenated gradients are cut per rank)."""

    def __init__(self, bucket_size: Optional[int] = None) -> None:
        if bucket_size is not None:
            _check_size("bucket_size", bucket_size)
            super().__init__("maxmin", bits=8, bucket_size=bucket_size)
        else:
            super().__init__("maxmin", bits=8)
        self.bucket_size = bucket_size
        self._per_tensor = {}

    def __repr__(self) -> str:
        size = "" if self.bucket_size is None else f"bucket_size={self.bucket_size}"
        return f"{type(self).__name__}({size})"

    def codec_for(self, numel: int) -> compressors.Compressor:
        if self.bucket_size is not None:
            return self._codec
        size = min(max(numel, 1), _BUCKET.hi)
        if size not in self._per_tensor:
            if len(self._per_tensor) > 64:
                self._per_tensor.clear()
            self._per_tensor[size] = compressors.get("maxmin", bits=8, bucket_size=size)
        return self._per_tensor[size]

    def estimate_compression_ratio(self, info) -> float:
        return 8.0 / bits_of(info.descriptor.dtype)


class BlockwiseQuantization(Uniform8BitQuantization):
    """8-bit uniform codes per block of ``block_size`` values (max-min, one bucket a block)."""

    def __init__(self, block_size: int = 4096) -> None:
        _check_size("block_size", block_size)
        super().__init__(bucket_size=block_size)
        self.block_size = block_size

    def __repr__(self) -> str:
        return f"{type(self).__name__}(block_size={self.block_size})"


_BINS = 256


class Quantile8BitQuantization(CompressionBase):
    """8-bit codes of equal-population bins (exact quantiles), decoded to each bin's mean."""

    def compress(self, tensor, info=None, allow_inplace=False) -> Payload:
        flat, dtype, requires_grad = compressor_input(tensor, type(self).__name__)
        x = flat.float()
        n = x.numel()
        if n == 0:
            codes, codebook = torch.empty(0, dtype=torch.uint8), torch.zeros(_BINS)
        else:
            # NaN sorts as +Inf, so the borders stay ordered; its bin's mean becomes NaN.
            key = torch.nan_to_num(x, nan=float("inf"), posinf=float("inf"),
                                   neginf=float("-inf"))  # fmt: skip
            ordered = torch.sort(key).values
            ranks = torch.arange(1, _BINS, dtype=torch.float64) * (n - 1) / _BINS
            borders = ordered[ranks.round().long()]
            index = torch.bucketize(key, borders)  # borders[i-1] < x <= borders[i] -> i
            sums = torch.zeros(_BINS, dtype=torch.float64).index_add_(0, index, x.double())
            counts = torch.bincount(index, minlength=_BINS).clamp_min_(1)
            codebook = (sums / counts).float()
            codes = index.to(torch.uint8)
        data = torch.cat([codebook.view(torch.uint8), codes])
        return Payload("quantile8", data, tuple(tensor.shape), dtype, requires_grad)

    def estimate_compression_ratio(self, info) -> float:
        return 8.0 / bits_of(info.descriptor.dtype)


def _extract_quantile(payload: Payload) -> torch.Tensor:
    n = 1
    for s in payload.shape:
        n *= s
    if payload.data.numel() != 4 * _BINS + n:
        raise ValueError(
            f"quantile8 payload of {payload.data.numel()} bytes, expected {4 * _BINS + n}"
        )
    codebook = payload.data[: 4 * _BINS].clone().view(torch.float32)
    return codebook[payload.data[4 * _BINS :].long()]


register_method("quantile8", _extract_quantile)
