"""A recorder of host reads of tensor values (:func:`host_reads`) and the ranks' code of
tests/test_device_engine.py's host-read test (:func:`run_host_reads`)."""

from __future__ import annotations

import json
import os
from functools import partial
from typing import Dict, List, Optional

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
    import traceback

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
                frame = traceback.extract_stack(limit=2)[0]
                where = f"{name} at {os.path.basename(frame.filename)}:{frame.lineno}"
                seen.append(f"{where}: {(frame.line or '').strip()}")
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


def run_host_reads(rank: int, world: int, out_path: str, kind: str) -> None:
    """The engine under a recorder of host reads, for a dense and a data-sized compressor."""
    import torch_cgx
    from torch_cgx.device.engine import DeviceCall, DeviceEngine
    from torch_cgx.device.transport import GroupTransport

    dist.init_process_group("gloo")
    transport = GroupTransport(dist.group.WORLD, rank, world)
    engine = DeviceEngine(transport, codecs=codec_factory(kind), check="deferred")
    base = torch_cgx.CGXConfig()
    out: Dict[str, Optional[List[str]]] = {}
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
        out[name] = host_reads(partial(engine.allreduce, x, call, stream=1, residual=res))
        rs = partial(engine.reduce_scatter, torch.empty(500), x, call, stream=1)
        out[name + "_rs"] = host_reads(rs)
    engine.check_headers()
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(out, f)
    dist.destroy_process_group()
