"""DiLoCo under transformers' Trainer: :class:`DiLoCoCallback` and :func:`attach_diloco`.

    trainer = Trainer(model=model, args=args, train_dataset=data)
    attach_diloco(trainer, sync_every=100, compressor="maxmin", compressor_params={"bits": 4})
    trainer.train()                   # resume_from_checkpoint=... restores DiLoCo too

Trainer's optimizer is DiLoCo's inner optimizer; one DiLoCo step is one Trainer step
(``global_step``: with gradient accumulation, one per accumulated batch). Trainer's DDP wrapper
keeps its place; with one rank per node its gradient synchronisation is off for the run, with
``ranks_per_node=n`` it is built on the node group (:func:`.diloco_accelerate.node_ddp`).
Every checkpoint gets ``diloco-rank<r>.pt`` per rank (Trainer saves rank 0's model and
optimizer only, and DiLoCo's replicas differ between syncs). On torchft (``manager=``) Trainer's
world is one replica group: its DDP stays on, the files are ``diloco-<replica id>-rank<r>.pt``.
"""

from __future__ import annotations

import os
from typing import Optional

import torch
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from torch_cgx.integrations.diloco import Options, Session, _rank, state_file, stop_grad_sync
from torch_cgx.integrations.diloco_accelerate import check_distributed_type, groups_for, node_ddp

__all__ = ["DiLoCoCallback", "attach_diloco"]


def _ddp_of(model) -> Optional[torch.nn.parallel.DistributedDataParallel]:
    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper
    return model if isinstance(model, torch.nn.parallel.DistributedDataParallel) else None


class DiLoCoCallback(TrainerCallback):
    """Trains a Trainer with DiLoCo (see the module). Arguments: those of
    :class:`torch_cgx.integrations.diloco.Options` (``sync_every``, ``compressor``,
    ``compressor_params``, ``outer_optimizer``, ``ranks_per_node``, ``fragments``,
    ``final_sync``, ``manager`` and DiLoCo's other keywords). Bind it to its trainer
    (:func:`attach_diloco` or ``bind``) before ``train()``; ``session.diloco`` is the DiLoCo
    once training started.

    Logs (every Trainer log): ``diloco/step``, ``diloco/syncs``, ``diloco/bytes_sent``,
    ``diloco/bytes_per_sync``, ``diloco/sync_seconds``; rank 0 prints a summary at the end.
    """

    def __init__(self, sync_every: int = 500, *, summary: bool = True, **options) -> None:
        self.options = Options(sync_every, **options)
        self.summary = summary
        self.trainer = None
        self.session: Optional[Session] = None
        self._group = None
        self._no_sync = None
        self._resume_dir: Optional[str] = None

    # -- before train() -----------------------------------------------------------------------

    def bind(self, trainer) -> DiLoCoCallback:
        """Checks the trainer, sets up the layout and puts this callback first among the
        trainer's callbacks (before the loggers, which then see its metrics). Collective with
        ``ranks_per_node > 1`` (the groups are created)."""
        args = trainer.args
        flags = (getattr(trainer, "is_deepspeed_enabled", False),
                 getattr(trainer, "is_fsdp_enabled", False), getattr(args, "deepspeed", None),
                 getattr(args, "fsdp", None))  # fmt: skip
        if any(flags):
            raise ValueError(
                "attach_diloco: Trainer runs DeepSpeed or FSDP; DiLoCo keeps a full replica per "
                "worker and runs on plain data parallelism (leave deepspeed / fsdp unset)"
            )
        check_distributed_type(trainer.accelerator, "attach_diloco")
        if args.n_gpu > 1:
            raise ValueError("attach_diloco: one process per device (torchrun), not DataParallel")
        from torch_cgx.integrations.transformers import CGXCallback, note_resume_dir

        if any(isinstance(c, CGXCallback) and c.hook is not None
               for c in trainer.callback_handler.callbacks):  # fmt: skip
            raise ValueError("attach_diloco: a DDP hook (attach(trainer, hook=...)) and DiLoCo "
                             "do not combine; attach(trainer) for the cgx stats does")  # fmt: skip
        if self.options.ranks_per_node > 1:
            node_ddp(trainer.accelerator, self.options.ranks_per_node)
        if self.options.manager is None:  # (with one, Trainer's world is one replica: DDP)
            # Trainer would gather every worker's token count each step and scale the loss by it
            args.average_tokens_across_devices = False
        self.trainer = trainer
        callbacks = trainer.callback_handler.callbacks
        if self in callbacks:
            callbacks.remove(self)
        callbacks.insert(0, self)
        note_resume_dir(trainer, self)
        return self

    # -- training -----------------------------------------------------------------------------

    def on_train_begin(self, args, state, control, **kwargs):
        if self.trainer is None:
            raise ValueError(
                "DiLoCoCallback needs its trainer: torch_cgx.integrations.attach_diloco(trainer, "
                "...) or callback.bind(trainer), before train()"
            )
        if self.session is not None:
            self._end(ok=False)  # an earlier train() that failed
        ddp = _ddp_of(self.trainer.model_wrapped)
        handler = self.trainer.accelerator.ddp_handler
        group, flat = groups_for(ddp, self.options.ranks_per_node, handler, "attach_diloco")
        if flat and ddp is not None and self.options.manager is None:
            self._no_sync = stop_grad_sync(ddp)
        self.session = Session(self.trainer.model, self.options, group)  # collective
        if state.global_step > 0:
            folder = self._checkpoint_dir(args, state)
            self.session.load(folder, self.trainer.optimizer, state.global_step)

    def _checkpoint_dir(self, args, state) -> str:
        step_dir = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        replica = self.options.replica
        for d in (self._resume_dir, args.resume_from_checkpoint, step_dir):
            if isinstance(d, str) and os.path.isfile(state_file(d, _rank(), replica)):
                return d
        raise ValueError(
            f"resuming at step {state.global_step} without this rank's DiLoCo state "
            f"(diloco-{self.session.tag}.pt in {self._resume_dir or step_dir}): the replicas, "
            "inner optimizers and DiLoCo's global copies cannot be restored"
        )

    def on_step_end(self, args, state, control, **kwargs):
        self.session.advance_to(state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.session is None:
            return
        extra = self.session.metrics()
        if logs is not None:
            logs.update(extra)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(extra)

    def on_save(self, args, state, control, **kwargs):
        if self.session is not None and not self.session.closed:
            folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
            self.session.save(folder, self.trainer.optimizer)

    def on_train_end(self, args, state, control, **kwargs):
        # load_best_model_at_end put rank 0's best replica on every rank: no final sync then
        best = args.load_best_model_at_end and state.best_model_checkpoint is not None
        self._end(ok=True, sync=not best)
        if self.summary and _rank() == 0:
            print(self.session.summary(), flush=True)

    def _end(self, ok: bool, sync: bool = True) -> None:
        self.session.close(ok=ok, sync=sync)
        if self._no_sync is not None:
            self._no_sync.__exit__(None, None, None)
            self._no_sync = None


def attach_diloco(trainer, sync_every: int = 500, **options) -> DiLoCoCallback:
    """A :class:`DiLoCoCallback` (``sync_every`` and ``options`` as there) bound to ``trainer``,
    first among its callbacks; returns it. Call it on every rank, before ``trainer.train()``."""
    return DiLoCoCallback(sync_every, **options).bind(trainer)
