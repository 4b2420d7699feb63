"""The vocabulary of tensor compression objects: roles, tensor information, payloads.

A compression object turns a tensor into a :class:`Payload` (``compress``) and back
(``extract``), and estimates its size (``estimate_compression_ratio``: compressed bits over
original bits, lower is smaller). :class:`CompressionInfo` tells it which tensor it sees: a key
(a parameter name or index), a descriptor (shape and dtype of the whole tensor) and a
:class:`TensorRole`, so that policies (``adaptive.py``) can choose per tensor.

A payload says how to extract it (``method``), so one :func:`extract` reads every payload,
whatever object made it. ``Payload.to_bytes`` / ``Payload.from_bytes`` give a self-contained
byte string: ``b"CGXP"``, a version byte, a u32 little-endian header length, a JSON header
(method, params, shape, dtype, requires_grad), then the data bytes.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import struct
from typing import Any, Callable, Dict, Optional, Tuple

import torch

__all__ = [
    "CompressionBase",
    "CompressionInfo",
    "NoCompression",
    "Payload",
    "TensorDescriptor",
    "TensorRole",
    "extract",
]

_MAGIC, _VERSION = b"CGXP", 1
_DTYPES = {
    str(d).replace("torch.", ""): d
    for d in (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
              torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)
}  # fmt: skip


class TensorRole(enum.Enum):
    """What a tensor is to the model (hivemind's roles)."""

    ACTIVATION = enum.auto()
    PARAMETER = enum.auto()
    GRADIENT = enum.auto()
    OPTIMIZER = enum.auto()
    UNSPECIFIED = enum.auto()


def role_name(role: Any) -> str:
    """``"GRADIENT"`` for ``TensorRole.GRADIENT``, hivemind's ``TensorRole.GRADIENT`` or
    ``"gradient"``."""
    name = getattr(role, "name", role)
    if not isinstance(name, str) or name.upper() not in TensorRole.__members__:
        raise ValueError(f"unknown tensor role {role!r} (roles: {list(TensorRole.__members__)})")
    return name.upper()


@dataclasses.dataclass(frozen=True)
class TensorDescriptor:
    """Shape and dtype of a whole tensor (``size`` and ``numel()`` as hivemind's descriptor)."""

    size: Tuple[int, ...]
    dtype: torch.dtype = torch.float32

    @classmethod
    def from_tensor(cls, tensor: torch.Tensor) -> TensorDescriptor:
        return cls(tuple(tensor.shape), tensor.dtype)

    def numel(self) -> int:
        n = 1
        for s in self.size:
            n *= s
        return n


@dataclasses.dataclass(frozen=True)
class CompressionInfo:
    """What a compression object knows of the tensor it compresses.

    ``key``: its name or index; ``descriptor``: the whole tensor's shape and dtype (also when a
    part is compressed); ``role``; ``part_index`` / ``part_size``: which part, when the tensor is
    sent in parts of at most ``part_size`` values."""

    key: Any
    descriptor: TensorDescriptor
    role: Any = TensorRole.UNSPECIFIED
    part_index: int = 0
    part_size: Optional[int] = None

    @classmethod
    def from_tensor(cls, tensor: torch.Tensor, key: Any = None, descriptor=None, **kwargs):
        return cls(key, descriptor or TensorDescriptor.from_tensor(tensor), **kwargs)

    def get_part(self, part_index: int, part_size: Optional[int]) -> CompressionInfo:
        return dataclasses.replace(self, part_index=part_index, part_size=part_size)


@dataclasses.dataclass(frozen=True)
class Payload:
    """A compressed tensor: ``data`` (1-D uint8) and what :func:`extract` needs to rebuild it."""

    method: str
    data: torch.Tensor
    shape: Tuple[int, ...]
    dtype: torch.dtype
    requires_grad: bool = False
    params: Dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Bytes of ``data`` (what a compressed transport sends, without this envelope)."""
        return self.data.numel()

    def to_bytes(self) -> bytes:
        header = json.dumps(
            {
                "method": self.method,
                "params": self.params,
                "shape": list(self.shape),
                "dtype": dtype_name(self.dtype),
                "requires_grad": self.requires_grad,
            },
            separators=(",", ":"),
        ).encode()
        head = _MAGIC + struct.pack("<BI", _VERSION, len(header)) + header
        return head + self.data.contiguous().numpy().tobytes()

    @classmethod
    def from_bytes(cls, buffer: bytes) -> Payload:
        if not is_payload_bytes(buffer):
            raise ValueError("not a torch_cgx payload (no CGXP header)")
        version, length = struct.unpack_from("<BI", buffer, 4)
        if version != _VERSION or 9 + length > len(buffer):
            raise ValueError(f"bad payload header (version {version}, length {length})")
        h = json.loads(bytes(buffer[9 : 9 + length]))
        body = bytearray(buffer[9 + length :])
        data = (
            torch.frombuffer(body, dtype=torch.uint8) if body else torch.empty(0, dtype=torch.uint8)
        )
        return cls(h["method"], data, tuple(h["shape"]), parse_dtype(h["dtype"]),
                   bool(h["requires_grad"]), dict(h["params"]))  # fmt: skip


def is_payload_bytes(buffer: bytes) -> bool:
    return len(buffer) >= 9 and bytes(buffer[:4]) == _MAGIC


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def parse_dtype(name: str) -> torch.dtype:
    if name not in _DTYPES:
        raise ValueError(f"unsupported dtype {name!r} in payload")
    return _DTYPES[name]


# method -> function rebuilding the tensor (flat, in the payload's dtype) from a payload.
_EXTRACTORS: Dict[str, Callable[[Payload], torch.Tensor]] = {}


def register_method(method: str, fn: Callable[[Payload], torch.Tensor]) -> None:
    _EXTRACTORS[method] = fn


def extract(payload: Payload) -> torch.Tensor:
    """The tensor a payload describes, whatever compression object made it."""
    if not isinstance(payload, Payload):
        raise ValueError(f"expected a torch_cgx.compression.Payload, got {type(payload).__name__}")
    base = payload.method.split("/", 1)[0]
    if base not in _EXTRACTORS:
        raise ValueError(f"unknown payload method {payload.method!r}")
    flat = _EXTRACTORS[base](payload)
    out = flat.to(payload.dtype).reshape(payload.shape)
    return out.requires_grad_(payload.requires_grad) if out.is_floating_point() else out


def bits_of(dtype: torch.dtype) -> int:
    """Bits per value of ``dtype`` (bool: 8, as stored)."""
    if dtype == torch.bool:
        return 8
    return torch.finfo(dtype).bits if dtype.is_floating_point else torch.iinfo(dtype).bits


class CompressionBase:
    """A way to compress one tensor. Subclasses set ``compress`` and
    ``estimate_compression_ratio``; ``allreduce_codec`` says how the DDP policy hook
    (``torch_cgx.compression.ddp``) sends a gradient chosen for this object."""

    def compress(
        self, tensor: torch.Tensor, info: Optional[CompressionInfo] = None, allow_inplace=False
    ) -> Payload:
        """``allow_inplace`` is accepted for hivemind's signature; the input is never changed."""
        raise NotImplementedError

    def extract(self, payload: Payload) -> torch.Tensor:
        return extract(payload)

    def estimate_compression_ratio(self, info: CompressionInfo) -> float:
        raise NotImplementedError

    def allreduce_codec(self) -> Optional[Tuple[str, Dict[str, float]]]:
        """(compressor name, parameters) of the cgx backend's compressed allreduce that carries
        this compression, or None for an exact allreduce. ValueError if there is none."""
        raise ValueError(
            f"{type(self).__name__} has no compressed allreduce in the cgx backend (its payloads "
            "cannot be summed in transit); use NoCompression, Float16Compression, "
            "Uniform8BitQuantization, BlockwiseQuantization or CGXCompression"
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def check_tensor(tensor, who: str, floating: bool = True) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{who} compresses a torch.Tensor, got {type(tensor).__name__}")
    if floating and tensor.dtype not in (torch.float64, torch.float32, torch.float16,
                                         torch.bfloat16):  # fmt: skip
        raise ValueError(f"{who} does not support {tensor.dtype} tensors (floating point only)")
    if tensor.dtype not in _DTYPES.values():
        raise ValueError(f"{who} does not support {tensor.dtype} tensors")
    return tensor.detach().cpu()


class NoCompression(CompressionBase):
    """The tensor's own bytes: exact for every supported dtype (floats, integers, bool)."""

    def compress(self, tensor, info=None, allow_inplace=False) -> Payload:
        requires_grad = isinstance(tensor, torch.Tensor) and tensor.requires_grad
        x = check_tensor(tensor, "NoCompression", floating=False).contiguous()
        data = x.reshape(-1).view(torch.uint8).clone()
        return Payload("none", data, tuple(x.shape), x.dtype, requires_grad)

    def estimate_compression_ratio(self, info) -> float:
        return 1.0

    def allreduce_codec(self):
        return None


register_method("none", lambda p: p.data.clone().view(p.dtype))
