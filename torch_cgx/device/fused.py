"""The protocols of a fused implementation (torch_cgx/device/kernels.py decides when one is
used: the setting, the first-use self-check, the fallback): :class:`FusedMaxMin` and
:class:`FusedLevels`. The Triton kernels (torch_cgx/device/triton/) implement them."""

from __future__ import annotations

import torch

__all__ = ["FusedLevels", "FusedMaxMin"]


class FusedMaxMin:
    """What a fused max-min implementation provides (duck-typed; subclass for documentation).

    ``load()`` raises (OSError, RuntimeError, ...) when the kernel cannot run in this process;
    ``encode`` returns the payload of ``x`` (1-D contiguous) on ``x``'s device, and
    ``decode_add_`` adds a payload's values to ``out`` (1-D contiguous), both enqueued on the
    device's current stream. ``dtype``: the dtype the payload was encoded from, when it is not
    ``out``'s (the device engine adds 16-bit payloads into fp32 sums); the dispatch
    (codecs/fused.py) passes it only then, so it may be left out where it equals ``out``'s."""

    name = "fused maxmin"

    def applies(self, device: torch.device) -> bool:
        return False

    def supports(self, codec, dtype: torch.dtype) -> bool:
        return codec.name == "maxmin" and not codec.clip

    def load(self) -> None:
        pass

    def encode(self, codec, x: torch.Tensor, seed: int, stream: int) -> torch.Tensor:
        raise NotImplementedError

    def decode_add_(self, codec, out: torch.Tensor, payload: torch.Tensor, dtype=None):
        raise NotImplementedError


class FusedLevels(FusedMaxMin):
    """A fused implementation of the dense bucketed compressors qsgd, terngrad, onebit and
    efsignsgd and of those without bucket scalars, signsgd, signum and tbq (same protocol as
    :class:`FusedMaxMin`)."""

    name = "fused levels"

    @property
    def codecs(self):
        from torch_cgx.device.codecs import family

        return family("levels")

    def supports(self, codec, dtype: torch.dtype) -> bool:
        return codec.name in self.codecs
