"""The one-shot compressed reduce-scatter (csrc/algorithms/reduce_scatter.cc, FSDP2's
gradients): chunk ``j`` of the input belongs to rank ``j``. Each rank encodes the ``W - 1``
chunks it does not own (each value quantized once, streams of piece 0), one alltoall delivers
them, and the owner adds them, decoded in rank order, to its own chunk in fp32 (divided by
``W`` for AVG). Data-dependent payload sizes travel first (the host reads them); fixed-size
ones need no exchange."""

from __future__ import annotations

import torch

from torch_cgx.device.algorithms.common import Run, divide_


def reduce_scatter(run: Run, output: torch.Tensor, input: torch.Tensor) -> None:
    """``output`` (``n`` values) = the sum over the ranks of chunk ``rank`` of their 1-D
    contiguous ``input`` (``W n`` values)."""
    world, me = run.t.size, run.t.rank
    n, dtype = output.numel(), input.dtype
    send = []
    for j in range(world):
        if j == me:
            send.append(input.new_empty(0, dtype=torch.uint8))
        else:
            send.append(run.encode(input[j * n : (j + 1) * n], 0, me, j, 0))
    cap = run.plan.size(n, dtype)
    if run.plan.fixed_size:
        recv = run.t.alltoall_v(send, [0 if j == me else cap for j in range(world)])
        run.bytes_sent += sum(int(p.numel()) for p in send)
    else:
        recv = run.t.alltoall_v(send, None, limit=cap)
        run.bytes_sent += sum(int(p.numel()) for p in send) + 8 * world
    acc = input[me * n : (me + 1) * n].float()
    if acc.data_ptr() == input.data_ptr() + me * n * input.element_size():
        acc = acc.clone()
    for j in range(world):
        if j != me:
            run.decode_add_(acc, recv[j], dtype)
    if run.average:
        divide_(acc, world)
    output.view(-1).copy_(acc)
