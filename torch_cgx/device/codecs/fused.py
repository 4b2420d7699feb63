"""The fused-kernel dispatch of the dense codecs (qsgd, terngrad, tbq, onebit, efsignsgd, signsgd,
signum):
``encode`` / ``decode_add_`` ask ``kernels.fused_for`` (torch_cgx/device/kernels.py: a kernel
that passed its self-check, CUDA tensors only) and otherwise run ``reference_encode`` /
``reference_decode_add_``, the tensor operations, as max-min's codec does."""

from __future__ import annotations

import torch

from torch_cgx.device.codecs.dense_common import DenseCodec, check_input, check_keys

__all__ = ["Fusable"]


class Fusable:
    """Mixin for a :class:`DenseCodec` that defines ``reference_encode``."""

    def encode(self, x, *, seed: int = 0, stream: int = 0, shared: int = 0) -> torch.Tensor:
        """The payload; through a fused kernel where one applies, else the tensor operations."""
        from torch_cgx.device import kernels

        x = check_input(x, self.name)
        check_keys(self.name, seed=seed, stream=stream, shared=shared)
        fused = kernels.fused_for(self, x.device, x.dtype)
        if fused is not None:
            return fused.encode(self, x, seed, stream)
        return self.reference_encode(x, seed=seed, stream=stream, shared=shared)

    def decode_add_(self, out: torch.Tensor, payload: torch.Tensor) -> torch.Tensor:
        """``out += decode(payload)`` (fp32, rounded once); through a fused kernel where one
        applies (the envelope is not checked here: ``header_ok``)."""
        if (isinstance(out, torch.Tensor) and isinstance(payload, torch.Tensor)
                and out.is_contiguous() and payload.is_contiguous()
                and payload.device == out.device):  # fmt: skip
            from torch_cgx.device import kernels

            self.body(payload, out.numel(), out.dtype)  # dtype and size checks
            fused = kernels.fused_for(self, out.device, out.dtype)
            if fused is not None:
                fused.decode_add_(self, out.view(-1), payload)
                return out
        return self.reference_decode_add_(out, payload)

    def reference_decode_add_(self, out: torch.Tensor, payload: torch.Tensor) -> torch.Tensor:
        return DenseCodec.decode_add_(self, out, payload)
