"""Exact allreduces on any group, for the hooks: a cgx group reduces with its exact path (whatever
its bits), any other group (Gloo, NCCL) with ``dist.all_reduce``. Each call is issued at once, on
the caller's thread, so the hooks' collectives keep one order on every rank."""

from __future__ import annotations

import zlib
from typing import List, Optional, Tuple

import torch
import torch.distributed as dist

from torch_cgx.backend import cgx_backend, get_config, is_cgx_group


def group_or_default(group: Optional[dist.ProcessGroup]) -> dist.ProcessGroup:
    return group if group is not None else dist.distributed_c10d._get_default_group()


def settled(fut: torch.futures.Future) -> None:
    """Raises the error of ``fut``, or of any future in a ``collect_all`` future's list. Every
    ``then`` callback of the hooks calls it first: a callback that never reads its future's value
    hides a failed collective, and DDP would apply this rank's unreduced gradients."""
    value = fut.value()
    if isinstance(value, list):
        for f in value:
            if isinstance(f, torch.futures.Future):
                f.value()


def then_value(fut: torch.futures.Future, value):
    """``fut.then``: ``value`` once ``fut`` has succeeded; its error otherwise."""

    def back(f: torch.futures.Future):
        settled(f)
        return value

    return fut.then(back)


def bucket_spans(state, bucket) -> Tuple[List[tuple], List[tuple]]:
    """(offset, numel, param) of the gradients ``state.compresses``, and of the others, in the
    order of the bucket's buffer."""
    spans, offset = ([], []), 0
    for p in bucket.parameters():
        spans[0 if state.compresses(p) else 1].append((offset, p.numel(), p))
        offset += p.numel()
    return spans


def call_stream(state, bucket, first) -> int:
    """The random streams of this step's call for ``bucket``: ``state.steps`` and the bucket's
    first compressed parameter (``state.key``: its name when known), the same on every rank and
    after a checkpoint, whatever index DDP gives the bucket."""
    key = state.key(first)
    tag = zlib.crc32(key.encode()) if isinstance(key, str) else bucket.index()
    return (state.steps << 20) ^ (tag & 0xFFFFF)


def exact_config(group: Optional[dist.ProcessGroup]):
    """The native settings of an exact call on the cgx ``group`` (its settings, uncompressed)."""
    return get_config(group).replace(bits=32, compressor="maxmin", compressor_params="").to_native()


def exact_allreduce(group: dist.ProcessGroup, tensor: torch.Tensor) -> torch.futures.Future:
    """Sums ``tensor`` in place over ``group``; the future's value is ``tensor``."""
    if is_cgx_group(group):
        work = cgx_backend(group).allreduce_with(tensor, exact_config(group), False)
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
    config = get_config(group).replace(
        bits=bits, bucket_size=bucket_size, compressor="maxmin", compressor_params=""
    )
    work = cgx_backend(group).allreduce_with(tensor, config.to_native(), False)
    return then_value(work.get_future(), tensor)


def done(value: torch.Tensor) -> torch.futures.Future:
    fut = torch.futures.Future()
    fut.set_result(value)
    return fut
