"""Policies: compression objects that choose another per tensor (hivemind's adaptive classes).

``SizeAdaptiveCompression(threshold, less, greater_equal)``: ``greater_equal`` for tensors of
at least ``threshold`` values (the whole tensor's ``descriptor.numel()``, also for its parts),
``less`` for the others. ``RoleAdaptiveCompression(activation=, parameter=, gradient=,
optimizer=, default=NoCompression())``: by ``info.role``; roles not given (and UNSPECIFIED) take
``default``. ``PerTensorCompression(mapping or sequence)``: by ``info.key`` (a name, or an index
into the sequence).

A policy compresses with its choice and estimates with it; payloads name their method, so
``extract`` needs no choice. Policies nest (a size policy inside a role policy...).
:func:`resolve` follows them down to the object that compresses.
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence, Union

from torch_cgx.compression.base import (
    CompressionBase,
    CompressionInfo,
    NoCompression,
    Payload,
    TensorRole,
    role_name,
)

__all__ = [
    "AdaptiveCompressionBase",
    "PerTensorCompression",
    "RoleAdaptiveCompression",
    "SizeAdaptiveCompression",
    "resolve",
]


def _check(what: str, value) -> CompressionBase:
    if not isinstance(value, CompressionBase):
        raise ValueError(f"{what} must be a torch_cgx.compression object, got {value!r}")
    return value


class AdaptiveCompressionBase(CompressionBase):
    """A compression object that delegates to ``choose_compression(info)``."""

    def choose_compression(self, info: CompressionInfo) -> CompressionBase:
        raise NotImplementedError

    def compress(self, tensor, info=None, allow_inplace=False) -> Payload:
        if info is None:
            info = CompressionInfo.from_tensor(tensor)
        return self.choose_compression(info).compress(tensor, info, allow_inplace)

    def estimate_compression_ratio(self, info: CompressionInfo) -> float:
        return self.choose_compression(info).estimate_compression_ratio(info)

    def allreduce_codec(self):
        raise ValueError(f"{type(self).__name__} chooses per tensor: resolve it first")


def resolve(policy: CompressionBase, info: CompressionInfo) -> CompressionBase:
    """The object that compresses the tensor ``info`` describes, through nested policies."""
    _check("policy", policy)
    seen = 0
    while isinstance(policy, AdaptiveCompressionBase):
        policy = _check(f"{type(policy).__name__}'s choice", policy.choose_compression(info))
        seen += 1
        if seen > 100:
            raise ValueError("policies nested more than 100 deep (a cycle?)")
    return policy


class SizeAdaptiveCompression(AdaptiveCompressionBase):
    """``greater_equal`` for tensors of at least ``threshold`` values, else ``less``."""

    def __init__(self, threshold: int, less: CompressionBase, greater_equal: CompressionBase):
        if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 0:
            raise ValueError(f"threshold must be an integer >= 0, got {threshold!r}")
        self.threshold = threshold
        self.less, self.greater_equal = _check("less", less), _check("greater_equal", greater_equal)

    def __repr__(self) -> str:
        return f"SizeAdaptiveCompression({self.threshold}, {self.less!r}, {self.greater_equal!r})"

    def choose_compression(self, info: CompressionInfo) -> CompressionBase:
        big = info.descriptor.numel() >= self.threshold
        return self.greater_equal if big else self.less


class RoleAdaptiveCompression(AdaptiveCompressionBase):
    """One compression per :class:`TensorRole`; ``default`` for the roles not given."""

    def __init__(
        self,
        *,
        activation: Optional[CompressionBase] = None,
        parameter: Optional[CompressionBase] = None,
        gradient: Optional[CompressionBase] = None,
        optimizer: Optional[CompressionBase] = None,
        default: Optional[CompressionBase] = None,
    ) -> None:
        default = NoCompression() if default is None else _check("default", default)
        given = {"ACTIVATION": activation, "PARAMETER": parameter, "GRADIENT": gradient,
                 "OPTIMIZER": optimizer}  # fmt: skip
        self.role_compressions = {
            TensorRole[r]: default if c is None else _check(r.lower(), c) for r, c in given.items()
        }
        self.role_compressions[TensorRole.UNSPECIFIED] = default

    def __repr__(self) -> str:
        roles = ", ".join(f"{r.name.lower()}={c!r}" for r, c in self.role_compressions.items())
        return f"RoleAdaptiveCompression({roles})"

    def choose_compression(self, info: CompressionInfo) -> CompressionBase:
        return self.role_compressions[TensorRole[role_name(info.role)]]


class PerTensorCompression(AdaptiveCompressionBase):
    """The compression of ``tensor_compressions[info.key]`` (a mapping, or a sequence indexed
    by integer keys)."""

    def __init__(self, tensor_compressions: Union[Mapping, Sequence[CompressionBase]]) -> None:
        if isinstance(tensor_compressions, Mapping):
            items = tensor_compressions.items()
        elif isinstance(tensor_compressions, Sequence) and not isinstance(tensor_compressions,
                                                                          str):  # fmt: skip
            items = enumerate(tensor_compressions)
        else:
            raise ValueError(
                "PerTensorCompression takes a mapping {key: compression} or a sequence, got "
                f"{type(tensor_compressions).__name__}"
            )
        for key, c in items:
            _check(f"the compression of key {key!r}", c)
        self.tensor_compressions = tensor_compressions

    def __repr__(self) -> str:
        return f"PerTensorCompression({self.tensor_compressions!r})"

    def choose_compression(self, info: CompressionInfo) -> CompressionBase:
        table, key = self.tensor_compressions, info.key
        if isinstance(table, Mapping):
            if key not in table:
                raise ValueError(f"PerTensorCompression has no entry for key {key!r} "
                                 f"(keys: {sorted(map(str, table))})")  # fmt: skip
            return table[key]
        if isinstance(key, bool) or not isinstance(key, int) or not -len(table) <= key < len(table):
            raise ValueError(
                f"PerTensorCompression over a sequence of {len(table)} needs an integer key in "
                f"range, got {key!r} (the DDP policy hook keys by parameter name: use a dict)"
            )
        return table[key]
