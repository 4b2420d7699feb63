"""A cgx group's device plane: the calls the c10d adapter hands it (csrc/torch/device_plane.h).

``data_plane`` (torch_cgx/settings.py) decides which tensors come here: ``auto`` CUDA tensors,
``device`` every tensor (how the CPU test suite runs this code), ``host`` none. A call arrives
with the group's settings for it (per-call variables and the plan applied by the adapter), runs
on the caller's thread through :class:`~torch_cgx.device.engine.DeviceEngine` over the plane's
own backend (NCCL for CUDA tensors when the group's ranks use distinct GPUs, compared through
the group's store; else a Gloo group of its own: see :func:`install`), and returns a completed
Work: on CUDA its future is CUDA-aware (``wait()`` makes the current stream wait, the host never
blocks), since every kernel and NCCL call was enqueued on the current stream.
"""

from __future__ import annotations

import itertools
import sys
import weakref
from typing import Callable, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist

from torch_cgx import _C
from torch_cgx.config import CGXConfig
from torch_cgx.device.engine import DeviceCall, DeviceEngine
from torch_cgx.device.transport import GroupTransport

__all__ = ["DevicePlane", "install", "plane_of"]

_SUM, _AVG = 0, 1  # c10d's RedOpType values
_OPS = {2: "PRODUCT", 3: "MIN", 4: "MAX", 5: "BAND", 6: "BOR", 7: "BXOR"}
_PLANES: weakref.WeakValueDictionary[int, DevicePlane] = weakref.WeakValueDictionary()
_TOKENS = itertools.count(1)


class DevicePlane:
    """The device plane of one cgx group (see the module). ``transports``: device type ->
    :class:`GroupTransport` (``cuda``: NCCL or Gloo; ``cpu``: Gloo, with ``data_plane=device``)."""

    def __init__(self, transports: Dict[str, GroupTransport], hierarchies=None,
                 lazy: Optional[Dict[str, Callable]] = None) -> None:  # fmt: skip
        self.transports = transports
        hierarchies = hierarchies or {}
        self.engines = {
            kind: DeviceEngine(t, hierarchies.get(kind)) for kind, t in transports.items()
        }
        # device type -> the transport's maker, for tensors served only for compressors written
        # in Python (made at their first call, which every rank makes: the Gloo rendezvous)
        self.lazy = dict(lazy or {})
        self.token = next(_TOKENS)
        self._calls: Dict[tuple, Optional[DeviceCall]] = {}
        self._since: dict = {}
        _PLANES[self.token] = self

    def _totals(self) -> dict:
        out: dict = {}
        for engine in self.engines.values():
            for k, v in engine.stats().items():
                out[k] = out.get(k, 0) + v
        return out

    def stats(self) -> dict:
        """The plane's counters since creation or :meth:`reset_stats`, summed over its engines
        (``torch_cgx.stats`` adds them to the native engine's)."""
        return {k: v - self._since.get(k, 0) for k, v in self._totals().items()}

    def reset_stats(self) -> None:
        self._since = self._totals()

    def __call__(self, kind: str, outputs: List[torch.Tensor], inputs, op: int, native):
        t = outputs[0]
        engine = self._engine(t)
        if op == _AVG and not t.is_floating_point():  # as the native adapter
            raise ValueError(f"ReduceOp.AVG needs a floating-point tensor, got {t.dtype}")
        if op not in (_SUM, _AVG) and op not in _OPS:  # PREMUL_SUM: its factor is not here
            raise ValueError(f"the cgx device plane does not serve reduce op {op} (RedOpType)")
        if op not in (_SUM, _AVG) or not t.is_floating_point():
            self._exact_other(engine.t, kind, outputs, inputs, op)
            return _done(outputs)
        call = self._call(native, op == _AVG)
        if kind == "allreduce_call":  # the hooks' and allreduce_with's: the stream is given
            residual = inputs[0] if inputs else None
            engine.allreduce(t, call, stream=native.stream, residual=residual, average=op == _AVG)
        elif kind == "allreduce":
            engine.allreduce(t, call, average=op == _AVG)
        elif kind == "allreduce_coalesced":  # one fused piece, as the native adapter
            flat = torch.cat([x.reshape(-1) for x in outputs])
            engine.allreduce(flat, call, average=op == _AVG)
            _scatter_back(flat, outputs)
        elif kind == "reduce_scatter_base":
            engine.reduce_scatter(t, inputs[0], call, average=op == _AVG)
        elif kind == "reduce_scatter":
            flat = torch.cat([x.reshape(-1) for x in inputs])
            engine.reduce_scatter(t, flat, call, average=op == _AVG)
        elif kind == "reduce_scatter_coalesced":
            world = engine.t.size
            rows = [x.reshape(world, o.numel()) for x, o in zip(inputs, outputs)]
            out = t.new_empty(sum(o.numel() for o in outputs))
            engine.reduce_scatter(out, torch.cat(rows, 1).reshape(-1), call, average=op == _AVG)
            _scatter_back(out, outputs)
        else:
            raise ValueError(f"cgx device plane: unknown call {kind!r}")
        return _done(outputs)

    def serves(self, tensor: torch.Tensor, compressor: str = "") -> bool:
        """Whether the plane reduces ``tensor`` in a call with ``compressor`` (the adapter's
        rule, device_plane.h): every tensor of its devices, and any tensor for a compressor
        written in Python."""
        kind = tensor.device.type
        if kind in self.engines and kind not in self.lazy:
            return True
        return (
            bool(compressor)
            and _C.is_external_compressor(compressor)
            and (kind in self.engines or kind in self.lazy)
        )

    # ---- helpers ----

    def _engine(self, t: torch.Tensor) -> DeviceEngine:
        engine = self.engines.get(t.device.type)
        if engine is None and t.device.type in self.lazy:
            transport = self.lazy[t.device.type]()
            self.transports[t.device.type] = transport
            engine = self.engines[t.device.type] = DeviceEngine(transport)
        if engine is None:
            raise ValueError(
                f"the cgx group's device plane carries {sorted(self.engines)} tensors, got one "
                f"on {t.device} (data_plane={'device' if 'cpu' in self.engines else 'auto'})"
            )
        return engine

    def _call(self, native, average: bool) -> Optional[DeviceCall]:
        key = (_config_key(native), average)
        if key not in self._calls:
            config = CGXConfig.from_native(native)
            self._calls[key] = DeviceCall.from_config(config, average)
        return self._calls[key]

    @staticmethod
    def _exact_other(transport: GroupTransport, kind, outputs, inputs, op: int) -> None:
        """Reductions the compressors do not serve (MIN, MAX, ..., integer tensors), exactly,
        on the plane's backend."""
        names = {_SUM: "SUM", _AVG: "AVG", **_OPS}
        rop = getattr(dist.ReduceOp, names[op])
        pg = transport.pg
        if kind in ("allreduce", "allreduce_coalesced"):
            for x in outputs:
                opts = dist.AllreduceOptions()
                opts.reduceOp = rop
                pg.allreduce([x], opts).wait()
            return
        opts = dist.ReduceScatterOptions()
        opts.reduceOp = rop
        if kind == "reduce_scatter":
            pg.reduce_scatter([outputs[0]], [list(inputs)], opts).wait()
        else:
            for o, i in zip(outputs, inputs):
                pg._reduce_scatter_base(o, i, opts).wait()


