"""torch_cgx where people train: transformers' Trainer and accelerate (docs/integrations.md).

    from torch_cgx.integrations import init_cgx, attach

    init_cgx(bits=4)                      # the cgx group, before TrainingArguments / Accelerator
    trainer = Trainer(model=model, args=TrainingArguments(...), train_dataset=data)
    attach(trainer, hook="cgx", bits=4)   # or no hook: the backend's settings compress
    trainer.train()

accelerate (and so Trainer) creates the default process group itself unless one exists, and
only with the backends it knows (``ddp_backend="cgx"`` is refused); it reuses an existing group
whatever its backend. :func:`init_cgx` creates that group as a cgx group first.
``torch_cgx.integrations.transformers`` holds the Trainer callbacks, ``.diloco_trainer`` /
``.diloco_accelerate`` / ``.diloco_lightning`` DiLoCo for Trainer, accelerate and Lightning
(imported on first use: ``import torch_cgx`` does not import transformers).
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Optional

__all__ = [
    "AccelerateDiLoCo",
    "CGXCallback",
    "CGXStatsCallback",
    "DiLoCoCallback",
    "attach",
    "attach_diloco",
    "init_cgx",
    "node_ddp",
]  # (lazy)

_LAZY = {  # name -> the module of this package that holds it (imported on first use)
    "CGXCallback": "transformers", "CGXStatsCallback": "transformers", "attach": "transformers",
    "DiLoCoCallback": "diloco_trainer", "attach_diloco": "diloco_trainer",
    "AccelerateDiLoCo": "diloco_accelerate", "node_ddp": "diloco_accelerate",
}  # fmt: skip


def init_cgx(options=None, *, timeout: Optional[timedelta] = None, **settings):
    """Creates the default process group with the cgx backend (``env://``: torchrun's or the
    emulated hosts' variables; mpirun's are mapped by ``import torch_cgx``) and returns it.

    ``options`` (``torch_cgx.Options``) or keywords (``bits=4``, ...; docs/settings.md) set the
    group's settings, else the ``CGX_*`` variables do. Call it before ``TrainingArguments``,
    ``Accelerator`` or ``PartialState``: they then reuse the group (accelerate still reports its
    backend as "gloo" on CPU, "nccl" on GPU; the group is cgx: ``torch_cgx.is_cgx_group()``).

    Already initialized: returns the cgx default group unchanged (ValueError if settings are
    given: ``torch_cgx.set_config`` changes them); ValueError naming the backend when the
    default group is not cgx. Not launched (no ``WORLD_SIZE``): returns None, nothing to do.
    """
    import torch
    import torch.distributed as dist

    import torch_cgx
    from torch_cgx import warn

    if options is not None and settings:
        raise ValueError("give options or setting keywords, not both")
    if options is not None and not isinstance(options, torch_cgx.Options):
        raise TypeError(f"options must be torch_cgx.Options, got {type(options).__name__}")
    opts = options if options is not None else (torch_cgx.Options(**settings) if settings else None)
    if dist.is_initialized():
        if not torch_cgx.is_cgx_group():
            raise ValueError(
                "torch.distributed is already initialized with backend "
                f"{dist.get_backend()!r}: call init_cgx() before TrainingArguments, Accelerator "
                "or PartialState create the group"
            )
        if opts is not None:
            raise ValueError(
                "the cgx default group exists already: change its settings with "
                "torch_cgx.set_config(None, ...) (collective)"
            )
        return dist.group.WORLD
    if "WORLD_SIZE" not in os.environ:
        return None
    local = os.environ.get("LOCAL_RANK")
    if torch.cuda.is_available() and local is not None:
        torch.cuda.set_device(int(local) % torch.cuda.device_count())
    kwargs = {} if timeout is None else {"timeout": timeout}
    dist.init_process_group("cgx", pg_options=opts, **kwargs)
    warn.check_group(None, "init_cgx")  # silent: the group is cgx
    return dist.group.WORLD


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
