"""The device engine's transport: the collectives its algorithms need, over any c10d group.

:class:`GroupTransport` wraps a c10d ``Backend`` (the cgx backend's inner NCCL one for CUDA
tensors, a Gloo one for CPU tensors) or a ``ProcessGroup``: both expose the same methods
(``_allgather_base``, ``alltoall_base``, ``send`` / ``recv``, ``allreduce``, ...), in the
group's own ranks. Payloads are uint8 tensors on the data's device and stay there; every
operation waits on its Work before returning, which blocks the host on Gloo (CPU tensors) and,
on NCCL, only makes the current stream wait.

The only values read back to the host are payload sizes, in :meth:`GroupTransport.allgather_v`
and in :meth:`GroupTransport.alltoall_v` without ``recv_sizes``: an algorithm calls them only for
compressors whose payload size depends on the data (threshold, DGC, GradDrop); the sizes go
up through ``constants.upload`` (non-blocking: only the read back waits). One exception by
necessity: over Gloo, point-to-point payloads of device tensors (ring, tree) are staged through
host memory, since Gloo's ``send`` / ``recv`` take host pointers only (NCCL is the device plane's
transport wherever it can serve).
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch
import torch.distributed as dist

from torch_cgx.device import constants

__all__ = ["GroupTransport"]

_LOW = (torch.float16, torch.bfloat16)


class GroupTransport:
    """The collectives of one group of ``size`` ranks, this one ``rank`` (see the module)."""

    def __init__(self, pg, rank: int, size: int, device=None) -> None:
        for what, v in (("rank", rank), ("size", size)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"GroupTransport: {what} must be an int, got {v!r}")
        if size < 1 or not 0 <= rank < size:
            raise ValueError(f"GroupTransport: rank {rank} outside a group of {size}")
        for method in ("_allgather_base", "alltoall_base", "send", "recv", "allreduce"):
            if not hasattr(pg, method):
                raise ValueError(f"GroupTransport needs a c10d Backend or ProcessGroup, got {pg!r}")
        self.pg, self.rank, self.size = pg, rank, size
        self.device = torch.device("cpu") if device is None else torch.device(device)
        # Gloo's send / recv hand the tensor's pointer to a socket: device payloads are staged
        # through host memory there (its collectives stage CUDA tensors themselves).
        name = pg.name() if hasattr(pg, "name") else type(pg).__name__
        self._gloo = "gloo" in str(name).lower()

    def __repr__(self) -> str:
        return f"GroupTransport(rank={self.rank}, size={self.size}, device={self.device})"

    # ---- payloads ----

    def allgather(self, t: torch.Tensor) -> List[torch.Tensor]:
        """Every rank's ``t`` (1-D, the same numel and dtype on every rank), in rank order."""
        t = t.contiguous().view(-1)
        if self.size == 1:
            return [t]
        if t.numel() == 0:
            return [t] * self.size
        out = t.new_empty(self.size * t.numel())
        self.pg._allgather_base(out, t).wait()
        return list(out.view(self.size, -1).unbind(0))

    def allgather_v(self, t: torch.Tensor, limit: Optional[int] = None) -> List[torch.Tensor]:
        """Every rank's 1-D ``t`` of any length: the lengths first (read on the host), then the
        payloads padded to the longest. A length above ``limit`` raises ValueError before
        anything is sized by it."""
        t = t.contiguous().view(-1)
        mine = constants.upload(torch.tensor([t.numel()], dtype=torch.int64), t.device)
        sizes = self.allgather(mine)
        sizes = torch.cat(sizes).tolist()  # the size exchange: a host read
        self._check_sizes(sizes, limit, "allgather")
        slot = max(sizes)
        if slot > t.numel():
            t = torch.cat([t, t.new_zeros(slot - t.numel())])
        return [p[:n] for p, n in zip(self.allgather(t), sizes)]

    def alltoall_v(
        self,
        chunks: Sequence[torch.Tensor],
        recv_sizes: Optional[List[int]] = None,
        limit: Optional[int] = None,
    ) -> List[torch.Tensor]:
        """``chunks[j]`` (1-D uint8) to rank ``j``; returns what each rank sent this one.
        ``recv_sizes``: the byte counts to expect when the caller knows them (fixed-size
        payloads: nothing read on the host); None: exchanged first and read on the host
        (each checked against ``limit``)."""
        if len(chunks) != self.size:
            raise ValueError(f"alltoall_v: {len(chunks)} chunks for {self.size} ranks")
        send = [c.contiguous().view(-1).view(torch.uint8) for c in chunks]
        send_sizes = [int(c.numel()) for c in send]
        device = send[0].device
        if recv_sizes is None:
            mine = constants.upload(torch.tensor(send_sizes, dtype=torch.int64), device)
            theirs = torch.empty_like(mine)
            self.pg.alltoall_base(theirs, mine, [1] * self.size, [1] * self.size).wait()
            recv_sizes = theirs.tolist()  # the size exchange: a host read
            self._check_sizes(recv_sizes, limit, "alltoall")
        flat = torch.cat(send) if send else torch.empty(0, dtype=torch.uint8, device=device)
        out = torch.empty(sum(recv_sizes), dtype=torch.uint8, device=device)
        if self.size > 1:  # every rank calls, even with nothing to move (a collective)
            self.pg.alltoall_base(out, flat, list(recv_sizes), send_sizes).wait()
        return list(out.split(list(recv_sizes)))

    def sendrecv(self, to: int, send: torch.Tensor, frm: int, recv_numel: int) -> torch.Tensor:
        """Sends ``send`` (1-D uint8) to ``to`` while receiving ``recv_numel`` bytes from
        ``frm``. On CUDA both go in one coalesced NCCL group (two separate calls could each
        wait for the other on a ring)."""
        send = send.contiguous().view(-1)
        if self._staged(send.device):  # GPU only
            return self.sendrecv(to, send.cpu(), frm, recv_numel).to(send.device)
        buf = torch.empty(recv_numel, dtype=torch.uint8, device=send.device)
        coalesce = send.is_cuda and hasattr(self.pg, "_start_coalescing")
        if coalesce:  # GPU only
            self.pg._start_coalescing(send.device)
        s = self.pg.send([send], to, 0)
        r = self.pg.recv([buf], frm, 0)
        if coalesce:  # GPU only
            work = self.pg._end_coalescing(send.device)
            if work is not None:
                work.wait()
                return buf
        s.wait()
        r.wait()
        return buf

    def send(self, to: int, t: torch.Tensor) -> None:
        t = t.contiguous().view(-1)
        if self._staged(t.device):  # GPU only
            t = t.cpu()
        self.pg.send([t], to, 0).wait()

    def recv(self, frm: int, numel: int, device=None) -> torch.Tensor:
        device = torch.device(device or self.device)
        host = self._staged(device)
        buf = torch.empty(numel, dtype=torch.uint8, device="cpu" if host else device)
        self.pg.recv([buf], frm, 0).wait()
        return buf.to(device) if host else buf

    def _staged(self, device: torch.device) -> bool:
        return self._gloo and device.type != "cpu"

    # ---- exact collectives ----

    def allreduce_exact(self, t: torch.Tensor, average: bool) -> None:
        """Exact sum (``average``: mean) of ``t`` in place, as the native engine's exact path:
        fp16 / bf16 summed in fp32, AVG as a SUM divided afterwards."""
        work = t.float() if t.dtype in _LOW else t.contiguous()
        if self.size > 1:
            opts = dist.AllreduceOptions()
            opts.reduceOp = dist.ReduceOp.SUM
            self.pg.allreduce([work], opts).wait()
        if average:
            work.div_(torch.full((), float(self.size), dtype=work.dtype, device=work.device))
        if work.data_ptr() != t.data_ptr():
            t.copy_(work.view(t.shape))

    def reduce_sum(self, t: torch.Tensor, root: int) -> None:
        """``t`` (contiguous fp32) summed into rank ``root``'s ``t``."""
        opts = dist.ReduceOptions()
        opts.rootRank, opts.reduceOp = root, dist.ReduceOp.SUM
        self.pg.reduce([t], opts).wait()

    def broadcast(self, t: torch.Tensor, root: int) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        self.pg.broadcast([t], opts).wait()

    def reduce_scatter_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Slice ``rank`` of the sum of every rank's ``t`` (``size`` equal slices, fp32)."""
        out = t.new_empty(t.numel() // self.size)
        opts = dist.ReduceScatterOptions()
        opts.reduceOp = dist.ReduceOp.SUM
        self.pg._reduce_scatter_base(out, t, opts).wait()
        return out

    def _check_sizes(self, sizes, limit, what: str) -> None:
        if limit is None:
            return
        for r, n in enumerate(sizes):
            if n > limit:
                raise ValueError(
                    f"{what}: rank {r} announced a {n}-byte payload, more than the "
                    f"{limit} bytes any payload of this call can take (settings "
                    "differ between ranks?)"
                )
