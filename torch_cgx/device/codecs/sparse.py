"""The sparse compressors as device codecs: topk, randomk, threshold, dgc, graddrop.

Byte for byte the payloads of docs/FORMAT.md ("Sparse compressors") that the native codecs
(``torch_cgx.compressors``) write for the same input, ``seed``, ``stream`` and ``shared``;
selection primitives in :mod:`torch_cgx.device.codecs.sparse_select`. Values travel in the
input dtype, bit for bit.

Host reads: none for topk and randomk (fixed size). threshold, dgc and graddrop have a
data-dependent size, known only after a device computation: their ``encode`` synchronises once,
in ``torch.nonzero`` (the positions that pass the threshold), and reads nothing else. Decoding
reads nothing: the pair count ``m`` follows from the payload's length (a host size), and what
only the bytes can tell (header fields, indices ascending and ``< n``) is the device flag
:meth:`header_ok`; indices out of range are redirected so that no payload writes out of bounds.
"""

from __future__ import annotations

import struct
from typing import Tuple

import torch

from torch_cgx.device.codecs import sparse_select as sel
from torch_cgx.device.codecs.base import DTYPE_CODES, DeviceCodec, envelope, rng_key

__all__ = ["CODECS", "DGC", "GradDrop", "RandomK", "Threshold", "TopK"]

_HEADER = 32
_MAX_INDEX_COUNT = 2**32 - 1
_ES = {torch.float32: 4, torch.float16: 2, torch.bfloat16: 2}


def _native_params(name: str, params: dict) -> dict:
    """``params`` validated exactly as the native codec validates them (same ValueError), with
    the defaults of ``torch_cgx.compressors.params(name)`` filled in."""
    from torch_cgx import compressors

    compressors.get(name, **params)
    full = {spec["name"]: spec["default"] for spec in compressors.params(name)}
    full.update({key: float(value) for key, value in params.items()})
    return full


def _check_input(name: str, x, seed: int, stream: int, shared: int) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dtype not in DTYPE_CODES:
        raise ValueError(f"{name}: the tensor must be float32, float16 or bfloat16")
    for what, v in (("seed", seed), ("stream", stream), ("shared", shared)):
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 2**64:
            raise ValueError(f"{name}: {what} must be an integer in [0, 2^64), got {v!r}")
    x = x.detach().reshape(-1)
    if x.numel() > _MAX_INDEX_COUNT:
        raise ValueError(
            f"{name}: element count {x.numel()} exceeds 2^32 - 1"
            " (indices are u32; split the tensor)"
        )
    return x


def _size_args(name: str, numel: int, dtype) -> int:
    """The element size of ``dtype`` after checking ``numel`` and ``dtype``."""
    if dtype not in _ES:
        raise ValueError(f"{name}: dtype must be float32, float16 or bfloat16, got {dtype}")
    if not isinstance(numel, int) or not 0 <= numel <= _MAX_INDEX_COUNT:
        raise ValueError(f"{name}: numel must be an integer in [0, 2^32 - 1], got {numel!r}")
    return _ES[dtype]


def _check_payload(name: str, payload, numel: int, dtype) -> int:
    if not isinstance(payload, torch.Tensor) or payload.dtype != torch.uint8 or payload.dim() != 1:
        raise ValueError(f"{name}: payload must be a 1-D uint8 tensor (what encode returned)")
    return _size_args(name, numel, dtype)


