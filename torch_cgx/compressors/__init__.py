"""Every gradient compressor of torch_cgx behind one interface: one registry of the native ones
(C++, csrc/compressors) and those written in Python (:func:`register`).

>>> from torch_cgx import compressors
>>> compressors.names()                       # maxmin, fp16, ..., natural, ...
>>> c = compressors.get("qsgd", bits=4)        # unknown names / bad parameters: ValueError
>>> payload = c.encode(grad)                   # uint8 tensor, self-describing
>>> c.decode(payload)                          # or c.decode_add_(acc, payload)

Compressors are stateless: error feedback and momentum belong to the caller. ``traits`` says
what the algorithms may rely on: ``biased`` (needs error feedback), ``fixed_size`` (the payload
size depends on the element count only), ``summable`` (payloads of one message can be summed as
they travel) and ``sparse``. Payload formats: docs/FORMAT.md. Writing one in Python:
docs/adding-a-compressor.md.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Type

import torch

from torch_cgx import _C
from torch_cgx.compressors import native, python
from torch_cgx.compressors.native import Compressor
from torch_cgx.compressors.python import CompressorBase, Context, Param

__all__ = ["Compressor", "CompressorBase", "Context", "Param", "PythonCompressor", "get",
           "is_python", "names", "params", "register", "unregister"]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class _Entry:
    cls: Type[CompressorBase]
    compile: bool


_PYTHON: Dict[str, _Entry] = {}
_COMPILED: Dict[tuple, CompressorBase] = {}


def names() -> List[str]:
    """Every registered compressor: the native ones in registry order, then Python ones."""
    return native.names() + list(_PYTHON)


def is_python(name: str) -> bool:
    """Whether ``name`` is a compressor written in Python (:func:`register`)."""
    return name in _PYTHON


def params(name: str) -> List[dict]:
    """The parameters ``name`` takes: name, default, min, max, integer, help."""
    if name not in _PYTHON:
        return native.params(name)
    return [dict(name=k, default=p.default, min=p.min, max=p.max, integer=p.integer, help=p.help)
            for k, p in _PYTHON[name].cls.params.items()]  # fmt: skip


def get(name: str, **parameters):
    """The compressor ``name`` with ``parameters`` (the rest take their defaults)."""
    if name not in _PYTHON:
        if name not in _C.compressor_names():
            raise ValueError(f"unknown compressor {name!r} (registered: {', '.join(names())})")
        return native.get(name, **parameters)
    entry = _PYTHON[name]
    if not entry.compile:
        return PythonCompressor(python.make(entry.cls, name, parameters, False), parameters)
    # one compiled instance per configuration: torch.compile's cache is per function object
    key = (name, tuple(sorted(parameters.items())))
    if key not in _COMPILED:
        _COMPILED[key] = python.make(entry.cls, name, parameters, True)
    return PythonCompressor(_COMPILED[key], parameters)


def register(name: str, cls: Type[CompressorBase], *, compile: bool = False,
             replace: bool = False) -> None:  # fmt: skip
    """Makes ``cls`` (a :class:`CompressorBase` subclass) the compressor ``name`` everywhere a
    native one works. ``compile``: its encode and decode run through ``torch.compile`` (Triton
    on GPUs, C++ on CPUs; compiled per input size at first use). Register before creating the
    groups (and on every rank): the backend's settings name it from then on. ValueError for a
    taken name (unless ``replace``) or a class that is not a compressor."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a compressor's name must be an identifier, got {name!r}")
    if not (isinstance(cls, type) and issubclass(cls, CompressorBase)):
        raise ValueError(f"register takes a CompressorBase subclass, got {cls!r}")
    if name in _C.compressor_names() or (name in _PYTHON and not replace):
        raise ValueError(f"compressor {name!r} is registered already")
    for key, p in cls.params.items():
        if not isinstance(p, Param):
            raise ValueError(f"{cls.__name__}.params[{key!r}] must be a Param, got {p!r}")
    python.make(cls, name, {}, False)  # its defaults must make one
    _C.declare_external_compressor(name)
    _PYTHON[name] = _Entry(cls, bool(compile))
    for key in [k for k in _COMPILED if k[0] == name]:
        del _COMPILED[key]


def unregister(name: str) -> None:
    """Forgets a Python compressor (its name stays reserved for Python ones in the binding)."""
    if name not in _PYTHON:
        raise ValueError(f"{name!r} is not a registered Python compressor")
    del _PYTHON[name]
    for key in [k for k in _COMPILED if k[0] == name]:
        del _COMPILED[key]


