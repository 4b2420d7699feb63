"""The accuracy levers of :func:`torch_cgx.cgx_hook` (docs/accuracy.md), as pure helpers.

- **Layer-aligned staging**: each compressed layer starts a new max-min bucket, its last bucket
  padded with copies of its last value (which changes neither that bucket's min nor its max),
  so no bucket mixes two layers of different scales. Costs at most ``bucket_size - 1`` padding
  values per layer on the wire.
- **Rotation**: a seeded sign flip + Walsh-Hadamard transform per bucket before quantizing
  (``torch_cgx._C.rotate_``, csrc/core/rotation.h), inverted after the allreduce. Every rank
  rotates with the same seed, and the rotation is linear, so the ranks reduce in the rotated
  domain. It spreads a bucket's outliers over the whole bucket and so shrinks its range.
- **Adaptive bits** (L-GreCo's idea): a layer whose buckets have ranges ``r_k`` loses
  ``E(b) = B * sum_k r_k^2 / (12 (2^b - 1)^2)`` (squared error of round-to-nearest with step
  ``r / (2^b - 1)``) at ``b`` bits; :func:`choose_bits` spends a budget of code bits on the
  layers where a bit buys the largest drop of the summed error. With the clipped range the
  codec is Max's optimal uniform quantizer of each (near-Gaussian) bucket instead, whose error is
  ``GAUSSIAN_MSE[b] * sum_k n_k sd_k^2``.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import List, Sequence

import torch

from torch_cgx import _C, settings

MIN_BITS, MAX_BITS = 1, 8
# Max (1960): squared error of the optimal uniform quantizer of a unit Gaussian at 1..8 bits
# (the clipped range of docs/FORMAT.md).
GAUSSIAN_MSE = (0.0, 0.3634, 0.1188, 0.03744, 0.01154, 0.003495, 0.001040, 0.0003043, 0.00008769)


def padded(numel: int, bucket_size: int, split: bool) -> int:
    """Values a layer of ``numel`` takes in the staged buffer."""
    return -(-numel // bucket_size) * bucket_size if split else numel


def valid_rotation_block(bucket_size: int) -> bool:
    """The settings table's rule (settings.rotation_block)."""
    return settings.rotation_block(bucket_size)


def rotation_seed(stream: int, layer: int) -> int:
    """The seed of one layer's rotation in one call: the same on every rank (``stream`` is the
    call's agreed random stream), distinct per layer and step."""
    return (stream * 1000003 + layer * 7919 + 1) % (1 << 64)


@dataclass
class Staged:
    """One compressed call: the staged fp32/buffer-dtype tensor and where each layer sits."""

    tensor: torch.Tensor
    spans: List[tuple]  # (offset in the bucket buffer, numel, param) per layer
    starts: List[int]  # position of each layer in ``tensor``
    sizes: List[int]  # padded size of each layer in ``tensor``
    rotations: List[tuple]  # (start, size, seed) of each rotated span (empty: no rotation)
    residual: torch.Tensor = None  # error-feedback output of the call (fp32, like tensor)


def stage(
    buf: torch.Tensor,
    spans: List[tuple],
    bucket_size: int,
    split: bool,
    dtype: torch.dtype,
    residuals: Sequence,
    seeds: Sequence[int],
) -> Staged:
    """Copies the layers of ``spans`` out of ``buf`` (each plus its residual, when one is given),
    pads each to whole buckets when ``split``, and rotates each layer's span with its seed when
    ``seeds`` are given (without ``split``: the concatenation, padded at its end, with the
    first seed)."""
    sizes = [padded(n, bucket_size, split) for _, n, _ in spans]
    starts, pos = [], 0
    for s in sizes:
        starts.append(pos)
        pos += s
    rotations = [(st, sz, seed) for st, sz, seed in zip(starts, sizes, seeds)]
    if seeds and not split:
        rotations = [(0, padded(pos, bucket_size, True), seeds[0])]
    end = max([pos] + [st + sz for st, sz, _ in rotations])
    out = torch.empty(end, dtype=dtype, device=buf.device)
    # One split and one foreach call per step instead of a slice and a copy per layer:
    # per-op dispatch, not bytes, is most of a hook's own time on small layers.
    lengths = [n for _, n, _ in spans]
    parts = views(out, starts, lengths)
    torch._foreach_copy_(parts, views(buf, [o for o, _, _ in spans], lengths))
    fed = [(part, res.to(dtype)) for part, res in zip(parts, residuals) if res is not None]
    if fed:
        torch._foreach_add_([part for part, _ in fed], [res for _, res in fed])
    for (_, n, _), start, size, part in zip(spans, starts, sizes, parts):
        if size > n:  # copies of the last value: the last bucket's min and max stay the same
            out[start + n : start + size].copy_(part[n - 1 : n].expand(size - n))
    if end > pos:  # the last value sent (with its residual)
        out[pos:end].copy_(out[pos - 1 : pos].expand(end - pos))
    for start, size, seed in rotations:
        rotate_(out[start : start + size], bucket_size, seed, True)
    return Staged(out, spans, starts, sizes, rotations)


