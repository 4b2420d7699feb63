"""Compressed reduce-scatter for FSDP2 (``fully_shard``), ZeRO++'s way, on torch.distributed.

    from torch_cgx import fsdp
    fully_shard(block) ...; fully_shard(model)
    fsdp.compress(model, compressor="maxmin", bits=8)   # every FSDPModule in the tree

FSDP2 hands its custom reduce-scatter (``FSDPModule.set_custom_reduce_scatter``) the flat
gradient buffer of a parameter group: W chunks, chunk j owned by rank j. Here each rank encodes
the chunks it does not own with the compressor, one all-to-all delivers to every owner the W - 1
payloads of its chunk, and the owner adds them, decoded, to its own chunk in fp32 (its own values
stay exact). Each value is quantized exactly once, so the error of an owned value is at most the
sum, over the other ranks, of one quantization error of that rank's value (max-min, nearest
rounding: half a step, (max - min) / (2^bits - 1) / 2, of its bucket); docs/algorithms.md. SUM
and AVG are served; other ops, and buffers under ``min_size`` values per chunk (``min_numel``,
a deprecated alias, is accepted), go through the group's own exact reduce-scatter. Any group works
(Gloo, NCCL, cgx): the payloads are bytes. No error feedback (as in ZeRO++): the error of a
step is not carried to the next.

The data stays on the tensors' device: chunks are encoded, exchanged, decoded and summed there
by the device codecs of :mod:`torch_cgx.device.codecs` (the native codec's bytes), so on an
NCCL group CUDA chunks never leave the GPU, and CPU tensors on Gloo run the same code. The host
reads only sizes: the (size, largest size) pairs of the first call for a chunk shape
(fixed-size compressors: the settings check, once) or of every call (data-dependent sizes).
``data_plane`` chooses as the backend's setting does: ``"auto"`` (default) takes that path for
tensors off the CPU and the native codec for CPU tensors (several times faster there, the same
bytes); ``"device"`` takes it for every tensor (how the CPU tests run the GPU path); ``"host"``
(or a compressor without a device codec) a host copy and the native codec (docs/gpu-engine.md,
"Entry points on the device").
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch
import torch.distributed as dist

from torch_cgx import compressors
from torch_cgx.hooks import core
from torch_cgx.hooks.compression import DEFAULT_BITS
from torch_cgx.settings import min_size_default

__all__ = ["CompressedAllGather", "CompressedReduceScatter", "compress"]


try:  # FSDP2's interfaces (torch >= 2.7); their module path is private
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather as _AllGather
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter as _ReduceScatter
except ImportError:  # pragma: no cover - older torch: usable by hand, not by FSDP2
    _AllGather = _ReduceScatter = object

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def _min_size(min_size: Optional[int], min_numel: Optional[int]) -> int:
    """Chunks under this many values are reduced (or gathered) exactly; default: the table's for
    fsdp (a chunk is 1/W of a parameter group's buffer, not a layer: settings.MIN_SIZE_DEFAULTS)."""
    return core.check_min_size(min_size, min_numel, "min_numel", min_size_default("fsdp"))


class _MinSizeAlias:
    @property
    def min_numel(self) -> int:
        """Deprecated alias of :attr:`min_size` (no compatibility target uses it): use
        ``min_size``."""
        return self.min_size


def _device_codec(compressor: str, params: dict, data_plane: str):
    """The device codec of ``compressor`` (None: the host path, by choice or for want of one)."""
    if data_plane not in ("auto", "device", "host"):
        raise ValueError(f"data_plane must be 'auto', 'device' or 'host', got {data_plane!r}")
    if data_plane == "host":
        return None
    from torch_cgx.device import codecs

    if compressor not in codecs.names():
        return None  # no device codec: the native one through a host copy (docs/gpu.md)
    return codecs.get(compressor, **params)


def _on_host(comm, t: torch.Tensor) -> bool:
    """Whether ``comm`` takes the host path for ``t`` (see the module's ``data_plane``)."""
    return comm.device_codec is None or (comm.data_plane == "auto" and t.device.type == "cpu")


def _divide_(t: torch.Tensor, w: int) -> None:
    """``t /= w`` as an IEEE division on every device (a CPU scalar divisor lets CUDA multiply by
    its reciprocal instead)."""
    t.div_(torch.full((), float(w), dtype=t.dtype, device=t.device))


class CompressedReduceScatter(_MinSizeAlias, _ReduceScatter):
    """A ``ReduceScatter`` for FSDP2 that sends compressed chunks (see the module docstring).

    Args:
        compressor: a name of ``torch_cgx.compressors.names()`` (default max-min).
        min_size: chunks with fewer values are reduced exactly (default 4096).
        min_numel: deprecated alias of ``min_size`` (no compatibility target uses it): use
            ``min_size``.
        data_plane: ``"auto"`` (default: tensors off the CPU on their device through the
            device codecs, CPU tensors through the native codec), ``"device"`` (every tensor
            through the device codecs) or ``"host"`` (a host copy and the native codec); the
            same bytes.
        **params: the compressor's parameters (max-min: ``bits`` default 4, as the hooks':
            docs/hooks.md; ``bucket_size``).

    ``calls`` counts the compressed calls, ``bytes_sent`` the bytes this rank sent in all of them
    (exact ones as (W - 1) chunks). ``check``: when the device path reads the received headers'
    flag (a host read): ``"auto"`` (at once on CPU tensors, at :meth:`check_headers` elsewhere),
    ``"end"`` or ``"deferred"``.
    """

    def __init__(
        self,
        compressor: str = "maxmin",
        min_size: Optional[int] = None,
        *,
        min_numel: Optional[int] = None,
        data_plane: str = "auto",
        **params,
    ) -> None:
        if compressor == "maxmin":
            params.setdefault("bits", DEFAULT_BITS)
        self.codec = compressors.get(compressor, **params)  # ValueError names the problem
        self.device_codec = _device_codec(compressor, params, data_plane)
        self.data_plane = data_plane
        self.min_size = _min_size(min_size, min_numel)
        self.calls, self.bytes_sent = 0, 0
        self.check = "auto"
        self.all_gather: Optional[CompressedAllGather] = None  # set by compress()
        self._checked: set = set()  # (group, n, dtype) whose sizes were checked (fixed-size)
        self._bad: Optional[torch.Tensor] = None

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device):
        return torch.empty(size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op: bool = False):
        world, rank = group.size(), group.rank()
        n = output_tensor.numel()
        if input_tensor.numel() != n * world:
            raise ValueError(
                f"reduce-scatter input has {input_tensor.numel()} values, expected {world} x {n}"
            )
        average = op == dist.ReduceOp.AVG
        if (op != dist.ReduceOp.SUM and not average) or n < self.min_size or world == 1:
            self.bytes_sent += (world - 1) * n * output_tensor.element_size()
            return dist.reduce_scatter_tensor(
                output_tensor, input_tensor, op=op, group=group, async_op=async_op
            )
        chunks = input_tensor.detach().view(world, n)
        if _on_host(self, chunks):
            acc = self._host_reduce(chunks, group, rank, world)
        else:
            acc = self._device_reduce(chunks, group, rank, world)
        if average:
            _divide_(acc, world)
        output_tensor.copy_(acc.view(output_tensor.shape))
        self.calls += 1
        return None  # done: the result is in output_tensor (on a GPU: in stream order)

    def check_headers(self) -> None:
        """Raises ValueError when a payload received since the last check had a header other
        than this rank expected (other settings on a peer, corrupt bytes). Reads one flag."""
        bad, self._bad = self._bad, None
        if bad is not None and bool(bad):  # the one host read of the header check
            raise ValueError(
                "reduce-scatter: a payload received had a header other than this rank expected "
                "(compressor settings differ between ranks?)"
            )

    def _device_reduce(self, chunks, group, rank: int, world: int) -> torch.Tensor:
        """Encode, exchange, decode and sum on the chunks' device (the device codecs)."""
        codec, n, dtype = self.device_codec, chunks.shape[1], chunks.dtype
        stream = self.calls * world + rank  # distinct streams per call and sender
        empty = torch.empty(0, dtype=torch.uint8, device=chunks.device)
        payloads = [
            empty if j == rank else codec.encode(chunks[j], seed=0, stream=stream)
            for j in range(world)
        ]
        limit = codec.encoded_size(n, dtype)  # the largest honest payload
        key = (getattr(group, "group_name", id(group)), n, dtype)
        known = codec.fixed_size and key in self._checked
        sizes = [0 if j == rank else limit for j in range(world)] if known else None
        received = self._exchange(payloads, group, rank, world, limit, sizes)
        if codec.fixed_size:
            self._checked.add(key)
        acc = chunks[rank].to(torch.float32, copy=True)
        for j, payload in enumerate(received):
            if j != rank:
                ok = codec.header_ok(payload, n, dtype)
                self._bad = ~ok if self._bad is None else self._bad | ~ok
                codec.decode_add_(acc, payload, dtype=dtype)  # a fused kernel where one applies
        if self.check == "end" or (self.check == "auto" and chunks.device.type == "cpu"):
            self.check_headers()
        return acc

    def _host_reduce(self, chunks, group, rank: int, world: int) -> torch.Tensor:
        """The host path: a host copy, the native codec, the result back on the device."""
        stream = self.calls * world + rank
        # a device copy on the host only where the caller chose it (data_plane="host") or the
        # compressor has no device codec (_on_host); CPU chunks are used as they are
        host = chunks.cpu() if chunks.device.type != "cpu" else chunks
        payloads = [
            torch.empty(0, dtype=torch.uint8)
            if j == rank
            else self.codec.encode(host[j], seed=0, stream=stream)
            for j in range(world)
        ]
        limit = self.codec.encoded_size(chunks.shape[1], chunks.dtype)
        received = self._exchange(payloads, group, rank, world, limit, None)
        acc = host[rank].to(torch.float32, copy=True)
        for j, payload in enumerate(received):
            if j != rank:
                self.codec.decode_add_(acc, payload)
        return acc.to(chunks.device)

    def _exchange(self, payloads, group, rank, world, limit, sizes) -> List[torch.Tensor]:
        """payloads[j] to rank j; returns what each rank sent to this one. ``sizes``: the byte
        counts to expect when known (a fixed-size compressor whose settings were checked:
        nothing read on the host), else None: each size travels first with its sender's
        ``limit``, the largest payload of a chunk, and is read on the host: ranks whose limits
        differ (other settings) all raise before the payloads move, and a size above the limit
        is refused before anything is allocated for it."""
        device = payloads[rank].device
        send_sizes = [int(p.numel()) for p in payloads]
        if sizes is None:
            sizes = self._sizes(send_sizes, group, world, limit, device)
        send = torch.cat(payloads)
        recv = torch.empty(sum(sizes), dtype=torch.uint8, device=device)
        dist.all_to_all_single(recv, send, sizes, send_sizes, group=group)
        self.bytes_sent += send.numel()
        return list(recv.split(sizes))

    @staticmethod
    def _sizes(send_sizes, group, world: int, limit: int, device) -> List[int]:
        """The size exchange: what each rank will send this one, checked (a host read)."""
        from torch_cgx.device import constants  # the upload does not block: only the read does

        head = torch.tensor([[b, limit] for b in send_sizes], dtype=torch.int64)
        head = constants.upload(head, device)
        heads = torch.empty(world, 2, dtype=torch.int64, device=device)
        dist.all_to_all_single(heads.view(-1), head.view(-1), group=group)
        got = heads.tolist()  # the documented size read
        incoming, limits = [int(b) for b, _ in got], [int(lim) for _, lim in got]
        if any(other != limit for other in limits):
            raise ValueError(
                f"reduce-scatter: the ranks' compressor settings differ (largest payload of a "
                f"chunk per rank: {limits}); give every rank the same CompressedReduceScatter"
            )
        bad = [(j, b) for j, b in enumerate(incoming) if not 0 <= b <= limit]
        if bad:
            raise ValueError(
                f"reduce-scatter: rank(s) {[j for j, _ in bad]} announced payloads of "
                f"{[b for _, b in bad]} bytes, above the {limit} bytes a chunk can take"
            )
        return incoming


