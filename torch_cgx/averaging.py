"""Gradient averaging outside DDP: ``PowerSGDGradientAverager``, the counterpart of hivemind's
(``averager_rank``, ``min_compression_ratio``) on torch.distributed.

    averager = PowerSGDGradientAverager(model.parameters(), averager_rank=4)
    loss.backward()
    averager.step()        # every p.grad becomes the group's average (PowerSGD-compressed)

Each gradient is seen as a matrix, its dimensions split where the two sides are closest to
square. A gradient is compressed when PowerSGD saves at least ``min_compression_ratio`` of its
values (``1 - rank * (rows + cols) / (rows * cols) >= min_compression_ratio``, hivemind's rule);
the others and 1-D gradients are averaged exactly, in the allreduce of the P matrices. Error
feedback and warm-started Q are kept per parameter (``state_dict`` / ``load_state_dict``). The
arithmetic is torch_cgx's PowerSGD (torch_cgx/hooks/lowrank.py): two allreduces per step. CUDA
gradients stay on their device (lowrank's device path); only a first random Q is uploaded.
"""

from __future__ import annotations

import math
from typing import Dict, Iterable, List, Optional, Tuple

import torch
import torch.distributed as dist

from torch_cgx.hooks import lowrank
from torch_cgx.hooks._reduce import exact_allreduce, group_or_default

__all__ = ["PowerSGDGradientAverager", "matrix_shape"]


def matrix_shape(shape: Tuple[int, ...]) -> Tuple[int, int]:
    """(rows, cols) of a tensor seen as a matrix: its dimensions split where the two products
    are closest to each other (most square)."""
    total = math.prod(shape)
    best = (total, 1)
    rows = 1
    for d in shape[:-1]:
        rows *= d
        cols = total // rows
        if abs(math.log(max(rows, 1)) - math.log(max(cols, 1))) < abs(
            math.log(max(best[0], 1)) - math.log(max(best[1], 1))
        ):
            best = (rows, cols)
    return best


class PowerSGDGradientAverager:
    """Averages the ``.grad`` of ``parameters`` over ``process_group`` with PowerSGD.

    Args:
        parameters: the parameters whose gradients are averaged (an iterable, kept in order).
        averager_rank: the rank of the approximation (>= 1).
        min_compression_ratio: compress a gradient only if it saves at least this fraction of
            its values (0..1; hivemind's default 0.5).
        process_group: the group (None: the default one; any backend).
        orthogonalization_epsilon: added to the norms in Gram-Schmidt (0: zero columns stay 0).
        seed: the random initial Q (the same on every rank).
    """

    def __init__(
        self,
        parameters: Iterable[torch.nn.Parameter],
        averager_rank: int,
        min_compression_ratio: float = 0.5,
        process_group: Optional[dist.ProcessGroup] = None,
        orthogonalization_epsilon: float = 0.0,
        seed: int = 0,
    ) -> None:
        self.parameters: List[torch.nn.Parameter] = list(parameters)
        if isinstance(averager_rank, bool) or not isinstance(averager_rank, int):
            raise ValueError(f"averager_rank must be an integer >= 1, got {averager_rank!r}")
        if averager_rank < 1:
            raise ValueError(f"averager_rank must be an integer >= 1, got {averager_rank!r}")
        if not isinstance(min_compression_ratio, (int, float)) or not (
            0 <= min_compression_ratio <= 1
        ):
            raise ValueError(
                f"min_compression_ratio must be in [0, 1], got {min_compression_ratio!r}"
            )
        if not self.parameters:
            raise ValueError("PowerSGDGradientAverager needs at least one parameter")
        self.rank, self.min_compression_ratio = averager_rank, float(min_compression_ratio)
        self.process_group, self.epsilon, self.seed = process_group, orthogonalization_epsilon, seed
        self.shapes = [self._plan(p) for p in self.parameters]
        self.residuals: Dict[int, torch.Tensor] = {}
        self.qs: Dict[int, torch.Tensor] = {}
        self.steps = 0

    def _plan(self, p: torch.Tensor) -> Optional[Tuple[int, int, int]]:
        """(rows, cols, rank) when ``p``'s gradient is compressed, else None."""
        if p.dim() <= 1:
            return None
        rows, cols = matrix_shape(tuple(p.shape))
        rank = min(rows, cols, self.rank)
        saved = 1 - rank * (rows + cols) / (rows * cols)
        return (rows, cols, rank) if saved >= self.min_compression_ratio else None

    def compressed(self) -> List[bool]:
        """Which parameters' gradients go through PowerSGD."""
        return [s is not None for s in self.shapes]

    def step(self) -> None:
        """Replaces every ``.grad`` (None: zeros) by the group's average."""
        group = group_or_default(self.process_group)
        items, exact = [], []
        for i, (p, shape) in enumerate(zip(self.parameters, self.shapes)):
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            if shape is None:
                exact.append(p.grad)
                continue
            rows, cols, rank = shape
            matrix = p.grad.reshape(rows, cols).float()  # a view of .grad when it can be
            item = lowrank.Item(i, matrix, rank, self.qs.get(i))
            item.add_error = i in self.residuals
            if item.q is None:
                gen = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
                item.q = torch.randn(cols, rank, generator=gen)
            error = self.residuals.get(i)
            if error is None or error.device != matrix.device or not error.is_contiguous():
                # first step, or a loaded state elsewhere: uploaded once (a fresh one is empty)
                error = torch.empty_like(matrix) if error is None else error.to(matrix).contiguous()
                self.residuals[i] = error
            item.error = error
            items.append(item)
        flat = torch.cat([g.reshape(-1).float() for g in exact]) if exact else None
        lowrank.power_step(
            items, flat, group.size(), self.epsilon,
            lambda t: exact_allreduce(group, t), lambda t: exact_allreduce(group, t),
        )  # fmt: skip
        for it in items:
            p = self.parameters[it.key]
            if it.matrix.data_ptr() != p.grad.data_ptr():
                p.grad.copy_(it.matrix.view(p.shape))
            self.qs[it.key] = it.q.clone()
        pos = 0
        for g in exact:
            g.copy_(flat[pos : pos + g.numel()].view(g.shape))
            pos += g.numel()
        self.steps += 1

    def state_dict(self) -> dict:
        return {
            "residuals": {k: v.clone() for k, v in self.residuals.items()},
            "qs": {k: v.clone() for k, v in self.qs.items()},
            "steps": self.steps,
        }

    def load_state_dict(self, state: dict) -> None:
        self.residuals = {int(k): v.clone() for k, v in state["residuals"].items()}
        self.qs = {int(k): v.clone() for k, v in state["qs"].items()}
        self.steps = int(state["steps"])