def _config_key(native) -> tuple:
    return tuple(
        getattr(native, k)
        if k != "compressor_params"
        else tuple(sorted(getattr(native, k).items()))
        for k in _NATIVE_FIELDS
    )


_NATIVE_FIELDS = (
    "bits",
    "bucket_size",
    "skip_incomplete_buckets",
    "minimal_size",
    "fusion_buffer_bytes",
    "pipeline_segment_bytes",
    "algorithm",
    "stochastic",
    "rotation",
    "clip",
    "seed",
    "compressor",
    "compressor_params",
)


def _scatter_back(flat: torch.Tensor, outputs: List[torch.Tensor]) -> None:
    at = 0
    for x in outputs:
        x.copy_(flat[at : at + x.numel()].view(x.shape))
        at += x.numel()


def _done(outputs: List[torch.Tensor]):
    devices = [outputs[0].device] if outputs[0].is_cuda else None
    fut = torch.futures.Future(devices=devices)
    fut.set_result(outputs)
    return torch._C._distributed_c10d._create_work_from_future(fut)


def plane_of(backend) -> Optional[DevicePlane]:
    """The device plane installed on the cgx backend object, if any."""
    return _PLANES.get(backend.device_plane_token())


# The ranks' device identifiers, in the plane's key space beside device/nccl/, device/gloo/ and
# device/<device type>/ (hierarchies): "uuid" is none of those names.
UUID_PREFIX = "device/uuid/"


def publish_device(store, rank: int, identifier: str) -> None:
    """Publishes the identifier of the CUDA device ``rank`` uses (its UUID)."""
    store.set(f"{UUID_PREFIX}{rank}", identifier)


def read_devices(store, size: int) -> List[str]:
    """Every rank's published device identifier (waits for all of them)."""
    return [store.get(f"{UUID_PREFIX}{r}").decode() for r in range(size)]


def nccl_carries(identifiers: Sequence[str], nccl_available: bool) -> bool:
    """NCCL carries the CUDA tensors when it is available and every rank uses a GPU of its own
    (NCCL refuses two ranks of one communicator on one GPU: "Duplicate GPU detected"). An empty
    identifier (a device that could not be named) counts as shared."""
    return nccl_available and all(identifiers) and len(set(identifiers)) == len(identifiers)


