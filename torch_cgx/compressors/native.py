"""The native compressors (the registry in csrc/compressors) behind one interface.

>>> from torch_cgx import compressors
>>> compressors.names()                       # maxmin, fp16, bf16, signsgd, onebit, ...
>>> c = compressors.get("qsgd", bits=4)        # unknown names / bad parameters: ValueError
>>> payload = c.encode(grad)                   # uint8 tensor, self-describing
>>> c.decode(payload)                          # or c.decode_add_(acc, payload)

Compressors are stateless: error feedback and momentum belong to the caller. ``traits`` says
what the algorithms may rely on: ``biased`` (needs error feedback), ``fixed_size`` (the payload
size depends on the element count only), ``summable`` (payloads of one message can be summed as
they travel) and ``sparse``. Payload formats: docs/FORMAT.md.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import torch

from torch_cgx import _C

__all__ = ["Compressor", "get", "names", "params"]  # torch_cgx.compressors re-exports them

_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def names() -> List[str]:
    """The registered compressors, in registry order."""
    return list(_C.compressor_names())


def params(name: str) -> List[dict]:
    """The parameters ``name`` takes: name, default, min, max, integer, help."""
    _check_name(name)
    return list(_C.compressor_specs(name))


def get(name: str, **parameters) -> Compressor:
    """The compressor ``name`` with ``parameters`` (the rest take their defaults)."""
    _check_name(name)
    values = {}
    for key, value in parameters.items():
        if isinstance(value, bool):
            value = int(value)
        if not isinstance(value, (int, float)):
            raise ValueError(f"{name} parameter {key} must be a number, got {value!r}")
        values[key] = float(value)
    return Compressor(name, _C.make_compressor(name, values), dict(parameters))


def _check_name(name: str) -> None:
    if name not in _C.compressor_names():
        raise ValueError(f"unknown compressor {name!r} (registered: {', '.join(names())})")


def _float_tensor(t, what: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dtype not in _DTYPES:
        raise ValueError(f"{what} must be a float32, float16 or bfloat16 tensor")
    if t.device.type != "cpu":
        raise ValueError(f"{what} must be on the CPU (GPU compressors: not yet)")
    return t


def _payload(p) -> torch.Tensor:
    if not isinstance(p, torch.Tensor) or p.dtype != torch.uint8 or p.dim() != 1:
        raise ValueError("payload must be a 1-D uint8 tensor (what encode returned)")
    if p.device.type != "cpu":
        raise ValueError("payload must be on the CPU")
    return p.contiguous()


def _check_out_buffer(out, need: int, tensor: torch.Tensor) -> None:
    if not isinstance(out, torch.Tensor) or out.dtype != torch.uint8 or out.dim() != 1:
        what = f"{out.dtype} of shape {tuple(out.shape)}" if isinstance(out, torch.Tensor) else out
        raise ValueError(f"out must be a 1-D uint8 tensor, got {what!r}")
    if out.device.type != "cpu" or not out.is_contiguous():
        raise ValueError("out must be a contiguous CPU tensor")
    if out.numel() < need:
        raise ValueError(f"out holds {out.numel()} bytes, the payload needs up to {need}")
    lo, hi = out.data_ptr(), out.data_ptr() + out.numel()
    t_lo = tensor.data_ptr()
    t_hi = t_lo + tensor.numel() * tensor.element_size()
    if tensor.numel() and out.numel() and lo < t_hi and t_lo < hi:
        raise ValueError("out overlaps the tensor being encoded")


class Compressor:
    """One configured compressor (see :func:`get`)."""

    __slots__ = ("name", "parameters", "_native")

    def __init__(self, name: str, native, parameters: Dict) -> None:
        self.name, self._native, self.parameters = name, native, parameters

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.parameters.items())
        return f"compressors.get({self.name!r}{', ' if args else ''}{args})"

    @property
    def traits(self) -> Dict[str, bool]:
        return dict(self._native.traits())

    def encoded_size(self, numel: int, dtype: torch.dtype = torch.float32) -> int:
        """Payload bytes for ``numel`` values: exact for fixed-size compressors, else at most."""
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be float32, float16 or bfloat16, got {dtype}")
        if not isinstance(numel, int) or numel < 0:
            raise ValueError(f"numel must be an integer >= 0, got {numel!r}")
        return self._native.max_encoded_size(numel, _DTYPES[dtype])

    def encode(
        self,
        tensor: torch.Tensor,
        seed: int = 0,
        stream: int = 0,
        shared: int = 0,
        *,
        out: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """The payload of ``tensor`` (any shape, flattened). ``seed`` / ``stream`` key stochastic
        choices (give every rank and call its own stream); ``shared`` must be the same on every
        rank for one message (random-k's indices). ``out``: a reusable 1-D uint8 buffer of at
        least ``encoded_size(tensor.numel(), tensor.dtype)`` bytes; the payload is then a view
        of its first bytes (no allocation)."""
        tensor = _float_tensor(tensor, "tensor")
        for what, v in (("seed", seed), ("stream", stream), ("shared", shared)):
            if not isinstance(v, int) or not 0 <= v < 2**64:
                raise ValueError(f"{what} must be an integer in [0, 2^64), got {v!r}")
        flat = tensor.detach().contiguous().view(-1)
        if out is not None:
            _check_out_buffer(out, self.encoded_size(flat.numel(), flat.dtype), flat)
        return self._native.encode(flat, seed, stream, shared, out)

    def numel(self, payload: torch.Tensor) -> int:
        """The element count a payload describes (validated)."""
        return self._native.payload_count(_payload(payload))

    def decode(
        self, payload: torch.Tensor, *, out: Optional[torch.Tensor] = None, dtype=None
    ) -> torch.Tensor:
        """Decodes into ``out`` or a new 1-D tensor of ``dtype`` (default float32)."""
        payload = _payload(payload)
        if out is None:
            out = torch.empty(self.numel(payload), dtype=dtype or torch.float32)
        return self._into(payload, _float_tensor(out, "out"), add=False)

    def decode_add_(self, out: torch.Tensor, payload: torch.Tensor) -> torch.Tensor:
        """``out += decode(payload)``, in fp32, rounded once to ``out``'s dtype."""
        return self._into(_payload(payload), _float_tensor(out, "out"), add=True)

    def _into(self, payload: torch.Tensor, out: torch.Tensor, add: bool) -> torch.Tensor:
        work = out if out.is_contiguous() else out.contiguous()
        self._native.decode_into(payload, work.view(-1), add)
        if work is not out:
            out.copy_(work)
        return out
