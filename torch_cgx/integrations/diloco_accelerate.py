"""DiLoCo for a bare accelerate loop, shaped like accelerate's ``LocalSGD`` context manager.

    accelerator = Accelerator()
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    with AccelerateDiLoCo(accelerator, model, optimizer, sync_every=100,
                          compressor="maxmin", compressor_params={"bits": 4}) as diloco:
        for batch in data:
            with accelerator.accumulate(model):
                accelerator.backward(loss_fn(model, batch))
                optimizer.step(); scheduler.step(); optimizer.zero_grad()
                diloco.step()            # counts when accelerator.sync_gradients

Where ``LocalSGD`` averages the parameters every K steps, DiLoCo averages compressed
pseudo-gradients and takes an outer optimizer step (docs/diloco.md). DDP inside nodes of n ranks:
``node_ddp(accelerator, n)`` before ``accelerator.prepare`` and ``ranks_per_node=n`` here.
On torchft (``manager=``): the accelerator's world is one replica group, DDP averages inside it.
"""

from __future__ import annotations

from typing import Optional

import torch

from torch_cgx.integrations.diloco import Options, Session, node_groups, stop_grad_sync

__all__ = ["AccelerateDiLoCo", "check_distributed_type", "node_ddp"]

_SUPPORTED = ("NO", "MULTI_CPU", "MULTI_GPU", "MULTI_XPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA",
              "MULTI_NPU", "MULTI_HPU", "MULTI_NEURON")  # fmt: skip


def check_distributed_type(accelerator, what: str) -> None:
    """ValueError unless accelerate runs plain data parallelism (no DeepSpeed, FSDP, Megatron,
    XLA, tensor parallelism): DiLoCo keeps a full replica per worker."""
    kind = getattr(accelerator.distributed_type, "name", str(accelerator.distributed_type))
    pc = getattr(accelerator, "parallelism_config", None)
    if kind not in _SUPPORTED or (pc is not None and getattr(pc, "tp_enabled", False)):
        raise ValueError(
            f"{what}: DiLoCo runs on plain data parallelism (DDP or one process), not on "
            f"accelerate's {kind}{' with tensor parallelism' if pc is not None else ''} "
            "(DeepSpeed, FSDP, Megatron-LM, XLA and TP plugins are not supported)"
        )


class _GroupDDPKwargs:
    """accelerate's DDP keyword handler, with DDP's process group set to the node group."""

    def __init__(self, base, group, groups) -> None:
        self.base, self.group, self.cgx_groups = base, group, groups

    def to_kwargs(self) -> dict:
        kwargs = self.base.to_kwargs() if self.base is not None else {}
        kwargs["process_group"] = self.group
        return kwargs

    def register_comm_hook(self, model) -> None:
        if self.base is not None:
            self.base.register_comm_hook(model)

    def __getattr__(self, name):
        base = self.__dict__.get("base")
        if base is None:
            raise AttributeError(name)
        return getattr(base, name)


def node_ddp(accelerator, ranks_per_node: int):
    """Makes the DDP wrapper that ``accelerator.prepare`` builds average gradients inside nodes
    of ``ranks_per_node`` consecutive ranks only; returns (node group, DiLoCo's group).
    Collective (the groups are created on every rank); call it before ``prepare``."""
    check_distributed_type(accelerator, "node_ddp")
    handler = accelerator.ddp_handler
    if isinstance(handler, _GroupDDPKwargs):
        if handler.cgx_groups[0].size() != ranks_per_node:
            raise ValueError("node_ddp was called already with another ranks_per_node")
        return handler.cgx_groups
    inner, outer = node_groups(ranks_per_node)
    if inner is None:
        raise ValueError(
            "node_ddp needs ranks_per_node > 1 (one rank per node: DDP is switched off)"
        )
    accelerator.ddp_handler = _GroupDDPKwargs(handler, inner, (inner, outer))
    return inner, outer


def groups_for(ddp, ranks_per_node: int, handler, what: str):
    """(DiLoCo's group, flat layout?) for a model DDP wraps (or None: one process), checking
    that the wrapper is on the node group when ``ranks_per_node > 1``."""
    if ranks_per_node == 1:
        return None, True
    groups = getattr(handler, "cgx_groups", None)
    if groups is None or ddp is None or ddp.process_group is not groups[0]:
        raise ValueError(
            f"{what}: ranks_per_node={ranks_per_node} needs DDP on the node group: call "
            "torch_cgx.integrations.node_ddp(accelerator, ranks_per_node) before "
            "accelerator.prepare"
        )
    return groups[1], False


