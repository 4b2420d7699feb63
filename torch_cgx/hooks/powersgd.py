"""PowerSGD (Vogels et al.) under torch's names: ``powerSGD_hook`` and ``batched_powerSGD_hook``.

The math is torch's: before ``start_powerSGD_iter`` a plain average; then each gradient worth
compressing (``n * m > (n + m) * rank * min_compression_rate``) is approximated as P Q^T with
one power iteration from the remembered Q (warm start) or a random one drawn from the same seeds
as torch's, with error feedback; the others are averaged exactly. What differs is the schedule:

- the hook is called for every DDP bucket in index order on every rank; it only prepares the
  bucket and returns a pending future. The call for the last bucket runs the whole step: one
  allreduce for every P of every bucket (the exactly averaged values ride in it) and one for
  every Q, instead of three allreduces per bucket;
- Gram-Schmidt runs once per matrix shape over a batch, not once per matrix;
- every collective is issued from the hook call itself, in the same order on every rank:
  nothing is issued or waited for in a future callback, so it runs on Gloo, NCCL and cgx with no
  wrapper (torch's hook issues its allreduces from callbacks: on Gloo with several buckets the
  ranks issue them in different orders);
- ``quantize_bits`` sends P and Q through the cgx backend's max-min codec.

CUDA gradients stay on the GPU: the passes run as torch operations on their device
(``lowrank``'s device path; fp32 CPU gradients take the fused native passes unless
``lowrank.NATIVE`` is False), the collectives are the group's, and the only host-to-device
traffic is the random Q of a matrix's first step (drawn on the CPU as torch's, uploaded).

Error feedback covers the compressed gradients (torch's also stores, for the exactly averaged
ones, each rank's difference to the average, which sums to zero over the ranks up to rounding).
A zero column in orthogonalization stays zero when ``orthogonalization_epsilon`` is 0 (torch
divides 0 by 0 there).
"""

# No `from __future__ import annotations`: DDP checks the hooks' annotations at run time.
import math
from collections import OrderedDict
from typing import List

import torch
import torch.distributed as dist

from torch_cgx.hooks import lowrank
from torch_cgx.hooks._reduce import exact_allreduce, group_or_default, quantized_allreduce
from torch_cgx.hooks.powersgd_state import PowerSGDState

__all__ = ["PowerSGDState", "batched_powerSGD_hook", "powerSGD_hook"]


class _Bucket:
    """What the step needs of one DDP bucket, taken when its hook is called."""

    __slots__ = ("buffer", "grads", "keys", "future")

    def __init__(self, state: PowerSGDState, bucket: dist.GradBucket) -> None:
        self.buffer = bucket.buffer()
        self.grads = bucket.gradients()
        self.keys = state.bucket_keys(bucket)
        self.future = torch.futures.Future()


def _average(group, buf: torch.Tensor) -> torch.futures.Future:
    return exact_allreduce(group, buf).then(lambda f: f.value().div_(group.size()))


def _run_step(state: PowerSGDState, bucket: dist.GradBucket, step) -> torch.futures.Future:
    """Queues the bucket; on the last one, runs ``step(state, group, buckets)`` and completes
    every bucket's future (or fails them all)."""
    if bucket.index() == 0 and state._pending:  # an earlier backward stopped half-way
        stale, state._pending = state._pending, []
        for b in stale:
            b.future.set_exception(RuntimeError("PowerSGD step abandoned by a new backward"))
    entry = _Bucket(state, bucket)
    state._pending.append(entry)
    if not bucket.is_last():
        return entry.future
    buckets, state._pending = state._pending, []
    group = group_or_default(state.process_group)
    try:
        step(state, group, buckets)
    except BaseException as e:
        for b in buckets:
            b.future.set_exception(e)
        raise
    state.report_stats()
    state.maybe_increase_iter(bucket)
    if not state.warm_start:
        state.q_memory_dict.clear()
    for b in buckets:
        b.future.set_result(b.buffer)
    return entry.future


def _reducers(state: PowerSGDState, group):
    if state.quantize_bits is None:
        return (lambda t: exact_allreduce(group, t),) * 2 + (None,)
    bits, size = state.quantize_bits, state.quantize_bucket_size
    quantized = lambda t: quantized_allreduce(group, t, bits, size)  # noqa: E731
    return quantized, quantized, lambda t: exact_allreduce(group, t)


def _random_qs(state: PowerSGDState, items: List[lowrank.Item], dtype, batched: bool):
    """Random Qs in torch's order: one seed per bucket, then by matrix shape (first seen first),
    one draw per shape when ``batched`` else one per matrix; drawn on the CPU (as torch's, so
    every device gets the same values) and copied where the matrices are by ``power_step``."""
    gen = torch.Generator().manual_seed(int(state.rng.randint(1_000_000_000)))
    by_shape: OrderedDict[tuple, list] = OrderedDict()
    for it in items:
        by_shape.setdefault(tuple(it.matrix.shape), []).append(it)
    for (_, m), group in by_shape.items():
        rank = group[0].rank
        if batched and len(group) > 1:
            draws = torch.randn(len(group), m, rank, generator=gen, dtype=dtype).unbind(0)
        else:
            draws = [torch.randn(1, m, rank, generator=gen, dtype=dtype)[0] for _ in group]
        for it, q in zip(group, draws):
            if it.q is None or not state.warm_start:
                it.q = q


