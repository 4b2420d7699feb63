"""DiLoCo and Streaming DiLoCo with compressed pseudo-gradients on any torch.distributed group.

>>> from torch_cgx.diloco import DiLoCo
>>> with DiLoCo(model, inner_opt, sync_every=100, compressor="maxmin",
...             compressor_params={"bits": 4}) as diloco:
...     for batch in data:
...         loss = model(batch).sum(); loss.backward(); inner_opt.step(); inner_opt.zero_grad()

Every ``inner_optimizer.step()`` counts (a step post-hook, removed on exit). Each fragment's
pseudo-gradient ``global - local`` is averaged over ``group`` with the compressor every
``sync_every`` inner steps (fragments staggered over the period: :mod:`.streaming`), the outer
optimizer (default: Nesterov SGD, lr 0.7, momentum 0.9, one per fragment) steps from the global
copy, and the fragment takes ``alpha * local + (1 - alpha) * new_global``. docs/diloco.md has
the schedule, the compressors, error feedback, checkpoints and the hierarchical layout.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Union

import torch
import torch.distributed as dist

from torch_cgx.diloco import arguments
from torch_cgx.diloco import state as _state
from torch_cgx.diloco.fragment import Fragment
from torch_cgx.diloco.reduce import Pending, Spec, start_average
from torch_cgx.diloco.streaming import Schedule

__all__ = ["DiLoCo", "Schedule", "hierarchical_groups", "outer_sgd"]

OUTER_LR, OUTER_MOMENTUM = 0.7, 0.9  # DiLoCo's outer Nesterov SGD (arXiv 2311.08105)


def outer_sgd(params, lr: float = OUTER_LR, momentum: float = OUTER_MOMENTUM):
    """DiLoCo's outer optimizer: SGD with Nesterov momentum."""
    return torch.optim.SGD(params, lr=lr, momentum=momentum, nesterov=True)


_FAILED = Pending([], lambda: None)  # a managed reduction that could not start


