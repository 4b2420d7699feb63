"""The max-min codec on torch tensors (wire format: docs/FORMAT.md).

A buffer is cut into buckets of ``bucket_size`` values; each bucket is sent as its minimum and
step (two fp32) plus one ``bits``-bit code per value. ``encode`` returns the payload as a uint8
tensor of exactly :func:`encoded_size` bytes; ``decode`` / ``decode_add_`` check the payload's
header and length before touching any memory and raise ``ValueError`` naming the problem.
"""

from __future__ import annotations

from typing import Optional

import torch

from torch_cgx import _C

__all__ = [
    "encode",
    "decode",
    "decode_add_",
    "encoded_size",
    "inspect",
    "num_threads",
    "set_num_threads",
]

_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
_BY_NAME = {v: k for k, v in _DTYPES.items()}


def _check_float(t: torch.Tensor, what: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _DTYPES:
        raise ValueError(f"{what} must be float32, float16 or bfloat16, got {t.dtype}")
    if t.device.type != "cpu":
        raise ValueError(f"{what} is on {t.device}; this build of the codec runs on CPU tensors")


def _check_payload(payload: torch.Tensor) -> torch.Tensor:
    if not isinstance(payload, torch.Tensor) or payload.dtype != torch.uint8:
        raise ValueError("payload must be a uint8 tensor returned by torch_cgx.codec.encode")
    if payload.device.type != "cpu":
        raise ValueError(f"payload is on {payload.device}; this build decodes CPU payloads")
    return payload.reshape(-1).contiguous()


def encoded_size(
    numel: int,
    bits: int = 4,
    bucket_size: int = 512,
    dtype: torch.dtype = torch.float32,
    skip_incomplete_buckets: bool = False,
) -> int:
    """Exact payload size in bytes: 24 + 8 * buckets + ceil(numel * bits / 8) (+ raw tail)."""
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be float32, float16 or bfloat16, got {dtype}")
    return _C.encoded_size(
        int(numel), _DTYPES[dtype], int(bits), int(bucket_size), bool(skip_incomplete_buckets)
    )


def encode(
    tensor: torch.Tensor,
    bits: int = 4,
    bucket_size: int = 512,
    *,
    stochastic: bool = False,
    seed: int = 0,
    stream: int = 0,
    skip_incomplete_buckets: bool = False,
    clip: bool = False,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Quantizes ``tensor`` (any shape, read in row-major order) to a uint8 payload.

    ``out``: a 1-D uint8 tensor of exactly :func:`encoded_size` bytes to write into (no
    allocation per call); the payload is returned either way.

    ``stochastic=True`` rounds up with probability equal to the fractional part (unbiased),
    drawing from a counter-based generator keyed by ``(seed, stream, element index)``: the same
    arguments give the same bytes; give each rank and call its own ``stream``.

    ``clip=True`` narrows each full bucket's range to the Gaussian-optimal one for ``bits`` (the
    bucket's mean +- a multiple of its standard deviation, docs/FORMAT.md "Clipped range") where
    that is narrower than max - min: values beyond decode to the nearest end. It lowers the mean
    squared error of near-Gaussian buckets (rotated ones, docs/accuracy.md), not the worst case.
    """
    _check_float(tensor, "tensor")
    if not 0 <= seed < 2**64 or not 0 <= stream < 2**64:
        raise ValueError("seed and stream must be in [0, 2^64)")
    if out is not None and (not isinstance(out, torch.Tensor) or out.dtype != torch.uint8):
        raise ValueError("out must be a uint8 tensor of exactly encoded_size() bytes")
    return _C.encode(
        tensor.contiguous(),
        int(bits),
        int(bucket_size),
        bool(skip_incomplete_buckets),
        bool(stochastic),
        bool(clip),
        int(seed),
        int(stream),
        out,
    )


def inspect(payload: torch.Tensor) -> dict:
    """The validated header of a payload: dtype, bits, bucket_size, count, flags."""
    return _C.inspect(_check_payload(payload))


def decode(
    payload: torch.Tensor,
    *,
    out: Optional[torch.Tensor] = None,
    dtype: Optional[torch.dtype] = None,
) -> torch.Tensor:
    """Decodes a payload into ``out`` (any shape with the payload's element count) or into a new
    1-D tensor of ``dtype`` (default: the encoded tensor's dtype). Returns the decoded tensor.

    ``out`` is keyword-only: the in-place form is ``decode_add_(out, payload)``, destination
    first like every in-place torch op, and a positional ``out`` here would read the other way.
    """
    payload = _check_payload(payload)
    if out is None:
        info = _C.inspect(payload)
        out = torch.empty(info["count"], dtype=dtype or _BY_NAME[info["dtype"]])
    _check_float(out, "out")
    return _into(payload, out, add=False)


def decode_add_(out: torch.Tensor, payload: torch.Tensor) -> torch.Tensor:
    """``out += decode(payload)``, accumulated in fp32 and rounded once to ``out``'s dtype."""
    _check_float(out, "out")
    return _into(_check_payload(payload), out, add=True)


def _into(payload: torch.Tensor, out: torch.Tensor, add: bool) -> torch.Tensor:
    if out.is_contiguous():
        _C.decode_into(payload, out, add)
        return out
    work = out.contiguous()
    _C.decode_into(payload, work, add)
    out.copy_(work)
    return out


def num_threads() -> int:
    """Threads the codec uses on large buffers: ``CGX_CODEC_THREADS`` when set, else the cores
    this process may use divided by the ranks sharing the host (``LOCAL_WORLD_SIZE``)."""
    return _C.num_threads()


def set_num_threads(n: int) -> None:
    _C.set_num_threads(int(n))
