"""Ring (csrc/algorithms/allreduce.cc ``ring``): ``W - 1`` re-quantizing hops, then SRA's
final stage. Hop ``s``: rank ``r`` sends the running sum of chunk ``r - s`` to ``r + 1`` and
receives that of chunk ``r - s - 1`` from ``r - 1``, adds it (decoded, fp32) to its own values
and re-encodes the sum for the next hop; the first hop sends the local values in their own
dtype. Rank ``r`` ends with the sum of chunk ``r + 1``, encodes it (averaged first) into a slot,
and an allgather gives every rank every reduced chunk."""

from __future__ import annotations

import torch

from torch_cgx.device.algorithms.common import Run, chunk_range
from torch_cgx.device.algorithms.sra import encode_final, final_slot


def ring(run: Run, data: torch.Tensor, piece: int) -> None:
    """Reduces the 1-D contiguous ``data`` (one piece) in place."""
    world, me = run.t.size, run.t.rank
    nxt, prev = (me + 1) % world, (me + world - 1) % world
    dtype, count, a = data.dtype, data.numel(), run.plan.alignment
    chunks = [chunk_range(count, world, a, j) for j in range(world)]
    ob, oe = chunks[me]
    send = run.encode(data[ob:oe], piece, me, me, 0)
    run.residual_(ob, data[ob:oe], send)
    acc = None
    for s in range(world - 1):
        k = (me - s - 1) % world
        ib, ie = chunks[k]
        in_dtype = dtype if s == 0 else torch.float32
        got = run.t.sendrecv(nxt, send, prev, run.plan.size(ie - ib, in_dtype))
        run.bytes_sent += int(send.numel())
        acc = data[ib:ie].float()
        if acc.data_ptr() == data[ib:ie].data_ptr():
            acc = acc.clone()
        run.decode_add_(acc, got, in_dtype)
        if s < world - 2:
            send = run.encode(acc, piece, me, k, 1)
            run.residual_(ib, acc, send)  # what this re-compression of the sum left out
    owned = nxt
    b, e = chunks[owned]
    slot = final_slot(run, count, world)
    final = encode_final(run, acc, piece, owned, slot, b)
    gathered = run.t.allgather(final)
    run.bytes_sent += slot * (world - 1)
    for r in range(world):
        cb, ce = chunks[(r + 1) % world]
        payload = gathered[r][: run.plan.size(ce - cb, torch.float32)]
        run.decode_to_(data[cb:ce], payload, torch.float32)