class DiLoCo:
    """DiLoCo (arXiv 2311.08105) and Streaming DiLoCo (arXiv 2501.18512) as a context manager.

    Args:
        model_fragments: a module, or a list of modules (the fragments of Streaming DiLoCo,
            synced in turn). Parameters may be DTensors (FSDP2): their local shards are used.
        inner_optimizer: the optimizer of the training loop; its ``step()`` counts.
        outer_optimizer: None (Nesterov SGD lr 0.7 momentum 0.9 per fragment), an optimizer
            over the parameters of every fragment (each outer step steps only the syncing
            fragment's), a list of one per fragment, or a factory ``params -> optimizer``
            called per fragment.
        sync_every: inner steps between two syncs of a fragment (H; default 500).
        manager: a torchft ``Manager`` (``use_async_quorum=False``): replicas that leave and
            join (:mod:`.managed`); no default process group needed, and construction issues
            no quorum and no collective. torchft's order, manager first, works too.
        group: the group the replicas average over (None: the default group); any backend.
        compressor: a name of ``torch_cgx.compressors.names()`` or None (exact fp32).
        compressor_params: its parameters (``compressors.params(name)``).
        error_feedback: keep each parameter's compression residual and add it to the next
            pseudo-gradient; None: for biased compressors (``traits["biased"]``).
        fragment_sync_delay: inner steps between the start of a fragment's reduction and its
            outer step (Streaming DiLoCo's tau; 0: blocking); < sync_every // fragments.
        fragment_update_alpha: the fragment becomes ``alpha * local + (1 - alpha) * global``
            after its outer step (torchft's meaning; 0: the global parameters).
        semi_async: each fragment's reduction stays in flight during its whole next window and
            is applied at that window's end (torchft's ``SemiAsyncDiLoCo``'s schedule; the
            pseudo-gradient is taken from the window's starting point, the average one
            window late); ``fragment_sync_delay`` must be 0.
        backup_device, pin_memory: where the global copies live (None: the parameters'
            device); torchft's names. torchft's ``should_quantize=True`` is max-min 8-bit;
            its ``use_bucketization`` / ``bucket_cap_mb`` are accepted (one flat buffer per
            fragment already).

    Without a manager the constructor broadcasts the group's rank 0 parameters (a
    collective): every replica starts from the same point. After a fragment's outer step its
    global copies are bitwise identical on every rank, and so are its parameters when
    ``fragment_update_alpha == 0``.
    """

    def __init__(self, *args, **kwargs) -> None:
        """``DiLoCo(model_fragments, inner_optimizer, outer_optimizer=None, sync_every=500, *,
        manager=None, group=None, compressor="maxmin", ...)`` or torchft's order
        ``DiLoCo(manager, model_fragments, inner_optimizer, outer_optimizer, sync_every, ...)``
        (:mod:`.arguments`)."""
        self._setup(**arguments.torchft_order(args, kwargs))

    def _setup(
        self,
        model_fragments: Union[torch.nn.Module, Sequence[torch.nn.Module]],
        inner_optimizer: torch.optim.Optimizer,
        outer_optimizer: Union[None, torch.optim.Optimizer, Sequence, Callable] = None,
        sync_every: int = 500,
        *,
        manager=None,
        group: Optional[dist.ProcessGroup] = None,
        compressor: Optional[str] = "maxmin",
        compressor_params: Optional[dict] = None,
        error_feedback: Optional[bool] = None,
        fragment_sync_delay: int = 0,
        fragment_update_alpha: float = 0.0,
        backup_device: Optional[torch.device] = None,
        pin_memory: bool = True,
        semi_async: bool = False,
    ) -> None:
        modules = arguments.fragments(model_fragments)
        if not isinstance(semi_async, bool):
            raise ValueError(f"semi_async must be a bool, got {semi_async!r}")
        if semi_async and fragment_sync_delay:
            raise ValueError(
                "semi_async=True overlaps each reduction with the whole next window: "
                f"fragment_sync_delay must be 0, got {fragment_sync_delay!r}"
            )
        self.semi_async = semi_async
        if not isinstance(inner_optimizer, torch.optim.Optimizer):
            got = type(inner_optimizer).__name__
            raise ValueError(f"inner_optimizer must be a torch.optim.Optimizer, got {got}")
        self.schedule = Schedule(sync_every, len(modules), fragment_sync_delay)
        alpha = fragment_update_alpha
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1:
            raise ValueError(f"fragment_update_alpha must be a number in [0, 1], got {alpha!r}")
        self.spec = Spec(compressor, compressor_params)
        if error_feedback is not None and not isinstance(error_feedback, bool):
            raise ValueError(f"error_feedback must be a bool or None, got {error_feedback!r}")
        if error_feedback and self.spec.name is None:
            raise ValueError("error_feedback=True needs a compressor (compressor=None is exact)")
        if error_feedback is None:
            error_feedback = bool(self.spec.traits["biased"])
        if manager is not None and group is not None:
            raise ValueError("give manager= or group=, not both (the manager has its group)")
        if group is not None and not isinstance(group, dist.ProcessGroup):
            raise ValueError(f"group must be a ProcessGroup or None, got {group!r}")
        if manager is not None and not arguments.is_manager(manager):
            raise ValueError(f"manager must be a torchft Manager or None, got {manager!r}")
        backup = None if backup_device is None else (torch.device(backup_device), pin_memory)
        self.group = group
        self.error_feedback = error_feedback
        self.fragment_update_alpha = float(alpha)
        self.inner_optimizer = inner_optimizer
        optimizers = arguments.outer_optimizers(outer_optimizer, modules, outer_sgd)
        self._fragments = [
            Fragment(i, m, o, backup) for i, (m, o) in enumerate(zip(modules, optimizers))
        ]
        self.step = 0  # inner steps taken
        self.payload_bytes = 0  # this rank's compressed pseudo-gradient bytes, all syncs
        self._hooks: list = []
        self._managed = None
        if manager is not None:  # no collective, no quorum: a replica may join mid-period
            from torch_cgx.diloco.managed import Managed

            self._managed = Managed(manager, self)
            return
        if not dist.is_initialized():
            raise ValueError("DiLoCo needs torch.distributed initialized (init_process_group)")
        src = dist.get_global_rank(self._group(), 0) if group is not None else 0
        for frag in self._fragments:
            frag.broadcast(group, src)

    def _group(self) -> dist.ProcessGroup:
        return self.group if self.group is not None else dist.group.WORLD

    @property
    def num_fragments(self) -> int:
        return len(self._fragments)

    @property
    def outer_optimizers(self) -> list:
        return [f.optimizer for f in self._fragments]

    def global_parameters(self, fragment: int = 0) -> dict:
        """The global copies of fragment ``fragment`` by parameter name (local shards)."""
        frag = self._fragments[fragment]
        return dict(zip(frag.names, frag.globals))

    # --- the context manager -----------------------------------------------------------------

    def __enter__(self) -> DiLoCo:
        if self._hooks:
            raise RuntimeError("this DiLoCo is already entered")
        self._hooks.append(self.inner_optimizer.register_step_post_hook(self._after_step))
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        """Removes the hook. Without an exception it also waits for a reduction in flight (no
        collective outlives the context; the result is applied at its step if the loop is
        entered again, or by ``sync_now()``); with one it leaves it (a peer may be gone)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        if exc_type is None and self._managed is None:
            for frag in self._fragments:
                if frag.pending is not None:
                    frag.pending.wait()
                    frag.take_residuals()
        elif exc_type is None:  # with a manager the commit decides: applied or discarded later
            for frag in self._fragments:
                self._managed.settle(frag.pending)
        return False

    def _after_step(self, _optimizer, _args, _kwargs) -> None:
        self.step += 1
        if self.semi_async:
            for f in self.schedule.applies_at(self.step):
                self._window_end(self._fragments[f])
            return
        starts = self.schedule.starts_at(self.step)
        contributes = True
        if starts and self._managed is not None:
            contributes = self._managed.quorum()  # a heal replaces the step and the state
            starts = self.schedule.starts_at(self.step)
        for f in starts:
            self._start(self._fragments[f], contributes)
        for f in self.schedule.applies_at(self.step):
            self._apply(self._fragments[f])

    # --- a sync ------------------------------------------------------------------------------

    def _start(self, frag: Fragment, contributes: bool = True) -> None:
        if frag.pending is not None:  # cannot happen with a valid schedule
            raise RuntimeError(f"fragment {frag.index}: a reduction is already in flight")
        self._issue(frag, frag.pseudo_gradient(self.error_feedback), contributes)

    def _issue(self, frag: Fragment, flat: torch.Tensor, contributes: bool) -> None:
        call = frag.syncs * self.num_fragments + frag.index  # the same on every rank
        if self._managed is not None:
            frag.pending = self._managed.start(
                flat, self.spec, contributes, frag.new_residual, call
            )
            frag.pending = frag.pending or _FAILED
        else:
            frag.pending = start_average(
                self.group, flat, self.spec, residual=frag.new_residual, call=call
            )
        self.payload_bytes += frag.pending.payload_bytes

    def _apply(self, frag: Fragment) -> None:
        if frag.pending is None:  # cannot happen with a valid schedule
            raise RuntimeError(f"fragment {frag.index}: nothing to apply")
        pending, frag.pending = frag.pending, None
        average = self._finish(frag, pending)
        if average is None:  # discarded: back to the last committed global copies
            frag.restore()
            return
        frag.outer_step(average, self.fragment_update_alpha)

    def _finish(self, frag: Fragment, pending) -> Optional[torch.Tensor]:
        """The average of ``pending`` (its residual taken), or None when a manager's commit
        refused it (the residual it would have given is dropped)."""
        if self._managed is None:
            average = pending.wait()
        else:
            average = self._managed.finish(None if pending is _FAILED else pending)
        if average is None:
            frag.new_residual = None
        else:
            frag.take_residuals()
        return average

    def _window_end(self, frag: Fragment) -> None:
        """Semi-asynchronous DiLoCo at the end of one of ``frag``'s windows: the reduction
        started at the end of the previous window (in flight during all of this one) is
        finished; this window's pseudo-gradient is taken against the window's starting point
        (the global copies, not yet moved); the previous average is applied (outer step and
        mix; without one, the parameters are mixed with the unmoved global copies, so every
        window starts from them); then this window's reduction starts (with a manager after the
        quorum, so that a heal takes the state of a peer that already applied the previous
        average)."""
        pending, frag.pending = frag.pending, None
        average = self._finish(frag, pending) if pending is not None else None
        flat = frag.pseudo_gradient(self.error_feedback)
        if average is not None:
            frag.outer_step(average, self.fragment_update_alpha)
        else:  # the first window, or a discarded one: the next starts from the global copies
            frag.mix(self.fragment_update_alpha)
        contributes = True
        if self._managed is not None:
            contributes = self._managed.quorum()
            if self._managed.healed:  # a peer's step and state now: its fragment, not ours
                frag = self._fragments[self.schedule.applies_at(self.step)[0]]
                flat = frag.pseudo_gradient(self.error_feedback)  # not sent: sizes the call
        self._issue(frag, flat, contributes)

    @property
    def syncs_discarded(self) -> int:
        """Syncs this replica discarded (with a manager: a sync that failed or was not
        committed; its fragment went back to the last committed global copies)."""
        return 0 if self._managed is None else self._managed.discarded

    def sync_now(self) -> None:
        """Starts and applies every fragment's sync at once, outside the schedule (e.g. before
        evaluating or saving a final model); a reduction in flight is applied first. Every rank
        must call it at the same point."""
        for frag in self._fragments:
            if frag.pending is not None:
                self._apply(frag)
        for frag in self._fragments:
            contributes = self._managed.quorum() if self._managed is not None else True
            self._start(frag, contributes)
            self._apply(frag)

    # --- checkpoints -------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Outer optimizers, global copies, residuals, inner-step count, the schedule and a
        finished reduction not yet applied (docs/diloco.md#checkpoints)."""
        return _state.save(self)

    def load_state_dict(self, state: dict) -> None:
        _state.load(self, state)


def hierarchical_groups(ranks_per_node: int, inner_backend=None, outer_backend=None):
    """(inner, outer) groups of this rank for DDP inside a node and DiLoCo across nodes:
    ``inner`` holds the ``ranks_per_node`` consecutive ranks of this rank's node, ``outer``
    the ranks with this rank's local index on every node. Collective: every rank calls it
    (each group is created on all ranks, in one order)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    n = ranks_per_node
    if isinstance(n, bool) or not isinstance(n, int) or n < 1 or world % n:
        raise ValueError(f"ranks_per_node must divide the world size {world}, got {n!r}")
    inner = outer = None
    for node in range(world // n):
        g = dist.new_group(list(range(node * n, node * n + n)), backend=inner_backend)
        inner = g if rank // n == node else inner
    for local in range(n):
        g = dist.new_group(list(range(local, world, n)), backend=outer_backend)
        outer = g if rank % n == local else outer
    return inner, outer
