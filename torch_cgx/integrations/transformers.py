"""transformers' Trainer on torch_cgx: :class:`CGXCallback` (a hook on the model Trainer wraps,
saved and restored with Trainer's checkpoints) and :class:`CGXStatsCallback` (what compression
saved, as metrics for the loggers Trainer reports to).

    init_cgx(bits=4)                           # torch_cgx.integrations: the cgx group first
    trainer = Trainer(model=model, args=args, train_dataset=data)
    attach(trainer)                            # the backend compresses; stats as metrics
    attach(trainer, hook="cgx", bits=4)        # or a hook: "cgx", "compression", "powersgd",
                                               # a compressor name, or a hook state
    trainer.train()                            # resume_from_checkpoint restores the hook state

A callback needs its trainer (Trainer hands callbacks the unwrapped model, the hook goes on the
DDP wrapper ``trainer.model_wrapped``): :func:`attach` makes one, binds it and puts it first
among the trainer's callbacks (so the loggers' callbacks, which run after it, see its metrics).
"""

from __future__ import annotations

import functools
import os
from typing import Any, Dict, Optional

import torch
import torch.distributed as dist
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from torch_cgx import hook_stats, warn
from torch_cgx.integrations.metrics import StatsMetrics

__all__ = ["CGXCallback", "CGXStatsCallback", "attach", "hook_file"]


def hook_file(checkpoint_dir: str, rank: int) -> str:
    """Where a rank's hook state goes in a Trainer checkpoint (each rank has its own residuals)."""
    return os.path.join(checkpoint_dir, f"cgx_hook_state-rank{rank}.pt")


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


