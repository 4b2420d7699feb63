"""Scatter-reduce-allgather (csrc/algorithms/allreduce.cc ``sra``), each value quantized twice.

A piece is cut into segments of whole buckets (the native pipeline's segments: they decide
which values share a chunk, hence a quantizer bucket, and which stream each payload draws, so
the device plane keeps them even though it runs them one after the other). Per segment:

1. rank ``r`` encodes the ``W - 1`` chunks it does not own, chunk ``j`` for rank ``j`` (one
   alltoall of payloads whose sizes every rank knows: no size exchange);
2. the owner adds the received payloads, decoded, to its own chunk in fp32, in rank order;
3. it divides by ``W`` for AVG, encodes the reduced chunk (an fp32 payload) into a slot of the
   largest chunk payload's size;
4. an allgather of the slots; every rank decodes every slot, its own included.
"""

from __future__ import annotations

import torch

from torch_cgx.device.algorithms.common import Run, chunk_range, divide_, padded, segment_id


def final_slot(run: Run, count: int, world: int) -> int:
    """Bytes of the largest reduced-chunk payload (fp32) of ``count`` values (the allgather's
    slot; not always chunk 0's: a raw tail can make a shorter chunk larger)."""
    a = run.plan.alignment
    sizes = []
    for j in range(world):
        b, e = chunk_range(count, world, a, j)
        sizes.append(run.plan.size(e - b, torch.float32))
    return max(sizes)


def encode_final(run: Run, acc: torch.Tensor, piece: int, chunk: int, slot: int, res_begin: int):
    """The owner's reduced chunk ``acc`` (fp32, averaged here when asked) as a payload padded to
    ``slot``; the residual of what it left out, times W when averaging (allreduce.cc)."""
    world, me = run.t.size, run.t.rank
    if run.average:
        divide_(acc, world)
    payload = run.encode(acc, piece, me, chunk, 2)
    run.residual_(res_begin, acc, payload, scale=world if run.average else 0)
    return padded(payload, slot)


def segments(count: int, esize: int, bucket: int, segment_bytes: int):
    """(begin, count) of SRA's segments of a piece (allreduce.cc: whole buckets)."""
    seg = count
    if segment_bytes > 0:
        seg = max(1, segment_bytes // esize // bucket) * bucket
    return [(b, min(seg, count - b)) for b in range(0, count, seg)] or [(0, 0)]


def sra(run: Run, data: torch.Tensor, piece: int, segment_bytes: int) -> None:
    """Reduces the 1-D contiguous ``data`` (one piece) in place."""
    for k, (begin, n) in enumerate(
        segments(data.numel(), data.element_size(), run.plan.alignment, segment_bytes)
    ):
        if n:
            _segment(run, data.narrow(0, begin, n), segment_id(piece, k), begin)


def _segment(run: Run, data: torch.Tensor, sid: int, base: int) -> None:
    world, me = run.t.size, run.t.rank
    dtype, count, a = data.dtype, data.numel(), run.plan.alignment
    chunks = [chunk_range(count, world, a, j) for j in range(world)]
    # 1. encode the chunks others own
    send = []
    for j, (b, e) in enumerate(chunks):
        if j == me:
            send.append(data.new_empty(0, dtype=torch.uint8))
            continue
        x = data[b:e]
        payload = run.encode(x, sid, me, j, 0)
        run.residual_(base + b, x, payload)
        send.append(payload)
    mb, me_end = chunks[me]
    mine = run.plan.size(me_end - mb, dtype)
    recv_sizes = [0 if j == me else mine for j in range(world)]
    recv = run.t.alltoall_v(send, recv_sizes)
    # 2-3. the owner's sum, in rank order, then its final payload
    acc = data[mb:me_end].float()
    if acc.data_ptr() == data[mb:me_end].data_ptr():
        acc = acc.clone()
    for j in range(world):
        if j != me:
            run.decode_add_(acc, recv[j], dtype)
    slot = final_slot(run, count, world)
    final = encode_final(run, acc, sid, me, slot, base + mb)
    run.bytes_sent += sum(int(p.numel()) for p in send) + slot * (world - 1)
    # 4. every rank decodes every reduced chunk
    gathered = run.t.allgather(final)
    for r, (b, e) in enumerate(chunks):
        n = e - b
        payload = gathered[r][: run.plan.size(n, torch.float32)]
        run.decode_to_(data[b:e], payload, torch.float32)