class CompressedAllGather(_MinSizeAlias, _AllGather):
    """An ``AllGather`` for FSDP2 that sends each rank's parameter shard block-quantized (max-min,
    ``bits`` per value, ``bucket_size`` values per block): every rank keeps its own shard exact
    and sees the others' within half a step of their block. Opt-in: it changes the weights the
    forward and backward passes see (never the sharded weights the optimizer updates). Shards
    under ``min_size`` values (``min_numel``: a deprecated alias; use ``min_size``) or of
    non-float dtypes are gathered exactly. ``bytes_sent``: what this rank's shard costs the wire,
    (W - 1) payloads (or exact shards) per call. Its 8 default bits are not the gradients' 4:
    these are the weights every forward and backward pass sees, with no error feedback over
    steps. The shards are encoded and decoded on their device (``data_plane="host"``: through a
    host copy)."""

    def __init__(
        self,
        bits: int = 8,
        bucket_size: int = 256,
        min_size: Optional[int] = None,
        *,
        min_numel: Optional[int] = None,
        data_plane: str = "auto",
    ) -> None:
        self.codec = compressors.get("maxmin", bits=bits, bucket_size=bucket_size)
        params = dict(bits=bits, bucket_size=bucket_size)
        self.device_codec = _device_codec("maxmin", params, data_plane)
        self.data_plane = data_plane
        self.min_size = _min_size(min_size, min_numel)
        self.calls, self.bytes_sent = 0, 0

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device):
        return torch.empty(size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, async_op: bool = False):
        world, rank = group.size(), group.rank()
        m = input_tensor.numel()
        if output_tensor.numel() != m * world:
            raise ValueError(
                f"all-gather output has {output_tensor.numel()} values, expected {world} x {m}"
            )
        if m < self.min_size or world == 1 or input_tensor.dtype not in _FLOATS:
            self.bytes_sent += (world - 1) * m * input_tensor.element_size()
            return dist.all_gather_into_tensor(
                output_tensor, input_tensor, group=group, async_op=async_op
            )
        shard, dtype = input_tensor.detach().reshape(-1), input_tensor.dtype
        codec = None if _on_host(self, shard) else self.device_codec
        if codec is None:  # the host path (data_plane="host", or no device codec: _on_host)
            payload = self.codec.encode(shard.cpu()).to(shard.device)
        else:  # on the shard's device, the native codec's bytes
            payload = codec.encode(shard.contiguous())
        gathered = payload.new_empty(world * payload.numel())
        dist.all_gather_into_tensor(gathered, payload, group=group)
        slots = output_tensor.view(world, m)
        mine = shard.clone()  # the input may be this rank's slot of the output
        for j, part in enumerate(gathered.view(world, -1)):
            if j == rank:
                continue
            if codec is None:
                slots[j].copy_(self.codec.decode(part.cpu(), dtype=torch.float32))
            else:  # -0.0 + v == v bitwise: a decode-add into -0.0 is the values, rounded once
                codec.decode_add_(slots[j].fill_(-0.0), part, dtype=dtype)
        slots[rank].copy_(mine)
        self.calls += 1
        self.bytes_sent += (world - 1) * payload.numel()  # as a ring all-gather sends
        return None


