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
from typing import Dict, List

from torch_cgx.device.codecs.base import DeviceCodec

__all__ = ["DeviceCodec", "get", "names"]

# the modules of this package that implement native compressors: each defines CODECS
_PACKAGE_MODULES = ("maxmin", "dense", "sparse", "sparseloco")


@functools.cache
def _native() -> Dict[str, type]:
    out: Dict[str, type] = {}
    for module in _PACKAGE_MODULES:
        out.update(importlib.import_module(f"torch_cgx.device.codecs.{module}").CODECS)
    return out


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
