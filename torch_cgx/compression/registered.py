"""Any registered torch_cgx compressor as a compression object.

``CGXCompression("maxmin", bits=4, bucket_size=512)`` wraps ``torch_cgx.compressors.get`` (same
names, parameters and errors); its payload data is the compressor's own payload
(docs/FORMAT.md). float64 tensors are sent as float32 (one rounding, then the codec's error) and
come back as float64; float32, float16 and bfloat16 are encoded as they are.

Stochastic compressors (qsgd, terngrad, stochastic max-min, random-k) draw from
``(seed, stream)``: the stream counts this object's calls, so successive calls are independent;
give every peer its own ``seed`` so that their errors are too.
"""

from __future__ import annotations

import itertools
from typing import Dict, Optional, Tuple

import torch

from torch_cgx import compressors
from torch_cgx.compression.base import (
    CompressionBase,
    Payload,
    check_tensor,
    register_method,
)

__all__ = ["CGXCompression"]

_WIRE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def compressor_input(tensor, who: str) -> Tuple[torch.Tensor, torch.dtype, bool]:
    """(flat contiguous tensor the codecs accept, the original dtype, requires_grad)."""
    requires_grad = isinstance(tensor, torch.Tensor) and tensor.requires_grad
    x = check_tensor(tensor, who)
    dtype = x.dtype
    if dtype not in _WIRE_DTYPES:
        x = x.float()
    return x.contiguous().reshape(-1), dtype, requires_grad


class CGXCompression(CompressionBase):
    """The compressor ``name`` of ``torch_cgx.compressors.names()`` with ``params``.

    Error: the compressor's (max-min: FORMAT.md's bound, fp16: one rounding, ...).
    ``estimate_compression_ratio`` is exact: the payload bytes over the tensor's bytes.
    """

    def __init__(self, compressor: str = "maxmin", *, seed: int = 0, **params) -> None:
        if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**64:
            raise ValueError(f"seed must be an integer in [0, 2^64), got {seed!r}")
        self._codec = compressors.get(compressor, **params)  # unknown / bad: ValueError
        self.compressor, self.params, self.seed = compressor, dict(params), seed
        self._calls = itertools.count()

    def __repr__(self) -> str:
        args = "".join(f", {k}={v!r}" for k, v in self.params.items())
        return f"{type(self).__name__}({self.compressor!r}{args})"

    def codec_for(self, numel: int) -> compressors.Compressor:
        """The configured compressor for a tensor of ``numel`` values."""
        return self._codec

    def encode(self, x: torch.Tensor, dtype, requires_grad: bool, shape) -> Payload:
        codec = self.codec_for(x.numel())
        data = codec.encode(x, seed=self.seed, stream=next(self._calls) % 2**64)
        method = f"cgx/{codec.name}"
        return Payload(method, data, tuple(shape), dtype, requires_grad, dict(codec.parameters))

    def compress(self, tensor, info=None, allow_inplace=False) -> Payload:
        x, dtype, requires_grad = compressor_input(tensor, type(self).__name__)
        return self.encode(x, dtype, requires_grad, tensor.shape)

    def estimate_compression_ratio(self, info) -> float:
        n, dtype = info.descriptor.numel(), info.descriptor.dtype
        if n == 0:
            return 1.0
        codec_dtype = dtype if dtype in _WIRE_DTYPES else torch.float32
        size = self.codec_for(n).encoded_size(n, codec_dtype)
        return size / (n * torch.finfo(dtype).bits / 8)

    def allreduce_codec(self) -> Optional[Tuple[str, Dict[str, float]]]:
        return self.compressor, dict(self.params)


def _extract_codec(payload: Payload) -> torch.Tensor:
    name = payload.method.split("/", 1)[1]
    codec = compressors.get(name, **payload.params)
    dtype = payload.dtype if payload.dtype in _WIRE_DTYPES else torch.float32
    return codec.decode(payload.data, dtype=dtype)


register_method("cgx", _extract_codec)
