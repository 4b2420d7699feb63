"""The ``sparseloco`` compressor (id 25) as a device codec: top-k of each chunk, the kept values
quantized to a sign and ``2^(bits-1)`` magnitude levels (docs/FORMAT.md, "sparseloco").

Byte for byte the payload the native codec (``csrc/compressors/sparseloco.cc``) writes for the
same input. The tensor is viewed as rows of ``chunk`` values (the full chunks) and a short last
row (the tail), and every step runs on all the rows of a block at once:

- selection: ``prim::top_k`` per row, on the unique int64 keys of
  :func:`sparse_select.order_keys` (NaN above +Inf, ties to the lower index), indices ascending;
- scalars per chunk: ``a = lo``, ``d = (hi - lo) / L`` in fp32 (``bits >= 2``), or ``a`` = the
  fp64 sum of the kept magnitudes in index order over ``k`` (``bits = 1``); NaN for both when a
  kept value is not finite;
- codes: the sign on top, the level ``min(max(floor((|x| - a) / d + 0.5), 0), L)`` below.

Fixed size: no host reads on encode or decode. Decode validation that only the bytes can tell
(header fields, indices in range and ascending per chunk) is the device flag :meth:`header_ok`;
an index out of its chunk is redirected so that no payload writes out of bounds.
"""

from __future__ import annotations

from typing import NamedTuple, Tuple

import torch

from torch_cgx.device.codecs import sparse_select as sel
from torch_cgx.device.codecs.base import DTYPE_CODES, DeviceCodec, envelope, scalar_bytes
from torch_cgx.device.codecs.maxmin import pack_codes, unpack_codes
from torch_cgx.device.codecs.sparse import _add_at, _as_dtype, _Dispatch, _native_params, _u32

__all__ = ["CODECS", "SparseLoCo"]

_HEADER = 32
_MAX_COUNT = 2**48
_M32 = 0xFFFFFFFF
_NAN_BITS = 0x7FC00000  # C's NAN, the bits the native codec writes for a non-finite chunk


class Block(NamedTuple):
    """Rows of equal length: ``rows`` chunks of ``length`` values from ``start``, ``k`` kept."""

    start: int
    rows: int
    length: int
    k: int


class Shape(NamedTuple):
    """The body's layout for ``n`` values (FORMAT.md): chunks, kept values, offsets, size."""

    blocks: Tuple[Block, ...]
    chunks: int
    kept: int
    idx_off: int
    codes_off: int
    body: int


def _nan(like: torch.Tensor) -> torch.Tensor:
    """The quiet NaN 0x7fc00000 as a 0-d fp32 tensor on ``like``'s device (a fill, no copy)."""
    return torch.full((), _NAN_BITS, dtype=torch.int32, device=like.device).view(torch.float32)


def sequential_sum(v: torch.Tensor, loop: bool = False) -> torch.Tensor:
    """Per row of the fp64 ``(r, k)`` tensor ``v``: ``((v0 + v1) + v2) + ...``, the native loop's
    order. CPU ``cumsum`` adds in that order; other devices (or ``loop``) add column by column."""
    if v.shape[1] == 0:
        return v.new_zeros(v.shape[0])
    if v.device.type == "cpu" and not loop:
        return torch.cumsum(v, 1)[:, -1]
    acc = v[:, 0].clone()
    for j in range(1, v.shape[1]):
        acc = acc + v[:, j]
    return acc


def row_top_k(rows: torch.Tensor, k: int) -> torch.Tensor:
    """``prim::top_k`` of each row of ``rows`` (``(r, L)``): int64 ``(r, k)``, ascending."""
    return sel.REFERENCE.row_top_k(rows, k)


