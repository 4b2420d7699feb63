"""The device engine: the native engine (csrc/torch/engine.cc) in tensor operations.

It composes the algorithms of :mod:`torch_cgx.device.algorithms` for one group, over a
:class:`~torch_cgx.device.transport.GroupTransport`: rotation around a hierarchical or flat
compressed allreduce, the compressed reduce-scatter, the exact reductions, the call counters
that number the random streams, and the byte counters. Tensors stay on their device; the only
host reads are the size exchanges of data-dependent payloads and the lazy header check
(:meth:`DeviceEngine.check_headers`).

>>> call = DeviceCall.from_config(torch_cgx.get_config(group), average=True)  # None: exact
>>> engine = DeviceEngine(GroupTransport(inner_backend, rank, size))
>>> engine.allreduce(grad, call)                     # in place, on grad's device
"""

from __future__ import annotations

from typing import Callable, Dict, Optional

import torch

from torch_cgx import settings
from torch_cgx.device.algorithms import common, gather, ring, rotation, sra, tree
from torch_cgx.device.algorithms import hierarchical as hier
from torch_cgx.device.algorithms import reduce_scatter as rs
from torch_cgx.device.call import DeviceCall, resolve

__all__ = ["DeviceCall", "DeviceEngine", "Hierarchy"]

Hierarchy = hier.Hierarchy


def _ring_bytes(world: int, nbytes: int) -> int:
    return 2 * (world - 1) * nbytes // world