def _split(state: PowerSGDState, b: _Bucket, items, exact) -> None:
    """The bucket's gradients: compressed ones become items (the error added; the new one will
    be written in its place), the others join ``exact``."""
    mine = []
    for key, grad in zip(b.keys, b.grads):
        if grad.dim() == 0:
            exact.append(grad.view(1))
            state.total_numel_before_compression += 1
            state.total_numel_after_compression += 1
            continue
        n, m = grad.shape[0], grad.numel() // max(grad.shape[0], 1)
        rank = min(n, m, state.matrix_approximation_rank)
        before, after = n * m, (n + m) * rank
        state.total_numel_before_compression += before
        if not (after * state.min_compression_rate < before):
            exact.append(grad.view(-1))
            state.total_numel_after_compression += before
            continue
        state.total_numel_after_compression += after
        matrix = grad.view(n, m)
        q = state.q_memory_dict.get(key) if state.warm_start else None
        q = q if q is not None and q.shape == (m, rank) else None
        item = lowrank.Item(key, matrix, rank, q)
        if state.use_error_feedback:
            err = state.error_dict.get(key)
            item.add_error = err is not None and err.shape == matrix.shape
            if not item.add_error:
                err = torch.empty_like(matrix)
            elif err.dtype != matrix.dtype or err.device != matrix.device:
                err = err.to(matrix).contiguous()  # a loaded state: fit the gradient (upload)
            elif not err.is_contiguous():
                err = err.contiguous()
            state.error_dict[key] = item.error = err
        mine.append(item)
    if not state.warm_start or b.keys not in state.seen_buckets:
        state.seen_buckets.add(b.keys)
        _random_qs(state, mine, b.buffer.dtype, state.batch_tensors_with_same_shape)
    items += mine


def _layerwise_step(state: PowerSGDState, group, buckets: List[_Bucket]) -> None:
    items, exact_views = [], []
    for b in buckets:
        _split(state, b, items, exact_views)
    missing = [it for it in items if it.q is None]
    if missing:  # a bucket seen before holds a matrix never compressed (DDP rebuilt buckets)
        _random_qs(state, missing, buckets[0].buffer.dtype, False)
    exact = torch.cat(exact_views) if exact_views else None
    reduce_p, reduce_q, reduce_exact = _reducers(state, group)
    lowrank.power_step(items, exact, group.size(), state.orthogonalization_epsilon,
                       reduce_p, reduce_q, reduce_exact)  # fmt: skip
    pos = 0
    for view in exact_views:
        view.copy_(exact[pos : pos + view.numel()])
        pos += view.numel()
    for it in items:
        state.q_memory_dict[it.key] = it.q


def powerSGD_hook(
    state: PowerSGDState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """torch's layer-wise PowerSGD (same parameters and math), two allreduces per step."""
    if state.iter < state.start_powerSGD_iter:
        state.maybe_increase_iter(bucket)
        return _average(group_or_default(state.process_group), bucket.buffer())
    return _run_step(state, bucket, _layerwise_step)


def _batched_step(state: PowerSGDState, group, buckets: List[_Bucket]) -> None:
    items, padded = [], []
    for b in buckets:
        total = b.buffer.numel()
        side = math.ceil(math.sqrt(total))
        rank = min(side, state.matrix_approximation_rank)
        state.total_numel_before_compression += total
        state.total_numel_after_compression += side * rank * 2
        square = torch.zeros(side * side, dtype=b.buffer.dtype, device=b.buffer.device)
        square[:total].copy_(b.buffer)
        key = b.keys  # the bucket's parameters: a new key when DDP rebuilds its buckets
        err = state.error_dict.get(key) if state.use_error_feedback else None
        if err is not None and err.numel() == square.numel():
            square.add_(err.to(square))  # a loaded state may sit elsewhere: an upload, once
        padded.append((key, square, square.clone() if state.use_error_feedback else None))
        q = state.q_memory_dict.get(key) if state.warm_start else None
        item = lowrank.Item(key, square.view(side, side), rank, q)
        if q is None or q.shape != (side, rank):
            item.q = None
            gen = torch.Generator().manual_seed(int(state.rng.randint(1_000_000_000)))
            item.q = torch.randn(side, rank, generator=gen, dtype=b.buffer.dtype)
        items.append(item)
    reduce_p, reduce_q, _ = _reducers(state, group)
    lowrank.power_step(items, None, group.size(), state.orthogonalization_epsilon,
                       reduce_p, reduce_q)  # fmt: skip
    for b, it, (key, square, copy) in zip(buckets, items, padded):
        b.buffer.copy_(square[: b.buffer.numel()])
        state.q_memory_dict[key] = it.q
        if copy is not None:
            state.error_dict[key] = copy.sub_(square)


def batched_powerSGD_hook(
    state: PowerSGDState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """torch's batched PowerSGD: each bucket as one square matrix (zero-padded), rank
    ``matrix_approximation_rank``; two allreduces per step for all buckets."""
    if state.iter < state.start_powerSGD_iter:
        state.maybe_increase_iter(bucket)
        return _average(group_or_default(state.process_group), bucket.buffer())
    return _run_step(state, bucket, _batched_step)
