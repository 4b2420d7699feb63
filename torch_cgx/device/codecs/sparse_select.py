"""The selection primitives of the sparse device codecs, in tensor operations (any device).

Each one gives the result of its native counterpart in ``csrc/core/primitives_select.cc`` and
``csrc/core/primitives.cc`` exactly (docs/FORMAT.md, "Sparse compressors"):

- :func:`top_k` is ``prim::top_k``: the ``k`` largest magnitudes, NaN above +Inf, ties to the
  lower index, indices ascending. ``torch.topk`` does not promise an order among equal values,
  so it runs on unique int64 keys (the magnitude's fp32 bits, then the complemented index).
- :func:`random_k` is ``prim::random_k`` (Floyd's sampling), made data-parallel (see there).
- :func:`sampled_threshold` is ``prim::sampled_threshold``: the same draws, the same quantile.

Nothing here moves a tensor's values to the host. Keys of the generator may be host integers or
0-d int64 tensors (a key read from a payload stays on the device).
"""

from __future__ import annotations

import math
from typing import Union

import torch

from torch_cgx.device.codecs.base import _fmix32, _mul32

__all__ = [
    "INF_BITS",
    "REFERENCE",
    "Reference",
    "count_for",
    "magnitude_bits",
    "order_keys",
    "random_k",
    "rng_bits",
    "sampled_threshold",
    "top_k",
]

INF_BITS = 0x7F800000  # fp32 +Inf; NaN magnitudes are mapped here for thresholds
_NAN_RANK = INF_BITS + 1  # NaN's place in the top-k order: above +Inf
_M32 = 0xFFFFFFFF
Key = Union[int, torch.Tensor]


def count_for(fraction: float, n: int) -> int:
    """``k(f, n)``: 0 for ``n = 0``, else ``ceil(f * n - 1e-6)`` clamped to ``[1, n]``."""
    if n <= 0:
        return 0
    k = math.ceil(fraction * float(n) - 1e-6)
    if not k >= 1:
        return 1
    return n if k >= n else int(k)


def magnitude_bits(x: torch.Tensor) -> torch.Tensor:
    """int32 fp32 bit patterns of ``|x|`` (computed in fp32), NaN mapped to +Inf's: they order
    like the magnitudes of ``prim::magnitude`` (non-negative floats order like their bits)."""
    bits = x.float().view(torch.int32) & 0x7FFFFFFF
    return bits.clamp_(max=INF_BITS)


