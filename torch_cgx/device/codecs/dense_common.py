"""What the dense device codecs share (dense.py, signs.py, levels.py): parameter checks, the native
dtype conversions, the bucket layout, the fp64 lane-ordered bucket sums and the envelope checks.

Every function is tensor operations on the input's device; sizes are host integers derived from
element counts only, never from tensor values.
"""

from __future__ import annotations

import struct
from typing import Dict, Optional

import torch

from torch_cgx.device.codecs.base import DeviceCodec, envelope, unpack_bits

__all__ = [
    "Buckets",
    "DenseCodec",
    "check_input",
    "check_params",
    "lane_sum",
    "narrow",
    "widen",
]

ENVELOPE_BYTES = 32
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_NAN = float("nan")


def check_params(name: str, given: Dict) -> Dict[str, float]:
    """``given`` checked like ``torch_cgx.compressors.get(name, **given)`` (the native specs and
    messages), completed with the defaults. Raises ValueError."""
    from torch_cgx import compressors  # lazy: the native module

    specs = compressors.params(name)
    values = {}
    for key, value in given.items():
        if isinstance(value, bool):
            value = int(value)
        if not isinstance(value, (int, float)):
            raise ValueError(f"{name} parameter {key} must be a number, got {value!r}")
        spec = next((s for s in specs if s["name"] == key), None)
        if spec is None:
            known = ", ".join(s["name"] for s in specs) or "none"
            raise ValueError(f"{name} has no parameter '{key}' (it takes: {known})")
        value = float(value)
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{name} parameter {key} must be finite")
        if spec["integer"] and value != int(value):
            raise ValueError(f"{name} parameter {key} must be an integer, got {value:g}")
        if not spec["min"] <= value <= spec["max"]:
            raise ValueError(
                f"{name} parameter {key} must be in [{spec['min']:g}, {spec['max']:g}], "
                f"got {value:g}"
            )
        values[key] = value
    for s in specs:
        values.setdefault(s["name"], float(s["default"]))
    return values


def check_input(x, name: str) -> torch.Tensor:
    """``x`` as a flat contiguous tensor; ValueError unless float32 / float16 / bfloat16."""
    if not isinstance(x, torch.Tensor) or x.dtype not in _FLOATS:
        raise ValueError(f"{name}: the tensor must be a float32, float16 or bfloat16 tensor")
    return x.detach().reshape(-1).contiguous()


def check_dtype(dtype, name: str) -> None:
    if dtype not in _FLOATS:
        raise ValueError(f"{name}: dtype must be float32, float16 or bfloat16, got {dtype}")


# ---- native conversions (csrc/core/dtype.h): round to nearest even, NaN bits as native --------


def widen(x: torch.Tensor) -> torch.Tensor:
    """float32 values of ``x`` as dtype.h's ``load_as_float``: exact; an fp16 NaN keeps its sign
    and payload and is quieted (F16C's rule)."""
    if x.dtype == torch.float32:
        return x
    v = x.float()
    if x.dtype == torch.bfloat16:
        return v  # bf16 -> fp32 is a shift of the bits, NaN payload included, in torch too
    h = x.view(torch.int16).to(torch.int32)  # sign-extended: h < 0 is the sign bit
    sign = (h < 0).to(torch.int32) * -(2**31)
    nan_bits = ((h & 0x3FF) << 13) | 0x7FC00000 | sign
    return torch.where(torch.isnan(v), nan_bits.view(torch.float32), v)


def narrow(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32 ``v`` rounded to ``dtype`` as dtype.h's ``store_from_float`` (nearest even; fp16
    overflow gives Inf; a NaN keeps its sign and top payload bits, quieted)."""
    if dtype == torch.float32:
        return v
    r = v.to(dtype)
    u = v.view(torch.int32)  # int32 arithmetic: >> sign-extends, every result fits 16 bits
    if dtype == torch.bfloat16:
        nan_bits = (u >> 16) | 0x40
    else:
        nan_bits = ((u >> 13) & 0x3FF) | 0x7E00 | (u < 0).to(torch.int32) * -(2**15)
    return torch.where(torch.isnan(v), nan_bits.to(torch.int16).view(dtype), r)


# ---- buckets ------------------------------------------------------------------------------------


class Buckets:
    """bucketed.h's layout of ``n`` values in buckets of ``size`` (0: one bucket): ``count``
    buckets, the last ``last`` values long; ``width`` = the longest bucket actually present."""

    def __init__(self, n: int, size: int) -> None:
        self.n = n
        self.size = size if size > 0 else max(n, 1)
        self.count = (n + self.size - 1) // self.size
        self.width = min(self.size, n)
        self.last = n - (self.count - 1) * self.size if self.count else 0

    def grid(self, v: torch.Tensor) -> torch.Tensor:
        """``v`` (n values) as a (count, width) grid, the last bucket padded with zeros."""
        pad = self.count * self.width - self.n
        if pad:
            v = torch.cat([v, v.new_zeros(pad)])
        return v.view(self.count, self.width)

    def lengths(self, device, dtype=torch.float64) -> torch.Tensor:
        """The buckets' lengths as a tensor (host constants)."""
        out = torch.full((self.count,), float(self.size), dtype=dtype, device=device)
        if self.count:
            out[-1] = float(self.last)
        return out

    def of_element(self, device) -> torch.Tensor:
        """The bucket index (int64) of every element."""
        return torch.arange(self.n, device=device) // self.size


