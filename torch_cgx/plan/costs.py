"""The planner's measured inputs: the link (per-message latency, bandwidth) and the compute (encode
and decode time of each compressor on this host), with a per-host cache of the compute figures.

Each compute operation is modelled as ``t(n) = fixed + per_value * n`` (n values), fitted from two
sizes; docs/algorithms.md ("Cost model") has the formulas that use them.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, Iterable, Optional, Tuple

from torch_cgx.plan.rates import parse_rate_bits, parse_time


def parse_rate(text: str) -> float:
    """'1gbit', '100mbit' -> bytes per second (tc's syntax, torch_cgx/plan/rates.py)."""
    return parse_rate_bits(text) / 8


@dataclass(frozen=True)
class LinkCosts:
    """What one message costs between two ranks: ``latency`` seconds plus its bytes over
    ``bandwidth`` bytes per second (each rank's own link, full duplex)."""

    bandwidth: float
    latency: float

    def __post_init__(self) -> None:
        if not self.bandwidth > 0 or not self.latency >= 0:
            raise ValueError(f"link needs bandwidth > 0 and latency >= 0, got {self}")

    @classmethod
    def parse(cls, rate: str, latency: str = "50us") -> LinkCosts:
        return cls(parse_rate(rate), parse_time(latency))

    def message(self, nbytes: float) -> float:
        return self.latency + nbytes / self.bandwidth


@dataclass(frozen=True)
class Linear:
    """t(n) = fixed + per_value * n seconds."""

    fixed: float
    per_value: float

    def __call__(self, n: float, calls: int = 1) -> float:
        return calls * self.fixed + self.per_value * n

    @classmethod
    def fit(cls, small: Tuple[int, float], large: Tuple[int, float], clamp: bool = True) -> Linear:
        """Through two points; ``clamp``: no negative part (a cost; a correction may be)."""
        (n0, t0), (n1, t1) = small, large
        per = (t1 - t0) / (n1 - n0)
        if clamp:
            per = max(per, 0.0)
            return cls(max(t0 - per * n0, 0.0), per)
        return cls(t0 - per * n0, per)


def _interpolate(points, n: float) -> tuple:
    """The values of ``points`` ((n, v...), n increasing) at n: linear in log2(n) between two
    points, held beyond the first and the last."""
    if n <= points[0][0]:
        return tuple(points[0][1:])
    for p0, p1 in zip(points, points[1:]):
        if n <= p1[0]:
            f = (math.log2(n) - math.log2(p0[0])) / (math.log2(p1[0]) - math.log2(p0[0]))
            return tuple(v0 + f * (v1 - v0) for v0, v1 in zip(p0[1:], p1[1:]))
    return tuple(points[-1][1:])


def _check_points(points, what: str) -> None:
    ns = [p[0] for p in points]
    if ns != sorted(set(ns)) or (ns and min(ns) < 1):
        raise ValueError(f"correction {what} need distinct increasing sizes >= 1: {points}")
    if not all(v > 0 and math.isfinite(v) for p in points for v in p[1:]):
        raise ValueError(f"correction {what} must be finite and > 0: {points}")


@dataclass(frozen=True)
class Correction:
    """What a path's calls took against what its formula predicts, at the probe's sizes: the
    ratio measured / predicted (``points``: (n, ratio)), and, where two settings of different
    compute / wire mix were probed, separate factors for the compute and the wire terms (``split``:
    (n, compute factor, wire factor)). Both interpolated linearly in log2(n) between the sizes and
    held beyond the first and the last."""

    points: Tuple[Tuple[int, float], ...]
    split: Tuple[Tuple[int, float, float], ...] = ()

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError("correction points need at least one size")
        _check_points(self.points, "points")
        _check_points(self.split, "split")

    def __call__(self, n: float) -> float:
        return _interpolate(self.points, n)[0]

    def factors(self, n: float) -> Tuple[float, float]:
        """(compute factor, wire factor) at n; the plain ratio for both without a split."""
        if not self.split:
            r = self(n)
            return r, r
        a, b = _interpolate(self.split, n)
        return a, b

    def to_json(self) -> dict:
        return {"points": [list(p) for p in self.points], "split": [list(p) for p in self.split]}

    @classmethod
    def from_json(cls, d: dict) -> Correction:
        points = tuple((int(p[0]), float(p[1])) for p in d["points"])
        split = tuple((int(p[0]), float(p[1]), float(p[2])) for p in d.get("split", ()))
        return cls(points, split)


@dataclass
class CompressorCosts:
    """Encode and decode-add time per compressor key (``"maxmin:bits=4"``), fp32 summing (``add``),
    the fixed cost of one call of the backend (queue, worker), and per algorithm path what the
    group's own calls took against the formulas (``paths``: measured by torch_cgx.plan.auto's
    probe; empty when planning from a laptop)."""

    encode: Dict[str, Linear] = field(default_factory=dict)
    decode: Dict[str, Linear] = field(default_factory=dict)
    add: Linear = Linear(0.0, 0.25e-9)
    call: float = 60e-6
    paths: Dict[str, Correction] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"encode": {k: asdict(v) for k, v in self.encode.items()},
                "decode": {k: asdict(v) for k, v in self.decode.items()},
                "add": asdict(self.add), "call": self.call,
                "paths": {k: c.to_json() for k, c in self.paths.items()}}  # fmt: skip

    @classmethod
    def from_json(cls, d: dict) -> CompressorCosts:
        return cls({k: Linear(**v) for k, v in d["encode"].items()},
                   {k: Linear(**v) for k, v in d["decode"].items()},
                   Linear(**d["add"]), float(d["call"]),
                   {k: Correction.from_json(v) for k, v in d.get("paths", {}).items()})  # fmt: skip


