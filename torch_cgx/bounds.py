"""Error bounds of the compressed allreduce, derived in docs/algorithms.md.

Used by the tests and by the benchmark's verify mode: a lossy allreduce is checked against the
exact sum with a tolerance computed from the quantization step, not a fixed 1e-5. The formula
itself lives once, in the C++ core (csrc/algorithms/error_bound.h), shared with the C++ tests.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import torch

from torch_cgx import _C
from torch_cgx.config import ALGORITHMS


def chunk_ranges(count: int, world: int, bucket_size: int) -> List[Tuple[int, int]]:
    """[begin, end) of each rank's chunk of a piece: equal, rounded up to whole buckets."""
    per = -(-count // world)
    chunk = -(-per // bucket_size) * bucket_size
    return [(min(count, chunk * j), min(count, chunk * (j + 1))) for j in range(world)]


def _bucket_ranges(x: torch.Tensor, bucket_size: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-bucket (max - min) and max |x| of each row of x (ranks x elements)."""
    w, n = x.shape
    nb = -(-n // bucket_size)
    pad = nb * bucket_size - n
    if pad:
        x = torch.cat([x, x[:, -1:].expand(w, pad)], dim=1)
    b = x.reshape(w, nb, bucket_size)
    hi, lo = b.amax(dim=2), b.amin(dim=2)
    return hi - lo, torch.maximum(hi.abs(), lo.abs())


def bucket_bound(
    range_sum: torch.Tensor,
    magnitude_sum: torch.Tensor,
    bits: int,
    world: int,
    algorithm: str = "sra",
    average: bool = False,
    dtype: torch.dtype = torch.float32,
    stochastic: bool = False,
) -> torch.Tensor:
    """The bound for each bucket, from the sum over ranks of its range (max - min) and of its
    largest magnitude. These sums are all a rank needs to know, so a benchmark can allreduce
    them instead of gathering every rank's buffer."""
    return _C.bucket_error_bound(
        range_sum.double(),
        magnitude_sum.double(),
        bits,
        world,
        ALGORITHMS[algorithm],
        average,
        stochastic,
        dtype,
    )


def bucket_stats(x: torch.Tensor, bucket_size: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """This rank's per-bucket range and largest magnitude (fp64), for :func:`bucket_bound`."""
    ranges, mags = _bucket_ranges(x.reshape(1, -1).double(), bucket_size)
    return ranges[0], mags[0]


def _per_chunk_buckets(n: int, world: int, bucket_size: int, fusion_elements: int):
    """(begin, end, owner) of each chunk of each piece: stretches of whole codec buckets."""
    for p0 in range(0, n, fusion_elements):
        p1 = min(n, p0 + fusion_elements)
        for owner, (b, e) in enumerate(chunk_ranges(p1 - p0, world, bucket_size)):
            if e > b:
                yield p0 + b, p0 + e, owner


def allreduce_error_bound(
    inputs: Sequence[torch.Tensor],
    bits: int,
    bucket_size: int,
    algorithm: str = "sra",
    average: bool = False,
    fusion_elements: int = 1 << 24,
    dtype: torch.dtype = torch.float32,
    stochastic: bool = False,
) -> torch.Tensor:
    """Per-element bound on |cgx allreduce - exact sum| for the ranks' `inputs` (flat, as held).

    Per bucket, with R the sum over ranks of the bucket's range, each quantization adds at most
    (range of what is quantized) / (2L) (stochastic rounding: / L), that range being at most R
    plus twice the error so far; SRA quantizes each value twice, ring W times. fp32 roundings and
    the final rounding to `dtype` are added.
    """
    x = torch.stack([t.reshape(-1).double() for t in inputs])
    world, n = x.shape
    out = torch.empty(n, dtype=torch.float64)
    for b, e, _ in _per_chunk_buckets(n, world, bucket_size, fusion_elements):
        ranges, mags = _bucket_ranges(x[:, b:e], bucket_size)
        err = bucket_bound(
            ranges.sum(0), mags.sum(0), bits, world, algorithm, average, dtype, stochastic
        )
        out[b:e] = err.repeat_interleave(bucket_size)[: e - b]
    return out


def sra_rms_error_estimate(
    inputs: Sequence[torch.Tensor],
    bits: int,
    bucket_size: int,
    average: bool = False,
    fusion_elements: int = 1 << 24,
    stochastic: bool = False,
) -> float:
    """Expected root-mean-square error of SRA (fp32), a statistical companion of the bound.

    A value rounded to a grid of step u with nearest rounding is off by a uniform error of
    variance u^2 / 12 (stochastic rounding: u^2 / 6 on average over the fractional position).
    SRA quantizes each value once on each of the W - 1 ranks that do not own its chunk (step:
    that rank's bucket range / L) and once more as a sum (step: the range of the sum / L, taken
    here from the exact sum). Unlike the worst-case bound, a result far from the sum, an
    all-zero one for instance, fails a check against this at any bit width.
    """
    x = torch.stack([t.reshape(-1).double() for t in inputs])
    world, n = x.shape
    levels = 2**bits - 1
    per_var = 1 / 6 if stochastic else 1 / 12
    if world == 1:
        return 0.0  # nothing is quantized
    total = 0.0
    for b, e, owner in _per_chunk_buckets(n, world, bucket_size, fusion_elements):
        ranges, _ = _bucket_ranges(x[:, b:e], bucket_size)
        sum_range, _ = _bucket_ranges(x[:, b:e].sum(0, keepdim=True), bucket_size)
        first = (ranges / levels) ** 2
        first[owner] = 0  # the owner's own values are added unquantized
        var = (first.sum(0) + (sum_range[0] / levels) ** 2) * per_var
        sizes = torch.full_like(var, bucket_size)
        sizes[-1] = (e - b) - bucket_size * (len(var) - 1)
        total += float((var * sizes).sum())
    rms = (total / max(n, 1)) ** 0.5
    return rms / world if average else rms
