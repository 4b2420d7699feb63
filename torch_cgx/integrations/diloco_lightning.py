"""DiLoCo under Lightning: :class:`DiLoCoStrategy`, Lightning's DDPStrategy with DiLoCo across
workers.

    trainer = L.Trainer(accelerator="cpu", devices=4,
                        strategy=DiLoCoStrategy(sync_every=100, compressor="maxmin",
                                                compressor_params={"bits": 4}))

One DiLoCo step is one optimizer step (with ``accumulate_grad_batches``, one per accumulated
batch); the LightningModule's single optimizer is the inner optimizer. With one rank per node
DDP's gradient synchronisation is off for the run; ``ranks_per_node=n`` builds the DDP wrapper
on the node group. Every checkpoint file ``X`` gets ``X.diloco-rank<r>.pt`` per rank, restored
by ``fit(ckpt_path=X)``. On torchft (``manager=``) the Trainer's world is one replica group: DDP
stays on inside it, the files are ``X.diloco-<replica id>-rank<r>.pt``.
``strategy_class("pytorch_lightning")`` gives the other package's flavour (as
:func:`torch_cgx.lightning.strategy_class`).
"""

from __future__ import annotations

import functools
import os
from typing import Optional

import torch

from torch_cgx.integrations.diloco import (
    Options,
    Session,
    _rank,
    file_tag,
    node_groups,
    stop_grad_sync,
)
from torch_cgx.lightning import _PACKAGES, installed_package, lightning_subclass

__all__ = ["DiLoCoStrategy", "rank_file", "strategy_class"]  # noqa: F822 (DiLoCoStrategy: lazy)


def rank_file(checkpoint_path, rank: int, replica: Optional[str] = None) -> str:
    """Where a rank's DiLoCo state goes beside a Lightning checkpoint file (``replica``: the
    manager's replica id, :func:`torch_cgx.integrations.diloco.file_tag`)."""
    return f"{os.fspath(checkpoint_path)}.diloco-{file_tag(rank, replica)}.pt"


@functools.cache
def strategy_class(package: str = "auto") -> type:
    """``DiLoCoStrategy`` for ``package``: "lightning", "pytorch_lightning" or "auto"."""
    if package == "auto":
        return strategy_class(installed_package(package, "DiLoCoStrategy"))
    return lightning_subclass(package, "strategies.DDPStrategy", _DiLoCoMixin, "DiLoCoStrategy",
                              __name__)  # fmt: skip


