"""The fused-kernel dispatch of the device codecs that have a fused kernel (max-min; qsgd,
terngrad, tbq, onebit, efsignsgd, signsgd, signum): ``encode`` / ``decode_add_`` ask
``kernels.fused_for`` (torch_cgx/device/kernels.py: a kernel that passed its self-check, CUDA
tensors only) and otherwise run ``reference_encode`` / ``reference_decode_add_``, the tensor
operations. ``decode_add_(out, payload, dtype=None)`` takes the dtype the payload was encoded
from (default ``out.dtype``): the device engine decodes 16-bit payloads into fp32 sums."""

from __future__ import annotations

import torch

from torch_cgx.device.codecs.dense_common import check_input, check_keys

__all__ = ["Fusable", "SERIAL_VALUES", "serial_bucket"]

SERIAL_VALUES = 1 << 20  # a lane-summed bucket longer than this is slow on a GPU


def serial_bucket(codec, n: int, device: torch.device) -> str:
    """Why encoding ``n`` values on ``device`` with ``codec`` is slow, or "": on a GPU, a codec
    whose scalars are lane-ordered fp64 sums (FORMAT.md: one dependent chain per lane, the
    native bits) sums each bucket in one program, so a bucket above :data:`SERIAL_VALUES`
    values (``bucket_size=0``: the whole tensor) takes one program's latency-bound loop
    (efsignsgd's whole tensor, 64 MB: 0.6 GB/s on an H100)."""
    if device.type != "cuda" or n <= SERIAL_VALUES:  # no bucket is longer than the tensor
        return ""
    lane_sums = getattr(codec, "lane_sums", None)  # the dense codecs' (max-min: none)
    if lane_sums is None or not lane_sums():
        return ""
    size = codec.layout(n).width
    if size <= SERIAL_VALUES:
        return ""
    return (f"{codec.name} with bucket_size={codec.bucket_size} sums a bucket of {size} values "
            "in one GPU program (the format's fp64 lane order is serial: about 0.6 GB/s on an "
            "H100); set bucket_size (512, say) for GPU speed")  # fmt: skip


class Fusable:
    """Mixin for a device codec that defines ``reference_encode`` (and, through the next class
    of its MRO, the reference ``decode_add_``). A codec with other input rules overrides
    :meth:`fusable_input` / :meth:`fusable_decode`."""

    def fusable_input(self, x, seed: int, stream: int, shared: int) -> torch.Tensor:
        """The checked input of ``encode`` (ValueError / TypeError on bad input or keys)."""
        x = check_input(x, self.name)
        check_keys(self.name, seed=seed, stream=stream, shared=shared)
        return x

    def fusable_decode(self, out, payload, dtype=None) -> bool:
        """Whether a fused ``decode_add_`` may take (out, payload of ``dtype``), after the size
        checks that must run before any kernel; False leaves every check to the reference."""
        if not (isinstance(out, torch.Tensor) and isinstance(payload, torch.Tensor)
                and out.is_contiguous() and payload.is_contiguous()
                and payload.device == out.device):  # fmt: skip
            return False
        self.body(payload, out.numel(), out.dtype if dtype is None else dtype)  # dtype, size
        return True

    def encode(self, x, *, seed: int = 0, stream: int = 0, shared: int = 0) -> torch.Tensor:
        """The payload; through a fused kernel where one applies, else the tensor operations."""
        from torch_cgx import warn
        from torch_cgx.device import kernels

        x = self.fusable_input(x, seed, stream, shared)
        slow = serial_bucket(self, x.numel(), x.device)
        if slow:
            warn.warn_once(("serial-bucket", self.name, self.bucket_size), slow,
                           category=warn.SlowPathWarning)  # fmt: skip
        fused = kernels.fused_for(self, x.device, x.dtype)
        if fused is not None:
            return fused.encode(self, x, seed, stream)
        return self.reference_encode(x, seed=seed, stream=stream, shared=shared)

    def decode_add_(self, out: torch.Tensor, payload: torch.Tensor, dtype=None) -> torch.Tensor:
        """``out += decode(payload)`` (fp32, rounded once); ``dtype``: what the payload was
        encoded from (default ``out.dtype``; the engine adds 16-bit payloads into fp32 sums).
        Through a fused kernel where one applies: one whose self-checks passed for the payload's
        dtype and for ``out``'s (the envelope is not checked here: ``header_ok``)."""
        if self.fusable_decode(out, payload, dtype):  # out's type checked here first
            from torch_cgx.device import kernels

            dtype = out.dtype if dtype is None else dtype
            fused = kernels.fused_for(self, out.device, dtype)
            if fused is not None and dtype != out.dtype:
                fused = fused if kernels.fused_for(self, out.device, out.dtype) is fused else None
            if fused is not None:
                if dtype == out.dtype:  # the protocol's dtype is optional: given where it differs
                    fused.decode_add_(self, out.view(-1), payload)
                else:
                    fused.decode_add_(self, out.view(-1), payload, dtype=dtype)
                return out
        return self.reference_decode_add_(out, payload, dtype)

    def reference_decode_add_(self, out: torch.Tensor, payload: torch.Tensor, dtype=None):
        """The tensor operations' ``decode_add_`` (the codec's base class)."""
        return super().decode_add_(out, payload, dtype=dtype)