def _creating_device_id():
    """The ``device_id`` of the c10d call creating the group now (init_process_group,
    new_group), or None: torch binds it to the group (``bound_device_id``) only after the
    backend's creator returns and never passes it to a custom backend's creator, so it is read
    from torch's helper on the call stack."""
    frame = sys._getframe(1)
    while frame is not None:
        code, module = frame.f_code.co_name, frame.f_globals.get("__name__")
        if code == "_new_process_group_helper" and module == "torch.distributed.distributed_c10d":
            return frame.f_locals.get("device_id")
        frame = frame.f_back
    return None


def bound_index(candidates) -> Optional[int]:
    """The index of the first CUDA device with an index among ``candidates`` (None skipped)."""
    for dev in candidates:
        dev = None if dev is None else torch.device(dev)
        if dev is not None and dev.type == "cuda" and dev.index is not None:
            return dev.index
    return None


def _device_uuid() -> str:
    """The UUID of the CUDA device this rank is bound to: the creating call's ``device_id``,
    else the default group's ``bound_device_id``, else the current device."""
    default = None
    if dist.is_initialized():
        default = getattr(dist.distributed_c10d._get_default_group(), "bound_device_id", None)
    index = bound_index([_creating_device_id(), default])
    index = torch.cuda.current_device() if index is None else index
    return str(torch.cuda.get_device_properties(index).uuid)


def _nccl_usable(store, rank: int, size: int) -> bool:
    """Collective: the ranks compare their devices through the group's store."""
    publish_device(store, rank, _device_uuid())
    return nccl_carries(read_devices(store, size), dist.is_nccl_available())


def install(backend, config: CGXConfig, store, rank: int, size: int, timeout) -> None:
    """Creates the plane's backends from the group's store and installs it on ``backend``
    (collective: every rank of the group creates the same ones). The CUDA carrier: NCCL when
    every rank publishes a distinct device UUID (:func:`nccl_carries`), else Gloo. CPU tensors
    come here with ``data_plane=device``, and otherwise for compressors written in Python only
    (their Gloo group is made at the first such call)."""
    every = config.data_plane == "device"
    cuda = torch.cuda.is_available()
    if config.data_plane == "host":
        return
    transports: Dict[str, GroupTransport] = {}
    carrier = gloo = None
    if cuda and _nccl_usable(store, rank, size):
        carrier = dist.ProcessGroupNCCL(dist.PrefixStore("device/nccl/", store), rank, size)
        transports["cuda"] = GroupTransport(carrier, rank, size, device="cuda")
    if every or (cuda and "cuda" not in transports):
        gloo = dist.ProcessGroupGloo(dist.PrefixStore("device/gloo/", store), rank, size, timeout)
        if every:
            transports["cpu"] = GroupTransport(gloo, rank, size)
        if cuda and "cuda" not in transports:
            transports["cuda"] = GroupTransport(gloo, rank, size, device="cuda")
        carrier = carrier or gloo
    hierarchies = {}
    if backend.hierarchical() and transports:  # the native layout (attach_hierarchy), on the device
        hierarchies = {
            kind: _hierarchy(kind, t.pg, config, store, rank, size, timeout)
            for kind, t in transports.items()
        }
    lazy = {} if every else {"cpu": _lazy_cpu(gloo, store, rank, size, timeout)}
    plane = DevicePlane(transports, hierarchies, lazy)
    backend.set_device_plane(plane, carrier, every, plane.token)


def _lazy_cpu(gloo, store, rank: int, size: int, timeout) -> Callable[[], GroupTransport]:
    def make() -> GroupTransport:
        pg = gloo or dist.ProcessGroupGloo(
            dist.PrefixStore("device/gloo-cpu/", store), rank, size, timeout
        )
        return GroupTransport(pg, rank, size)

    return make


def _hierarchy(kind: str, carrier, config: CGXConfig, store, rank: int, size: int, timeout):
    """The node and cross-node transports of the hierarchical allreduce for ``kind``'s tensors,
    of the carrier's type (NCCL or Gloo), on the node layout topology.attach_hierarchy found."""
    from torch_cgx.device.engine import Hierarchy
    from torch_cgx.topology import _place, layout

    nodes = layout([store.get(f"node/{r}").decode() for r in range(size)])
    node, local = _place(nodes, rank)
    nccl = type(carrier).__name__ == "ProcessGroupNCCL"

    def group(prefix: str, r: int, n: int) -> GroupTransport:
        s = dist.PrefixStore(f"device/{kind}/{prefix}", store)
        pg = dist.ProcessGroupNCCL(s, r, n) if nccl else dist.ProcessGroupGloo(s, r, n, timeout)
        return GroupTransport(pg, r, n, device=kind)

    intra = group(f"intra/{node}/", local, len(nodes[node]))
    cross = None
    if not config.intra_broadcast:
        cross = group(f"cross/{local}/", node, len(nodes))
    elif local == 0:
        cross = group("cross/", node, len(nodes))
    return Hierarchy(intra, cross, local, len(nodes[node]), config.intra_broadcast)