class _DiLoCoMixin:
    """What DiLoCoStrategy adds to Lightning's DDPStrategy.

    Args: ``sync_every``, ``compressor``, ``compressor_params``, ``outer_optimizer``,
    ``ranks_per_node``, ``fragments``, ``final_sync``, ``manager`` (torchft) as in
    :class:`torch_cgx.integrations.diloco.Options`; ``diloco_kwargs``: DiLoCo's other keywords;
    the rest goes to DDPStrategy (``process_group_backend``, DDP's keywords, ...).
    ``strategy.session.diloco`` is the DiLoCo once training started; the loggers get
    ``diloco/...`` every ``log_every_n_steps`` steps.
    """

    strategy_name = "cgx_diloco"

    def __init__(self, sync_every: int = 500, *, compressor: Optional[str] = "maxmin",
                 compressor_params: Optional[dict] = None, outer_optimizer=None,
                 ranks_per_node: int = 1, fragments=None, final_sync: bool = True,
                 manager=None, diloco_kwargs: Optional[dict] = None,
                 **kwargs) -> None:  # fmt: skip
        for name in ("ddp_comm_hook", "ddp_comm_state", "model_averaging_period", "process_group"):
            if kwargs.get(name) is not None:
                raise ValueError(f"DiLoCoStrategy sets DDP up itself: {name} is not taken")
        if diloco_kwargs is not None and not isinstance(diloco_kwargs, dict):
            raise ValueError(f"diloco_kwargs must be a dict, got {diloco_kwargs!r}")
        self.diloco_options = Options(sync_every, compressor=compressor,
                                      compressor_params=compressor_params,
                                      outer_optimizer=outer_optimizer,
                                      ranks_per_node=ranks_per_node, fragments=fragments,
                                      final_sync=final_sync, manager=manager,
                                      **(diloco_kwargs or {}))  # fmt: skip
        super().__init__(**kwargs)
        self.session: Optional[Session] = None
        self._outer = None
        self._no_sync = None
        self._resume: Optional[dict] = None

    def setup(self, trainer) -> None:
        n = self.diloco_options.ranks_per_node
        if n > 1 and self._outer is None:
            inner, self._outer = node_groups(n)  # collective; the default group exists now
            self._ddp_kwargs["process_group"] = inner
        super().setup(trainer)
        if self.model is not None and isinstance(
            self.model, torch.nn.parallel.DistributedDataParallel
        ):
            if len(self.optimizers) != 1:
                raise ValueError(
                    f"DiLoCoStrategy trains with one optimizer, got {len(self.optimizers)}"
                )
            if n == 1 and self.diloco_options.manager is None:  # (with one: the replica's DDP)
                self._no_sync = stop_grad_sync(self.model)

    def on_train_start(self) -> None:
        super().on_train_start()
        step = self.lightning_module.trainer.global_step
        if step > 0 and self._resume is None:
            raise ValueError(
                f"resuming at step {step} without this rank's DiLoCo state (the checkpoint's "
                f".diloco-{self._tag()}.pt): replicas and DiLoCo's state cannot be restored"
            )
        self.session = Session(self.lightning_module, self.diloco_options, self._outer)
        if self._resume is not None:
            self.session.load_state_dict(self._resume, self._inner(), step)
            self._resume = None

    def _file(self, checkpoint_path) -> str:
        return rank_file(checkpoint_path, _rank(), self.diloco_options.replica)

    def _tag(self) -> str:
        return file_tag(_rank(), self.diloco_options.replica)

    def _inner(self):
        return self.optimizers[0] if len(self.optimizers) == 1 else None

    def optimizer_step(self, optimizer, closure, model=None, **kwargs):
        out = super().optimizer_step(optimizer, closure, model, **kwargs)
        if self.session is not None and not self.session.closed:
            self.session.advance_to(self.session.loop_step + 1)
            trainer = self.lightning_module.trainer
            if self.session.step % max(trainer.log_every_n_steps, 1) == 0:
                for logger in trainer.loggers:
                    logger.log_metrics(self.session.metrics(), step=self.session.step)
        return out

    # -- checkpoints: one file per rank beside Lightning's ------------------------------------

    def save_checkpoint(self, checkpoint, filepath, storage_options=None) -> None:
        super().save_checkpoint(checkpoint, filepath, storage_options=storage_options)
        if self.session is not None and not self.session.closed:
            path = self._file(filepath)
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)  # rank 0 may not have yet
            torch.save(self.session.state_dict(self._inner()), path)

    def remove_checkpoint(self, filepath) -> None:
        super().remove_checkpoint(filepath)
        path = self._file(filepath)
        if os.path.isfile(path):
            os.remove(path)

    def load_checkpoint(self, checkpoint_path, *args, **kwargs):
        checkpoint = super().load_checkpoint(checkpoint_path, *args, **kwargs)
        path = self._file(checkpoint_path)
        if os.path.isfile(path):
            self._resume = torch.load(path, map_location="cpu", weights_only=True)
        return checkpoint

    # -- the end ------------------------------------------------------------------------------

    def on_train_end(self) -> None:
        super().on_train_end()
        self._end(ok=True)
        if self.session is not None and _rank() == 0:
            print(self.session.summary(), flush=True)

    def on_exception(self, exception: BaseException) -> None:
        self._end(ok=False)
        super().on_exception(exception)

    def _end(self, ok: bool) -> None:
        if self.session is not None:
            self.session.close(ok=ok)
        if self._no_sync is not None:
            self._no_sync.__exit__(None, None, None)
            self._no_sync = None


def __getattr__(name: str):
    if name == "DiLoCoStrategy":
        return strategy_class("auto")
    if name.startswith("_DiLoCoStrategy_") and name[len("_DiLoCoStrategy_") :] in _PACKAGES:
        return strategy_class(name[len("_DiLoCoStrategy_") :])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
