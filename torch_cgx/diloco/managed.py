"""DiLoCo on a torchft ``Manager``: replicas that leave and join without stopping the others.

torchft (optional; ``pip install torchft``) provides the membership: a quorum per sync from its
Lighthouse, a process group reconfigured to the quorum, ``should_commit()`` (every rank of a
replica group agrees; a replica whose sync failed discards it), and healing (a replica behind the
quorum's newest step receives a live peer's registered state). This module adds what DiLoCo needs
on top, with no membership protocol of its own:

- the state a healing replica receives: ``DiLoCo.state_dict()`` of the source (global copies,
  outer optimizers, residuals, step, schedule), registered under :data:`KEY`;
- what a healed replica does with it (:func:`heal`): it takes the global copies, outer optimizers,
  step and sync counts bitwise; its parameters become the global copies (every fragment); its
  residuals start empty (a copy of the source's would send the source's unsent error twice);
- the average of a sync counts only real contributions: a replica that healed in this sync (or
  is not participating) sends nothing and the sum is divided by the number of replicas that did
  (torchft counts the healed replica's copy of its source's pseudo-gradient: that source's
  batches twice);
- the reduction over the manager's process group: exact fp32 (an allreduce of the pseudo-gradient
  and the contributor count) or compressed (each contributor's payload all-gathered, decoded in
  rank order); errors are reported to the manager, which then refuses the commit.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch

from torch_cgx.diloco.reduce import Pending, Spec, codec_for, encode_payload

__all__ = ["KEY", "Managed", "heal", "start_managed_average"]

KEY = "torch_cgx.diloco"
_log = logging.getLogger("torch_cgx.diloco")


def _process_group(manager):
    pg = getattr(manager, "_pg", None)
    if pg is None or not callable(getattr(pg, "allgather", None)):
        raise ValueError("manager: a torchft Manager with its process group (Manager(pg=...))")
    return pg


def _rank(pg) -> int:
    """This replica's rank in the reconfigured group (torchft's wrappers hold the real group
    as ``parent``; the wrapper itself was built with rank 0 of 1)."""
    return getattr(pg, "parent", pg).rank()


def _gather(pg, tensor: torch.Tensor, world: int):
    from torch.distributed.distributed_c10d import AllgatherOptions

    outs = [torch.empty_like(tensor) for _ in range(world)]
    return outs, pg.allgather([outs], [tensor], AllgatherOptions())


def start_managed_average(
    manager,
    flat: torch.Tensor,
    spec: Spec,
    *,
    contributes: bool,
    residual=None,
    call: int = 0,
    report: Optional[dict] = None,
) -> Pending:
    """Starts averaging ``flat`` over the contributing replicas of ``manager``'s quorum.
    ``contributes=False``: this replica sends nothing (its residual becomes zeros) and still
    receives the average. The result is bitwise the same on every replica of the quorum;
    ``report["contributors"]`` is set to the divisor when it is known."""
    report = {} if report is None else report
    pg = _process_group(manager)
    world, rank = pg.size(), _rank(pg)
    if spec.name is None:
        from torch.distributed.distributed_c10d import AllreduceOptions

        buf = torch.zeros(flat.numel() + 1, dtype=torch.float32, device=flat.device)
        if contributes:
            buf[:-1] = flat
            buf[-1] = 1.0
        work = pg.allreduce([buf], AllreduceOptions())  # a sum

        def exact() -> torch.Tensor:
            report["contributors"] = int(buf[-1])
            return _divide(buf[:-1], buf[-1])

        return Pending([work], exact)
    codec = codec_for(spec, flat.device)
    values = flat.cpu() if codec.host else flat
    if contributes:
        payload = encode_payload(codec, values, rank, call, residual).to(flat.device)
    else:
        payload = torch.empty(0, dtype=torch.uint8, device=flat.device)
        if residual is not None:
            residual.zero_()
    header = torch.tensor([payload.numel(), int(contributes)], dtype=torch.int64)
    headers, work = _gather(pg, header.to(flat.device), world)
    work.wait()  # one small blocking round: payload sizes and who contributes
    table = torch.stack(headers).cpu().tolist()
    wire = torch.zeros(max(size for size, _ in table), dtype=torch.uint8, device=flat.device)
    wire[: payload.numel()] = payload
    payloads, work = _gather(pg, wire, world)

    def finish() -> torch.Tensor:
        total = torch.zeros(values.numel(), dtype=torch.float32, device=values.device)
        count = 0
        for part, (size, gave) in zip(payloads, table):  # rank order: the same sum everywhere
            if gave:
                codec.decode_add_(total, part[:size].cpu() if codec.host else part[:size])
                count += 1
        report["contributors"] = count
        return _divide(total.to(flat.device), count)

    return Pending([work], finish, payload.numel())


def _divide(total: torch.Tensor, count) -> torch.Tensor:
    count = float(count)
    return total.div_(count) if count > 0 else total.zero_()


def heal(diloco, state: dict) -> None:
    """A healing replica takes ``state`` (a live peer's ``state_dict()``): everything bitwise,
    then its parameters become the global copies and its residuals start empty."""
    from torch_cgx.diloco import state as _state
    from torch_cgx.diloco.fragment import local_tensor

    _state.load(diloco, state)
    with torch.no_grad():
        for frag in diloco._fragments:
            for p, g in zip(frag.params, frag.globals):
                local_tensor(p).copy_(g)
            frag.residuals = {}


class Managed:
    """The torchft side of one DiLoCo: registration, the quorum, the commit."""

    def __init__(self, manager, diloco) -> None:
        if getattr(manager, "_use_async_quorum", False):
            raise ValueError(
                "manager: DiLoCo needs a synchronous quorum (a replica must heal before it "
                "computes its pseudo-gradient): Manager(..., use_async_quorum=False)"
            )
        _process_group(manager)
        self.manager = manager
        self.healed = False  # this sync's quorum healed this replica
        self.discarded = 0  # syncs this replica did not commit
        self.last = {}  # the last finished sync's report: "contributors", its divisor
        self._reports = {}  # pending -> its report, until finished
        self._diloco = diloco
        try:
            manager.register_state_dict_fn(KEY, self._load, self._save)
        except AssertionError:
            raise ValueError(
                f"manager: a DiLoCo is already registered with it (key {KEY!r}); one per manager"
            ) from None

    def _save(self) -> dict:
        state = self._diloco.state_dict()  # waits for reductions in flight: reports filled
        frags = self._diloco._fragments
        state["contributors"] = [
            self._reports.get(f.pending, {}).get("contributors") for f in frags
        ]
        return state

    def _load(self, state: dict) -> None:
        heal(self._diloco, state)
        self.healed = True
        for frag, count in zip(self._diloco._fragments, state.get("contributors", [])):
            if frag.pending is not None and count is not None:  # a peer's finished reduction
                self._reports[frag.pending] = {"contributors": count}

    def quorum(self) -> bool:
        """A new quorum for the sync about to start; True when this replica sends its
        pseudo-gradient (False: it healed in this quorum, or is a spare)."""
        self.healed = False
        self.manager.start_quorum()
        if self.healed:
            _log.info("healed at inner step %d from a live peer", self._diloco.step)
        return not self.healed and self.manager.is_participating()

    def start(self, flat, spec, contributes, residual, call) -> Optional[Pending]:
        try:
            report = {}
            pending = start_managed_average(
                self.manager,
                flat,
                spec,
                contributes=contributes,
                residual=residual,
                call=call,
                report=report,
            )
            self._reports[pending] = report
            return pending
        except Exception as e:  # a peer gone mid-sync: the manager refuses the commit
            _log.warning("DiLoCo sync failed to start (discarded): %s", e)
            self.manager.report_error(e)
            return None

    def settle(self, pending: Optional[Pending]) -> None:
        """Waits for a reduction in flight without applying it; an error goes to the manager
        (the sync is then discarded at its apply step)."""
        if pending is None:
            return
        try:
            pending.wait()
        except Exception as e:
            _log.warning("DiLoCo sync failed (discarded): %s", e)
            self.manager.report_error(e)

    def finish(self, pending: Optional[Pending]) -> Optional[torch.Tensor]:
        """The average when every replica of the group commits this sync, else None (then
        every step of this sync is discarded on this replica)."""
        average = None
        self.last = self._reports.pop(pending, {}) if pending is not None else {}
        if pending is not None:
            try:
                average = pending.wait()
            except Exception as e:
                _log.warning("DiLoCo sync failed (discarded): %s", e)
                self.manager.report_error(e)
        if not self.manager.should_commit() or average is None:
            self.discarded += 1
            return None
        return average