def _check_tensor(t, what: str, floating: bool = True) -> None:
    """ValueError unless ``t`` is a dense tensor of a dtype the call can reduce: floating
    point, or (``floating=False``: an exact sum) integer too, as the native exact path."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{what} must be a tensor, got {type(t).__name__}")
    if t.is_complex() or t.dtype == torch.bool:
        raise ValueError(f"{what} must be a real number tensor, got {t.dtype}")
    if floating and not t.is_floating_point():
        raise ValueError(f"{what} must be a floating-point tensor (a mean or a compressed "
                         f"call), got {t.dtype}")  # fmt: skip
    if t.layout != torch.strided:
        raise ValueError(f"{what} must be a dense (strided) tensor, got {t.layout}")


class DeviceEngine:
    """Compressed and exact reductions of one group on the device (see the module).

    ``codecs``: the codec factory ``(name, **params) -> DeviceCodec`` (default
    ``torch_cgx.device.codecs.get``). ``check``: when headers are checked: ``"end"`` (at the end
    of each call: a host read), ``"deferred"`` (only in :meth:`check_headers`, which the caller
    runs where it synchronises anyway), ``"auto"`` (end on CPU tensors, deferred elsewhere)."""

    def __init__(
        self,
        transport,
        hierarchy: Optional[Hierarchy] = None,
        *,
        codecs: Optional[Callable] = None,
        check: str = "auto",
    ) -> None:
        if check not in ("auto", "end", "deferred"):
            raise ValueError(f"check must be auto, end or deferred, got {check!r}")
        self.t, self.hierarchy, self.check = transport, hierarchy, check
        if codecs is None:
            from torch_cgx.device import codecs as _codecs

            codecs = _codecs.get
        self._make_codec = codecs
        self._plans: Dict[DeviceCall, common.Plan] = {}
        self._calls = 0  # numbers each algorithm run's random streams (the native calls_)
        self._rotated_calls = 0
        self._bad: Optional[torch.Tensor] = None
        self._stats = dict.fromkeys(
            (
                "bytes_sent",
                "bytes_exact",
                "calls_compressed",
                "calls_exact",
                "reduce_scatter_compressed",
                "reduce_scatter_exact",
            ),
            0,
        )

    # ---- public ----

    def stats(self) -> dict:
        """This engine's counters (the fields of :class:`torch_cgx.Stats` it keeps)."""
        return dict(self._stats)

    def check_headers(self) -> None:
        """Raises ValueError when a payload received since the last check had a header other
        than expected (other settings on a peer, or corrupt bytes). Reads one device flag."""
        bad, self._bad = self._bad, None
        if bad is not None and bool(bad):
            raise ValueError(
                "a payload received had a header other than this rank expected "
                "(compressor settings differ between ranks?)"
            )

    def allreduce(
        self,
        tensor: torch.Tensor,
        call: Optional[DeviceCall],
        *,
        stream: int = -1,
        residual: Optional[torch.Tensor] = None,
        average: bool = False,
    ) -> None:
        """Reduces ``tensor`` in place over the group with ``call`` (None: exactly, a mean
        when ``average``). ``stream``: the index of the call's random streams, >= 0, or -1 for
        this engine's call counter (the native ``BackendConfig.stream``). ``residual``: an fp32
        tensor of ``tensor``'s numel on its device, contiguous, that receives what this rank's
        compression left out (zeros when the call runs exactly). Integer tensors are summed
        exactly (a mean needs floating point)."""
        mean = call.average if call is not None else average
        _check_tensor(tensor, "tensor", floating=mean)
        if not isinstance(stream, int) or stream < -1:
            raise ValueError(
                f"stream must be an int >= 0, or -1 for the call counter, got {stream!r}"
            )
        if residual is not None:
            self._check_residual(residual, tensor)
            residual.zero_()
        work = tensor.contiguous().view(-1)
        if call is None or not self._eligible(work, call):
            self.allreduce_exact(work, mean)
        else:
            self._allreduce(work, call, stream, residual)
        if work.data_ptr() != tensor.data_ptr():
            tensor.copy_(work.view(tensor.shape))
        self._maybe_check(tensor)

    def allreduce_exact(self, tensor: torch.Tensor, average: bool) -> None:
        """The exact sum (mean) of ``tensor`` in place, counted as the native exact path."""
        _check_tensor(tensor, "tensor", floating=average)
        self.t.allreduce_exact(tensor, average)
        nbytes = tensor.numel() * (4 if tensor.element_size() < 4 else tensor.element_size())
        sent = _ring_bytes(self.t.size, nbytes)
        self._count(calls_exact=1, bytes_sent=sent, bytes_exact=sent)

    def reduce_scatter(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        call: Optional[DeviceCall],
        *,
        stream: int = -1,
        average: bool = False,
    ) -> None:
        """``output`` = chunk ``rank`` of the sum (a mean: ``call.average``, or ``average``
        when ``call`` is None) over the ranks of ``input`` (``size`` chunks of ``output``'s
        numel); compressed as the native one-shot reduce-scatter when ``call`` compresses
        ``output``, else exactly (fp32 sums)."""
        mean = call.average if call is not None else average
        _check_tensor(output, "output")
        _check_tensor(input, "input")
        world = self.t.size
        if input.numel() != output.numel() * world:
            raise ValueError(
                f"reduce_scatter: input has {input.numel()} values, expected "
                f"{world} x {output.numel()}"
            )
        if input.dtype != output.dtype or input.device != output.device:
            raise ValueError("reduce_scatter: input and output differ in dtype or device")
        flat = input.contiguous().view(-1)
        out = output.contiguous().view(-1)
        if call is None or world == 1 or not self._eligible(out, call):
            self._reduce_scatter_exact(out, flat, mean)
        else:
            self._count(
                reduce_scatter_compressed=1, bytes_exact=(world - 1) * 4 * flat.numel() // world
            )
            run = self._run_state(self.t, call, call.average, stream, None)
            rs.reduce_scatter(run, out, flat)
            self._finish(run)
        if out.data_ptr() != output.data_ptr():
            output.copy_(out.view(output.shape))
        self._maybe_check(output)

    # ---- the compressed allreduce ----

    def _allreduce(self, work, call: DeviceCall, stream: int, residual) -> None:
        self._count(calls_compressed=1, bytes_exact=_ring_bytes(self.t.size, 4 * work.numel()))
        if not call.rotation:
            return self._unrotated(work, call, stream, residual)
        index = self._rotated_calls if stream < 0 else stream
        self._rotated_calls += 1
        seed = rotation.rotation_seed(call.seed, index)
        fp32 = work if work.dtype == torch.float32 else work.float()
        block = int(call.param("bucket_size"))
        rotation.with_rotation(
            fp32, block, seed, residual, lambda d, r: self._unrotated(d, call, stream, r)
        )
        if fp32.data_ptr() != work.data_ptr():
            work.copy_(fp32)

    def _unrotated(self, work, call: DeviceCall, stream: int, residual) -> None:
        if self.hierarchy is None:
            return self._run(self.t, work, call, call.average, stream, residual)
        h = self.hierarchy
        fp32 = work.float()
        if fp32.data_ptr() == work.data_ptr():
            fp32 = fp32.clone()
        plan = self._plan(call)
        hier.hierarchical(
            h,
            fp32,
            plan.alignment,
            self.t.size if call.average else 0,
            residual,
            lambda tr, v, r: self._run(tr, v, call, False, stream, r),
        )
        work.copy_(fp32)

    def _run(self, transport, data, call: DeviceCall, average: bool, stream: int, residual):
        """One compressed allreduce of the 1-D contiguous ``data`` over ``transport``, piece by
        piece (allreduce.cc ``run``)."""
        run = self._run_state(transport, call, average, stream, None)
        n, esize = data.numel(), data.element_size()
        if transport.size == 1 or n == 0:
            return
        plan = run.plan
        piece_elems = max(1, call.fusion_bytes // esize)
        for piece, begin in enumerate(range(0, n, piece_elems)):
            p = data[begin : begin + piece_elems]
            res = None if residual is None else residual[begin : begin + p.numel()]
            if self._lanes(call, plan, esize, p.numel()):
                a = plan.alignment
                seg = max(1, call.segment_bytes // esize // a) * a
                for k, b in enumerate(range(0, p.numel(), seg)):
                    run.residual = None if res is None else res[b : b + seg]
                    self._piece(run, call, p[b : b + seg], common.segment_id(piece, k))
            else:
                run.residual = res
                self._piece(run, call, p, piece)
        self._finish(run)

    @staticmethod
    def _lanes(call: DeviceCall, plan: common.Plan, esize: int, count: int) -> bool:
        """Whether the native engine pipelines this piece in lanes (lanes.cc ``lanes_apply``):
        then its segments are reduced as pieces of their own."""
        if call.segment_bytes == 0 or count * esize <= call.segment_bytes:
            return False
        if plan.sum_in_transit or plan.gather_only:
            return call.pipeline_sparse
        return call.algorithm != "sra"

    @staticmethod
    def _piece(run: common.Run, call: DeviceCall, data, piece: int) -> None:
        """One piece with the algorithm the call and its compressor take (reduce_piece)."""
        plan = run.plan
        if call.algorithm != "allgather" and plan.sum_in_transit:
            gather.sum_reduce(run, data, piece)
        elif call.algorithm == "allgather" or plan.gather_only:
            gather.allgather_reduce(run, data, piece)
        elif call.algorithm == "tree":
            tree.tree(run, data, piece)
        elif call.algorithm == "ring":
            ring.ring(run, data, piece)
        else:
            sra.sra(run, data, piece, call.segment_bytes)

    # ---- helpers ----

    def _run_state(self, transport, call, average, stream, residual) -> common.Run:
        index = self._calls if stream < 0 else stream
        self._calls += 1
        return common.Run(
            transport,
            self._plan(call),
            seed=call.seed,
            call_index=index,
            average=average,
            residual=residual,
            header_flag=None,
        )

    def _finish(self, run: common.Run) -> None:
        self._count(bytes_sent=run.bytes_sent)
        if run.bad is not None:
            self._bad = run.bad if self._bad is None else self._bad | run.bad

    def _plan(self, call: DeviceCall) -> common.Plan:
        plan = self._plans.get(call)
        if plan is None:
            plan = self._plans[call] = resolve(call, self._make_codec)
        return plan

    def _eligible(self, t: torch.Tensor, call: DeviceCall) -> bool:
        size = max(call.min_size, settings.MIN_SIZE_FLOOR)
        return t.dtype in common.FLOAT_DTYPES and t.numel() >= size

    def _reduce_scatter_exact(self, out, flat, average: bool) -> None:
        world = self.t.size
        part = flat.float()
        part = self.t.reduce_scatter_sum(part) if world > 1 else part.clone()
        if average:
            common.divide_(part, world)
        out.copy_(part)
        sent = (world - 1) * flat.numel() * flat.element_size() // world
        self._count(reduce_scatter_exact=1, bytes_sent=sent, bytes_exact=sent)

    def _check_residual(self, residual, tensor) -> None:
        if not isinstance(residual, torch.Tensor) or residual.dtype != torch.float32:
            raise ValueError("residual must be a float32 tensor")
        if not residual.is_contiguous() or residual.numel() != tensor.numel():
            raise ValueError(
                f"residual must be contiguous with {tensor.numel()} values, got {residual.numel()}"
            )
        if residual.device != tensor.device:
            raise ValueError(f"residual is on {residual.device}, the tensor on {tensor.device}")

    def _maybe_check(self, t: torch.Tensor) -> None:
        if self.check == "end" or (self.check == "auto" and t.device.type == "cpu"):
            self.check_headers()

    def _count(self, **add) -> None:
        for k, v in add.items():
            self._stats[k] += int(v)