def compress(
    module: torch.nn.Module,
    compressor: str = "maxmin",
    min_size: Optional[int] = None,
    all_gather_bits: Optional[int] = None,
    *,
    min_numel: Optional[int] = None,
    data_plane: str = "auto",
    **params,
) -> CompressedReduceScatter:
    """Sets a compressed reduce-scatter on every ``fully_shard`` module in ``module``'s tree
    (one shared object: its ``calls`` and ``bytes_sent`` count all of them) and, with
    ``all_gather_bits`` (e.g. 8), a block-quantized parameter all-gather
    (:class:`CompressedAllGather`, kept as ``.all_gather`` of the returned object).
    ``data_plane``: ``"auto"`` (default), ``"device"`` or ``"host"``, for both. ``min_numel``:
    a deprecated alias of ``min_size`` (use ``min_size``). ValueError when none is sharded."""
    from torch.distributed.fsdp import FSDPModule

    min_size = _min_size(min_size, min_numel)
    comm = CompressedReduceScatter(compressor, min_size, data_plane=data_plane, **params)
    if all_gather_bits is not None:
        comm.all_gather = CompressedAllGather(
            all_gather_bits, min_size=min_size, data_plane=data_plane
        )
    sharded = [m for m in module.modules() if isinstance(m, FSDPModule)]
    if not sharded:
        raise ValueError("no module in the tree is sharded: call fully_shard first")
    for m in sharded:
        m.set_custom_reduce_scatter(comm)
        if comm.all_gather is not None:
            m.set_custom_all_gather(comm.all_gather)
    return comm
