"""The arithmetic of PowerSGD for all the matrices of a step at once: batched orthogonalization,
one allreduce for every P (with the exactly reduced values riding along) and one for every Q.

Matrices with the same number of rows and rank share one ``[B, rows, rank]`` block of a flat
buffer, so Gram-Schmidt runs once per shape instead of once per matrix, and the flat buffers are
what goes on the wire (no staging copy). The per-matrix products stay ``torch.mm`` into views.

Two paths compute the same passes. fp32 contiguous CPU matrices take the fused native passes of
csrc/core/lowrank.h (one read of the matrix each); every other matrix (CUDA tensors, half
precision) takes the *device path*: torch operations on the matrix's device, nothing read back
to the host, the same steps in the same order (the error added in place, then ``P = M Q``;
``Q = M^T P``; ``A = P Q^T``, ``error = M - A``, ``M = A``), different only in the rounding of
the sums (tests/test_device_entry_points.py bounds it). Orthogonalization is tensor operations
on both paths. Set :data:`NATIVE` to False (or use :func:`device_path`) to run the device path
on CPU tensors too: that is how the CPU tests run the GPU code.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from typing import Callable, Iterator, List, Optional, Tuple

import torch

from torch_cgx import _C

Reduce = Callable[[torch.Tensor], torch.futures.Future]


class Item:
    """One matrix to approximate: ``matrix`` (n x m, a view written with the result), its
    ``rank``, its Q (m x rank) when one is remembered (warm start) or freshly drawn, and
    ``error`` (n x m) to receive ``matrix - P Q^T`` (error feedback) or None; with
    ``add_error`` it holds last step's error, added to ``matrix`` first."""

    __slots__ = ("key", "matrix", "rank", "q", "error", "add_error")

    def __init__(self, key, matrix: torch.Tensor, rank: int, q: Optional[torch.Tensor]) -> None:
        self.key, self.matrix, self.rank, self.q = key, matrix, rank, q
        self.error: Optional[torch.Tensor] = None
        self.add_error = False


# True: fp32 contiguous CPU matrices take the native fused passes; False: every matrix takes
# the device path (torch operations), as CUDA tensors always do (see the module docstring).
NATIVE = True


@contextlib.contextmanager
def device_path() -> Iterator[None]:
    """Within the block every matrix takes the device path (``NATIVE = False``), CPU ones too."""
    global NATIVE
    before, NATIVE = NATIVE, False
    try:
        yield
    finally:
        NATIVE = before


def _fusable(*tensors) -> bool:
    """The fused passes of csrc/core/lowrank.h apply (fp32, CPU, contiguous, :data:`NATIVE`)."""
    return NATIVE and all(
        t is None or (t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous())
        for t in tensors
    )


def _project(it: Item, q: torch.Tensor, p: torch.Tensor) -> None:
    """p = (matrix + error) q, the error added in place first when ``add_error``."""
    if it.add_error and _fusable(it.matrix, it.error, p):
        _C.lowrank_add_and_project(it.matrix, it.error, q.t().contiguous(), p)
        return
    if it.add_error:
        it.matrix.add_(it.error)
    torch.mm(it.matrix, q, out=p)


def _transpose_project(it: Item, p: torch.Tensor, q: torch.Tensor) -> None:
    """q = matrix^T p."""
    if _fusable(it.matrix, p):
        qt = torch.empty(q.shape[1], q.shape[0], dtype=q.dtype)
        _C.lowrank_transpose_project(it.matrix, p, qt)
        q.copy_(qt.t())
        return
    torch.mm(it.matrix.t(), p, out=q)


def _decompress(it: Item, p: torch.Tensor, q: torch.Tensor) -> None:
    """error = matrix - p q^T (when kept), then matrix = p q^T."""
    if _fusable(it.matrix, it.error, p):
        _C.lowrank_decompress(it.matrix, it.error, p, q.t().contiguous())
        return
    if it.error is None:
        torch.mm(p, q.t(), out=it.matrix)
        return
    approx = torch.mm(p, q.t())  # as the native pass: A once, error = M - A, then M = A
    torch.sub(it.matrix, approx, out=it.error)
    it.matrix.copy_(approx)