def lane_sum(grid: torch.Tensor) -> torch.Tensor:
    """Per row of a (buckets, width) fp64 grid: the eight-lane sum of prim::stats (element 8q + j
    in lane j, each lane accumulated in order from +0.0, the lanes added as
    ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7))). cumsum along q is sequential on the CPU; a GPU's scan
    may group the additions differently (docs/gpu-codecs.md)."""
    rows, width = grid.shape
    m = (width + 7) // 8
    if m * 8 != width:
        grid = torch.nn.functional.pad(grid, (0, m * 8 - width))
    if m == 0:
        return grid.new_zeros(rows)
    lanes = grid.view(rows, m, 8).cumsum(1)[:, -1, :] + 0.0  # + 0.0: a lane of -0.0 sums to +0.0
    pair = lanes[:, 0::2] + lanes[:, 1::2]  # l0+l1, l2+l3, l4+l5, l6+l7
    quad = pair[:, 0::2] + pair[:, 1::2]
    return quad[:, 0] + quad[:, 1]


def abs_max(grid: torch.Tensor) -> torch.Tensor:
    """Per row of a (buckets, width) grid: max |x|, NaN where the row holds a NaN (amax
    propagates NaN; one reduction, where isfinite().all(1) is a slow boolean one on the CPU)."""
    if grid.shape[0] == 0 or grid.shape[1] == 0:
        return grid.new_zeros(grid.shape[0])
    return grid.abs().amax(1)


def non_finite_flag(x: torch.Tensor) -> torch.Tensor:
    """0-d uint8: 1 if ``x`` holds NaN or Inf (the envelope's flag bit 0)."""
    if x.numel() == 0:
        return torch.zeros((), dtype=torch.uint8, device=x.device)
    return (~(x.abs().amax() < float("inf"))).to(torch.uint8)


