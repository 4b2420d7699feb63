"""An exact reference for the integration tests (Trainer, accelerate, Lightning): replicas that
agree with each other say nothing of the scale (summed or twice-averaged gradients agree too).

After the first step of plain SGD (no momentum, no weight decay, lr known) the gradient a rank
applied is (theta_before - theta_after) / lr. It must equal the exact average of the ranks'
local gradients (each rank's gradient of the same loss on its own batch, from a copy of the
initial model, summed in fp64 over a Gloo group, / W) within the compressed allreduce's bound
(torch_cgx.bounds, derived in docs/algorithms.md) plus the fp32 roundings of the SGD update."""

from __future__ import annotations

from typing import Callable, List, Sequence

import torch
import torch.distributed as dist

from torch_cgx.bounds import bucket_bound

EPS32 = torch.finfo(torch.float32).eps


def snapshot(params) -> List[torch.Tensor]:
    return [p.detach().clone() for p in params]


def local_gradient(model: torch.nn.Module, loss: Callable[[torch.nn.Module], torch.Tensor]):
    """This rank's own gradient of ``loss(model)`` (no DDP: nothing is reduced)."""
    model.zero_grad()
    loss(model).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def _flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).double() for t in tensors])


def assert_first_step_is_exact_average(
    what: str,
    before: Sequence[torch.Tensor],
    after: Sequence[torch.Tensor],
    lr: float,
    local: Sequence[torch.Tensor],
    group: dist.ProcessGroup,
    bits: int,
    algorithm: str = "sra",
    stochastic: bool = False,
    scale: float = 1.0,
) -> None:
    """``before`` / ``after``: the parameters around the first SGD step; ``local``: this rank's
    local gradient of them; ``group``: a Gloo group of the same ranks (the exact sum);
    ``scale``: 1 (a test's plant multiplies the recovered gradient to show the check bites).

    The bound is layout-free: per rank, the range (max - min) and largest magnitude of its whole
    flat gradient bound those of any codec bucket (straddling layers or not, any chunking), and
    the library's per-bucket bound grows with both; exactly reduced parts are within it too."""
    world = group.size()
    b, a = _flat(before), _flat(after)
    applied = (b - a) / lr * scale
    mine = _flat(local)
    exact = mine.clone()
    dist.all_reduce(exact, group=group)  # fp64 sum of fp32 values of 2 ranks: exact
    exact /= world
    stats = torch.stack([mine.max() - mine.min(), mine.abs().max()])
    dist.all_reduce(stats, group=group)
    bound = float(bucket_bound(stats[:1], stats[1:], bits, world, algorithm, average=True,
                               stochastic=stochastic)[0])  # fmt: skip
    # p - lr * g in fp32: at most two roundings, each <= EPS32 / 2 of |p| + |lr g| <= |b| + |a|.
    tol = bound + 2 * EPS32 * (b.abs() + a.abs()) / lr
    # Summed gradients are off by |exact| (W - 1), averaged twice by |exact| (1 - 1 / W):
    # the check tells them apart only where that exceeds the tolerance.
    assert bool((exact.abs() * (1 - 1 / world) > tol).any()), (
        f"{what}: tolerance (bound {bound:.3g}) too loose to tell summed from averaged gradients"
    )
    err = (applied - exact).abs()
    worst = int((err - tol).argmax())
    assert bool((err <= tol).all()), (
        f"{what}: the first step applied {applied[worst]:.6g} at element {worst}, the exact "
        f"average of the ranks' gradients is {exact[worst]:.6g} (off by {err[worst]:.3g} > "
        f"tolerance {tol[worst]:.3g}; {bits}-bit bound {bound:.3g}): summed or twice averaged?"
    )


def record_first_call(module: torch.nn.Module) -> dict:
    """The keyword arguments of ``module``'s first forward call (the batch this rank saw), in
    the returned dict under "kwargs" once it ran."""
    seen: dict = {}

    def pre_hook(_module, args, kwargs):
        seen.setdefault("kwargs", dict(kwargs))
        seen.setdefault("args", args)

    module.register_forward_pre_hook(pre_hook, with_kwargs=True)
    return seen


def check_first_step(what, initial, trained, lr, loss, bits, scale=1.0) -> None:
    """:func:`assert_first_step_is_exact_average` for a model after its first SGD step
    (``trained``) and a copy of it from before (``initial``, where ``loss`` gives this rank's
    local gradient); the algorithm and rounding are the default group's (torch_cgx settings)."""
    import torch_cgx

    cfg = torch_cgx.get_config()
    local = local_gradient(initial, loss)
    assert_first_step_is_exact_average(
        what, snapshot(initial.parameters()), snapshot(trained.parameters()), lr, local,
        dist.new_group(backend="gloo"), bits, cfg.algorithm, cfg.stochastic, scale)  # fmt: skip
