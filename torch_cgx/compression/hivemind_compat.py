"""torch_cgx compression objects inside hivemind (optional: hivemind is not a dependency).

>>> averager = hivemind.averaging.DecentralizedAverager(
...     tensors, dht=dht, prefix="run", compression=to_hivemind(CGXCompression("maxmin", bits=4)))

``to_hivemind(obj)`` returns a subclass of hivemind's ``CompressionBase`` (built on first use)
whose ``compress`` puts ``obj``'s payload (``Payload.to_bytes()``) into a ``runtime_pb2.Tensor``
and whose ``extract`` reads it back. hivemind 1.1.12 decodes every received tensor, and
compresses the averaged delta a peer sends back, by the message's ``CompressionType``, an enum
of six fixed values looked up in ``hivemind.compression.serialization._BASE_COMPRESSION_TYPES``.
A new codec therefore takes one of those slots: ``to_hivemind`` installs the adapter there
(``slot``, default ``"BLOCKWISE_8BIT"``: hivemind's needs bitsandbytes). In this process that
slot then compresses with ``obj``; received messages of the slot that are not torch_cgx payloads
are still read by hivemind's own class. Every peer of a run must call ``to_hivemind`` with the
same object configuration before averaging.
"""

from __future__ import annotations

import functools

import torch

from torch_cgx.compression.base import (
    CompressionBase,
    Payload,
    dtype_name,
    extract,
    is_payload_bytes,
)

__all__ = ["to_hivemind"]


@functools.cache
def _adapter_class():
    try:
        from hivemind.compression import CompressionBase as HivemindBase
        from hivemind.proto import runtime_pb2
    except ImportError as e:
        raise ImportError("to_hivemind needs hivemind (pip install hivemind)") from e

    class CGXHivemindCompression(HivemindBase):
        """A torch_cgx compression object speaking hivemind's protocol."""

        def __init__(self, compression: CompressionBase, slot: str, fallback) -> None:
            self.compression, self.slot, self.fallback = compression, slot, fallback
            self.compression_type = runtime_pb2.CompressionType.Value(slot)

        def compress(self, tensor: torch.Tensor, info, allow_inplace: bool = False):
            payload = self.compression.compress(tensor, info, allow_inplace)
            return runtime_pb2.Tensor(
                compression=self.compression_type,
                buffer=payload.to_bytes(),
                size=payload.shape,
                dtype=dtype_name(payload.dtype),
                requires_grad=payload.requires_grad,
            )

        def extract(self, serialized_tensor) -> torch.Tensor:
            if not is_payload_bytes(serialized_tensor.buffer) and self.fallback is not None:
                return self.fallback.extract(serialized_tensor)
            return extract(Payload.from_bytes(serialized_tensor.buffer))

        def estimate_compression_ratio(self, info) -> float:
            return self.compression.estimate_compression_ratio(info)

        def __repr__(self) -> str:
            return f"to_hivemind({self.compression!r}, slot={self.slot!r})"

    return CGXHivemindCompression, runtime_pb2


def to_hivemind(compression: CompressionBase, slot: str = "BLOCKWISE_8BIT"):
    """``compression`` as a hivemind compression object, installed in ``slot`` (see above)."""
    if not isinstance(compression, CompressionBase):
        raise ValueError(f"expected a torch_cgx.compression object, got {compression!r}")
    cls, runtime_pb2 = _adapter_class()
    if slot not in runtime_pb2.CompressionType.keys() or slot == "NONE":
        choices = [k for k in runtime_pb2.CompressionType.keys() if k != "NONE"]
        raise ValueError(f"slot must be one of {choices}, got {slot!r}")
    from hivemind.compression import serialization

    table = serialization._BASE_COMPRESSION_TYPES
    previous = table[slot]
    fallback = previous.fallback if isinstance(previous, cls) else previous
    adapter = cls(compression, slot, fallback)
    table[slot] = adapter
    return adapter