class PythonCompressor:
    """A configured Python compressor with the interface of :class:`Compressor` (any device)."""

    __slots__ = ("name", "parameters", "impl")

    def __init__(self, impl: CompressorBase, parameters: Dict) -> None:
        self.name, self.impl, self.parameters = impl.name, impl, dict(parameters)

    def __repr__(self) -> str:
        args = "".join(f", {k}={v!r}" for k, v in self.parameters.items())
        return f"compressors.get({self.name!r}{args})"

    @property
    def traits(self) -> Dict[str, bool]:
        c = self.impl
        return dict(biased=c.biased, fixed_size=c.fixed_size, summable=False, sparse=c.sparse)

    def encoded_size(self, numel: int, dtype: torch.dtype = torch.float32) -> int:
        if dtype not in native._DTYPES:
            raise ValueError(f"dtype must be float32, float16 or bfloat16, got {dtype}")
        if not isinstance(numel, int) or numel < 0:
            raise ValueError(f"numel must be an integer >= 0, got {numel!r}")
        return python.HEADER_BYTES + self.impl.body_size(numel)

    def encode(self, tensor: torch.Tensor, seed: int = 0, stream: int = 0, shared: int = 0, *,
               out: Optional[torch.Tensor] = None) -> torch.Tensor:  # fmt: skip
        if not isinstance(tensor, torch.Tensor) or tensor.dtype not in native._DTYPES:
            raise ValueError("tensor must be a float32, float16 or bfloat16 tensor")
        for what, v in (("seed", seed), ("stream", stream), ("shared", shared)):
            if not isinstance(v, int) or not 0 <= v < 2**64:
                raise ValueError(f"{what} must be an integer in [0, 2^64), got {v!r}")
        payload = python.encode(self.impl, tensor, Context(seed, stream, shared, tensor.device))
        if out is None:
            return payload
        if not isinstance(out, torch.Tensor) or out.dtype != torch.uint8 or out.dim() != 1:
            raise ValueError("out must be a 1-D uint8 tensor")
        if out.numel() < payload.numel():
            raise ValueError(f"out holds {out.numel()} bytes, the payload needs {payload.numel()}")
        return out[: payload.numel()].copy_(payload)

    def numel(self, payload: torch.Tensor) -> int:
        """The element count a payload describes (its header, validated)."""
        ok = isinstance(payload, torch.Tensor) and payload.dtype == torch.uint8
        if not ok or payload.dim() != 1:
            raise ValueError("payload must be a 1-D uint8 tensor (what encode returned)")
        if payload.numel() < python.HEADER_BYTES:
            raise ValueError(f"{self.name}: a payload of {payload.numel()} bytes has no header")
        n = int.from_bytes(bytes(payload[8:16].cpu().tolist()), "little")
        python.check_header(self.impl, payload, n)
        python.split(self.impl, payload, n)
        return n

    def decode(self, payload: torch.Tensor, *, out: Optional[torch.Tensor] = None,
               dtype=None) -> torch.Tensor:  # fmt: skip
        n = self.numel(payload)
        values = self._values(payload, n)
        if out is None:
            return values.to(dtype or torch.float32)
        self._check_out(out, n)
        return out.copy_(values.view(out.shape))

    def decode_add_(self, out: torch.Tensor, payload: torch.Tensor) -> torch.Tensor:
        """``out += decode(payload)``, in fp32, rounded once to ``out``'s dtype."""
        n = self.numel(payload)
        self._check_out(out, n)
        if out.dtype == torch.float32 and out.is_contiguous():
            self.impl.decode_add_(out.view(-1), python.split(self.impl, payload, n))
            return out
        return out.copy_(out.float() + self._values(payload, n).view(out.shape))

    def _values(self, payload: torch.Tensor, n: int) -> torch.Tensor:
        return self.impl.decode(python.split(self.impl, payload, n), n).float()

    def _check_out(self, out, n: int) -> None:
        if not isinstance(out, torch.Tensor) or out.dtype not in native._DTYPES:
            raise ValueError("out must be a float32, float16 or bfloat16 tensor")
        if out.numel() != n:
            raise ValueError(f"out has {out.numel()} elements, the payload {n}")


def device_codec(name: str, **parameters):
    """The device plane's codec of the Python compressor ``name`` (ValueError if it is not)."""
    if name not in _PYTHON:
        raise ValueError(f"{name!r} is not a registered Python compressor")
    return python.DeviceAdapter(get(name, **parameters).impl, parameters)


def _builtin() -> None:
    from torch_cgx.compressors import drive, floats, natural

    register("natural", natural.Natural)
    register("drive", drive.Drive)
    register("fp8", floats.FP8)
    register("mxfp8", floats.MXFP8)
    register("mxfp6", floats.MXFP6)
    register("mxfp4", floats.MXFP4)
    register("nvfp4", floats.NVFP4)


_builtin()
