"""The arguments of :class:`~torch_cgx.collaborative.Optimizer`: checks, and hivemind's
arguments that have no meaning here (refused, naming what to pass instead) or that are
accepted with a documented behaviour."""

from __future__ import annotations

from typing import Any, Dict

import torch

__all__ = ["check_delay", "check_hivemind_only", "check_number", "make_optimizer", "make_scheduler"]

# hivemind arguments refused: what to do instead
REFUSED = {
    "dht": "peers meet at a torchft Lighthouse, not a DHT: pass initial_peers='host:port' (the "
    "address the first peer printed), or leave it out on the first peer",
    "client_mode": "every peer sends and receives here (no client mode); peers behind NAT need "
    "an address the others reach: pass host= (or host_maddrs=)",
    "auxiliary": "auxiliary peers (averaging without training) are not supported: leave it out",
    "tracker_opts": "progress is planned from the rates gathered at each round (see "
    "torch_cgx.collaborative.progress), not tracked in a DHT: leave it out",
}
# refused unless empty (the default)
REFUSED_UNLESS_EMPTY = {
    "extra_tensors": "extra tensors are not averaged here: leave extra_tensors out",
    "average_opt_statistics": "with use_local_updates=True only the parameters are averaged "
    "(the optimizer's statistics stay local): leave average_opt_statistics out",
}
# accepted: what they do here (docs/collaborative.md has the table)
ACCEPTED = {
    "delay_state_averaging": "the state average runs in step(): accepted, no effect",
    "offload_optimizer": "the optimizer runs where its parameters are: accepted, no effect",
    "load_state_compression": "a joining peer receives the state exactly: accepted, no effect",
    "averager_opts": "accepted, no effect (the round's process group is torchft's Gloo)",
    "next_chunk_timeout": "accepted, no effect (averaging_timeout bounds a round)",
    "allreduce_timeout": "accepted, no effect (averaging_timeout bounds a round)",
    "load_state_timeout": "accepted, no effect (averaging_timeout bounds a state transfer)",
    "shutdown_timeout": "accepted, no effect",
    "performance_ema_alpha": "the weight of the newest epoch in a peer's rate estimate",
}


def check_delay(grad_averaging, optimizer_step, local_updates, averager_factory,
                wait_for_round=False) -> bool:  # fmt: skip
    """Whether rounds run in the background (hivemind's ``delay_grad_averaging`` /
    ``delay_optimizer_step``: either one); ValueError where it cannot."""
    delayed = bool(grad_averaging) or bool(optimizer_step)
    if wait_for_round and not delayed:
        raise ValueError("wait_for_round is about rounds in the background: pass "
                         "delay_grad_averaging=True too, or leave it out")  # fmt: skip
    if delayed and local_updates:
        raise ValueError("delay_grad_averaging / delay_optimizer_step delay the gradients' "
                         "average: with use_local_updates=True the parameters are averaged "
                         "(leave the delay flags out)")  # fmt: skip
    if delayed and averager_factory is not None:
        raise ValueError("delay_grad_averaging / delay_optimizer_step do not go with "
                         "grad_averager_factory (the averager reads p.grad while the training "
                         "loop writes it): leave one out")  # fmt: skip
    return delayed


def check_hivemind_only(kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """``kwargs`` checked: refused ones raise ValueError; returns the accepted ones."""
    for key, value in kwargs.items():
        if key in REFUSED:
            raise ValueError(f"{key}: {REFUSED[key]}")
        if key in REFUSED_UNLESS_EMPTY:
            if value:
                raise ValueError(f"{key}: {REFUSED_UNLESS_EMPTY[key]}")
        elif key not in ACCEPTED:
            raise TypeError(f"Optimizer() got an unexpected keyword argument {key!r}")
    alpha = kwargs.get("performance_ema_alpha")
    if alpha is not None:
        check_number("performance_ema_alpha", alpha, 0.0, 1.0, low_open=True)
    return kwargs


def check_number(name, value, low, high=None, *, low_open=False, integer=False):
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ValueError(f"{name} must be a{'n integer' if integer else ' number'}, got {value!r}")
    if value < low or (low_open and value == low) or (high is not None and value > high):
        rng = f"{'(' if low_open else '['}{low}, {high if high is not None else 'inf'}]"
        raise ValueError(f"{name} must be in {rng}, got {value!r}")
    return value


def make_optimizer(optimizer, params):
    """(the optimizer, its parameters in order) from an instance or a class / factory."""
    if isinstance(optimizer, torch.optim.Optimizer):
        if params is not None:
            raise ValueError("params: pass params only with an optimizer class or factory "
                             "(this optimizer already has its parameters)")  # fmt: skip
    elif callable(optimizer):
        if params is None:
            raise ValueError("params: an optimizer class or factory needs params=")
        optimizer = optimizer(params)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ValueError(f"optimizer(params) must return a torch.optim.Optimizer, got "
                             f"{type(optimizer).__name__}")  # fmt: skip
    else:
        raise ValueError(f"optimizer must be a torch.optim.Optimizer, or a class / factory "
                         f"taking params, got {optimizer!r}")  # fmt: skip
    ordered = [p for group in optimizer.param_groups for p in group["params"]]
    if not ordered:
        raise ValueError("the optimizer has no parameters")
    return optimizer, ordered


def make_scheduler(scheduler, optimizer):
    """None, an LR scheduler instance, or a factory ``optimizer -> scheduler``."""
    if scheduler is None or hasattr(scheduler, "step") and hasattr(scheduler, "state_dict"):
        return scheduler
    if callable(scheduler):
        made = scheduler(optimizer)
        if not hasattr(made, "step"):
            raise ValueError("scheduler(optimizer) must return an LR scheduler")
        return made
    raise ValueError(f"scheduler must be an LR scheduler or a factory of one, got {scheduler!r}")