def nan_where(ok: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``value`` where ``ok``, else the quiet NaN 0x7fc00000 (C's NAN)."""
    return torch.where(ok, value, torch.full_like(value, _NAN))


def f32_bits(value: float) -> int:
    """The bits of ``value`` rounded to float32 (host arithmetic)."""
    return struct.unpack("<I", struct.pack("<f", value))[0]


def to_f32(value: float) -> float:
    """``value`` rounded to float32 (C's ``float(double)``), as a Python float."""
    return struct.unpack("<f", struct.pack("<f", value))[0]


# ---- the codec base -----------------------------------------------------------------------------


class DenseCodec(DeviceCodec):
    """A dense compressor's device codec: envelope + ``scalars`` f32 per bucket + ``bits``-bit
    codes. Subclasses set ``name``, ``compressor_id``, ``scalars``, ``bits``, ``flag_mask`` and
    implement ``encode`` and ``values``; ``bucket_size`` is 0 unless the compressor has one."""

    compressor_id = 0
    scalars = 0
    bits = 1
    flag_mask = 0  # envelope flag bits the payload may set (bit 0: non-finite input)
    bucket_size = 0
    param1 = 0

    def __init__(self, **params) -> None:
        super().__init__(**params)
        self.config = check_params(self.name, params)

    def layout(self, numel: int) -> Buckets:
        return Buckets(numel, self.bucket_size)

    def lane_sums(self) -> bool:
        """Whether the scalars come from FORMAT.md's lane-ordered fp64 sums over a bucket: one
        dependent chain per lane, serial within a bucket on any device."""
        return False

    def body_size(self, numel: int) -> int:
        return self.layout(numel).count * self.scalars * 4 + (numel * self.bits + 7) // 8

    def encoded_size(self, numel: int, dtype: torch.dtype = torch.float32) -> int:
        check_dtype(dtype, self.name)
        if not isinstance(numel, int) or isinstance(numel, bool) or numel < 0:
            raise ValueError(f"numel must be an integer >= 0, got {numel!r}")
        return ENVELOPE_BYTES + self.body_size(numel)

    def expected_envelope(self, numel: int, dtype: torch.dtype, device) -> torch.Tensor:
        return envelope(
            self.compressor_id,
            dtype,
            numel,
            self.body_size(numel),
            self.bucket_size,
            self.param1,
            device=device,
        )

    def wrap(self, x: torch.Tensor, parts, flags: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The payload: the envelope of ``x`` then the body ``parts`` (uint8 tensors)."""
        head = envelope(
            self.compressor_id,
            x.dtype,
            x.numel(),
            self.body_size(x.numel()),
            self.bucket_size,
            self.param1,
            flags if flags is not None else 0,
            device=x.device,
        )
        return torch.cat([head, *parts])

    def body(self, payload: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """The payload's body after the host-side checks (type, size); ValueError otherwise."""
        check_dtype(dtype, self.name)
        if not isinstance(payload, torch.Tensor) or payload.dtype != torch.uint8:
            raise ValueError(f"{self.name}: the payload must be a 1-D uint8 tensor")
        if payload.dim() != 1:
            raise ValueError(f"{self.name}: the payload must be a 1-D uint8 tensor")
        want = self.encoded_size(numel, dtype)
        if payload.numel() != want:
            raise ValueError(
                f"{self.name} payload corrupt: {payload.numel()} bytes, a payload of {numel} "
                f"values takes {want}"
            )
        return payload[ENVELOPE_BYTES:]

    def bucket_scalars(self, body: torch.Tensor, numel: int) -> torch.Tensor:
        """The (buckets, scalars) f32 table at the start of the body."""
        nb = self.layout(numel).count
        raw = body[: nb * self.scalars * 4].clone()  # clone: an aligned copy to view as f32
        return raw.view(torch.float32).view(nb, self.scalars)

    def codes(self, body: torch.Tensor, numel: int) -> torch.Tensor:
        """The ``bits``-bit codes (int32) after the scalars."""
        return unpack_bits(body[self.layout(numel).count * self.scalars * 4 :], numel, self.bits)

    def codes_ok(self, body: torch.Tensor, numel: int) -> torch.Tensor:
        """A device-side check of the codes (2-bit formats: no code 3)."""
        return torch.ones((), dtype=torch.bool, device=body.device)

    def header_ok(self, payload: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """The envelope equals the expected one (flags within ``flag_mask``) and the codes are
        valid (no code 3 in a 2-bit format); False for a payload of the wrong size."""
        if not isinstance(payload, torch.Tensor) or payload.dim() != 1:
            raise ValueError(f"{self.name}: the payload must be a 1-D uint8 tensor")
        if payload.dtype != torch.uint8 or payload.numel() != self.encoded_size(numel, dtype):
            return torch.zeros((), dtype=torch.bool, device=payload.device)
        want = self.expected_envelope(numel, dtype, payload.device)
        head = payload[:ENVELOPE_BYTES]
        same = head == want
        same[7] = (head[7] & (0xFF & ~self.flag_mask)) == 0  # a host constant mask
        return same.all() & self.codes_ok(payload[ENVELOPE_BYTES:], numel)

    def flag_nan(self, payload: torch.Tensor) -> torch.Tensor:
        """0-d bool: the payload's flag bit 0 (non-finite input)."""
        return (payload[7] & 1) == 1

    # decode order as the native loops: fp32 out += value; 16-bit out = round(value + out)
    def decode(self, payload: torch.Tensor, numel: int, dtype=torch.float32) -> torch.Tensor:
        return narrow(self.values(payload, numel, dtype), dtype)

    def decode_add_(self, out: torch.Tensor, payload: torch.Tensor, dtype=None) -> torch.Tensor:
        """``out += decode(payload)``; ``dtype``: what the payload was encoded from (default
        ``out.dtype``)."""
        check_dtype(out.dtype, self.name)
        v = self.values(payload, out.numel(), out.dtype if dtype is None else dtype)
        v = v.view(out.shape)
        if out.dtype == torch.float32:
            return out.add_(v)
        return out.copy_(narrow(widen(out) + v, out.dtype))


def check_keys(name: str, **keys) -> None:
    """seed / stream / shared: integers in [0, 2^64), as ``compressors.Compressor.encode``."""
    for what, v in keys.items():
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 2**64:
            raise ValueError(f"{name}: {what} must be an integer in [0, 2^64), got {v!r}")


def as_bytes(values: torch.Tensor) -> torch.Tensor:
    """The little-endian bytes of a tensor (any shape) as a flat uint8 tensor."""
    return values.contiguous().view(-1).view(torch.uint8)