class SparseLoCo(_Dispatch, DeviceCodec):
    """``sparseloco`` with the native parameters ``ratio``, ``chunk`` and ``bits``."""

    name, compressor_id, fixed_size = "sparseloco", 25, True

    def __init__(self, **params) -> None:
        super().__init__(**_native_params(self.name, params))
        self.ratio = self.params["ratio"]
        self.chunk = int(self.params["chunk"])
        self.bits = int(self.params["bits"])
        self.levels = (1 << (self.bits - 1)) - 1
        self.width = 2 if self.chunk <= 65536 else 4

    def shape(self, n: int) -> Shape:
        full, tail = divmod(n, self.chunk)
        blocks = [Block(0, full, self.chunk, sel.count_for(self.ratio, self.chunk))]
        if tail:
            blocks.append(Block(full * self.chunk, 1, tail, sel.count_for(self.ratio, tail)))
        blocks = tuple(b for b in blocks if b.rows)
        chunks = sum(b.rows for b in blocks)
        kept = sum(b.rows * b.k for b in blocks)
        idx_off = 8 * chunks
        codes_off = idx_off + self.width * kept
        return Shape(
            blocks, chunks, kept, idx_off, codes_off, codes_off + (kept * self.bits + 7) // 8
        )

    def _check_sizes(self, numel, dtype) -> None:
        if dtype not in DTYPE_CODES:
            raise ValueError(
                f"{self.name}: dtype must be float32, float16 or bfloat16, got {dtype}"
            )
        if not isinstance(numel, int) or isinstance(numel, bool) or not 0 <= numel <= _MAX_COUNT:
            raise ValueError(f"{self.name}: numel must be an integer in [0, 2^48], got {numel!r}")

    def encoded_size(self, numel: int, dtype: torch.dtype = torch.float32) -> int:
        self._check_sizes(numel, dtype)
        return _HEADER + self.shape(numel).body

    # ---- encode ---------------------------------------------------------------------------

    def checked_input(self, x, seed: int, stream: int, shared: int) -> torch.Tensor:
        return self._check_input(x, seed, stream, shared)

    def reference_encode(self, x, *, seed: int = 0, stream: int = 0, shared: int = 0,
                         prims=sel.REFERENCE) -> torch.Tensor:  # fmt: skip
        """The payload; the per-chunk top-k through ``prims`` (default: tensor operations)."""
        x = self._check_input(x, seed, stream, shared)
        n = x.numel()
        s = self.shape(n)
        head = envelope(
            self.compressor_id, x.dtype, n, s.body, self.chunk, self.bits, device=x.device
        )
        if not s.blocks:
            return head
        rows = [x[b.start : b.start + b.rows * b.length].view(b.rows, b.length) for b in s.blocks]
        idxs = [prims.row_top_k(r, b.k) for r, b in zip(rows, s.blocks)]
        fused = getattr(prims, "loco_payload", None)  # the scalars, indices and codes fused
        if fused is not None:
            return fused(self, x, s, head, idxs)
        scalars, codes = [], []
        for r, idx in zip(rows, idxs):
            v = torch.gather(r, 1, idx).float()
            a, d = self._scalars(v)
            scalars.append(torch.stack([a, d], 1).reshape(-1))
            codes.append(self._codes(v, a, d).reshape(-1))
        idx = torch.cat([i.reshape(-1) for i in idxs])
        # the low bytes of each little-endian int64 index are its u16 / u32
        index_bytes = idx.view(torch.uint8).view(-1, 8)[:, : self.width].reshape(-1)
        body = [
            scalar_bytes(torch.cat(scalars)),
            index_bytes,
            pack_codes(torch.cat(codes), self.bits),
        ]
        return torch.cat([head] + body)

    def _check_input(self, x, seed: int, stream: int, shared: int) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dtype not in DTYPE_CODES:
            raise ValueError(f"{self.name}: the tensor must be float32, float16 or bfloat16")
        for what, v in (("seed", seed), ("stream", stream), ("shared", shared)):
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 2**64:
                raise ValueError(f"{self.name}: {what} must be an integer in [0, 2^64), got {v!r}")
        if x.numel() > _MAX_COUNT:
            raise ValueError(f"{self.name}: element count {x.numel()} exceeds 2^48")
        return x.detach().reshape(-1).contiguous()

    def _scalars(self, v: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Per row of the kept values ``v`` (fp32 ``(r, k)``): ``(a, d)`` fp32 ``(r,)``."""
        mag = v.abs()
        bad = ~torch.isfinite(mag).all(1)
        if self.bits == 1:
            total = sequential_sum(mag.double())
            a = torch.div(total, torch.full_like(total, v.shape[1])).float()
            d = torch.zeros_like(a)
        else:
            lo, hi = mag.amin(1), mag.amax(1)
            a, d = lo, torch.div(hi - lo, torch.full_like(lo, self.levels))
        nan = _nan(v)
        return torch.where(bad, nan, a), torch.where(bad, nan, d)

    def _codes(self, v: torch.Tensor, a: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        """int32 codes of the kept values ``v`` (``(r, k)``) given their rows' ``a`` and ``d``."""
        sign = (v < 0).to(torch.int32) << (self.bits - 1)
        if self.bits == 1:
            return sign
        a, d = a.unsqueeze(1), d.unsqueeze(1)
        f = torch.floor(torch.div(v.abs() - a, d) + 0.5)
        usable = (d > 0) & torch.isfinite(d)
        level = torch.where(usable, f.clamp(0, self.levels), torch.zeros_like(f))
        return sign | level.to(torch.int32)

    # ---- decode ---------------------------------------------------------------------------

    def _parts(self, payload, numel: int, dtype):
        """(chunk of each kept value, its chunk's length, in-chunk index, code, scalars ``(nc,
        2)``) after the host-side size checks: int64 / int32 / fp32 tensors on the payload's
        device."""
        if (
            not isinstance(payload, torch.Tensor)
            or payload.dtype != torch.uint8
            or payload.dim() != 1
        ):
            raise ValueError(
                f"{self.name}: payload must be a 1-D uint8 tensor (what encode returned)"
            )
        self._check_sizes(numel, dtype)
        s = self.shape(numel)
        if payload.numel() != _HEADER + s.body:
            raise ValueError(
                f"{self.name} payload corrupt: {payload.numel()} bytes, expected"
                f" {_HEADER + s.body} for {numel} values (ratio {self.ratio}, chunk {self.chunk},"
                f" bits {self.bits})"
            )
        body = payload[_HEADER:]
        dev = payload.device
        scalars = _as_dtype(body[: s.idx_off], torch.float32).view(s.chunks, 2)
        raw = body[s.idx_off : s.codes_off]
        if self.width == 2:
            index = _as_dtype(raw, torch.int16).to(torch.int64) & 0xFFFF
        else:
            index = _u32(raw)
        codes = unpack_codes(body[s.codes_off :], s.kept, self.bits)
        # the tail keeps at most the full chunks' k, so j // k is the chunk of kept value j
        k_full = sel.count_for(self.ratio, self.chunk)
        chunk_of = torch.div(
            torch.arange(s.kept, dtype=torch.int64, device=dev), k_full, rounding_mode="floor"
        )
        full = numel // self.chunk
        length = torch.where(chunk_of < full, self.chunk, numel - full * self.chunk)
        return chunk_of, length, index, codes, scalars

    def _decoded(self, chunk_of, codes, scalars) -> torch.Tensor:
        """The kept values in fp32: ``+-(a + l d)`` (``bits = 1``: ``+-a``)."""
        a = scalars[:, 0][chunk_of]
        top = 1 << (self.bits - 1)
        if self.bits == 1:
            mag = a
        else:
            level = (codes & (top - 1)).float()
            mag = a + level * scalars[:, 1][chunk_of]
        return torch.where((codes & top) != 0, -mag, mag)

    def values(self, payload, numel: int, dtype) -> torch.Tensor:
        chunk_of, length, index, codes, scalars = self._parts(payload, numel, dtype)
        out = torch.zeros(numel + 1, dtype=torch.float32, device=payload.device)
        pos = torch.where(index < length, chunk_of * self.chunk + index, numel)  # spare slot
        out[pos] = self._decoded(chunk_of, codes, scalars)
        return out[:numel]

    def decode_add_(self, out: torch.Tensor, payload: torch.Tensor, dtype=None) -> torch.Tensor:
        dtype = out.dtype if dtype is None else dtype
        chunk_of, length, index, codes, scalars = self._parts(payload, out.numel(), dtype)
        if out.numel() == 0:
            return out
        pos = chunk_of * self.chunk + torch.minimum(index, length - 1)  # stays in its chunk
        return _add_at(out, pos, self._decoded(chunk_of, codes, scalars))

    def header_ok(self, payload, numel: int, dtype) -> torch.Tensor:
        try:
            chunk_of, length, index, _, _ = self._parts(payload, numel, dtype)
        except ValueError:
            return torch.zeros((), dtype=torch.bool, device=getattr(payload, "device", None))
        body = payload.numel() - _HEADER
        expected = envelope(
            self.compressor_id, dtype, numel, body, self.chunk, self.bits, device=payload.device
        )
        ok = (payload[:_HEADER] == expected).all() & (index < length).all()
        ascending = (index[1:] > index[:-1]) | (chunk_of[1:] != chunk_of[:-1])
        return ok & ascending.all()


CODECS = {"sparseloco": SparseLoCo}