def compressor_key(name: str, params: Optional[Dict] = None) -> str:
    """'maxmin:bits=4,bucket_size=512'; the cache's and the plan's name of a compressor setting."""
    items = ",".join(f"{k}={v}" for k, v in sorted((params or {}).items()))
    return f"{name}:{items}"


def _time(fn, reps: int) -> float:
    fn()  # warm: allocations, page faults
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_compressors(keys: Iterable[Tuple[str, Dict]], sizes=(1 << 12, 1 << 20), reps=3):
    """Times encode and decode-add of each (name, params) at two sizes on this host."""
    import torch

    from torch_cgx import compressors

    costs = CompressorCosts()
    g = torch.Generator().manual_seed(0)
    data = {n: torch.randn(n, generator=g) for n in sizes}
    for name, params in keys:
        comp = compressors.get(name, **params)
        enc, dec = [], []
        for n in sizes:
            x, out = data[n], torch.zeros(n)
            payload = comp.encode(x)
            enc.append((n, _time(lambda c=comp, x=x: c.encode(x), reps)))
            dec.append((n, _time(lambda c=comp, o=out, p=payload: c.decode_add_(o, p), reps)))
        key = compressor_key(name, params)
        costs.encode[key], costs.decode[key] = Linear.fit(*enc), Linear.fit(*dec)
    a, b = (data[n] for n in sizes)
    ta = _time(lambda: a.add_(a), reps)
    tb = _time(lambda: b.add_(b), reps)
    costs.add = Linear.fit((sizes[0], ta), (sizes[1], tb))
    return costs


def cache_path() -> str:
    from torch_cgx.version import __version__

    root = os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache"))
    from torch_cgx import codec as maxmin_codec

    threads = (
        maxmin_codec.num_threads()
    )  # the process setting as applied (settings.process_settings)
    name = f"compressors-{socket.gethostname()}-{__version__}-threads{threads}.json"
    return os.path.join(root, "torch_cgx", name)


def calibrate(keys, refresh: bool = False, path: Optional[str] = None) -> CompressorCosts:
    """The compute costs of ``keys`` on this host: from the cache when it has them all (and
    ``refresh`` is false), measured otherwise (about 0.1 s per key) and written back. A cache
    that cannot be read or written is ignored."""
    keys = [(n, dict(p)) for n, p in keys]
    path = path or cache_path()
    cached = None
    if not refresh:
        try:
            with open(path) as f:
                cached = CompressorCosts.from_json(json.load(f))
        except (OSError, ValueError, KeyError, TypeError):
            cached = None
    wanted = {compressor_key(n, p) for n, p in keys}
    if cached and wanted <= set(cached.encode) & set(cached.decode):
        return cached
    costs = measure_compressors(keys)
    if cached:  # keep what was measured before for other keys
        cached.encode.update(costs.encode)
        cached.decode.update(costs.decode)
        cached.add = costs.add
        costs = cached
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(costs.to_json(), f, indent=1)
        os.replace(tmp, path)
    except OSError:
        pass
    return costs
