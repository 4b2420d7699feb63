"""``HivemindStrategy`` for Lightning 2.x (``lightning`` and ``pytorch_lightning``), with
lightning-hivemind's signature, on :class:`torch_cgx.collaborative.Optimizer`.

>>> from torch_cgx.lightning import HivemindStrategy
>>> trainer = pl.Trainer(strategy=HivemindStrategy(target_batch_size=8192), accelerator="cpu")

Every process is a peer and its own world (global rank 0 of 1), on one device. At setup the
module's one optimizer is wrapped: ``optimizer.step()`` counts the batch (its size: ``batch_size``
or, when None, read from the first batch) and steps with the collaboration's epochs; the
schedulers the module configures step once per epoch (``scheduler_fn`` too, as
lightning-hivemind's). The options that served hivemind's internals are accepted with no effect
(docs/collaborative.md lists them); any other keyword goes to the Optimizer
(``grad_compression``, ``state_averaging_compression``, ``grad_averager_factory``,
``use_local_updates``, ...).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import torch

__all__ = ["EpochScheduler", "mixin"]


class _Wrapped(torch.optim.Optimizer):
    """The module's optimizer as Lightning sees it: steps through the collaboration."""

    def __init__(self, collaborative, strategy) -> None:  # no super().__init__: a view
        self.collaborative, self._strategy = collaborative, strategy
        self.defaults = collaborative.optimizer.defaults

    @property
    def param_groups(self):
        return self.collaborative.optimizer.param_groups

    @property
    def state(self):
        return self.collaborative.optimizer.state

    def step(self, closure=None):
        return self.collaborative.step(closure, batch_size=self._strategy.current_batch_size)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.collaborative.zero_grad(set_to_none)

    def state_dict(self):
        return self.collaborative.state_dict()

    def load_state_dict(self, state_dict) -> None:
        self.collaborative.load_state_dict(state_dict)

    def __repr__(self) -> str:
        return f"collaborative({self.collaborative.optimizer!r})"


class EpochScheduler:
    """A scheduler Lightning steps per batch or epoch, stepped instead once per collaborative
    epoch (however often Lightning calls ``step``)."""

    def __init__(self, scheduler, collaborative) -> None:
        self.scheduler, self.collaborative = scheduler, collaborative
        self.stepped = collaborative.local_epoch

    def step(self, *args, **kwargs) -> None:
        while self.stepped < self.collaborative.local_epoch:
            self.scheduler.step()
            self.stepped += 1

    def state_dict(self) -> dict:
        return {"scheduler": self.scheduler.state_dict(), "stepped": self.stepped}

    def load_state_dict(self, state: dict) -> None:
        self.scheduler.load_state_dict(state["scheduler"])
        self.stepped = int(state["stepped"])

    def __getattr__(self, name: str):
        return getattr(self.scheduler, name)


def _batch_size(batch, cls: type) -> int:
    """The batch size Lightning reads off ``batch``, with the utility of the package ``cls``
    (a HivemindStrategy flavour) derives from."""
    import importlib

    base = next(c for c in cls.__mro__ if c.__name__ == "SingleDeviceStrategy")
    package = base.__module__.split(".strategies", 1)[0]  # lightning.pytorch / pytorch_lightning
    return importlib.import_module(f"{package}.utilities.data").extract_batch_size(batch)


class mixin:
    """What HivemindStrategy adds to Lightning's SingleDeviceStrategy."""

    strategy_name = "hivemind"

    def __init__(self, target_batch_size: int, run_id: str = "lightning_run",
                 batch_size: Optional[int] = None, delay_state_averaging: bool = False,
                 delay_optimizer_step: Optional[bool] = None, delay_grad_averaging: bool = False,
                 offload_optimizer: Optional[bool] = None, reuse_grad_buffers: bool = False,
                 scheduler_fn: Optional[Callable] = None, matchmaking_time: float = 5.0,
                 averaging_timeout: float = 30.0, verbose: bool = False,
                 averager_opts: Optional[Dict] = None, host_maddrs=None, initial_peers=None,
                 **optimizer_kwargs: Any) -> None:  # fmt: skip
        from torch_cgx.collaborative import arguments

        arguments.check_number("target_batch_size", target_batch_size, 1, integer=True)
        if batch_size is not None:
            arguments.check_number("batch_size", batch_size, 1, integer=True)
        for key in ("optimizer", "params", "scheduler", "batch_size_per_step"):
            if key in optimizer_kwargs:
                raise ValueError(
                    f"HivemindStrategy: {key} comes from the LightningModule "
                    "(configure_optimizers) and batch_size, not a keyword"
                )
        arguments.check_hivemind_only(
            {k: v for k, v in optimizer_kwargs.items() if k in arguments.REFUSED}
        )
        device = "cuda" if torch.cuda.is_available() else "cpu"
        super().__init__(device=device)
        self.current_batch_size = batch_size
        self._fixed_batch = batch_size is not None
        self.collaborative = None
        self._options = dict(
            run_id=run_id, target_batch_size=target_batch_size,
            reuse_grad_buffers=reuse_grad_buffers, scheduler=scheduler_fn,
            matchmaking_time=matchmaking_time,
            averaging_timeout=averaging_timeout, verbose=verbose, host_maddrs=host_maddrs,
            initial_peers=initial_peers, delay_state_averaging=delay_state_averaging,
            delay_optimizer_step=delay_optimizer_step, delay_grad_averaging=delay_grad_averaging,
            offload_optimizer=offload_optimizer, averager_opts=averager_opts, **optimizer_kwargs,
        )  # fmt: skip

    def setup_environment(self) -> None:
        if type(self.accelerator).__name__ == "CPUAccelerator":
            self._root_device = torch.device("cpu")
        super().setup_environment()

    def setup(self, trainer) -> None:
        super().setup(trainer)
        if trainer.state.fn != "fit":
            return
        if len(self.optimizers) != 1:
            raise ValueError(f"HivemindStrategy trains with one optimizer, the module "
                             f"configured {len(self.optimizers)}")  # fmt: skip
        from torch_cgx.collaborative import Optimizer

        self.collaborative = Optimizer(optimizer=self.optimizers[0], **self._options)
        self.optimizers = [_Wrapped(self.collaborative, self)]
        for config in trainer.lr_scheduler_configs:
            config.scheduler = EpochScheduler(config.scheduler, self.collaborative)

    def on_train_batch_start(self, batch, batch_idx: int, *args) -> None:
        if not self._fixed_batch:
            self.current_batch_size = _batch_size(batch, type(self))
        return super().on_train_batch_start(batch, batch_idx, *args)

    def teardown(self) -> None:
        if self.collaborative is not None:
            self.collaborative.shutdown()
            self.collaborative = None
        super().teardown()
