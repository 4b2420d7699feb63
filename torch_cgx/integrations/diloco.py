"""DiLoCo in the training loops people use: what the Trainer callback
(:mod:`.diloco_trainer`), the accelerate context manager (:mod:`.diloco_accelerate`) and the
Lightning strategy (:mod:`.diloco_lightning`) share (docs/integrations.md, "DiLoCo").

A DiLoCo "step" is one optimizer step of the training loop, as the loop counts it (Trainer's
``global_step``, an accelerate step taken with ``accelerator.sync_gradients``, Lightning's
optimizer step): with gradient accumulation one step per accumulated batch. The loop tells the
:class:`Session` (``advance_to`` / ``step``), which steps a :class:`StepCounter` that stands in
for DiLoCo's inner optimizer, so every rank counts the same steps even where an fp16 loss scaler
skipped the real optimizer's step on some rank only (DiLoCo would otherwise miss a sync there
and the ranks' collectives would no longer match).

Layouts (docs/diloco.md): ``ranks_per_node=1``, every rank is a DiLoCo worker; the framework's
DDP wrapper stays, with its gradient synchronisation off for the whole run (as accelerate's
``LocalSGD`` does: ``no_sync``), so no collective runs across workers between syncs.
``ranks_per_node=n > 1``: DDP averages gradients inside each node of n consecutive ranks (the
wrapper is built on the node group) and DiLoCo runs across nodes
(:func:`torch_cgx.diloco.hierarchical_groups`).

With a torchft ``Manager`` (``manager=``, docs/integrations.md "DiLoCo on torchft") every replica
group is its own torch.distributed world: DiLoCo averages across replicas through the manager
only, DDP (if the world has several ranks) averages inside the replica every step, and nothing
here runs a collective across replicas. A heal moves DiLoCo's step to a live peer's; the loop's
step stays the loop's own (:attr:`Session.loop_step`). Files are keyed by the replica id.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Dict, Optional

import torch
import torch.distributed as dist

__all__ = ["Options", "Session", "StepCounter", "file_tag", "node_groups", "state_file",
           "stop_grad_sync"]  # fmt: skip

VERSION = 1


def file_tag(rank: int, replica: Optional[str] = None) -> str:
    """``rank<r>``, or ``<replica>-rank<r>`` with a manager (every replica group is its own world,
    so ranks repeat across replicas; characters other than letters, digits, ``.``, ``_`` and
    ``-`` in the replica id are written as ``%XX``)."""
    if replica is None:
        return f"rank{rank}"
    safe = "".join(c if c.isascii() and (c.isalnum() or c in "._-")
                   else "".join(f"%{b:02X}" for b in c.encode()) for c in replica)  # fmt: skip
    return f"{safe}-rank{rank}"


def state_file(folder: str, rank: int, replica: Optional[str] = None) -> str:
    """Where a rank's DiLoCo state goes in a checkpoint folder (each rank has its own: local
    parameters, inner optimizer, residuals): ``diloco-<file_tag>.pt``."""
    return os.path.join(folder, f"diloco-{file_tag(rank, replica)}.pt")


class StepCounter(torch.optim.Optimizer):
    """DiLoCo's inner optimizer as the integrations give it: ``step()`` does nothing but count
    (DiLoCo's step post-hook runs); the training loop's own optimizer trains."""

    def __init__(self) -> None:
        super().__init__([torch.zeros(0)], {})

    def step(self, closure=None):  # noqa: D102  (counts; nothing to update)
        return None


def _count(value, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


class Options:
    """The integrations' DiLoCo arguments, checked before training starts.

    Args:
        sync_every: H, optimizer steps between two syncs of a fragment (>= 1).
        compressor, compressor_params, outer_optimizer: as :class:`torch_cgx.diloco.DiLoCo`
            (default max-min, 4 bits unless ``compressor_params`` say otherwise).
        ranks_per_node: 1 (every rank a DiLoCo worker) or n > 1 (DDP inside nodes of n ranks).
        fragments: None (the whole model) or ``model -> list of modules`` (Streaming DiLoCo's
            fragments); together they must hold every trainable parameter.
        final_sync: at the end of training ``sync_now()`` unless the last step synced the
            whole model; then (with ``fragment_update_alpha`` 0) every rank holds one model.
        manager: a torchft ``Manager`` (its ``replica_id`` set) or None; with one, each replica
            group is its own world, ``ranks_per_node`` must be 1 and files are keyed by the
            replica id (module docstring).
        diloco_kwargs: DiLoCo's other keywords (``error_feedback``, ``fragment_sync_delay``,
            ``fragment_update_alpha``, ...), passed on unchanged.
    """

    def __init__(self, sync_every: int = 500, *, compressor: Optional[str] = "maxmin",
                 compressor_params: Optional[dict] = None, outer_optimizer=None,
                 ranks_per_node: int = 1, fragments: Optional[Callable] = None,
                 final_sync: bool = True, manager=None, **diloco_kwargs) -> None:  # fmt: skip
        from torch_cgx.diloco import Schedule

        self.sync_every = _count(sync_every, "sync_every", 1)
        self.ranks_per_node = _count(ranks_per_node, "ranks_per_node", 1)
        Schedule(sync_every, 1, diloco_kwargs.get("fragment_sync_delay", 0))  # names the problem
        if compressor is not None:
            from torch_cgx import compressors

            if not isinstance(compressor, str):
                raise ValueError(
                    f"compressor must be a registered name or None, got {compressor!r}"
                )
            if compressor_params is not None and not isinstance(compressor_params, dict):
                raise ValueError(f"compressor_params must be a dict, got {compressor_params!r}")
            compressors.get(compressor, **(compressor_params or {}))  # names the problem
        if fragments is not None and not callable(fragments):
            raise ValueError(
                f"fragments must be None or model -> list of modules, got {fragments!r}"
            )
        if not isinstance(final_sync, bool):
            raise ValueError(f"final_sync must be a bool, got {final_sync!r}")
        for name in ("model_fragments", "inner_optimizer", "group", "sync_every"):
            if name in diloco_kwargs:
                raise ValueError(f"{name} is set by the integration, not a DiLoCo keyword here")
        self.fragments, self.final_sync = fragments, final_sync
        self.manager, self.replica = manager, _replica_of(manager, self.ranks_per_node)
        self.diloco_kwargs = dict(diloco_kwargs, compressor=compressor,
                                  compressor_params=compressor_params,
                                  outer_optimizer=outer_optimizer)  # fmt: skip
        if manager is not None:
            self.diloco_kwargs["manager"] = manager


def _replica_of(manager, ranks_per_node: int) -> Optional[str]:
    """The replica id that keys this replica's files (None without a manager)."""
    if manager is None:
        return None
    from torch_cgx.diloco.arguments import is_manager

    if not is_manager(manager):
        raise ValueError(f"manager must be a torchft Manager or None, got {manager!r}")
    if ranks_per_node != 1:
        raise ValueError(
            f"ranks_per_node={ranks_per_node} with a manager: each replica group is its own "
            "torch.distributed world and DDP averages inside it (its whole default group); "
            "DiLoCo runs across replicas through the manager. Leave ranks_per_node at 1"
        )
    replica = getattr(manager, "_replica_id", None)
    if not isinstance(replica, str) or not replica:
        raise ValueError(
            "manager: give it a replica_id (Manager(replica_id=...)): each replica's files are "
            f"keyed by it (ranks repeat across replica groups), got {replica!r}"
        )
    return replica