def unstage(staged: Staged, buf: torch.Tensor, bucket_size: int) -> List[torch.Tensor]:
    """Writes the reduced layers back into ``buf`` (rotated back first) and returns each layer's
    residual in the gradient's own domain (rotated back too), or an empty list."""
    out, res = staged.tensor, staged.residual
    for start, size, seed in staged.rotations:
        rotate_(out[start : start + size], bucket_size, seed, False)
        if res is not None:  # R^T (R x - Q(R x)) = x - R^T Q(R x): the error where x lives
            rotate_(res[start : start + size], bucket_size, seed, False)
    lengths = [n for _, n, _ in staged.spans]
    if out is not buf:
        offsets = [o for o, _, _ in staged.spans]
        torch._foreach_copy_(views(buf, offsets, lengths), views(out, staged.starts, lengths))
    if res is None:
        return []
    return views(res, staged.starts, lengths)


def rotate_(x: torch.Tensor, bucket_size: int, seed: int, forward: bool) -> None:
    """The rotation in place: the native one on CPU tensors, the device one (the same values,
    torch_cgx/device/rotation.py) on tensors elsewhere."""
    if x.device.type == "cpu":
        _C.rotate_(x, bucket_size, seed, forward)
    else:
        from torch_cgx.device import rotation

        rotation.rotate_(x, bucket_size, seed, forward)


def views(tensor: torch.Tensor, starts: Sequence[int], lengths: Sequence[int]) -> List:
    """``tensor[start : start + length]`` for each (start, length), in one ``split`` call
    (``starts`` increasing, the spans not overlapping)."""
    sizes, pos = [], 0
    for start, length in zip(starts, lengths):
        sizes += (start - pos, length)
        pos = start + length
    sizes.append(tensor.numel() - pos)
    return list(tensor.split(sizes)[1::2])


def range_energy(tensor: torch.Tensor, start: int, size: int, bucket_size: int) -> float:
    """``sum_k n_k r_k^2`` over the buckets of a staged layer (n_k values of range r_k; a short
    last bucket counts its own length), in fp64: the numerator of the layer's error at any bit
    width."""
    span = tensor[start : start + size]
    full = size - size % bucket_size
    lo, hi = torch.aminmax(span[:full].view(-1, bucket_size), dim=1)
    r = hi.double() - lo.double()
    energy = bucket_size * float(torch.dot(r, r))
    if full < size:
        t_lo, t_hi = torch.aminmax(span[full:])
        energy += (size - full) * (float(t_hi) - float(t_lo)) ** 2
    return energy


def spread_energy(tensor: torch.Tensor, start: int, size: int, bucket_size: int) -> float:
    """``sum_k n_k sd_k^2`` over the buckets of a staged layer, in fp64: with the clipped range,
    the numerator of the layer's error at any bit width."""
    span = tensor[start : start + size].double()
    full = size - size % bucket_size
    energy = bucket_size * float(span[:full].view(-1, bucket_size).var(dim=1, correction=0).sum())
    if full < size:
        energy += (size - full) * float(span[full:].var(correction=0))
    return energy


def error_at(energy: float, bits: int, clipped: bool = False) -> float:
    """Squared error at ``bits`` of a layer: round-to-nearest max-min for a range energy
    (uniform error over a step of r / (2^b - 1): variance step^2 / 12), or, ``clipped``, Max's
    optimum for a spread energy (``spread_energy``)."""
    if clipped:
        return energy * GAUSSIAN_MSE[bits]
    return energy / (12.0 * float((1 << bits) - 1) ** 2)


def choose_bits(
    energies: Sequence[float], sizes: Sequence[int], budget: float, clipped: bool = False
) -> List[int]:
    """Bits per layer (1..8) minimising ``sum error_at(energy_l, b_l, clipped)`` under
    ``sum size_l * b_l <= budget * sum size_l``: every layer starts at 1 bit, then the bit that
    removes the most error per value it costs goes next, while it fits (greedy on convex
    per-layer curves; ties go to the earlier layer). Deterministic: the same inputs give the same
    bits on every rank."""
    if not MIN_BITS <= budget <= MAX_BITS:
        raise ValueError(f"bit budget must be in [{MIN_BITS}, {MAX_BITS}], got {budget!r}")
    bits = [MIN_BITS] * len(sizes)
    total = sum(sizes)
    spare = budget * total - MIN_BITS * total

    def gain(i: int) -> float:
        b = bits[i]
        gain = error_at(energies[i], b, clipped) - error_at(energies[i], b + 1, clipped)
        return gain / max(1, sizes[i])

    # A bit that removes no error (a constant layer) is not worth its bytes.
    heap = [(-gain(i), i) for i in range(len(sizes)) if sizes[i] > 0 and gain(i) > 0]
    heapq.heapify(heap)
    while heap:
        _, i = heapq.heappop(heap)
        if sizes[i] > spare + 1e-9:
            continue  # does not fit: smaller layers may still
        bits[i] += 1
        spare -= sizes[i]
        if bits[i] < MAX_BITS and gain(i) > 0:
            heapq.heappush(heap, (-gain(i), i))
    return bits
