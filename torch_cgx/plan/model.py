"""Predicted time of one allreduce of ``n`` values over ``W`` ranks, per algorithm, from the link's
latency and bandwidth, the compressor's exact payload size and the measured compute costs.
Formulas and their derivation: docs/algorithms.md, "Cost model".

Notation: a message of B bytes costs ``latency + B / bandwidth``; ``P(m)`` is the payload of m
values; ``enc``/``dec`` are the compute's encode / decode-add times (fixed + per value); ``call``
the backend's fixed cost per allreduce.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

from torch_cgx.plan.costs import CompressorCosts, Correction, Linear, LinkCosts, compressor_key

ALGORITHMS = ("sra", "ring", "tree", "allgather")
SEGMENT_BYTES = 4 << 20  # the backend's CGX_PIPELINE_SEGMENT_MB default


@dataclass(frozen=True)
class Option:
    """One way to reduce a tensor: exact (``compressor`` None) or a compressor with its
    parameters, an algorithm, and its pipeline segments (0: the backend's own pipeline, one
    segment per ``SEGMENT_BYTES`` of fp32 values, none on the sparse paths; 1: none; k: k
    segments, on every path)."""

    compressor: Optional[str] = None
    params: tuple = ()  # sorted (name, value) pairs
    algorithm: str = "sra"
    segments: int = 0

    @property
    def exact(self) -> bool:
        return self.compressor is None

    @property
    def key(self) -> str:
        return compressor_key(self.compressor or "exact", dict(self.params))

    def describe(self) -> str:
        if self.exact:
            return "exact"
        # 0, the backend's own pipeline, says nothing: it only applies above one segment.
        extra = {0: "", 1: ", no pipeline"}.get(self.segments, f", {self.segments} segments")
        return f"{self.key} {self.algorithm}{extra}"


def traits_and_size(option: Option) -> tuple:
    """(traits dict, payload size function m -> bytes of fp32 values) of a compressed option."""
    from torch_cgx import compressors

    comp = compressors.get(option.compressor, **dict(option.params))
    return comp.traits, lambda m: comp.encoded_size(max(int(m), 0))


def path_of(option: Option, traits: Dict[str, bool]) -> str:
    """The algorithm the backend runs for this option (csrc/algorithms/allreduce.cc's choice)."""
    sparse, fixed = traits.get("sparse"), traits.get("fixed_size")
    if traits.get("summable") and sparse and fixed and option.algorithm != "allgather":
        return "sum_reduce"  # payload.h's sum_in_transit
    if sparse or not fixed:
        return "sparse"  # allgather-reduce (gather_only), pipelined only when asked
    return option.algorithm


def exact_time(n: int, world: int, link: LinkCosts, host: CompressorCosts, elem: int = 4) -> float:
    """Gloo's ring allreduce: 2 (W - 1) messages of S / W bytes and (W - 1) / W of the values
    summed."""
    if world <= 1 or n == 0:
        return 0.0
    share = n * elem / world
    t = host.call + 2 * (world - 1) * link.message(share) + host.add((world - 1) * n / world)
    return _corrected(t, host.paths.get("exact"), n)


def _corrected(t: float, ratio: Optional[Correction], n: int) -> float:
    """The formula's time times what the group's probe measured against it at this size."""
    return t if ratio is None else t * ratio(n)


def segments_of(option: Option, n: int) -> int:
    """How many pipeline segments the backend runs for n fp32 values with ``option``."""
    if option.segments:
        return option.segments
    return max(1, math.ceil(4 * n / SEGMENT_BYTES))


def pipelined(parts: Tuple[float, float], k: int) -> float:
    """k segments of (compute, wire) seconds each through a two-stage pipeline (compute on the
    calling threads, transfers on the communication thread): the slower stage sets the pace,
    the other adds one segment's worth at the start. k = 1: no overlap."""
    compute, wire = parts
    if k <= 1:
        return compute + wire
    return k * max(compute, wire) + min(compute, wire)


# Each returns (compute, wire) seconds of one allreduce of n values.
def _sra(n, w, link, enc: Linear, dec: Linear, size: Callable):
    m = n / w  # values per chunk
    compute = enc(w * m, calls=w) + dec((2 * w - 1) * m, calls=2 * w - 1)
    return compute, 2 * (w - 1) * link.message(size(m))


def _ring(n, w, link, enc: Linear, dec: Linear, size: Callable):
    m = n / w
    compute = (w - 1) * (enc(m) + dec(m)) + enc(m) + dec(w * m, calls=w)
    return compute, 2 * (w - 1) * link.message(size(m))


def _tree(n, w, link, enc: Linear, dec: Linear, size: Callable):
    levels = math.ceil(math.log2(w))
    return levels * dec(n) + 2 * enc(n) + dec(n), 2 * levels * link.message(size(n))


def _allgather(n, w, link, enc: Linear, dec: Linear, size: Callable):
    return enc(n) + dec(w * n, calls=w), (w - 1) * (link.message(8) + link.message(size(n)))


def _sum_reduce(n, w, link, enc: Linear, dec: Linear, size: Callable, host: CompressorCosts):
    """Summable payloads: an allgather of the headers, then the values reduced like an exact
    allreduce of (payload - header) bytes."""
    body = max(size(n) - 32, 0)
    compute = enc(n) + dec(n) + host.add((w - 1) * body / 4 / w)
    return compute, (w - 1) * link.message(32) + 2 * (w - 1) * link.message(body / w)


def pipeline_applies(option: Option, path: str, n: int) -> bool:
    """Whether the backend pipelines this call: every dense path when the call spans more
    than one segment; the sparse ones (allgather of a sparse compressor, sum-reduce) only when
    the option names its segments (csrc/algorithms/lanes.cc)."""
    if segments_of(option, n) <= 1:
        return False
    return path not in ("sum_reduce", "sparse") or option.segments > 1


def predict(
    option: Option,
    n: int,
    world: int,
    link: LinkCosts,
    host: CompressorCosts,
    elem: int = 4,
    agree: bool = False,
) -> float:
    """Seconds one allreduce of ``n`` values takes with ``option`` (``elem`` bytes a value).
    ``agree``: the call first agrees on its settings (CGX_SETTINGS_PER_CALL without a plan):
    one small allgather, W - 1 messages; planned calls do not."""
    if option.exact or world <= 1 or n == 0:
        return exact_time(n, world, link, host, elem)
    path, parts, k = formula_parts(option, n, world, link, host)
    a, b = host.paths[path].factors(n) if path in host.paths else (1.0, 1.0)
    t = pipelined((a * parts[0], b * parts[1]), k)  # scaled by what the group's probe found
    return host.call + t + (world - 1) * link.message(64) * agree


def formula_parts(option: Option, n: int, world: int, link: LinkCosts, host: CompressorCosts):
    """(path, (compute, wire) seconds of one segment, segments) of a compressed option."""
    traits, size = traits_and_size(option)
    key = option.key
    if key not in host.encode or key not in host.decode:
        raise KeyError(f"no compute costs for {key}: calibrate it first")
    enc, dec = host.encode[key], host.decode[key]
    path = path_of(option, traits)
    k = segments_of(option, n) if pipeline_applies(option, path, n) else 1
    m = n / k  # values per segment
    if path == "sra":
        parts = _sra(m, world, link, enc, dec, size)
    elif path == "ring":
        parts = _ring(m, world, link, enc, dec, size)
    elif path == "tree":
        parts = _tree(m, world, link, enc, dec, size)
    elif path == "sum_reduce":
        parts = _sum_reduce(m, world, link, enc, dec, size, host)
    else:
        parts = _allgather(m, world, link, enc, dec, size)
    return path, parts, k
