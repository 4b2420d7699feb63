"""The rotation lever around any allreduce (csrc/algorithms/rotated.cc), over the seeded
Walsh-Hadamard rotation of :mod:`torch_cgx.device.rotation` (bitwise the native one): every full
block of the fp32 buffer rotated with the call's seed, reduced, and rotated back, the residual
too; the tail that fills no block stays as it is."""

from __future__ import annotations

from typing import Callable, Optional

import torch

from torch_cgx.device.rotation import rotate_full_, rotation_seed, valid_block

__all__ = ["rotation_seed", "valid_block", "with_rotation"]


def with_rotation(
    data: torch.Tensor,
    block: int,
    seed: int,
    residual: Optional[torch.Tensor],
    reduce: Callable[[torch.Tensor, Optional[torch.Tensor]], None],
) -> None:
    """Rotates the 1-D contiguous fp32 ``data``, runs ``reduce(data, residual)``, and rotates
    data and residual back (the residual is then in the caller's domain)."""
    rotate_full_(data, block, seed, True)
    reduce(data, residual)
    rotate_full_(data, block, seed, False)
    if residual is not None:
        rotate_full_(residual, block, seed, False)
