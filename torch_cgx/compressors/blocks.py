"""The building blocks of compressors written in Python (the built-in device codecs' own): tensor
operations only, so the same code runs on CPU and CUDA tensors.

- :func:`pack_bits` / :func:`unpack_bits`: integer codes of ``bits`` bits as a little-endian
  bit stream (signs: ``bits=1``).
- :func:`uniform`: the shared generator of FORMAT.md (``Context.uniform`` keys it per call).
- :func:`bucket_stats`: per-bucket min, max and L2 norm of a flat tensor.
- :func:`top_k`: the indices of the ``k`` largest magnitudes (ties by index, as the native
  top-k); :func:`random_k`: ``k`` distinct indices from a key (identical on every rank).
- :func:`rotate_`: the seeded randomized Hadamard rotation per block (and its inverse).
"""

from __future__ import annotations

from typing import Tuple

import torch

from torch_cgx.device.codecs.base import pack_bits, uniform, unpack_bits
from torch_cgx.device.codecs.sparse_select import random_k, top_k
from torch_cgx.device.rotation import rotate_

__all__ = ["bucket_stats", "pack_bits", "random_k", "rotate_", "top_k", "uniform", "unpack_bits"]


def bucket_stats(x: torch.Tensor, bucket: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(min, max, L2 norm) of each bucket of ``bucket`` consecutive values of the 1-D tensor
    ``x`` (the last bucket may be shorter), in float32."""
    if not isinstance(bucket, int) or bucket < 1:
        raise ValueError(f"bucket must be an integer >= 1, got {bucket!r}")
    n = x.numel()
    full = n // bucket * bucket
    grid = x[:full].float().view(-1, bucket)
    lo, hi, norm = grid.amin(1), grid.amax(1), grid.square().sum(1).sqrt()
    if full < n:
        tail = x[full:].float()
        lo = torch.cat([lo, tail.amin().view(1)])
        hi = torch.cat([hi, tail.amax().view(1)])
        norm = torch.cat([norm, tail.square().sum().sqrt().view(1)])
    return lo, hi, norm
