"""Every registered compressor as a device codec (tensor operations, any device).

>>> from torch_cgx.device import codecs
>>> c = codecs.get("maxmin", bits=4)           # names and parameters of torch_cgx.compressors
>>> payload = c.encode(grad.view(-1))          # uint8 on grad's device, docs/FORMAT.md's bytes
>>> c.decode_add_(acc, payload)

Each module below defines ``CODECS = {name: class}``; the dense deterministic ones give the native
codec's bytes for the same input (tests/test_device_codecs_*.py check it on CPU tensors).
"""

from __future__ import annotations

import importlib
from typing import List

from torch_cgx.device.codecs.base import DeviceCodec

__all__ = ["DeviceCodec", "get", "names"]

# compressor name -> module of this package that implements it
_MODULES = {
    "maxmin": "maxmin",
    "fp16": "dense",
    "bf16": "dense",
    "signsgd": "dense",
    "signum": "dense",
    "onebit": "dense",
    "efsignsgd": "dense",
    "terngrad": "dense",
    "qsgd": "dense",
    "tbq": "dense",
    "topk": "sparse",
    "randomk": "sparse",
    "threshold": "sparse",
    "dgc": "sparse",
    "graddrop": "sparse",
    "sparseloco": "sparseloco",
}


def names() -> List[str]:
    """The compressors with a device codec."""
    return list(_MODULES)


def get(name: str, **params) -> DeviceCodec:
    """The device codec of compressor ``name`` with ``params`` (validated like
    ``torch_cgx.compressors.get``: unknown names and bad parameters raise ValueError)."""
    if name not in _MODULES:
        raise ValueError(f"no device codec for compressor {name!r} (have: {', '.join(_MODULES)})")
    module = importlib.import_module(f"torch_cgx.device.codecs.{_MODULES[name]}")
    return module.CODECS[name](**params)
