"""What every device codec shares: the interface, bit packing, the envelope, the generator.

A device codec is a compressor of docs/FORMAT.md written in tensor operations only, so the same
code runs on CUDA tensors (the GPU data plane) and on CPU tensors (the test suite, which checks it
byte for byte against the native codec of ``torch_cgx.compressors``). Nothing here moves a
tensor's values to the host: constants go host -> device, never the other way, and only through
torch_cgx/device/constants.py (cached, non-blocking: no host synchronisation on a GPU).
"""

from __future__ import annotations

from typing import Dict, Optional, Union

import torch

from torch_cgx.device import constants

__all__ = [
    "DTYPE_CODES",
    "DeviceCodec",
    "constant_bytes",
    "envelope",
    "pack_bits",
    "rng_key",
    "scalar_bytes",
    "uniform",
    "unpack_bits",
]

DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
_M32 = 0xFFFFFFFF
_M64 = 0xFFFFFFFFFFFFFFFF


class DeviceCodec:
    """One configured compressor in tensor operations (any device).

    Subclasses set ``name`` and ``fixed_size`` and implement :meth:`encoded_size`,
    :meth:`encode` and :meth:`values`. Parameters have the names and defaults of
    ``torch_cgx.compressors.params(name)``.
    """

    name: str = ""
    fixed_size: bool = True

    def __init__(self, **params) -> None:
        self.params: Dict[str, float] = dict(params)

    def __repr__(self) -> str:
        args = "".join(f", {k}={v!r}" for k, v in self.params.items())
        return f"device_codecs.get({self.name!r}{args})"

    def encoded_size(self, numel: int, dtype: torch.dtype = torch.float32) -> int:
        """Payload bytes for ``numel`` values: exact when ``fixed_size``, else the most."""
        raise NotImplementedError

    def encode(self, x: torch.Tensor, *, seed: int = 0, stream: int = 0, shared: int = 0):
        """The payload (1-D uint8 on ``x``'s device) of the 1-D contiguous float tensor ``x``."""
        raise NotImplementedError

    def values(self, payload: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """The decoded values ``x'`` in float32 (1-D, ``numel``, on the payload's device) of a
        payload encoded from ``numel`` values of ``dtype``. Raises ValueError when the payload's
        size cannot be one of such a payload (a host-side check on sizes only)."""
        raise NotImplementedError

    def header_ok(self, payload: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A 0-d bool tensor on the payload's device: the header matches what the receiver
        expects. The caller reads it when it synchronises anyway (never forced here)."""
        raise NotImplementedError

    def decode(self, payload: torch.Tensor, numel: int, dtype=torch.float32) -> torch.Tensor:
        return self.values(payload, numel, dtype).to(dtype)

    def decode_add_(self, out: torch.Tensor, payload: torch.Tensor, dtype=None) -> torch.Tensor:
        """``out += decode(payload)`` computed in fp32 and rounded once to ``out``'s dtype;
        ``dtype``: the dtype the payload was encoded from (default ``out.dtype``; the engine
        adds fp16 / bf16 payloads into fp32 sums). Adding into ``-0.0`` gives :meth:`values`
        bit for bit (``-0 + v == v`` for every v), which is how the engine decodes."""
        v = self.values(payload, out.numel(), out.dtype if dtype is None else dtype)
        if out.dtype == torch.float32:
            return out.add_(v.view(out.shape))
        return out.copy_(out.float() + v.view(out.shape))


def scalar_bytes(t: torch.Tensor) -> torch.Tensor:
    """The little-endian bytes of a contiguous tensor (any dtype) as a 1-D uint8 view."""
    return t.contiguous().view(-1).view(torch.uint8)


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes (integer tensor, each < 2^bits) as one little-endian bit stream: code ``i`` at bits
    ``[i*bits, (i+1)*bits)``, bit ``j`` of the stream bit ``j % 8`` of byte ``j / 8``; unused high
    bits of the last byte 0. ``ceil(n * bits / 8)`` bytes."""
    n = codes.numel()
    nbytes = (n * bits + 7) // 8
    if n == 0:
        return torch.zeros(0, dtype=torch.uint8, device=codes.device)
    if bits == 1:  # the same bytes: bit j of byte i is code 8 i + j (fuses under torch.compile)
        c = codes.reshape(-1).to(torch.uint8)
        if nbytes * 8 != n:
            c = torch.cat([c, c.new_zeros(nbytes * 8 - n)])
        v = c.view(nbytes, 8)
        out = v[:, 0]
        for j in range(1, 8):
            out = out | (v[:, j] << j)
        return out
    shifts = torch.arange(bits, device=codes.device, dtype=torch.int32)
    stream = (codes.reshape(-1, 1).to(torch.int32) >> shifts) & 1  # (n, bits)
    stream = stream.reshape(-1).to(torch.uint8)
    pad = nbytes * 8 - stream.numel()
    if pad:
        stream = torch.cat([stream, stream.new_zeros(pad)])
    weights = constants.get(("pack_bits",), codes.device, _bit_weights)
    return (stream.view(nbytes, 8).to(torch.int32) * weights).sum(1).to(torch.uint8)


def _bit_weights() -> torch.Tensor:
    return torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.int32)


def unpack_bits(data: torch.Tensor, n: int, bits: int) -> torch.Tensor:
    """The first ``n`` codes (int32) of a bit stream written by :func:`pack_bits`."""
    if n == 0:
        return torch.zeros(0, dtype=torch.int32, device=data.device)
    nbytes = (n * bits + 7) // 8
    shifts = torch.arange(8, device=data.device, dtype=torch.int32)
    stream = (data[:nbytes].to(torch.int32).reshape(-1, 1) >> shifts) & 1
    stream = stream.reshape(-1)[: n * bits].view(n, bits)
    weights = torch.ones(bits, dtype=torch.int32, device=data.device) << torch.arange(
        bits, dtype=torch.int32, device=data.device
    )
    return (stream * weights).sum(1, dtype=torch.int32)


def _le(value: int, nbytes: int) -> list:
    return [(value >> (8 * i)) & 0xFF for i in range(nbytes)]


def envelope(
    compressor_id: int,
    dtype: torch.dtype,
    count: int,
    body: Union[int, torch.Tensor],
    param0: Union[int, torch.Tensor] = 0,
    param1: Union[int, torch.Tensor] = 0,
    flags: Union[int, torch.Tensor] = 0,
    device: Optional[torch.device] = None,
) -> torch.Tensor:
    """The 32-byte envelope of FORMAT.md ("Compressor payloads") on ``device``. Fields known on
    the host are ints; data-dependent ones (``flags``: uint8 0-d, ``body``: int64 0-d,
    ``param0`` / ``param1``: int64 or uint32 bit patterns, 0-d) may be device tensors."""
    fields = ((7, flags, 1), (16, body, 8), (24, param0, 4), (28, param1, 4))
    host = tuple(0 if isinstance(f, torch.Tensor) else int(f) for _, f, _ in fields)
    out = constant_bytes(
        (ord("C"), ord("G"), ord("X"), ord("C"), 1, DTYPE_CODES[dtype], compressor_id, host[0])
        + tuple(_le(count, 8))
        + tuple(_le(host[1], 8))
        + tuple(_le(host[2], 4))
        + tuple(_le(host[3], 4)),
        torch.device("cpu") if device is None else torch.device(device),
    ).clone()
    for offset, field, width in fields:
        if isinstance(field, torch.Tensor):
            out[offset : offset + width] = scalar_bytes(field.to(torch.int64).reshape(1))[:width]
    return out


def constant_bytes(values: tuple, device: torch.device) -> torch.Tensor:
    """``values`` as a uint8 tensor on ``device``, made once per (values, device) by
    :func:`torch_cgx.device.constants.get` (headers repeat from call to call: no copy, and no
    host wait, after the first). Shared: never write into the result (clone it)."""
    return constants.bytes_of(values, device)


# The max-min generator of FORMAT.md ("The stochastic-rounding generator"), shared by stochastic
# max-min, terngrad and qsgd. Keys are host integers; element hashes are int64 tensor arithmetic
# that never overflows (u32 products split in 16-bit halves).


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def rng_key(seed: int, stream: int) -> tuple:
    """(k0, k1): the low and high 32 bits of ``splitmix64(splitmix64(seed) ^ stream)``."""
    k = _splitmix64(_splitmix64(seed & _M64) ^ (stream & _M64))
    return k & _M32, k >> 32


def _mul32(a: torch.Tensor, b: int) -> torch.Tensor:
    """``a * b mod 2^32`` for int64 ``a`` in [0, 2^32) and a constant ``b``, without overflow."""
    lo = (a & 0xFFFF) * b
    hi = ((a >> 16) * b) & 0xFFFF
    return (lo + (hi << 16)) & _M32


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def uniform(seed: int, stream: int, index: torch.Tensor) -> torch.Tensor:
    """``u(seed, stream, i)`` in [0, 1) as float32 for the int64 element indices ``index``."""
    k0, k1 = rng_key(seed, stream)
    i = index.to(torch.int64)
    lo, hi = i & _M32, (i >> 32) & _M32
    h = _fmix32((_fmix32(lo ^ k0) + (_mul32(hi, 0x9E3779B1) ^ k1)) & _M32)
    return (h >> 8).to(torch.float32) * (2.0**-24)
