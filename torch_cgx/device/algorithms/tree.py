"""Tree (csrc/algorithms/tree.cc): a binomial tree rooted at rank 0 over the whole piece. Up: a
rank adds the decoded payloads of its children ``r + 2^j`` (every ``2^j`` below its lowest set
bit; every power of two below ``W`` at the root) to its values in fp32, encodes that partial sum
once and sends it to its parent ``r - lowbit(r)``. The root encodes the total (averaged first)
once more; that payload travels down unchanged, the farthest subtree first, and every rank
decodes the same bytes."""

from __future__ import annotations

import torch

from torch_cgx.device.algorithms.common import Run
from torch_cgx.device.algorithms.sra import encode_final


def tree(run: Run, data: torch.Tensor, piece: int) -> None:
    """Reduces the 1-D contiguous ``data`` (one piece) in place."""
    world, me = run.t.size, run.t.rank
    count = data.numel()
    nbytes = run.plan.size(count, torch.float32)
    acc = data.float()
    if acc.data_ptr() == data.data_ptr():
        acc = acc.clone()
    span = world if me == 0 else me & -me
    mask = 1
    while mask < span and me + mask < world:
        run.decode_add_(acc, run.t.recv(me + mask, nbytes, data.device), torch.float32)
        mask <<= 1
    if me != 0:
        parent = me - (me & -me)
        payload = run.encode(acc, piece, me, 0, 1)
        run.residual_(0, acc, payload)
        run.t.send(parent, payload)
        run.bytes_sent += nbytes
        final = run.t.recv(parent, nbytes, data.device)
    else:
        final = encode_final(run, acc, piece, 0, nbytes, 0)
    top = 1
    while top * 2 < span:
        top *= 2
    mask = top
    while mask >= 1:  # down: the farthest subtree first
        if mask < span and me + mask < world:
            run.t.send(me + mask, final)
            run.bytes_sent += nbytes
        mask >>= 1
    run.decode_to_(data, final, torch.float32)
