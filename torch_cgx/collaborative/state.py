"""What one peer of a collaboration holds between rounds: its accumulated gradients (or, with
local updates, its parameters' distance from the last average), its compression residuals,
and the state a joining peer receives from it."""

from __future__ import annotations

from typing import List, Optional

import torch

__all__ = ["PeerState", "cloned"]


def cloned(obj):
    """``obj`` with every tensor cloned (dicts, lists and tuples walked)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: cloned(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(cloned(v) for v in obj)
    return obj


def _host(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", torch.float32).reshape(-1)


class PeerState:
    """The tensors of one :class:`~torch_cgx.collaborative.Optimizer` (``owner``)."""

    def __init__(self, owner) -> None:
        self.owner = owner
        params = owner.params
        self.acc: List[torch.Tensor] = [torch.zeros(p.numel()) for p in params]
        self.residuals: List[Optional[torch.Tensor]] = [None] * len(params)
        self._pending: Optional[List[Optional[torch.Tensor]]] = None
        self.globals = [_host(p).clone() for p in params] if owner.use_local_updates else None
        self._spare: Optional[List[torch.Tensor]] = None  # a zeroed accumulator to swap in
        self.deferring = False  # a round runs in the background: a heal waits for finish()
        self.heal_received = False  # a live peer's state came in the round running now
        self._healed_with: Optional[dict] = None

    # --- between rounds ---------------------------------------------------------------------

    def accumulate(self, batch_size: int) -> None:
        """Adds ``p.grad * batch_size`` (the batch's summed gradient) for every parameter."""
        for p, a in zip(self.owner.params, self.acc):
            if p.grad is None:
                continue
            a.add_(_host(p.grad), alpha=float(batch_size))
            if self.owner.reuse_grad_buffers:
                p.grad.zero_()

    def drop_samples(self) -> None:
        for a in self.acc:
            a.zero_()
        if self.globals is not None:  # local updates: back to the last average
            self._set_params(self.globals)

    def take(self) -> List[torch.Tensor]:
        """The accumulated gradients, for a round; a zeroed accumulator takes their place (the
        samples of the steps during a background round go to the next epoch)."""
        taken, spare = self.acc, self._spare
        self.acc = spare if spare is not None else [torch.zeros_like(a) for a in taken]
        self._spare = None
        return taken

    def give_back(self, taken: List[torch.Tensor]) -> None:
        """A round that did not commit: its gradients are added back (sent at the next)."""
        for a, t in zip(self.acc, taken):
            a.add_(t)
        self.recycle(taken)

    def recycle(self, taken: List[torch.Tensor]) -> None:
        for t in taken:
            t.zero_()
        self._spare = taken

    # --- a round ----------------------------------------------------------------------------

    def values(self, acc: List[torch.Tensor], samples: int) -> List[torch.Tensor]:
        """What this peer sends: its mean gradient over ``samples`` (with local updates:
        ``global - local``), plus its residual where error feedback is on."""
        owner = self.owner
        if self.globals is not None:
            values = [g - _host(p) for g, p in zip(self.globals, owner.params)]
        else:
            values = [a / float(samples) for a in acc]
        for i, r in enumerate(self.residuals):
            if owner.error_feedback[i] and r is not None:
                values[i].add_(r)
        return values

    def pending_from(self, values, decoded) -> None:
        """The residuals ``values - decoded`` (where error feedback is on), kept until the
        round commits."""
        self._pending = None
        if values is not None and decoded is not None and any(self.owner.error_feedback):
            on = self.owner.error_feedback
            self._pending = [v.clone().sub_(d) if f else None
                             for v, d, f in zip(values, decoded, on)]  # fmt: skip

    def encode(self, acc: List[torch.Tensor], samples: int) -> torch.Tensor:
        """This peer's payload as one piece (averages by whole payloads)."""
        values = self.values(acc, samples)
        payload = self.owner.codec.encode(values)
        self.pending_from(values, self.owner.codec.decode(payload))
        return payload

    def discard_round(self) -> None:
        self._pending = None

    def _take_residuals(self) -> None:
        if self._pending is not None:
            self.residuals = self._pending
        self._pending = None

    def average_with(self, averager, table, manager, acc) -> List[torch.Tensor]:
        """The sample-weighted average through a gradient averager (PowerSGD): each peer
        passes ``sum of its gradients * W / N`` so that the averager's mean over the W peers
        is the weighted mean."""
        from torch_cgx.diloco.managed import _process_group

        world, total = len(table), sum(int(r[0]) for r in table)
        scale = float(world) / float(total)
        for p, a in zip(self.owner.params, acc):
            p.grad = (a * scale).view(p.shape).to(p.device, p.dtype)
        averager.process_group = _process_group(manager)
        averager.step()
        return [_host(p.grad) for p in self.owner.params]

    def set_gradients(self, average: List[torch.Tensor]) -> None:
        for p, a in zip(self.owner.params, average):
            p.grad = a.view(p.shape).to(p.device, p.dtype)
        self._take_residuals()

    def after_step(self) -> None:
        if self.owner.reuse_grad_buffers:
            for p in self.owner.params:
                p.grad = None

    def set_parameters(self, average_delta: List[torch.Tensor]) -> None:
        """Local updates: every peer's parameters become ``global - average(global - local)``."""
        self._set_params([g - d for g, d in zip(self.globals, average_delta)])
        self.globals = [_host(p).clone() for p in self.owner.params]
        self._take_residuals()

    def _set_params(self, values) -> None:
        with torch.no_grad():
            for p, v in zip(self.owner.params, values):
                p.copy_(v.view(p.shape))

    # --- a joining peer's state -------------------------------------------------------------

    def for_peer(self) -> dict:
        """What a joining peer receives (cloned: this peer goes on training)."""
        owner = self.owner
        averager = None
        if owner.averager is not None:
            averager = cloned(owner.averager.state_dict())
            averager["residuals"] = {}  # its own compression error, not this peer's
        return {
            "params": [p.detach().clone() for p in owner.params],
            "optimizer": cloned(owner.optimizer.state_dict()),
            "scheduler": None if owner.scheduler is None else cloned(owner.scheduler.state_dict()),
            "epoch": owner.local_epoch,
            "globals": cloned(self.globals),
            "averager": averager,
        }

    def load_from_peer(self, state: dict) -> None:
        """A live peer's state, bitwise; the accumulated samples and the residuals start empty
        (a residual is this peer's own unsent error: a copy of the source's would send the
        source's twice). During a background round (the training loop runs meanwhile) it is
        kept and loaded by :meth:`apply_heal` when the round finishes."""
        self.heal_received = True
        if self.deferring:
            self._healed_with = state
            return
        self._load(state)

    def apply_heal(self) -> bool:
        """Loads a state received during a background round; True if there was one."""
        state, self._healed_with = self._healed_with, None
        if state is not None:
            self._load(state)
        return state is not None

    def _load(self, state: dict) -> None:
        owner = self.owner
        self._set_params(state["params"])
        owner.optimizer.load_state_dict(state["optimizer"])
        if owner.scheduler is not None and state["scheduler"] is not None:
            owner.scheduler.load_state_dict(state["scheduler"])
        if owner.averager is not None and state["averager"] is not None:
            owner.averager.load_state_dict(state["averager"])
        owner.local_epoch = int(state["epoch"])
        self.globals = cloned(state["globals"])
        for a in self.acc:
            a.zero_()
        self.residuals, self._pending = [None] * len(self.acc), None

    # --- checkpoints ------------------------------------------------------------------------

    def checkpoint(self) -> dict:
        owner = self.owner
        return {
            "optimizer": owner.optimizer.state_dict(),
            "local_epoch": owner.local_epoch,
            "scheduler": None if owner.scheduler is None else owner.scheduler.state_dict(),
            "residuals": cloned(self.residuals),
            "globals": cloned(self.globals),
            "averager": None if owner.averager is None else owner.averager.state_dict(),
        }

    def restore(self, state: dict) -> None:
        owner = self.owner
        missing = {"optimizer", "local_epoch", "residuals"} - set(state)
        if missing:
            raise ValueError(f"load_state_dict: not a collaborative Optimizer state (missing "
                             f"{sorted(missing)})")  # fmt: skip
        owner.optimizer.load_state_dict(state["optimizer"])
        owner.local_epoch = int(state["local_epoch"])
        if owner.scheduler is not None and state.get("scheduler") is not None:
            owner.scheduler.load_state_dict(state["scheduler"])
        if owner.averager is not None and state.get("averager") is not None:
            owner.averager.load_state_dict(state["averager"])
        residuals = list(state["residuals"])
        if len(residuals) != len(self.acc):
            raise ValueError(f"load_state_dict: {len(residuals)} residuals for "
                             f"{len(self.acc)} parameters")  # fmt: skip
        self.residuals = cloned(residuals)
        if state.get("globals") is not None:
            self.globals = cloned(state["globals"])
