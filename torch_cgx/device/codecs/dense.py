"""Device codecs of the dense compressors (docs/FORMAT.md "Compressor payloads"): fp16 and bf16
here, the sign family in signs.py, the level quantizers in levels.py. ``CODECS`` maps every name
to its class (the registry in ``torch_cgx.device.codecs`` imports this module for all of them).

On CPU tensors every encode gives the native codec's bytes and every decode its values, bit for
bit (tests/test_device_dense.py); on a GPU the same operations run, and the fp64 bucket sums are
the one place where the order of additions may differ (docs/gpu-codecs.md).
"""

from __future__ import annotations

import torch

from torch_cgx.device.codecs.dense_common import (
    DenseCodec,
    as_bytes,
    check_dtype,
    check_input,
    check_keys,
    narrow,
    widen,
)
from torch_cgx.device.codecs.levels import QSGD, TBQ, TernGrad
from torch_cgx.device.codecs.signs import EFSignSGD, OneBit, SignSGD, Signum

__all__ = ["CODECS", "BF16", "FP16"]


class _Cast(DenseCodec):
    """Every value rounded to the 16-bit ``wire`` dtype (nearest even); body: ``n`` values."""

    bits = 16
    wire = torch.float16

    def encode(self, x, *, seed: int = 0, stream: int = 0, shared: int = 0) -> torch.Tensor:
        x = check_input(x, self.name)
        check_keys(self.name, seed=seed, stream=stream, shared=shared)
        wire = x if x.dtype == self.wire else narrow(widen(x), self.wire)
        return self.wrap(x, [as_bytes(wire)])

    def _wire(self, payload: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return self.body(payload, numel, dtype).clone().view(self.wire)

    def values(self, payload: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return widen(self._wire(payload, numel, dtype))

    def decode(self, payload: torch.Tensor, numel: int, dtype=torch.float32) -> torch.Tensor:
        check_dtype(dtype, self.name)
        wire = self._wire(payload, numel, dtype)
        return wire if dtype == self.wire else narrow(widen(wire), dtype)  # same dtype: the bits

    def decode_add_(self, out: torch.Tensor, payload: torch.Tensor, dtype=None) -> torch.Tensor:
        check_dtype(out.dtype, self.name)
        v = self.values(payload, out.numel(), out.dtype if dtype is None else dtype)
        v = v.view(out.shape)
        if out.dtype == torch.float32:
            return out.add_(v)
        return out.copy_(narrow(v + widen(out), out.dtype))  # prim::convert's order: value + out


class FP16(_Cast):
    name, compressor_id, wire = "fp16", 1, torch.float16


class BF16(_Cast):
    name, compressor_id, wire = "bf16", 2, torch.bfloat16


CODECS = {
    "fp16": FP16,
    "bf16": BF16,
    "signsgd": SignSGD,
    "signum": Signum,
    "onebit": OneBit,
    "efsignsgd": EFSignSGD,
    "terngrad": TernGrad,
    "qsgd": QSGD,
    "tbq": TBQ,
}
