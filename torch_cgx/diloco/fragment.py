"""One fragment of a DiLoCo model: its parameters, their global copies, its outer optimizer,
residuals and the reduction in flight; the pseudo-gradient and the outer step.

Parameters may be plain tensors or DTensors (FSDP2's ``fully_shard``): everything here works on
the local shard (``to_local()``), so pseudo-gradients, residuals and global copies are those of
this rank's shard, and the outer optimizer's gradient is handed back as a DTensor of the same
layout.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import torch
import torch.distributed as dist

__all__ = ["Fragment", "local_tensor"]


def _dtensor_type():
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without DTensor
        return None
    return DTensor


def local_tensor(p: torch.Tensor) -> torch.Tensor:
    """The tensor holding this rank's values of ``p`` (its local shard for a DTensor), sharing
    ``p``'s storage: writing into it writes the parameter."""
    t = p.detach()
    dtensor = _dtensor_type()
    if dtensor is not None and isinstance(t, dtensor):
        t = t.to_local()
    return t


def _as_param_grad(p: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """``grad`` (local values) as ``p.grad`` takes it: a DTensor like ``p`` where ``p`` is one."""
    dtensor = _dtensor_type()
    if dtensor is not None and isinstance(p, dtensor):
        return dtensor.from_local(
            grad, p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride()
        )
    return grad


def _backup(t: torch.Tensor, backup) -> torch.Tensor:
    if backup is None:
        return t.clone()
    device, pin = backup
    copy = torch.empty(t.shape, dtype=t.dtype, device=device)
    if pin and copy.device.type == "cpu" and torch.cuda.is_available():
        copy = copy.pin_memory()
    return copy.copy_(t)


class Fragment:
    """The parameters of one model fragment and DiLoCo's state for them."""

    def __init__(self, index: int, module: torch.nn.Module, optimizer, backup=None) -> None:
        """``backup``: None (global copies on the parameters' device) or ``(device,
        pin_memory)`` (torchft's ``backup_device`` / ``pin_memory``)."""
        self.index, self.module, self.optimizer = index, module, optimizer
        named = [(n, p) for n, p in module.named_parameters()]
        self.names: List[str] = [n for n, _ in named]
        self.params: List[torch.Tensor] = [p for _, p in named]
        locals_ = [local_tensor(p) for p in self.params]
        self.device = locals_[0].device
        if any(t.device != self.device for t in locals_):
            raise ValueError(f"model_fragments[{index}]: parameters on more than one device")
        self.numel = sum(t.numel() for t in locals_)
        self.globals: List[torch.Tensor] = [_backup(t, backup) for t in locals_]
        self.residuals: Dict[str, torch.Tensor] = {}
        self.syncs = 0  # outer steps taken
        self.pending = None  # reduce.Pending of the reduction in flight
        self.new_residual: Optional[torch.Tensor] = None

    # --- the start ---------------------------------------------------------------------------

    def broadcast(self, group, src: int) -> None:
        """Every rank of ``group`` takes ``src``'s parameters (one collective per dtype) and
        starts from them as its global copies."""
        locals_ = [local_tensor(p) for p in self.params]
        for dtype in sorted({t.dtype for t in locals_}, key=str):
            same = [t for t in locals_ if t.dtype == dtype]
            flat = torch.cat([t.reshape(-1) for t in same])
            dist.broadcast(flat, src=src, group=group)
            offset = 0
            with torch.no_grad():
                for t in same:
                    t.copy_(flat[offset : offset + t.numel()].view_as(t))
                    offset += t.numel()
        with torch.no_grad():
            for g, t in zip(self.globals, locals_):
                g.copy_(t)

    # --- the pseudo-gradient -----------------------------------------------------------------

    def pseudo_gradient(self, error_feedback: bool) -> torch.Tensor:
        """The flat fp32 ``global - local`` over the fragment's parameters, plus each one's
        residual with ``error_feedback`` (then :attr:`new_residual` is the buffer the reduction
        writes the new residuals to)."""
        with torch.no_grad():
            parts = [
                (g.to(self.device).float() - local_tensor(p).float()).reshape(-1)
                for g, p in zip(self.globals, self.params)
            ]
            flat = torch.cat(parts) if len(parts) > 1 else parts[0].contiguous()
            self.new_residual = None
            if error_feedback:
                offset = 0
                for name, g in zip(self.names, self.globals):
                    r = self.residuals.get(name)
                    if r is not None:
                        flat[offset : offset + g.numel()] += r
                    offset += g.numel()
                self.new_residual = torch.empty_like(flat)
        return flat

    def take_residuals(self) -> None:
        """Once the reduction is done: its residual becomes each parameter's (views, by name)."""
        if self.new_residual is None:
            return
        offset = 0
        for name, g in zip(self.names, self.globals):
            self.residuals[name] = self.new_residual[offset : offset + g.numel()]
            offset += g.numel()
        self.new_residual = None

    # --- the outer step ----------------------------------------------------------------------

    def restore(self) -> None:
        """The parameters back to the global copies (a sync that was not committed)."""
        self.new_residual = None
        with torch.no_grad():
            for p, g in zip(self.params, self.globals):
                local_tensor(p).copy_(g)

    def mix(self, alpha: float) -> None:
        """The parameters become ``alpha * local + (1 - alpha) * global`` with the global
        copies as they are (no outer step)."""
        with torch.no_grad():
            for p, g in zip(self.params, self.globals):
                t = local_tensor(p)
                t.copy_(g.to(t.device).lerp(t, alpha) if alpha > 0 else g)

    def outer_step(self, average: torch.Tensor, alpha: float) -> None:
        """The outer optimizer steps from the global copies with ``average`` as the gradient;
        the results become the new global copies, and the parameters
        ``alpha * local + (1 - alpha) * global``. An optimizer shared with other fragments
        steps only this one's parameters (theirs have no gradient during the step)."""
        locals_ = [local_tensor(p) for p in self.params]
        saved_grads = [p.grad for p in self.params]
        mine = {id(p) for p in self.params}
        others = [
            p for group in self.optimizer.param_groups for p in group["params"] if id(p) not in mine
        ]
        others_grads = [p.grad for p in others]
        for p in others:
            p.grad = None
        with torch.no_grad():
            kept = [t.clone() for t in locals_] if alpha > 0 else None
            offset = 0
            for p, t, g in zip(self.params, locals_, self.globals):
                t.copy_(g)
                grad = average[offset : offset + t.numel()].view(t.shape).to(t.dtype)
                p.grad = _as_param_grad(p, grad)
                offset += t.numel()
        self.optimizer.step()
        with torch.no_grad():
            for i, (p, t, g) in enumerate(zip(self.params, locals_, self.globals)):
                g.copy_(t)
                if kept is not None:
                    t.lerp_(kept[i], alpha)
                p.grad = saved_grads[i]  # the inner gradients, as they were
            for p, grad in zip(others, others_grads):
                p.grad = grad
        self.syncs += 1