def _as_dtype(data: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bytes (contiguous uint8) reinterpreted as ``dtype``; copied first when the view would be
    misaligned (a payload at an odd offset of a receive buffer)."""
    if data.storage_offset() % dtype.itemsize:
        data = data.clone()
    return data.view(dtype)


def _u32(data: torch.Tensor) -> torch.Tensor:
    """Little-endian u32 words (bytes) as int64."""
    return _as_dtype(data, torch.int32).to(torch.int64) & 0xFFFFFFFF


def _header_matches(payload, expected: torch.Tensor, upto: int) -> torch.Tensor:
    return (payload[:upto] == expected[:upto]).all()


def _add_at(out: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``out[index] += values`` in fp32, rounded once to ``out``'s dtype; positions not in
    ``index`` untouched (``index`` distinct and in range for a valid payload)."""
    flat = out.view(-1) if out.is_contiguous() else out.contiguous().view(-1)
    flat[index] = (flat[index].float() + values).to(out.dtype)
    if flat.data_ptr() != out.data_ptr():
        out.copy_(flat.view(out.shape))
    return out


class _Dispatch:
    """Encode through a fused implementation where ``torch_cgx.device.kernels`` selects one for
    the input (``TritonSparse``: the same bytes from kernels; first use self-checked, NaN input
    included), else ``reference_encode``; both take their primitives from ``prims``."""

    self_check_nan = True  # the self-check also encodes its buffer with a NaN in it

    def checked_input(self, x, seed: int, stream: int, shared: int) -> torch.Tensor:
        return _check_input(self.name, x, seed, stream, shared)

    def encode(self, x, *, seed: int = 0, stream: int = 0, shared: int = 0) -> torch.Tensor:
        from torch_cgx.device import kernels

        x = self.checked_input(x, seed, stream, shared)
        fused = kernels.fused_for(self, x.device, x.dtype)
        if fused is not None:
            return fused.encode(self, x.contiguous(), seed, stream, shared)
        return self.reference_encode(x, seed=seed, stream=stream, shared=shared)

    def reference_decode_add_(self, out, payload, dtype=None, prims=sel.REFERENCE):
        """``decode_add_`` in tensor operations (no primitive of ``prims`` in it)."""
        return self.decode_add_(out, payload, dtype)


class _Pairs(_Dispatch, DeviceCodec):
    """Base of the pair layout (topk, threshold, dgc, graddrop): ``m`` u32 indices ascending,
    then the ``m`` values in the input dtype."""

    compressor_id = 0

    def __init__(self, **params) -> None:
        super().__init__(**_native_params(self.name, params))

    def max_pairs(self, n: int) -> int:
        raise NotImplementedError

    def select(self, x: torch.Tensor, seed: int, stream: int, prims) -> Tuple[torch.Tensor, object]:
        """The positions (int64, ascending) to send and param1 (int or 0-d tensor)."""
        raise NotImplementedError

    def encoded_size(self, numel: int, dtype: torch.dtype = torch.float32) -> int:
        es = _size_args(self.name, numel, dtype)
        return _HEADER + self.max_pairs(numel) * (4 + es)

    def reference_encode(self, x, *, seed: int = 0, stream: int = 0, shared: int = 0,
                         prims=sel.REFERENCE) -> torch.Tensor:  # fmt: skip
        """The payload through ``prims`` (default: the tensor operations)."""
        x = _check_input(self.name, x, seed, stream, shared)
        n, es = x.numel(), x.element_size()
        idx, param1 = self.select(x, seed, stream, prims)
        m = idx.numel()
        head = envelope(self.compressor_id, x.dtype, n, m * (4 + es), m, param1, device=x.device)
        return prims.pack(head, idx, x, True)

    def _pairs(self, payload, numel: int, dtype) -> Tuple[torch.Tensor, torch.Tensor, int]:
        """(indices int64, values fp32, m) after the host-side size checks."""
        es = _check_payload(self.name, payload, numel, dtype)
        body = payload.numel() - _HEADER
        m, rest = divmod(body, 4 + es)
        if body < 0 or rest:
            raise ValueError(
                f"{self.name} payload corrupt: {payload.numel()} bytes is not 32 + m * {4 + es}"
            )
        limit = self.max_pairs(numel)
        if m > limit or (self.fixed_size and m != limit):
            expected = f"{'' if self.fixed_size else 'at most '}{limit}"
            raise ValueError(
                f"{self.name} payload corrupt: {m} pairs, expected {expected} for {numel} values"
            )
        index = _u32(payload[_HEADER : _HEADER + 4 * m])
        values = _as_dtype(payload[_HEADER + 4 * m :], dtype).float()
        return index, values, m

    def values(self, payload, numel: int, dtype) -> torch.Tensor:
        index, values, _ = self._pairs(payload, numel, dtype)
        out = torch.zeros(numel + 1, dtype=torch.float32, device=payload.device)
        out[index.clamp(max=numel)] = values  # an index >= n lands in the spare slot
        return out[:numel]

    def decode_add_(self, out: torch.Tensor, payload: torch.Tensor, dtype=None) -> torch.Tensor:
        n = out.numel()
        index, values, _ = self._pairs(payload, n, out.dtype if dtype is None else dtype)
        if n == 0:
            return out
        return _add_at(out, index.clamp(max=n - 1), values)

    def header_ok(self, payload, numel: int, dtype) -> torch.Tensor:
        try:
            index, _, m = self._pairs(payload, numel, dtype)
        except ValueError:
            return torch.zeros((), dtype=torch.bool, device=getattr(payload, "device", None))
        es = _ES[dtype]
        expected = envelope(
            self.compressor_id, dtype, numel, m * (4 + es), m, device=payload.device
        )
        ok = _header_matches(payload, expected, 28)  # param1 is informational
        ok = ok & (index < numel).all()
        return ok & (index[1:] > index[:-1]).all()


class TopK(_Pairs):
    """The ``k(ratio, n)`` largest magnitudes (``prim::top_k``, exact)."""

    name, compressor_id, fixed_size = "topk", 20, True

    def max_pairs(self, n: int) -> int:
        return sel.count_for(self.params["ratio"], n)

    def select(self, x, seed, stream, prims):
        return prims.top_k(x, self.max_pairs(x.numel())), 0


class Threshold(_Pairs):
    """Every ``|x| >= float(tau)`` (NaN kept). Synchronises once in ``nonzero``."""

    name, compressor_id, fixed_size = "threshold", 22, False

    def __init__(self, **params) -> None:
        super().__init__(**params)
        self.tau_bits = struct.unpack("<I", struct.pack("<f", self.params["tau"]))[0]

    def max_pairs(self, n: int) -> int:
        return n

    def select(self, x, seed, stream, prims):
        return torch.nonzero(prims.at_least(x, self.tau_bits)).view(-1), self.tau_bits


class _Sampled(_Pairs):
    """dgc / graddrop: the sampled threshold, capped at ``C = min(n, 2k)`` by the exact top-k.
    Synchronises once in ``nonzero``."""

    name, fixed_size = "", False

    def keep_count(self, n: int) -> int:
        raise NotImplementedError

    def max_pairs(self, n: int) -> int:
        return min(n, 2 * self.keep_count(n))

    def select(self, x, seed, stream, prims):
        n = x.numel()
        if n == 0:
            return torch.zeros(0, dtype=torch.int64, device=x.device), 0
        k, cap = self.keep_count(n), self.max_pairs(n)
        sample = max(sel.count_for(self.params["sample_rate"], n), min(n, 1024))
        keep, thr = prims.sampled_mask(x, k, sample, *rng_key(seed, stream))
        idx = torch.nonzero(keep).view(-1)
        if idx.numel() > cap:  # all of the cap largest pass the threshold: select among these
            idx = prims.top_k(x[idx], cap, index=idx)
        return idx, thr


class DGC(_Sampled):
    name, compressor_id = "dgc", 23

    def keep_count(self, n: int) -> int:
        return sel.count_for(self.params["ratio"], n)


class GradDrop(_Sampled):
    name, compressor_id = "graddrop", 24

    def keep_count(self, n: int) -> int:
        return sel.count_for(1 - self.params["drop"], n)


class RandomK(_Dispatch, DeviceCodec):
    """``k(ratio, n)`` values at ``prim::random_k(n, k, rng_key(seed, shared))``, values only.
    The indices are computed on the device (:func:`sparse_select.random_k`), on decode from the
    key words the payload carries."""

    name, compressor_id, fixed_size = "randomk", 21, True

    def __init__(self, **params) -> None:
        super().__init__(**_native_params(self.name, params))
        self.scale = bool(self.params["scale"])

    def encoded_size(self, numel: int, dtype: torch.dtype = torch.float32) -> int:
        es = _size_args(self.name, numel, dtype)
        return _HEADER + sel.count_for(self.params["ratio"], numel) * es

    def reference_encode(self, x, *, seed: int = 0, stream: int = 0, shared: int = 0,
                         prims=sel.REFERENCE) -> torch.Tensor:  # fmt: skip
        """The payload through ``prims`` (default: the tensor operations)."""
        x = _check_input(self.name, x, seed, stream, shared)
        n = x.numel()
        k = sel.count_for(self.params["ratio"], n)
        k0, k1 = rng_key(seed, shared)
        idx = prims.random_k(n, k, (k0, k1), device=x.device)
        flags = (~torch.isfinite(x).all()).to(torch.int64) * 2 + int(self.scale)
        head = envelope(
            self.compressor_id, x.dtype, n, k * x.element_size(), k0, k1, flags, x.device
        )
        return prims.pack(head, idx, x, False)

    def _count(self, payload, numel: int, dtype) -> int:
        """``k`` after the host-side checks (the payload's size is exactly ``32 + k * es``)."""
        es = _check_payload(self.name, payload, numel, dtype)
        k = sel.count_for(self.params["ratio"], numel)
        if payload.numel() != _HEADER + k * es:
            raise ValueError(
                f"{self.name} payload corrupt: {payload.numel()} bytes, expected {_HEADER + k * es}"
                f" ({k} values of {dtype} for {numel} values at ratio {self.params['ratio']})"
            )
        return k

    def _parts(self, payload, numel: int, dtype, prims=sel.REFERENCE):
        """(indices, values fp32 scaled, non-finite flag 0-d)."""
        k = self._count(payload, numel, dtype)
        index = prims.random_k(numel, k, payload[24:32], device=payload.device)
        values = _as_dtype(payload[_HEADER:], dtype).float()
        if self.scale and k:  # a Python scalar: fp32 kernels round it to float(n / k)
            values = values * (numel / k)
        return index, values, (payload[7] & 2) != 0

    def values(self, payload, numel: int, dtype) -> torch.Tensor:
        index, values, nonfinite = self._parts(payload, numel, dtype)
        out = torch.zeros(numel, dtype=torch.float32, device=payload.device)
        out[index] = values
        return torch.where(nonfinite, float("nan"), out)

    def decode_add_(self, out: torch.Tensor, payload: torch.Tensor, dtype=None) -> torch.Tensor:
        """Through a fused implementation (its indices: the draws) where one is selected."""
        from torch_cgx.device import kernels

        fused = None
        if isinstance(out, torch.Tensor) and isinstance(payload, torch.Tensor):
            src = out.dtype if dtype is None else dtype
            if src in _ES and payload.is_contiguous() and payload.device == out.device:
                fused = kernels.fused_for(self, out.device, src)
        if fused is not None:
            return fused.decode_add_(self, out, payload, dtype)
        return self.reference_decode_add_(out, payload, dtype)

    def reference_decode_add_(self, out, payload, dtype=None, prims=sel.REFERENCE):
        """``decode_add_`` through ``prims`` (default: the tensor operations)."""
        dtype = out.dtype if dtype is None else dtype
        index, values, _ = self._parts(payload, out.numel(), dtype, prims)
        _add_at(out, index, values)
        # a non-finite input anywhere: every element becomes out + NaN (no host read)
        return prims.nan_if_flagged(out, payload)

    def header_ok(self, payload, numel: int, dtype) -> torch.Tensor:
        try:
            k = self._count(payload, numel, dtype)
        except ValueError:
            return torch.zeros((), dtype=torch.bool, device=getattr(payload, "device", None))
        es = _ES[dtype]
        expected = envelope(self.compressor_id, dtype, numel, k * es, device=payload.device)
        ok = _header_matches(payload, expected, 7) & _header_matches(payload[8:], expected[8:], 16)
        return ok & ((payload[7] & 0xFC) == 0) & ((payload[7] & 1) == int(self.scale))


CODECS = {c.name: c for c in (TopK, RandomK, Threshold, DGC, GradDrop)}
