"""Exact allreduces on any group, for the hooks: a cgx group reduces with its exact path (whatever
its bits), any other group (Gloo, NCCL) with ``dist.all_reduce``. Each call is issued at once, on
the caller's thread, so the hooks' collectives keep one order on every rank."""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from torch_cgx.backend import is_cgx_group
from torch_cgx.hooks import core
from torch_cgx.hooks.core import settled


def group_or_default(group: Optional[dist.ProcessGroup]) -> dist.ProcessGroup:
    return group if group is not None else dist.distributed_c10d._get_default_group()


def then_value(fut: torch.futures.Future, value):
    """``fut.then``: ``value`` once ``fut`` has succeeded; its error otherwise."""

    def back(f: torch.futures.Future):
        settled(f)
        return value

    return fut.then(back)


def exact_allreduce(group: dist.ProcessGroup, tensor: torch.Tensor) -> torch.futures.Future:
    """Sums ``tensor`` in place over ``group``; the future's value is ``tensor``."""
    if is_cgx_group(group):
        calls = core.native_calls(group)
        backend = calls.refresh(group)
        work = core.issue(backend, tensor, calls.exact(), average=False)
    else:
        work = dist.all_reduce(tensor, group=group, async_op=True)
    return then_value(work.get_future(), tensor)


def quantized_allreduce(
    group: dist.ProcessGroup, tensor: torch.Tensor, bits: int, bucket_size: int
) -> torch.futures.Future:
    """Sums ``tensor`` in place with max-min ``bits`` through the cgx backend (ValueError on a
    group that is not cgx)."""
    if not is_cgx_group(group):
        raise ValueError(
            "quantized allreduce (quantize_bits) needs a group created with backend 'cgx'"
        )
    calls = core.native_calls(group)
    backend = calls.refresh(group)
    options = calls.options(
        ("maxmin", bits, bucket_size),
        lambda c: c.replace(
            bits=bits, bucket_size=bucket_size, compressor="maxmin", compressor_params=""
        ),  # fmt: skip
    )
    work = core.issue(backend, tensor, options, average=False)
    return then_value(work.get_future(), tensor)


def done(value: torch.Tensor) -> torch.futures.Future:
    fut = torch.futures.Future()
    fut.set_result(value)
    return fut
