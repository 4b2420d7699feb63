"""The hierarchical (node-aware) allreduce over node transports (csrc/algorithms/hierarchical.cc,
the path without shared memory): exact inside a node, compressed across nodes.

- leaders (``intra_broadcast``, CGX's default): the node sum (fp32) to local rank 0, which runs
  the compressed allreduce over the leaders and broadcasts the result in its node;
- slices: local rank ``l`` owns slice ``l`` of the buffer padded to ``L * per`` (``per`` a
  multiple of the compressor's alignment), an exact reduce-scatter inside the node, the
  compressed allreduce over the ranks of local rank ``l`` on every node, an allgather back.

The result is divided by the whole group's size for AVG (the cross-node call sums). Residual:
what this rank's cross-node compression left out, zero elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from torch_cgx.device.algorithms.common import divide_


@dataclass
class Hierarchy:
    """A rank's node layout: ``intra`` (the node's GroupTransport), ``cross`` (its cross-node
    GroupTransport: the leaders, or the ranks of its local rank; None on a non-leader with
    ``intra_broadcast``), its local rank and the node's size."""

    intra: object
    cross: Optional[object]
    local_rank: int
    local_size: int
    intra_broadcast: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.local_rank < self.local_size:
            raise ValueError(
                f"hierarchical: local rank {self.local_rank} outside a node of {self.local_size}"
            )
        if self.cross is None and not (self.intra_broadcast and self.local_rank != 0):
            raise ValueError("hierarchical: this rank needs a cross-node transport")
        if self.intra.size != self.local_size or self.intra.rank != self.local_rank:
            raise ValueError(
                "hierarchical: the node transport's rank / size differ from the layout's"
            )


Cross = Callable[[object, torch.Tensor, Optional[torch.Tensor]], None]


def hierarchical(
    h: Hierarchy,
    data: torch.Tensor,
    alignment: int,
    divisor: int,
    residual: Optional[torch.Tensor],
    cross: Cross,
) -> None:
    """Reduces the 1-D contiguous fp32 ``data`` in place over every rank of every node;
    ``cross(transport, values, residual)`` runs one compressed allreduce (summing)."""
    if h.intra_broadcast:
        _leaders(h, data, residual, cross)
    else:
        _slices(h, data, alignment, residual, cross)
    if divisor:
        divide_(data, divisor)


def _leaders(h: Hierarchy, data, residual, cross) -> None:
    h.intra.reduce_sum(data, 0)
    if h.local_rank == 0:
        cross(h.cross, data, residual)
    elif residual is not None:
        residual.zero_()
    h.intra.broadcast(data, 0)


def _slices(h: Hierarchy, data, alignment: int, residual, cross) -> None:
    n, L, a = data.numel(), h.local_size, alignment
    per = ((n + L - 1) // L + a - 1) // a * a
    padded = torch.zeros(per * L, dtype=torch.float32, device=data.device)
    padded[:n].copy_(data)
    part = h.intra.reduce_scatter_sum(padded)
    res = None if residual is None else torch.zeros(per, dtype=torch.float32, device=data.device)
    cross(h.cross, part, res)
    whole = torch.cat(h.intra.allgather(part))
    data.copy_(whole[:n])
    if residual is not None:
        residual.zero_()
        begin = min(n, h.local_rank * per)
        end = min(n, begin + per)
        residual[begin:end].copy_(res[: end - begin])
