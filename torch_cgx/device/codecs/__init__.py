"""Every registered compressor as a device codec (tensor operations, any device).

>>> from torch_cgx.device import codecs
>>> c = codecs.get("maxmin", bits=4)           # names and parameters of torch_cgx.compressors
>>> payload = c.encode(grad.view(-1))          # uint8 on grad's device, docs/FORMAT.md's bytes
>>> c.decode_add_(acc, payload)

Each module of ``_PACKAGE_MODULES`` defines ``CODECS = {name: class}``; compressors written in
Python are their own device codecs; the dense deterministic ones give the native
codec's bytes for the same input (tests/test_device_codecs_*.py check it on CPU tensors).
"""

from __future__ import annotations

import functools
import importlib
from typing import Dict, List, Tuple

from torch_cgx.device.codecs.base import DeviceCodec

__all__ = ["DeviceCodec", "family", "get", "names"]

# the modules of this package that implement native compressors: each defines CODECS
_PACKAGE_MODULES = ("maxmin", "dense", "sparse", "sparseloco")


@functools.cache
def _native() -> Dict[str, type]:
    out: Dict[str, type] = {}
    for module in _PACKAGE_MODULES:
        out.update(importlib.import_module(f"torch_cgx.device.codecs.{module}").CODECS)
    return out


@functools.cache
def family(kind: str) -> Tuple[str, ...]:
    """The native compressors (registry order) whose device codec a family of fused kernels
    serves: ``levels``, the dense codecs with a fused encode (``Fusable`` in dense.py: bucket
    scalars and codes), or ``sparse``, the selection codecs (sparse.py, sparseloco.py)."""
    from torch_cgx import compressors
    from torch_cgx.device.codecs import dense, fused, sparse, sparseloco

    if kind == "levels":
        members = {n for n, c in dense.CODECS.items() if issubclass(c, fused.Fusable)}
    elif kind == "sparse":
        members = set(sparse.CODECS) | set(sparseloco.CODECS)
    else:
        raise ValueError(f"family must be 'levels' or 'sparse', got {kind!r}")
    return tuple(n for n in compressors.native.names() if n in members)


def names() -> List[str]:
    """The compressors with a device codec: the native ones in this package's modules, then
    every compressor written in Python (``torch_cgx.compressors.register``)."""
    from torch_cgx import compressors

    return [n for n in compressors.names() if n in _native() or compressors.is_python(n)]


def get(name: str, **params) -> DeviceCodec:
    """The device codec of compressor ``name`` with ``params`` (validated like
    ``torch_cgx.compressors.get``: unknown names and bad parameters raise ValueError)."""
    from torch_cgx import compressors

    if compressors.is_python(name):
        return compressors.device_codec(name, **params)
    if name not in _native():
        raise ValueError(f"no device codec for compressor {name!r} (have: {', '.join(names())})")
    return _native()[name](**params)
