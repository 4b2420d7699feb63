"""Lightning's DDP on the cgx backend with compressed gradients: :class:`CGXStrategy`.

>>> from torch_cgx.lightning import CGXStrategy
>>> trainer = Trainer(accelerator="cpu", devices=2,
...                   strategy=CGXStrategy(grad_compression="maxmin",
...                                        compression_params={"bits": 4}))

``HivemindStrategy`` (lightning-hivemind's signature) trains collaboratively with peers that
join and leave, on :mod:`torch_cgx.collaborative` (its module ``collaborative/strategy.py``).

``CGXStrategy`` subclasses Lightning's ``DDPStrategy`` with ``process_group_backend="cgx"`` and
registers the torch_cgx DDP hook that ``grad_compression`` names, on CPU and GPU alike (Lightning
itself registers ``ddp_comm_hook`` on CUDA only):

=====================================  ===========================================================
``grad_compression``                   hook
=====================================  ===========================================================
None                                   none: DDP's allreduce through the cgx backend (CGX_* env)
a compressor name (``"maxmin"``,       :func:`~torch_cgx.hooks.compression_hook` with a
``"topk"``, ...)                       ``CompressionState(compressor=name, params=
                                       compression_params, module=model)``
a ``torch_cgx.compression`` object     :func:`~torch_cgx.compression.policy_hook` with a
                                       ``PolicyState(model, object)``
``CGXState``                           :func:`~torch_cgx.hooks.cgx_hook`
``CompressionState``                   :func:`~torch_cgx.hooks.compression_hook`
``PowerSGDState``                      :func:`~torch_cgx.hooks.powerSGD_hook`
``PolicyState``                        :func:`~torch_cgx.compression.policy_hook`
=====================================  ===========================================================

The state in use is ``strategy.hook_state`` once training has started (its counters:
``torch_cgx.stats(strategy.hook_state)``). ``CGXStatsCallback()`` writes the group's and the
hook's stats (``cgx/bytes_sent``, ``cgx/ratio``, ``cgx_hook/...``) to the trainer's loggers every
``log_every_n_steps`` and prints the one-line stats at the end. Both Lightning packages
work; neither is a dependency. ``CGXStrategy`` is ``lightning.pytorch``'s flavour when that is
installed, else ``pytorch_lightning``'s; ``strategy_class("pytorch_lightning")`` gives the other
(a Trainer accepts only strategies of its own package).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from typing import Any, Callable, Dict, Optional, Tuple

import torch

# CGXStrategy, CGXStatsCallback: module __getattr__
__all__ = ["CGXStatsCallback", "CGXStrategy", "HivemindStrategy",  # noqa: F822
           "hivemind_strategy_class", "make_hook", "stats_callback_class",
           "strategy_class"]  # fmt: skip

_PACKAGES = {"lightning": "lightning.pytorch", "pytorch_lightning": "pytorch_lightning"}


def _state_hooks() -> Dict[type, Callable]:
    from torch_cgx.compression import PolicyState, policy_hook
    from torch_cgx.hooks import (
        CGXState,
        CompressionState,
        PowerSGDState,
        cgx_hook,
        compression_hook,
        powerSGD_hook,
    )

    return {PolicyState: policy_hook, CGXState: cgx_hook, CompressionState: compression_hook,
            PowerSGDState: powerSGD_hook}  # fmt: skip


def check_grad_compression(grad_compression, compression_params: Optional[Dict]) -> None:
    """ValueError, naming the problem, for anything :func:`make_hook` cannot turn into a hook."""
    from torch_cgx import compressors
    from torch_cgx.compression import AdaptiveCompressionBase, CompressionBase

    if compression_params is not None and not isinstance(grad_compression, str):
        raise ValueError("compression_params goes with a compressor name as grad_compression")
    if compression_params is not None and not isinstance(compression_params, dict):
        raise ValueError(f"compression_params must be a dict, got {compression_params!r}")
    if grad_compression is None:
        return
    if isinstance(grad_compression, str):
        compressors.get(grad_compression, **(compression_params or {}))  # names the problem
    elif isinstance(grad_compression, CompressionBase):
        if not isinstance(grad_compression, AdaptiveCompressionBase):
            grad_compression.allreduce_codec()  # a single object without an allreduce: raises
    elif type(grad_compression) not in _state_hooks():
        raise ValueError(
            "grad_compression must be None, a compressor name "
            f"({', '.join(compressors.names())}), a torch_cgx.compression object or a hook "
            f"state (CGXState, CompressionState, PowerSGDState, PolicyState); got "
            f"{grad_compression!r}"
        )


def make_hook(
    grad_compression,
    module: torch.nn.Module,
    compression_params: Optional[Dict] = None,
    process_group=None,
) -> Optional[Tuple[Any, Callable]]:
    """(state, hook) for ``grad_compression`` (see the module's table) on ``module``'s
    parameters; None for None."""
    from torch_cgx.compression import CompressionBase, PolicyState
    from torch_cgx.hooks import CompressionState

    check_grad_compression(grad_compression, compression_params)
    if grad_compression is None:
        return None
    if isinstance(grad_compression, str):
        state = CompressionState(process_group, grad_compression, compression_params,
                                 module=module)  # fmt: skip
    elif isinstance(grad_compression, CompressionBase):
        state = PolicyState(module, grad_compression, process_group)
    else:
        state = grad_compression
    return state, _state_hooks()[type(state)]


def _needs_cgx(grad_compression) -> bool:
    from torch_cgx.hooks import PowerSGDState

    return grad_compression is not None and not isinstance(grad_compression, PowerSGDState)


def installed_package(package: str, what: str) -> str:
    """``package`` checked ("lightning" or "pytorch_lightning"), or for "auto" the first of the
    two that is installed."""
    if package == "auto":
        for name in _PACKAGES:
            if importlib.util.find_spec(name) is not None:
                return name
        raise ImportError(f"{what} needs Lightning: pip install lightning")
    if package not in _PACKAGES:
        raise ValueError(f"package must be 'auto' or one of {list(_PACKAGES)}, got {package!r}")
    return package


def lightning_subclass(package: str, base: str, mixin: type, name: str, module: str) -> type:
    """``name``: ``mixin`` over ``package``'s ``base`` ("strategies.DDPStrategy"), defined in
    ``module`` as ``_<name>_<package>`` (the qualified name lets pickle find the class again:
    Lightning's spawn launcher pickles it; the module's ``__getattr__`` answers it)."""
    package = installed_package(package, name)
    where, _, cls = base.rpartition(".")
    parent = getattr(importlib.import_module(f"{_PACKAGES[package]}.{where}"), cls)
    attrs = {"__module__": module, "__qualname__": f"_{name}_{package}"}
    return type(name, (mixin, parent), attrs)


@functools.cache
def strategy_class(package: str = "auto") -> type:
    """``CGXStrategy`` for ``package``: "lightning" (``lightning.pytorch``),
    "pytorch_lightning", or "auto" (the first installed of the two)."""
    if package == "auto":
        return strategy_class(installed_package(package, "CGXStrategy"))
    return lightning_subclass(package, "strategies.DDPStrategy", _CGXMixin, "CGXStrategy",
                              __name__)  # fmt: skip


class _CGXMixin:
    """What CGXStrategy adds to Lightning's DDPStrategy (its __init__ and hook registration)."""

    strategy_name = "cgx"

    def __init__(
        self,
        grad_compression=None,
        compression_params: Optional[Dict] = None,
        *,
        process_group_backend: Optional[str] = "cgx",
        **kwargs,
    ) -> None:
        import torch_cgx  # noqa: F401  (registers the cgx backend)

        check_grad_compression(grad_compression, compression_params)
        if grad_compression is not None and kwargs.get("ddp_comm_hook") is not None:
            raise ValueError("give grad_compression or ddp_comm_hook, not both")
        if _needs_cgx(grad_compression) and process_group_backend != "cgx":
            raise ValueError(
                f"grad_compression={grad_compression!r} runs on the cgx backend, not "
                f"process_group_backend={process_group_backend!r}"
            )
        super().__init__(process_group_backend=process_group_backend, **kwargs)
        self.grad_compression, self.compression_params = grad_compression, compression_params
        self.hook_state = None

    def _register_ddp_hooks(self) -> None:
        ddp = self.model
        if self._ddp_comm_hook is not None:  # Lightning's own arguments, on any device
            hook = self._ddp_comm_hook
            if self._ddp_comm_wrapper is not None:
                hook = self._ddp_comm_wrapper(hook)
            ddp.register_comm_hook(self._ddp_comm_state, hook)
            self.hook_state = self._ddp_comm_state
            return
        made = make_hook(self.grad_compression, ddp.module, self.compression_params)
        if made is not None:
            from torch_cgx.hook_stats import counted

            self.hook_state, hook = made
            ddp.register_comm_hook(self.hook_state, counted(hook, self.hook_state))


@functools.cache
def stats_callback_class(package: str = "auto") -> type:
    """``CGXStatsCallback`` for ``package`` (as :func:`strategy_class`)."""
    if package == "auto":
        return stats_callback_class(installed_package(package, "CGXStatsCallback"))
    return lightning_subclass(package, "callbacks.Callback", _StatsMixin, "CGXStatsCallback",
                              __name__)  # fmt: skip


class _StatsMixin:
    """What CGXStatsCallback adds to Lightning's Callback: the cgx group's stats and those of
    the strategy's hook state as metrics, every ``every_n_steps`` (None: the trainer's
    ``log_every_n_steps``); ``summary``: rank 0 prints the one-line stats at the end."""

    def __init__(self, every_n_steps: Optional[int] = None, summary: bool = True) -> None:
        from torch_cgx.integrations.metrics import StatsMetrics

        if every_n_steps is not None and (isinstance(every_n_steps, bool)
                                          or not isinstance(every_n_steps, int)
                                          or every_n_steps < 1):  # fmt: skip
            raise ValueError(f"every_n_steps must be an integer >= 1, got {every_n_steps!r}")
        self.every_n_steps, self.summary = every_n_steps, summary
        self.stats = StatsMetrics()

    def _sync_states(self, trainer) -> None:
        state = getattr(trainer.strategy, "hook_state", None)
        self.stats.states = [state] if state is not None else []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        every = self.every_n_steps or trainer.log_every_n_steps
        step = trainer.global_step
        if step == 0 or step % every:
            return
        self._sync_states(trainer)
        metrics = self.stats.metrics(step)
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)

    def on_train_end(self, trainer, pl_module) -> None:
        self._sync_states(trainer)
        if self.summary and trainer.global_rank == 0:
            print(self.stats.summary(), flush=True)


