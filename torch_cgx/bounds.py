"""Error bounds of the compressed allreduce, derived in docs/algorithms.md.

Used by the tests and by the benchmark's verify mode: a lossy allreduce is checked against the
exact sum with a tolerance computed from the quantization step, not a fixed 1e-5.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import torch


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
) -> torch.Tensor:
    """The bound for one bucket, from the sum over ranks of its range (max - min) and of its
    largest magnitude. These sums are all a rank needs to know, so a benchmark can allreduce
    them instead of gathering every rank's buffer."""
    levels = 2**bits - 1
    rounds = world if algorithm == "ring" else 2
    final_rounding = {torch.float32: 2**-23, torch.float16: 2**-10, torch.bfloat16: 2**-7}[dtype]
    err = torch.zeros_like(range_sum, dtype=torch.float64)
    for _ in range(rounds):
        err = err + (range_sum + 2 * err) / (2 * levels)
    err = err * (1 + 1e-3) + (1e-6 + final_rounding) * magnitude_sum
    return err / world if average else err


def bucket_stats(x: torch.Tensor, bucket_size: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """This rank's per-bucket range and largest magnitude (fp64), for :func:`bucket_bound`."""
    ranges, mags = _bucket_ranges(x.reshape(1, -1).double(), bucket_size)
    return ranges[0], mags[0]


def allreduce_error_bound(
    inputs: Sequence[torch.Tensor],
    bits: int,
    bucket_size: int,
    algorithm: str = "sra",
    average: bool = False,
    fusion_elements: int = 1 << 24,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Per-element bound on |cgx allreduce - exact sum| for the ranks' `inputs` (flat, as held).

    Per bucket, with R the sum over ranks of the bucket's range, each quantization adds at most
    (range of what is quantized) / (2L), that range being at most R plus twice the error so far;
    SRA quantizes each value twice (the W - 1 first-stage errors are bounded by R / (2L)
    together), ring W times. fp32 roundings and the final rounding to `dtype` are added.
    """
    x = torch.stack([t.reshape(-1).double() for t in inputs])
    world, n = x.shape
    out = torch.empty(n, dtype=torch.float64)
    for p0 in range(0, n, fusion_elements):
        p1 = min(n, p0 + fusion_elements)
        for b, e in chunk_ranges(p1 - p0, world, bucket_size):
            if e <= b:
                continue
            ranges, mags = _bucket_ranges(x[:, p0 + b : p0 + e], bucket_size)
            err = bucket_bound(ranges.sum(0), mags.sum(0), bits, world, algorithm, average, dtype)
            out[p0 + b : p0 + e] = err.repeat_interleave(bucket_size)[: e - b]
    return out