class AccelerateDiLoCo:
    """DiLoCo (compressed pseudo-gradients, outer optimizer, error feedback, Streaming DiLoCo's
    fragments) for an accelerate loop, used like ``accelerate.local_sgd.LocalSGD``.

    Args:
        accelerator: the ``Accelerator``; DeepSpeed / FSDP / Megatron / XLA are refused.
        model: the prepared model (DDP or not); DiLoCo works on ``unwrap_model(model)``.
        optimizer: the prepared inner optimizer (saved and restored per rank), or None.
        sync_every, ranks_per_node, manager and the rest:
            :class:`torch_cgx.integrations.diloco.Options`.
        enabled: False: nothing happens (DDP synchronises every step), as with LocalSGD.

    The constructor is a collective (DiLoCo broadcasts rank 0's parameters), except with a
    torchft ``manager`` (no collective; the accelerator's world is this replica group alone,
    its DDP, if any, keeps averaging inside it). Inside the context DDP's gradient
    synchronisation is off (one rank per node, no manager); ``step()`` after each
    optimizer step counts one DiLoCo step when ``accelerator.sync_gradients`` (so with
    ``accelerator.accumulate`` one per accumulated batch). Leaving it without an exception
    syncs once more (``final_sync``).
    """

    def __init__(self, accelerator, model: torch.nn.Module, optimizer=None,
                 sync_every: int = 500, *, enabled: bool = True, **options) -> None:  # fmt: skip
        check_distributed_type(accelerator, "AccelerateDiLoCo")
        self.options = Options(sync_every, **options)
        self.accelerator, self.model, self.optimizer = accelerator, model, optimizer
        self.enabled = bool(enabled)
        self.session: Optional[Session] = None
        self._no_sync = None
        ddp = model if isinstance(model, torch.nn.parallel.DistributedDataParallel) else None
        handler = getattr(accelerator, "ddp_handler", None)
        group, self._flat = groups_for(
            ddp, self.options.ranks_per_node, handler, "AccelerateDiLoCo"
        )
        self._flat = self._flat and self.options.manager is None  # DDP: the replica's own
        self._ddp = ddp
        if self.enabled:
            self.session = Session(accelerator.unwrap_model(model), self.options, group)

    @property
    def diloco(self):
        """The :class:`torch_cgx.diloco.DiLoCo` (None when not enabled)."""
        return None if self.session is None else self.session.diloco

    def __enter__(self) -> AccelerateDiLoCo:
        if self.enabled and self._flat and self._ddp is not None:
            self._no_sync = stop_grad_sync(self._ddp)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self.session is not None:
            self.session.close(ok=exc_type is None)
        if self._no_sync is not None:
            self._no_sync.__exit__(exc_type, exc, tb)
            self._no_sync = None
        return False

    def step(self) -> None:
        """One DiLoCo step if this was an optimizer step (``accelerator.sync_gradients``)."""
        if self.session is not None and self.accelerator.sync_gradients:
            self.session.advance_to(self.session.loop_step + 1)

    def metrics(self) -> dict:
        """``diloco/syncs``, ``diloco/bytes_sent``, ``diloco/bytes_per_sync``, ... (for
        ``accelerator.log``)."""
        return {} if self.session is None else self.session.metrics()

    def save_state(self, folder: str) -> Optional[str]:
        """Writes this rank's state (model replica, inner optimizer, DiLoCo) to
        ``folder/diloco-rank<r>.pt`` (with a manager ``diloco-<replica id>-rank<r>.pt``), beside
        ``accelerator.save_state(folder)`` (which keeps rank 0's model and optimizer only).
        Every rank calls it."""
        return None if self.session is None else self.session.save(folder, self.optimizer)

    def load_state(self, folder: str) -> None:
        """Restores :meth:`save_state`; after ``accelerator.load_state(folder)``, before the
        first step."""
        if self.session is not None:
            self.session.load(folder, self.optimizer)
