"""Predicted time of one allreduce of ``n`` values over ``W`` ranks, per algorithm, from the link's
latency and bandwidth, the compressor's exact payload size and the measured codec costs.
Formulas and their derivation: docs/algorithms.md, "Cost model".

Notation: a message of B bytes costs ``latency + B / bandwidth``; ``P(m)`` is the payload of m
values; ``enc``/``dec`` are the codec's encode / decode-add times (fixed + per value); ``call``
the backend's fixed cost per allreduce.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, Optional

from torch_cgx.plan.costs import CodecCosts, Linear, LinkCosts, codec_key

ALGORITHMS = ("sra", "ring", "tree", "allgather")
SEGMENT_BYTES = 4 << 20  # the backend's CGX_PIPELINE_SEGMENT_MB default


def segments_of(option: Option, n: int) -> int:
    """How many pipeline segments SRA runs for n fp32 values with ``option``."""
    if option.segments:
        return option.segments
    return max(1, math.ceil(4 * n / SEGMENT_BYTES))


@dataclass(frozen=True)
class Option:
    """One way to reduce a tensor: exact (``compressor`` None) or a compressor with its
    parameters, an algorithm, and SRA's pipeline segments (0: the backend's own pipeline, one
    segment per ``SEGMENT_BYTES`` of fp32 values; 1: none; k: k segments)."""

    compressor: Optional[str] = None
    params: tuple = ()  # sorted (name, value) pairs
    algorithm: str = "sra"
    segments: int = 0

    @property
    def exact(self) -> bool:
        return self.compressor is None

    @property
    def key(self) -> str:
        return codec_key(self.compressor or "exact", dict(self.params))

    def describe(self) -> str:
        if self.exact:
            return "exact"
        extra = f", {self.segments} segments" if self.segments > 1 else ""
        if self.algorithm == "sra" and self.segments == 0:
            extra = ", pipelined"
        return f"{self.key} {self.algorithm}{extra}"


def traits_and_size(option: Option) -> tuple:
    """(traits dict, payload size function m -> bytes of fp32 values) of a compressed option."""
    from torch_cgx import compressors

    codec = compressors.get(option.compressor, **dict(option.params))
    return codec.traits, lambda m: codec.encoded_size(max(int(m), 0))


def path_of(option: Option, traits: Dict[str, bool]) -> str:
    """The algorithm the backend runs for this option (csrc/algorithms/allreduce.cc's choice)."""
    if option.algorithm == "allgather":
        return "allgather"
    if traits.get("summable"):
        return "sum_reduce"
    if traits.get("sparse") or not traits.get("fixed_size"):
        return "allgather"
    return option.algorithm


def exact_time(n: int, world: int, link: LinkCosts, host: CodecCosts, elem: int = 4) -> float:
    """Gloo's ring allreduce: 2 (W - 1) messages of S / W bytes and (W - 1) / W of the values
    summed."""
    if world <= 1 or n == 0:
        return 0.0
    share = n * elem / world
    t = host.call + 2 * (world - 1) * link.message(share) + host.add((world - 1) * n / world)
    return _corrected(t, host.paths.get("exact"), n)


def _corrected(t: float, excess: Optional[Linear], n: int) -> float:
    """The formula's time plus the probe's excess for its path, never below a tenth of it (an
    excess fitted at two sizes may go negative far from them)."""
    return t if excess is None else max(t + excess(n), 0.1 * t)


def _sra(n, w, link, enc: Linear, dec: Linear, size: Callable, segments: int) -> float:
    k = max(1, min(segments, math.ceil(n / 4096)))
    m = n / k / w  # values per chunk of one segment
    codec = enc(w * m, calls=w) + dec((2 * w - 1) * m, calls=2 * w - 1)
    wire = 2 * (w - 1) * link.message(size(m))
    if k == 1:
        return codec + wire
    # A two-stage pipeline (codec on this thread, transfers on the comm thread): the slower stage
    # sets the pace, the other adds one segment's worth at the start.
    return k * max(codec, wire) + min(codec, wire)


def _ring(n, w, link, enc: Linear, dec: Linear, size: Callable) -> float:
    m = n / w
    hops = (w - 1) * (link.message(size(m)) + enc(m) + dec(m))
    return hops + enc(m) + (w - 1) * link.message(size(m)) + dec(w * m, calls=w)


def _tree(n, w, link, enc: Linear, dec: Linear, size: Callable) -> float:
    levels = math.ceil(math.log2(w))
    up = levels * (link.message(size(n)) + dec(n))
    return up + 2 * enc(n) + levels * link.message(size(n)) + dec(n)


def _allgather(n, w, link, enc: Linear, dec: Linear, size: Callable) -> float:
    return (w - 1) * (link.message(8) + link.message(size(n))) + enc(n) + dec(w * n, calls=w)


def _sum_reduce(n, w, link, enc: Linear, dec: Linear, size: Callable, host: CodecCosts) -> float:
    """Summable payloads: an allgather of the headers, then the values reduced like an exact
    allreduce of (payload - header) bytes."""
    body = max(size(n) - 32, 0)
    reduce = 2 * (w - 1) * link.message(body / w) + host.add((w - 1) * body / 4 / w)
    return enc(n) + (w - 1) * link.message(32) + reduce + dec(n)


def predict(
    option: Option,
    n: int,
    world: int,
    link: LinkCosts,
    host: CodecCosts,
    elem: int = 4,
    agree: bool = False,
) -> float:
    """Seconds one allreduce of ``n`` values takes with ``option`` (``elem`` bytes a value).
    ``agree``: the call first agrees on its settings (CGX_SETTINGS_PER_CALL without a plan):
    one small allgather, W - 1 messages; planned calls do not."""
    if option.exact or world <= 1 or n == 0:
        return exact_time(n, world, link, host, elem)
    traits, size = traits_and_size(option)
    key = option.key
    if key not in host.encode or key not in host.decode:
        raise KeyError(f"no codec costs for {key}: calibrate it first")
    enc, dec = host.encode[key], host.decode[key]
    path = path_of(option, traits)
    if path == "sra":
        t = _sra(n, world, link, enc, dec, size, segments_of(option, n))
    elif path == "ring":
        t = _ring(n, world, link, enc, dec, size)
    elif path == "tree":
        t = _tree(n, world, link, enc, dec, size)
    elif path == "sum_reduce":
        t = _sum_reduce(n, world, link, enc, dec, size, host)
    else:
        t = _allgather(n, world, link, enc, dec, size)
    t = _corrected(t, host.paths.get(path), n)  # what the group's probe found beyond it
    return host.call + t + (world - 1) * link.message(64) * agree