@functools.cache
def hivemind_strategy_class(package: str = "auto") -> type:
    """``HivemindStrategy`` (torch_cgx.collaborative) for ``package``, as :func:`strategy_class`."""
    if package == "auto":
        return hivemind_strategy_class(installed_package(package, "HivemindStrategy"))
    from torch_cgx.collaborative.strategy import mixin

    return lightning_subclass(package, "strategies.SingleDeviceStrategy", mixin,
                              "HivemindStrategy", __name__)  # fmt: skip


def imported_package() -> str:
    """The Lightning package this program imported first (``sys.modules`` keeps the order of
    imports; the other one may be imported by the first at run time), else as "auto"."""
    import sys

    for name in sys.modules:
        if name in ("pytorch_lightning", "lightning.pytorch"):
            return "pytorch_lightning" if name == "pytorch_lightning" else "lightning"
    return installed_package("auto", "HivemindStrategy")


class _HivemindSelector:
    """``HivemindStrategy(...)``: the flavour of the Lightning package the program imported
    (hivemind's page imports ``pytorch_lightning``); ``hivemind_strategy_class(package)`` names
    one explicitly."""

    def __new__(cls, *args, **kwargs):
        return hivemind_strategy_class(imported_package())(*args, **kwargs)


def __getattr__(name: str):
    if name == "HivemindStrategy":
        return _HivemindSelector
    if name.startswith("_HivemindStrategy_") and name[len("_HivemindStrategy_") :] in _PACKAGES:
        return hivemind_strategy_class(name[len("_HivemindStrategy_") :])
    if name == "CGXStrategy":
        return strategy_class("auto")
    if name == "CGXStatsCallback":
        return stats_callback_class("auto")
    if name.startswith("_CGXStatsCallback_") and name[len("_CGXStatsCallback_") :] in _PACKAGES:
        return stats_callback_class(name[len("_CGXStatsCallback_") :])
    if name.startswith("_CGXStrategy_") and name[len("_CGXStrategy_") :] in _PACKAGES:
        return strategy_class(name[len("_CGXStrategy_") :])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
