"""Recorders of what synchronises a GPU with the host: reads of tensor values
(:func:`host_reads`), host-to-device copies of values made on the host (:func:`host_uploads`),
both at once (:func:`host_syncs`), and the ranks' code of tests/test_device_engine.py's
host-sync tests (:func:`run_host_reads`)."""

from __future__ import annotations

import json
import os
import sys
from functools import partial
from typing import Dict, List

import torch
import torch.distributed as dist
from device_engine_cases import _inputs, codec_factory

_UNINITIALISED = {"empty", "empty_like", "new_empty", "empty_strided"}


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


def _where(name: str) -> str:
    """ "name at file:line: source" of the innermost frame outside this file (the recorders'
    own frames, nested or not, are skipped)."""
    import linecache

    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    if frame is None:
        return f"{name} at ?"
    code = frame.f_code
    line = linecache.getline(code.co_filename, frame.f_lineno).strip()
    return f"{name} at {os.path.basename(code.co_filename)}:{frame.f_lineno}: {line}"


def host_reads(fn) -> List[str]:
    """Runs ``fn()`` and lists its host reads of tensor values ("func at file:line: source"): item,
    tolist, cpu, numpy, to(cpu), bool, int, float, index on a tensor that holds data, and the
    ops whose output size depends on the values (nonzero, masked_select, boolean-mask
    indexing: a device synchronisation on CUDA).

    On CPU tensors ``to(cpu)`` moves nothing, so the recorder tells data from *host constants*:
    tensors made inside ``fn`` from Python values (``torch.tensor``, ``full``, ``from_numpy``, ...)
    and everything computed from constants alone. Reading or moving a constant is not a read of
    the data (a codec's ``torch.tensor(bits).to(device)`` is an upload). Data: every tensor
    made outside ``fn``, uninitialised buffers (``empty``: a collective fills them) and all
    that derives from either."""

    from torch.overrides import TorchFunctionMode

    watched = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.cpu, torch.Tensor.numpy,
               torch.Tensor.__bool__, torch.Tensor.__int__, torch.Tensor.__float__,
               torch.Tensor.__index__}  # fmt: skip
    seen: List[str] = []
    consts: Dict[int, torch.Tensor] = {}  # id -> tensor (kept alive: ids stay unique)

    def to_cpu(func, args, kwargs) -> bool:
        if func is not torch.Tensor.to:
            return False
        return any(str(a) == "cpu" or (isinstance(a, torch.device) and a.type == "cpu")
                   for a in list(args[1:]) + list(kwargs.values()))  # fmt: skip

    def syncs(func, args) -> bool:
        """Ops whose output size depends on the values (a device sync on CUDA)."""
        if func in (torch.nonzero, torch.Tensor.nonzero, torch.masked_select, torch.unique):
            return True
        if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and len(args) > 1:
            index = args[1] if isinstance(args[1], tuple) else (args[1],)
            return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index)
        return False

    class Recorder(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            inputs = list(_tensors(args)) + list(_tensors(kwargs))
            const = all(id(t) in consts for t in inputs)
            name = getattr(func, "__name__", str(func))
            if (func in watched or to_cpu(func, args, kwargs) or syncs(func, args)) and not const:
                seen.append(_where(name))
            out = func(*args, **kwargs)
            if const and name not in _UNINITIALISED:
                for t in _tensors(out):
                    consts[id(t)] = t
            return out

    from_numpy = torch.from_numpy  # not a torch function: the mode never sees it

    def constant_from_numpy(a):
        t = from_numpy(a)
        consts[id(t)] = t
        return t

    torch.from_numpy = constant_from_numpy
    try:
        with Recorder():
            fn()
    finally:
        torch.from_numpy = from_numpy
    return seen


_FROM_VALUES = {torch.tensor, torch.as_tensor, torch.asarray}
_SANCTIONED = os.path.join("torch_cgx", "device", "constants.py")


def _sanctioned() -> bool:
    """Whether a frame of the current call stack runs torch_cgx/device/constants.py (the cache of
    device constants and its non-blocking ``upload``: the one sanctioned way in)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.endswith(_SANCTIONED):
            return True
        frame = frame.f_back
    return False


def _has_device(args, kwargs) -> bool:
    """A device named in a ``to`` call: a device, a device string, or a tensor to match."""
    rest = list(args[1:]) + [kwargs.get("device"), kwargs.get("other")]
    return any(isinstance(a, (torch.device, torch.Tensor)) or (isinstance(a, str) and a != "")
               for a in rest if a is not None)  # fmt: skip


def _list_index(args) -> bool:
    """An index holding a Python list (advanced indexing: a host-built index tensor)."""
    if len(args) < 2:
        return False
    index = args[1] if isinstance(args[1], tuple) else (args[1],)
    return any(isinstance(i, list) for i in index)


def host_uploads(fn) -> List[str]:
    """Runs ``fn()`` and lists its host-to-device copies of values made on the host ("func at
    file:line: source"), each a blocking copy plus a stream synchronisation on CUDA:
    ``torch.tensor`` / ``as_tensor`` / ``asarray`` of Python data with a device, ``new_tensor``,
    indexing with a Python list, ``t[i] = <Python number>`` (a host scalar copied in: the GPU
    check saw it synchronise), and ``to(device)``, ``copy_`` or ``__setitem__`` of a *host
    constant* (a tensor made from Python values without a device -- ``torch.tensor``,
    ``from_numpy``, a fill with no device -- or computed from such tensors alone) into a tensor
    that is not one. Fills with a device (``full``, ``zeros``, ``arange``, ``empty``) are kernels,
    not copies. Anything made inside torch_cgx/device/constants.py is allowed (its pinned,
    non-blocking copies)."""

    from torch.overrides import TorchFunctionMode

    seen: List[str] = []
    host: Dict[int, torch.Tensor] = {}  # id -> host constant (kept alive: ids stay unique)

    def is_host(t) -> bool:
        return isinstance(t, torch.Tensor) and id(t) in host

    def upload(func, args, kwargs, inputs) -> bool:
        device = kwargs.get("device") is not None
        if func in _FROM_VALUES:
            data = args[0] if args else kwargs.get("data")
            return device and (is_host(data) or not isinstance(data, torch.Tensor))
        if func is torch.Tensor.new_tensor:
            return not is_host(args[0])
        if func in (torch.Tensor.to, torch.Tensor.cuda):
            return is_host(args[0]) and (func is torch.Tensor.cuda or _has_device(args, kwargs))
        if func is torch.Tensor.copy_:
            return is_host(args[1]) and not is_host(args[0])
        if func in (torch.Tensor.__setitem__, torch.Tensor.__getitem__):
            value = args[2] if func is torch.Tensor.__setitem__ and len(args) > 2 else None
            dst_host = is_host(args[0])
            number = func is torch.Tensor.__setitem__ and isinstance(value, (bool, int, float))
            return not dst_host and (is_host(value) or number or _list_index(args))
        return False

    class Recorder(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if _sanctioned():
                return func(*args, **kwargs)
            inputs = list(_tensors(args)) + list(_tensors(kwargs))
            moved = upload(func, args, kwargs, inputs)
            if moved:
                seen.append(_where(getattr(func, "__name__", str(func))))
            out = func(*args, **kwargs)
            made_here = all(is_host(t) for t in inputs)  # no inputs: a factory
            if made_here and not moved and kwargs.get("device") is None:
                for t in _tensors(out):
                    if t.device.type == "cpu":
                        host[id(t)] = t
            return out

    from_numpy = torch.from_numpy  # not a torch function: the mode never sees it

    def host_from_numpy(a):
        t = from_numpy(a)
        if not _sanctioned():
            host[id(t)] = t
        return t

    torch.from_numpy = host_from_numpy
    try:
        with Recorder():
            fn()
    finally:
        torch.from_numpy = from_numpy
    return seen


def through_plane(record, fn) -> List[str]:
    """``record(fn)``, and ``record`` also inside every call c10d hands a cgx group's device
    plane. A TorchFunctionMode is off inside the function it intercepts, and ``dist.all_reduce``
    is one: without this, a recorder around ``dist.all_reduce`` (or a DDP step, whose reducer
    calls the group from C++) sees nothing of the plane's work."""
    from torch_cgx.device.plane import DevicePlane

    seen: List[str] = []
    original = DevicePlane.__call__

    def recorded(self, *args, **kwargs):
        box = {}
        seen.extend(record(lambda: box.setdefault("out", original(self, *args, **kwargs))))
        return box["out"]

    DevicePlane.__call__ = recorded
    try:
        seen.extend(record(fn))
    finally:
        DevicePlane.__call__ = original
    return seen


def host_syncs(fn) -> Dict[str, List[str]]:
    """``fn()`` under both recorders, also inside the device plane's calls
    (:func:`through_plane`): {"reads": host reads, "uploads": host-to-device copies}."""
    uploads: List[str] = []
    reads = through_plane(host_reads, lambda: uploads.extend(through_plane(host_uploads, fn)))
    return {"reads": reads, "uploads": uploads}


def run_host_reads(rank: int, world: int, out_path: str, kind: str) -> None:
    """The engine's allreduce and reduce-scatter under both recorders (:func:`host_syncs`),
    each after one warm-up call, for dense and data-sized compressors: {case: {"reads": [...],
    "uploads": [...]}} in ``out_path``."""
    import torch_cgx
    from torch_cgx.device.engine import DeviceCall, DeviceEngine
    from torch_cgx.device.transport import GroupTransport

    dist.init_process_group("gloo")
    transport = GroupTransport(dist.group.WORLD, rank, world)
    engine = DeviceEngine(transport, codecs=codec_factory(kind), check="deferred")
    base = torch_cgx.CGXConfig()
    out: Dict[str, Dict[str, List[str]]] = {}
    for name, changes in (
        ("maxmin_sra", dict(bits=4, bucket_size=64)),
        ("maxmin_ring_rotation", dict(bits=4, bucket_size=64, algorithm="ring", rotation="on")),
        ("maxmin_tree", dict(bits=4, bucket_size=64, algorithm="tree")),
        ("fp16", dict(compressor="fp16")),
        ("randomk", dict(compressor="randomk", compressor_params="ratio=0.1")),
        ("threshold", dict(compressor="threshold", compressor_params="tau=1.0")),
    ):
        call = DeviceCall.from_config(base.replace(**changes), True)
        x, res = _inputs(rank, torch.float32, 1000, 3), torch.empty(1000)
        engine._plan(call)  # the codec built outside: construction is not the data path
        ar = partial(engine.allreduce, x, call, stream=1, residual=res)
        rs = partial(engine.reduce_scatter, torch.empty(500), x, call, stream=1)
        for key, fn in ((name, ar), (name + "_rs", rs)):
            fn()  # the warm-up: caches of device constants fill here
            out[key] = host_syncs(fn)
    engine.check_headers()
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(out, f)
    dist.destroy_process_group()