class CGXStatsCallback(TrainerCallback):
    """Writes the cgx group's counters (``torch_cgx.stats()``) and those of the hook states in
    ``states`` into every log of Trainer (``cgx/bytes_sent``, ``cgx/ratio``,
    ``cgx/bytes_per_step``, ...; ``cgx_hook/...`` for a hook state), so TensorBoard, W&B and
    the console get them; ``summary``: rank 0 prints the one-line stats at the end of training.
    Bound to the trainer (:func:`attach`), it runs before the loggers' callbacks; added
    through ``callbacks=[...]`` it runs after them and its metrics reach ``log_history``."""

    def __init__(self, states=(), *, summary: bool = True) -> None:
        self.summary, self.trainer = summary, None
        self._metrics = StatsMetrics(states)

    @property
    def states(self) -> list:
        return self._metrics.states

    @states.setter
    def states(self, value) -> None:
        self._metrics.states = list(value)

    def bind(self, trainer) -> CGXStatsCallback:
        """Binds the trainer and puts this callback first among its callbacks."""
        self.trainer = trainer
        callbacks = trainer.callback_handler.callbacks
        if self in callbacks:
            callbacks.remove(self)
        callbacks.insert(0, self)
        return self

    def metrics(self, global_step: int) -> Dict[str, float]:
        """The numbers logged at ``global_step``: cumulative counters, ratio, bytes per step
        since the previous log (:class:`torch_cgx.integrations.metrics.StatsMetrics`)."""
        return self._metrics.metrics(global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        extra = self.metrics(state.global_step)
        if logs is not None:
            logs.update(extra)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(extra)

    def on_train_end(self, args, state, control, **kwargs):
        if self.summary and _rank() == 0:
            print(self._metrics.summary(), flush=True)


def _make_state(hook, module: torch.nn.Module, bits: Optional[int], params: Optional[dict]):
    """(state, hook function, needs a cgx group) for ``hook`` (see :class:`CGXCallback`)."""
    from torch_cgx import hooks
    from torch_cgx.lightning import make_hook

    params = dict(params or {})
    if hook == "cgx":
        cp = {k: params.pop(k) for k in ("bucket_size", "stochastic") if k in params}
        if bits is not None:
            cp["bits"] = bits
        return hooks.CGXState(None, compression_params=cp, module=module, **params), \
            hooks.cgx_hook, True  # fmt: skip
    if hook == "powersgd":
        params.setdefault("start_powerSGD_iter", 2)
        if bits is not None:
            params["quantize_bits"] = bits
        state = hooks.PowerSGDState(None, module=module, **params)
        return state, hooks.powerSGD_hook, bits is not None
    if hook == "compression":
        hook = params.pop("compressor", "maxmin")
    if isinstance(hook, str) and hook == "maxmin" and bits is not None:
        params["bits"] = bits
    elif bits is not None and isinstance(hook, str):
        raise ValueError(f"bits goes with hook='cgx', 'powersgd' or 'maxmin', not {hook!r}")
    state, fn = make_hook(hook, module, params or None)
    return state, fn, not isinstance(state, hooks.PowerSGDState) or state.quantize_bits is not None


def note_resume_dir(trainer, owner) -> None:
    """Wraps ``trainer.train`` so that ``owner._resume_dir`` is the checkpoint directory that
    ``train(resume_from_checkpoint=...)`` resumes from (``True``: the last one; None: none).
    Once per owner."""
    train = trainer.train
    if getattr(train, "__cgx_owner__", None) is owner:
        return

    @functools.wraps(train)
    def bound_train(resume_from_checkpoint=None, *args, **kwargs):
        path = resume_from_checkpoint
        if isinstance(path, bool):
            path = get_last_checkpoint(trainer.args.output_dir) if path else None
        owner._resume_dir = path
        return train(resume_from_checkpoint, *args, **kwargs)

    bound_train.__cgx_owner__ = owner
    trainer.train = bound_train


class CGXCallback(CGXStatsCallback):
    """Registers a torch_cgx DDP hook on the model Trainer wraps (at ``on_train_begin``), saves
    its state in every Trainer checkpoint (``on_save``: one file per rank, :func:`hook_file`)
    and restores it when training resumes from one, bit for bit; logs the stats
    (:class:`CGXStatsCallback`) and tells once when nothing is compressed (torch_cgx.warn).

    Args:
        hook: None (the backend's settings compress DDP's allreduce), ``"cgx"`` (CGXState +
            cgx_hook), ``"powersgd"`` (PowerSGDState, ``start_powerSGD_iter`` 2 unless given),
            ``"compression"`` (``params["compressor"]``, default max-min), a compressor name
            (``"topk"``, ...: compression_hook), or a state object (CGXState, CompressionState,
            PowerSGDState, PolicyState) used as it is.
        bits: max-min bits of ``"cgx"`` / ``"maxmin"`` / ``"compression"`` (max-min), P and Q
            quantized to ``bits`` with ``"powersgd"``.
        params: the state's other keywords (compressor parameters for a compressor name).
        check_after: optimizer steps after which a hook that never ran, or a compressing group
            that compressed nothing, is reported (once).
    """

    def __init__(self, hook=None, *, bits: Optional[int] = None, params: Optional[dict] = None,
                 check_after: int = 10, summary: bool = True) -> None:  # fmt: skip
        super().__init__(summary=summary)
        if isinstance(check_after, bool) or not isinstance(check_after, int) or check_after < 1:
            raise ValueError(f"check_after must be an integer >= 1, got {check_after!r}")
        if params is not None and not isinstance(params, dict):
            raise ValueError(f"params must be a dict, got {params!r}")
        if hook is not None and not isinstance(hook, str) and (params, bits) != (None, None):
            raise ValueError("params and bits go with a hook name, not with a state object")
        if hook is None and bits is not None:
            raise ValueError("bits goes with a hook; the backend's: init_cgx(bits=...)")
        self.hook, self.bits, self.params, self.check_after = hook, bits, params, check_after
        self.state = None
        self._resume_dir: Optional[str] = None
        self._check_at: Optional[int] = None
        self._compressed0 = 0

    def bind(self, trainer) -> CGXCallback:
        """Binds the trainer (first among its callbacks) and notes which checkpoint
        ``trainer.train(resume_from_checkpoint=...)`` resumes from."""
        super().bind(trainer)
        note_resume_dir(trainer, self)
        return self

    # -- registration and resume ------------------------------------------------------------

    def _ddp(self):
        if self.trainer is None:
            raise ValueError(
                "CGXCallback needs its trainer (the hook goes on trainer.model_wrapped): use "
                "torch_cgx.integrations.attach(trainer, ...) or callback.bind(trainer)"
            )
        model = self.trainer.model_wrapped
        return model if isinstance(model, torch.nn.parallel.DistributedDataParallel) else None

    def _saved_state_path(self, args, state) -> Optional[str]:
        dirs = [
            self._resume_dir,
            args.resume_from_checkpoint,
            os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"),
        ]
        for d in dirs:
            if isinstance(d, str) and os.path.isfile(hook_file(d, _rank())):
                return hook_file(d, _rank())
        return None

    def _restore(self, args, state, module) -> None:
        if state.global_step == 0 or self.state is None:
            return
        path = self._saved_state_path(args, state)
        if path is None:
            msg = (
                f"resuming at step {state.global_step} without a saved hook state "
                "(cgx_hook_state-rank*.pt): the hook starts afresh"
            )
            warn.warn_once(("resume", id(self)), msg)
            return
        saved = torch.load(path)  # weights_only: the states are safe globals
        if isinstance(saved, dict) and "policy_state" in saved:
            self.state.load_state_dict(saved["policy_state"])
            return
        if type(saved) is not type(self.state):
            raise ValueError(f"{path} holds a {type(saved).__name__}, the callback a "
                             f"{type(self.state).__name__}")  # fmt: skip
        if hasattr(saved, "attach"):
            saved.attach(module, None)
        self.state = saved

    def on_train_begin(self, args, state, control, **kwargs):
        self._check_at = state.global_step + self.check_after
        if self.hook is None:  # works unbound too (callbacks=[CGXCallback()])
            warn.check_group(None, "Trainer")
            self._compressed0 = self._group_compressed()
            return
        ddp = self._ddp()
        if ddp is None:
            self._check_at = None
            msg = "Trainer's model is not DistributedDataParallel (one process?): no hook"
            warn.warn_once(("no-ddp", id(self)), msg)
            return
        self.state, fn, needs_cgx = _make_state(self.hook, ddp.module, self.bits, self.params)
        import torch_cgx

        if needs_cgx and not torch_cgx.is_cgx_group():
            raise ValueError(
                f"hook {self.hook!r} runs on a cgx group, and Trainer's group uses backend "
                f"{dist.get_backend()!r}: call torch_cgx.integrations.init_cgx() before "
                "TrainingArguments"
            )
        self._restore(args, state, ddp.module)
        self.states = [self.state]
        ddp.register_comm_hook(self.state, hook_stats.counted(fn, self.state))

    def on_save(self, args, state, control, **kwargs):
        if self.state is None:
            return
        folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        os.makedirs(folder, exist_ok=True)
        from torch_cgx.compression import PolicyState

        saved: Any = self.state  # PolicyState holds codec objects: its state_dict() instead
        if isinstance(self.state, PolicyState):
            saved = {"policy_state": self.state.state_dict()}
        torch.save(saved, hook_file(folder, _rank()))

    # -- nothing compressed? ----------------------------------------------------------------

    def _group_compressed(self) -> int:
        import torch_cgx

        return torch_cgx.stats().calls_compressed if torch_cgx.is_cgx_group() else 0

    def on_step_end(self, args, state, control, **kwargs):
        if self._check_at is None or state.global_step < self._check_at:
            return
        self._check_at = None
        n = self.check_after
        if self.state is not None:
            if hook_stats.hook_stats(self.state).buckets == 0:
                msg = (
                    f"the {type(self.state).__name__} hook did not run in {n} steps: nothing it "
                    "was to compress was compressed (is it registered on the model that trains?)"
                )
                warn.warn_once(("hook-never-ran", id(self.state)), msg)
            return
        ddp = self._ddp() if self.trainer is not None else None
        if (ddp is not None and ddp._comm_hooks) or not self._group_compresses():
            return  # a hook of the user's: its own matter
        if self._group_compressed() == self._compressed0:
            from torch_cgx.counters import plan

            msg = (
                f"the cgx group's settings compress ({plan()}), but no allreduce of the last {n} "
                "steps was compressed (every gradient bucket under min_size, or not float?)"
            )
            warn.warn_once(("group-compressed-nothing",), msg)

    def _group_compresses(self) -> bool:
        import torch_cgx

        if not torch_cgx.is_cgx_group():
            return False
        from torch_cgx.counters import plan

        return plan() != "exact"


def attach(trainer, hook=None, **kwargs) -> CGXCallback:
    """A :class:`CGXCallback` (``hook`` and ``kwargs`` as there), bound to ``trainer`` and first
    among its callbacks; returns it (``.state`` is the hook state once training started)."""
    return CGXCallback(hook, **kwargs).bind(trainer)