def node_groups(ranks_per_node: int):
    """(DDP's group, DiLoCo's group): (None, None) for one rank per node (the default group for
    DiLoCo, DDP's synchronisation off), else :func:`torch_cgx.diloco.hierarchical_groups`.
    Collective when ``ranks_per_node > 1``."""
    if ranks_per_node == 1:
        return None, None
    from torch_cgx.diloco import hierarchical_groups

    return hierarchical_groups(ranks_per_node)


def stop_grad_sync(ddp: torch.nn.parallel.DistributedDataParallel):
    """Turns DDP's gradient synchronisation off until the returned context is exited
    (``ddp.no_sync()`` entered, as accelerate's LocalSGD does); DDP's buffer broadcast at the
    next forward is skipped too (it would overwrite a resumed rank's buffers)."""
    context = ddp.no_sync()
    context.__enter__()
    ddp.require_forward_param_sync = False
    return context


def _modules(model: torch.nn.Module, fragments: Optional[Callable]):
    if fragments is None:
        return model
    modules = list(fragments(model))
    held = {id(p) for m in modules for p in m.parameters()}
    missing = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in held]
    if missing:
        raise ValueError(f"fragments(model) leaves out trainable parameters: {missing[:5]}")
    return modules


class Session:
    """One training run's DiLoCo: made at the start of training (a collective: the DiLoCo
    constructor broadcasts rank 0's parameters over ``group``; none with a manager), stepped by
    the loop, saved and restored per rank, closed at the end."""

    def __init__(self, model: torch.nn.Module, options: Options, group=None) -> None:
        from torch_cgx.diloco import DiLoCo, Schedule

        self.model, self.options = model, options
        self.counter = StepCounter()
        self.diloco = DiLoCo(_modules(model, options.fragments), self.counter,
                             sync_every=options.sync_every, group=group,
                             **options.diloco_kwargs)  # fmt: skip
        delay = options.diloco_kwargs.get("fragment_sync_delay", 0)
        self.schedule = Schedule(options.sync_every, self.diloco.num_fragments, delay)
        self.diloco.__enter__()
        self.loop_step = 0  # the loop's optimizer steps (DiLoCo's step but after a heal)
        self.syncs = self.started = 0  # fragment outer steps applied / reductions started
        self.bytes_before = 0  # payload bytes of the runs before a resume
        self.sync_seconds = 0.0  # wall time of the steps that started or applied a sync
        self.closed = False

    @property
    def step(self) -> int:
        return self.diloco.step

    def advance_to(self, step: int) -> None:
        """Counts the loop's optimizer steps up to ``step`` (normally one more); syncs happen in
        here. Without a manager DiLoCo's step is the loop's; with one a heal moves DiLoCo's to
        a peer's, and each loop step still counts one."""
        if step < self.loop_step:
            raise RuntimeError(f"DiLoCo counted {self.loop_step} loop steps, the loop at {step}")
        while self.loop_step < step:
            self.loop_step += 1
            t = self.diloco.step + 1
            starts, applies = self.schedule.starts_at(t), self.schedule.applies_at(t)
            t0 = time.perf_counter()
            self.counter.step()
            if starts or applies:
                self.sync_seconds += time.perf_counter() - t0
            self.started += len(starts)
            self.syncs += len(applies)

    @property
    def bytes_sent(self) -> int:
        return self.bytes_before + self.diloco.payload_bytes

    def metrics(self) -> Dict[str, float]:
        """``diloco/step``, ``diloco/syncs`` (fragment outer steps), ``diloco/bytes_sent`` (this
        rank's compressed pseudo-gradient bytes), ``diloco/bytes_per_sync``,
        ``diloco/sync_seconds``."""
        per = self.bytes_sent / self.started if self.started else 0.0
        out = {"diloco/step": self.diloco.step, "diloco/syncs": self.syncs,
               "diloco/bytes_sent": self.bytes_sent, "diloco/bytes_per_sync": per,
               "diloco/sync_seconds": round(self.sync_seconds, 6)}  # fmt: skip
        if self.options.manager is not None:  # this process's discarded syncs
            out["diloco/syncs_discarded"] = self.diloco.syncs_discarded
        return out

    def summary(self) -> str:
        m = self.metrics()
        return (f"DiLoCo: {m['diloco/step']} steps, {m['diloco/syncs']} fragment syncs, "
                f"{m['diloco/bytes_sent'] / 1e6:.3f} MB sent by this rank "
                f"({m['diloco/bytes_per_sync'] / 1e6:.3f} MB per sync)")  # fmt: skip

    # -- checkpoints --------------------------------------------------------------------------

    def state_dict(self, optimizer=None) -> dict:
        """This rank's state: its model replica (``state_dict()``), the inner optimizer's
        state, DiLoCo's ``state_dict()`` and the counters."""
        return {"version": VERSION, "step": self.diloco.step, "loop_step": self.loop_step,
                "replica": self.options.replica, "syncs": self.syncs,
                "started": self.started, "bytes_sent": self.bytes_sent,
                "sync_seconds": self.sync_seconds, "model": self.model.state_dict(),
                "optimizer": None if optimizer is None else optimizer.state_dict(),
                "diloco": self.diloco.state_dict()}  # fmt: skip

    def load_state_dict(self, state: dict, optimizer=None, step: Optional[int] = None) -> None:
        """Restores :meth:`state_dict` (after construction: the order docs/diloco.md gives);
        ``step``: the loop's step, which must be the saved one."""
        if not isinstance(state, dict) or state.get("version") != VERSION:
            raise ValueError(f"not a DiLoCo integration state of version {VERSION}")
        loop_step = int(state.get("loop_step", state["step"]))
        if step is not None and loop_step != step:
            raise ValueError(f"the DiLoCo state is of loop step {loop_step}, the loop at {step}")
        if state.get("replica") != self.options.replica:
            raise ValueError(f"the DiLoCo state is replica {state.get('replica')!r}'s, this is "
                             f"replica {self.options.replica!r}")  # fmt: skip
        self.model.load_state_dict(state["model"])
        if optimizer is not None and state["optimizer"] is not None:
            optimizer.load_state_dict(state["optimizer"])
        self.diloco.load_state_dict(state["diloco"])
        self.loop_step = loop_step
        self.syncs, self.started = int(state["syncs"]), int(state["started"])
        self.bytes_before = int(state["bytes_sent"])
        self.sync_seconds = float(state["sync_seconds"])

    @property
    def tag(self) -> str:
        """This rank's file tag (:func:`file_tag`)."""
        return file_tag(_rank(), self.options.replica)

    def save(self, folder: str, optimizer=None) -> str:
        os.makedirs(folder, exist_ok=True)
        path = state_file(folder, _rank(), self.options.replica)
        torch.save(self.state_dict(optimizer), path)
        return path

    def load(self, folder: str, optimizer=None, step: Optional[int] = None) -> None:
        path = state_file(folder, _rank(), self.options.replica)
        if not os.path.isfile(path):
            raise ValueError(f"no DiLoCo state for this rank in {folder} ({path} is missing)")
        self.load_state_dict(torch.load(path, map_location="cpu", weights_only=True),
                             optimizer, step)  # fmt: skip

    # -- the end ------------------------------------------------------------------------------

    def close(self, ok: bool = True, sync: bool = True) -> None:
        """Ends the run: with ``final_sync``, ``sync`` and no exception, ``sync_now()`` unless
        the last step synced the whole model; removes DiLoCo's step hook."""
        if self.closed:
            return
        self.closed = True
        step = self.diloco.step
        synced = self.diloco.num_fragments == 1 and step % self.options.sync_every == 0
        if ok and sync and self.options.final_sync and step > 0 and not synced:
            t0 = time.perf_counter()
            self.diloco.sync_now()
            self.sync_seconds += time.perf_counter() - t0
            self.started += self.diloco.num_fragments
            self.syncs += self.diloco.num_fragments
        if ok:
            self.diloco.__exit__(None, None, None)
        else:
            self.diloco.__exit__(RuntimeError, RuntimeError("training failed"), None)


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