def orthogonalize(mats: torch.Tensor, epsilon: float) -> None:
    """Orthonormal columns, in place, for a batch ``[B, rows, rank]`` (rank <= rows).

    Rank <= 2 or half precision: Gram-Schmidt, column by column over the whole batch (in fp32
    for half inputs); otherwise Householder QR. With ``epsilon == 0`` a column of zeros stays
    zeros (torch's hook divides 0 by 0 there and spreads NaN through the gradient); with
    ``epsilon > 0`` each column is divided by its norm + epsilon, as in torch's hook.
    """
    rank = mats.shape[2]
    if rank > 2 and mats.dtype in (torch.float32, torch.float64):
        q, _ = torch.linalg.qr(mats)
        mats.copy_(q)
        return
    work = mats if mats.dtype in (torch.float32, torch.float64) else mats.float()
    for i in range(rank):
        col = work[:, :, i : i + 1]
        norm = torch.norm(col, dim=1, keepdim=True)
        if epsilon == 0:
            norm = torch.where(norm == 0, torch.ones_like(norm), norm)
        else:
            norm = norm + epsilon
        col /= norm
        if i + 1 < rank:
            rest = work[:, :, i + 1 :]
            rest -= torch.sum(col * rest, dim=1, keepdim=True) * col
    if work is not mats:
        mats.copy_(work)


def _layout(shapes: List[Tuple[int, int]]) -> Tuple[int, list, list]:
    """Offsets of ``(rows, rank)`` blocks grouped by shape: (total, per-item (group, index),
    groups as (rows, rank, count, offset))."""
    groups: OrderedDict[Tuple[int, int], list] = OrderedDict()
    for i, shape in enumerate(shapes):
        groups.setdefault(shape, []).append(i)
    where, blocks, offset = [None] * len(shapes), [], 0
    for g, ((rows, rank), members) in enumerate(groups.items()):
        for j, i in enumerate(members):
            where[i] = (g, j)
        blocks.append((rows, rank, len(members), offset))
        offset += rows * rank * len(members)
    return offset, where, blocks


class _Flat:
    """A flat buffer of ``[B, rows, rank]`` blocks; ``view(i)`` is item i's ``rows x rank``."""

    def __init__(self, shapes, dtype, device, extra: int = 0) -> None:
        total, self.where, blocks = _layout(shapes)
        self.data = torch.empty(total + extra, dtype=dtype, device=device)
        self.tail = self.data[total:]
        self.blocks = [
            self.data[o : o + rows * rank * n].view(n, rows, rank) for rows, rank, n, o in blocks
        ]

    def view(self, i: int) -> torch.Tensor:
        g, j = self.where[i]
        return self.blocks[g][j]

    def orthogonalize(self, epsilon: float) -> None:
        for block in self.blocks:
            orthogonalize(block, epsilon)


def power_step(
    items: List[Item],
    exact: Optional[torch.Tensor],
    world: int,
    epsilon: float,
    reduce_p: Reduce,
    reduce_q: Reduce,
    reduce_exact: Optional[Reduce] = None,
) -> None:
    """One PowerSGD step for every item: each ``matrix`` becomes the average low-rank
    approximation P Q^T, each ``q`` the averaged Q (a view of this step's Q buffer) and each
    ``error`` what this rank's matrix lost. fp32 CPU matrices go through the fused passes of
    csrc/core/lowrank.h: the error added while P is computed, and the new error written while
    the result is, two reads of each matrix in all besides Q's product.
    ``exact`` (flat) is averaged exactly: in P's allreduce, or by ``reduce_exact`` when given
    (P quantized). The reduce functions sum in place and return a future (waited for here)."""
    if not items and exact is None:
        return  # nothing to reduce (every gradient of the step is empty)
    first = items[0].matrix if items else exact
    dtype, device = first.dtype, first.device
    n_exact = 0 if exact is None else exact.numel()
    qs = _Flat([(it.matrix.shape[1], it.rank) for it in items], dtype, device)
    for i, it in enumerate(items):
        qs.view(i).copy_(it.q)
    qs.orthogonalize(epsilon)
    ride = n_exact if reduce_exact is None else 0
    ps = _Flat([(it.matrix.shape[0], it.rank) for it in items], dtype, device, extra=ride)
    pending = []
    if n_exact and reduce_exact is not None:
        pending.append(reduce_exact(exact))
    elif n_exact:
        ps.tail.copy_(exact)
    for i, it in enumerate(items):
        _project(it, qs.view(i), ps.view(i))
    if items or ride:
        reduce_p(ps.data).wait()
    for fut in pending:
        fut.wait()
    if ride:
        exact.copy_(ps.tail)
    if n_exact:
        exact.div_(world)
    if not items:
        return
    ps.orthogonalize(epsilon)
    for i, it in enumerate(items):
        _transpose_project(it, ps.view(i), qs.view(i))
    reduce_q(qs.data).wait()
    qs.data.div_(world)
    for i, it in enumerate(items):
        _decompress(it, ps.view(i), qs.view(i))
        it.q = qs.view(i)