def order_keys(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Unique int64 keys whose descending order is ``prim::top_k``'s: NaN first, then ``|x|``
    descending, then the lower index first (``index``: int64 positions of ``values``)."""
    bits = values.float().view(torch.int32) & 0x7FFFFFFF
    bits = bits.clamp_(max=_NAN_RANK).to(torch.int64)
    return (bits << 32) | (_M32 - index)


def top_k(x: torch.Tensor, k: int, index: Union[torch.Tensor, None] = None) -> torch.Tensor:
    """The positions (int64, ascending) of the ``k`` largest magnitudes of ``x`` in
    ``prim::top_k``'s order. With ``index``, ``x`` holds the values at those positions of a
    larger tensor (candidates) and the answer is a subset of ``index``."""
    n = x.numel()
    k = max(0, min(k, n))
    if index is None:
        index = torch.arange(n, dtype=torch.int64, device=x.device)
    if k == n:
        return index
    keys = order_keys(x, index)
    chosen = torch.topk(keys, k, sorted=False).indices
    return torch.sort(index[chosen]).values


def rng_bits(k0: Key, k1: Key, index: torch.Tensor) -> torch.Tensor:
    """``rng_bits(key, i)`` of csrc/core/rng.h (int64 in [0, 2^32)) for int64 indices."""
    lo, hi = index & _M32, (index >> 32) & _M32
    return _fmix32((_fmix32(lo ^ k0) + (_mul32(hi, 0x9E3779B1) ^ k1)) & _M32)


def _draw(k0: Key, k1: Key, step: torch.Tensor, modulus: Union[int, torch.Tensor]):
    """``r64 % modulus`` with ``r64 = rng_bits(2 step) << 32 | rng_bits(2 step + 1)``, the u64
    remainder computed in int64 without overflow (``modulus <= 2^32``)."""
    hi = rng_bits(k0, k1, 2 * step)
    lo = rng_bits(k0, k1, 2 * step + 1)
    a = hi % modulus  # (hi * 2^32) mod m as two shifts by 2^16, each below 2^48
    a = (a << 16) % modulus
    a = (a << 16) % modulus
    return (a + lo) % modulus


def random_k(n: int, k: int, k0: Key, k1: Key, device=None) -> torch.Tensor:
    """``prim::random_k(n, k, {k0, k1})``: ``k`` distinct positions in ``[0, n)``, ascending.

    Floyd's loop reads: for step ``t`` (``j = n - k + t``) draw ``r_t`` in ``[0, j]`` and take
    ``r_t``, or ``j`` if ``r_t`` was taken before. It is sequential as written, but which steps
    take ``j`` is computable in parallel. Every earlier draw ``r_u`` is in the taken set after its
    step (taken then, or already), and the only other members are steps ``u`` that took ``j_u``.
    So ``r_t`` was taken iff it equals an earlier draw, or it is an earlier step's ``j_u``
    (``n - k <= r_t < j``) and that step took its ``j_u``: an OR along the chain ``t -> u``
    (``u < t``), resolved by pointer jumping in ``ceil(log2 k) + 1`` gather rounds.
    """
    k = max(0, min(k, n))
    if k == n or k == 0:
        return torch.arange(k, dtype=torch.int64, device=device)
    step = torch.arange(k, dtype=torch.int64, device=device)
    j = step + (n - k)
    r = _draw(k0, k1, step, j + 1)
    # r_t equals an earlier draw: not the first of its value in a stable sort by value
    order = torch.sort(r, stable=True)
    repeat_sorted = torch.zeros(k, dtype=torch.bool, device=device)
    repeat_sorted[1:] = order.values[1:] == order.values[:-1]
    taken = torch.empty_like(repeat_sorted)
    taken[order.indices] = repeat_sorted
    # r_t is an earlier step's j_u: follow u = r_t - (n - k)
    pointer = torch.where((r >= n - k) & (r < j), r - (n - k), -1)
    for _ in range(k.bit_length()):
        linked = pointer >= 0
        at = pointer.clamp(min=0)
        taken = taken | (linked & taken[at])
        pointer = torch.where(linked, pointer[at], -1)
    picks = torch.where(taken, j, r)
    return torch.sort(picks).values


def sampled_threshold(mag: torch.Tensor, k: int, sample: int, k0: int, k1: int) -> torch.Tensor:
    """``prim::sampled_threshold`` as a 0-d int32 tensor of fp32 bits, for the magnitudes
    ``mag`` (:func:`magnitude_bits`): for ``sample < n`` the ``ceil(k s / n)``-th largest of
    ``s`` magnitudes drawn with replacement (position ``r64 % n`` for draw ``j``), else the exact
    ``k``-th largest."""
    n = mag.numel()
    if n == 0 or k <= 0:
        return torch.full((), INF_BITS, dtype=torch.int32, device=mag.device)
    if sample >= n:
        chosen = mag
    else:
        step = torch.arange(max(sample, 1), dtype=torch.int64, device=mag.device)
        chosen = mag[_draw(k0, k1, step, n)]
    s = chosen.numel()
    ks = max(1, min((k * s + n - 1) // n, s))
    # the ks-th largest is the (s - ks + 1)-th smallest; fp32 so that every device sorts it
    value = torch.kthvalue(chosen.view(torch.float32), s - ks + 1).values
    return value.view(torch.int32)


class Reference:
    """The primitives the sparse codecs take (``prims``), in tensor operations: the reference a
    fused implementation (torch_cgx/device/triton/sparse.py) must match byte for byte."""

    @staticmethod
    def top_k(x: torch.Tensor, k: int, index=None) -> torch.Tensor:
        return top_k(x, k, index)

    @staticmethod
    def row_top_k(rows: torch.Tensor, k: int) -> torch.Tensor:
        """``prim::top_k`` of each row of ``rows`` (``(r, L)``): int64 ``(r, k)``, ascending."""
        r, length = rows.shape
        index = torch.arange(length, dtype=torch.int64, device=rows.device)
        if k >= length:
            return index.expand(r, length).contiguous()
        keys = order_keys(rows, index)  # unique per row: the low word is 2^32 - 1 - index
        top = torch.topk(keys, k, dim=1, sorted=False).values
        return torch.sort(_M32 - (top & _M32), dim=1).values

    @staticmethod
    def random_k(n: int, k: int, key, device=None) -> torch.Tensor:
        """``key``: host words ``(k0, k1)`` or a payload's 8 key bytes (uint8 tensor)."""
        if isinstance(key, torch.Tensor):
            key = key.clone() if key.storage_offset() % 4 else key
            words = key.view(torch.int32).to(torch.int64) & _M32
            key = words[0], words[1]
        return random_k(n, k, key[0], key[1], device=device)

    @staticmethod
    def sampled_mask(x: torch.Tensor, k: int, sample: int, k0: int, k1: int):
        """(``magnitude_bits(x) >= thr`` bool, ``thr``) for the :func:`sampled_threshold`."""
        mag = magnitude_bits(x)
        thr = sampled_threshold(mag, k, sample, k0, k1)
        return mag >= thr, thr

    @staticmethod
    def at_least(x: torch.Tensor, thr) -> torch.Tensor:
        """``magnitude_bits(x) >= thr`` (bool); ``thr`` host bits or a 0-d int32 tensor."""
        return magnitude_bits(x) >= thr

    @staticmethod
    def pack(head: torch.Tensor, idx: torch.Tensor, x: torch.Tensor, index: bool):
        """The payload: ``head``, the u32 ``idx`` (``index``), the values ``x[idx]``."""
        m = idx.numel()
        # the low 4 bytes of each little-endian int64 index are its u32
        parts = [head, idx.view(torch.uint8).view(m, 8)[:, :4].reshape(-1)] if index else [head]
        return torch.cat(parts + [x[idx].contiguous().view(-1).view(torch.uint8)])

    @staticmethod
    def nan_if_flagged(out: torch.Tensor, payload: torch.Tensor) -> torch.Tensor:
        """``out + NaN`` everywhere where the payload's flags byte (7) has the non-finite bit
        (2), else ``out`` unchanged: no host read (three passes over ``out`` either way)."""
        flagged = (payload[7] & 2) != 0
        return out.copy_(torch.where(flagged, (out.float() + float("nan")).to(out.dtype), out))


REFERENCE = Reference()
