"""The sparse paths (csrc/algorithms/allgather_reduce.cc, sum_reduce.cc).

Allgather-reduce: each rank encodes its whole piece once; the payload sizes travel first (an
allgather the host reads: the one place a size is read back, and only for compressors whose
size depends on the data; fixed-size payloads skip it), then the payloads padded to the
largest; every rank decodes all ``W`` payloads, its own included, in rank order into an fp32
sum (divided by ``W`` for AVG) and rounds it once to the tensor's dtype.

Sum-reduce (random-k: every rank draws the same indices): each rank encodes once; the 32-byte
headers travel first (an allgather: they must agree but for the flags, which are OR-ed, so a
NaN on any rank reaches every rank; a mismatch is recorded in the call's lazy header flag), then
the values are reduced like an exact allreduce of a k-vector: chunk ``j`` to rank ``j``, the
owner sums the ``W`` copies in fp32 in rank order and rounds once to the values' dtype, and an
allgather returns the sums. Every rank decodes the same payload.
"""

from __future__ import annotations

import torch

from torch_cgx.device.algorithms.common import Run, chunk_range, divide_, padded

HEAD = 32  # the envelope (docs/FORMAT.md): random-k's values follow it


def allgather_reduce(run: Run, data: torch.Tensor, piece: int) -> None:
    """Reduces the 1-D contiguous ``data`` (one piece) in place."""
    world, me = run.t.size, run.t.rank
    count, dtype = data.numel(), data.dtype
    payload = run.encode(data, piece, me, 0, 0)
    run.residual_(0, data, payload)
    if run.plan.fixed_size:
        size = run.plan.size(count, dtype)
        gathered = run.t.allgather(payload)
        sizes = [size] * world
        run.bytes_sent += size * (world - 1)
    else:
        gathered = run.t.allgather_v(payload, limit=run.plan.size(count, dtype))
        sizes = [int(p.numel()) for p in gathered]
        run.bytes_sent += (8 + max(sizes)) * (world - 1)
    acc = torch.zeros(count, dtype=torch.float32, device=data.device)
    for r in range(world):
        run.decode_add_(acc, gathered[r][: sizes[r]], dtype)
    if run.average:
        divide_(acc, world)
    data.copy_(acc)


def sum_reduce(run: Run, data: torch.Tensor, piece: int) -> None:
    """Reduces the 1-D contiguous ``data`` (one piece) in place (random-k's payloads)."""
    world, me = run.t.size, run.t.rank
    count, dtype = data.numel(), data.dtype
    payload = run.encode(data, piece, me, 0, 0).clone()
    run.residual_(0, data, payload)
    es = torch.empty((), dtype=dtype).element_size()
    k = (int(payload.numel()) - HEAD) // es
    # the headers: all must equal this rank's but for the flags (byte 7), which are OR-ed
    heads = torch.stack(run.t.allgather(payload[:HEAD].contiguous()))
    differ = (heads[:, :7] != payload[:7]).any() | (heads[:, 8:HEAD] != payload[8:HEAD]).any()
    run.flag(differ)  # slices, not a boolean mask: a mask's size is a host read on CUDA
    flags = heads[0, 7]
    for r in range(1, world):
        flags = flags | heads[r, 7]
    payload[7] = flags
    # reduce-scatter of the values, then an allgather of the sums (chunks of whole values)
    values = payload[HEAD:].view(dtype)
    chunks = [chunk_range(k, world, 1, j) for j in range(world)]
    mb, mend = chunks[me]
    send = [
        data.new_empty(0, dtype=torch.uint8) if j == me else values[b:e].view(torch.uint8)
        for j, (b, e) in enumerate(chunks)
    ]
    recv_sizes = [0 if j == me else (mend - mb) * es for j in range(world)]
    recv = run.t.alltoall_v(send, recv_sizes)
    total = torch.zeros(mend - mb, dtype=torch.float32, device=data.device)
    for r in range(world):
        total += (values[mb:mend] if r == me else recv[r].view(dtype)).float()
    slot = (chunks[0][1] - chunks[0][0]) * es
    mine = padded(total.to(dtype).view(torch.uint8), slot)
    gathered = run.t.allgather(mine)
    for r, (b, e) in enumerate(chunks):
        values[b:e].copy_(gathered[r][: (e - b) * es].view(dtype))
    run.bytes_sent += (HEAD + slot) * (world - 1) + sum(int(s.numel()) for s in send)
    # Random-k's decode scatters the sums into zeros: +0.0 where no index points, the sum's own
    # bits (-0.0 too, after a 16-bit rounding) where one does. No fill makes a decode-add give
    # both signs of zero, and random-k has no fused kernel: its tensor-op values, as natively.
    acc = run.codec.values(payload, count, dtype)
    if run.average:
        divide_(acc, world)
    data.copy_(acc)
