"""Worst-case checks of a compressor's decode against its input (``benchmarks.codec`` with
``--compressors``).

``check(name, x, decoded, params)`` compares the decoded values with the fp32 input ``x`` using
the definition of each compressor in docs/FORMAT.md ("Compressor payloads", "Sparse
compressors"), independently of the payload's bytes, so that it judges our codec and the torch-ops
peers alike:

- maxmin: per bucket ``|x' - x| <= unit / 2`` plus the fp32 roundings (the FORMAT.md bound with
  the torch-ops codec's wider rounding slack);
- fp16 / bf16: relative half a unit in the last place (2^-11 / 2^-8) plus half the smallest
  subnormal step;
- signsgd, signum, tbq, threshold: the exact expected values;
- onebit / efsignsgd: the bucket's mean of the value's sign group / mean ``|x|``, with the sign of
  ``x`` (relative 2^-12 of the bucket's scale for the summation order);
- terngrad: ``0`` or ``s * sign(x)`` with ``s`` the bucket's ``max |x|``, so ``|x' - x| <= s``;
- qsgd: same sign and ``|x' - x| <=`` one level, ``norm / (2^(bits-1) - 1)``;
- topk / dgc / graddrop: carried values bit for bit, the count (``k``; at most ``2k``) and the
  selection by magnitude (every carried ``|x|`` >= every dropped one); randomk: the count and the
  values (times ``n / k`` with ``scale``); sparseloco: per chunk the count and the selection,
  the sign, and half a step of its level.

Inputs must hold no exact zeros (a carried zero looks dropped): the benchmark uses ``randn``.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, NamedTuple, Tuple

import torch

from benchmarks import torch_ops_codec
from benchmarks.torch_ops_compressors import k_of, rows

__all__ = ["Check", "check"]


class Check(NamedTuple):
    max_err: float  # max |decoded - x|
    ok: bool
    detail: str  # why not, when not ok


Result = Tuple[bool, str]


def _valid(x: torch.Tensor, bucket: int) -> torch.Tensor:
    """Which entries of ``rows(x, bucket)`` are real values (not padding)."""
    return rows(torch.ones(x.numel(), dtype=torch.bool), bucket)


def _within(err: torch.Tensor, bound: torch.Tensor, what: str) -> Result:
    bad = ~(err <= bound)  # also catches NaN
    if bool(bad.any()):
        i = int(bad.view(-1).nonzero()[0])
        e, b = float(err.reshape(-1)[i]), float(bound.expand_as(err).reshape(-1)[i])
        return False, f"{what}: {int(bad.sum())} out of bound, first at {i}: {e:.3g} > {b:.3g}"
    return True, ""


def _exact(d: torch.Tensor, want: torch.Tensor, what: str) -> Result:
    if torch.equal(d, want):
        return True, ""
    i = int((d != want).nonzero()[0])
    return False, f"{what}: element {i} is {float(d[i])!r}, expected {float(want[i])!r}"


def _maxmin(x, d, p) -> Result:
    bits, bucket = int(p["bits"]), int(p["bucket_size"])
    levels = (1 << bits) - 1
    buckets = torch_ops_codec._bucketed(x, bucket)
    mn, mx = buckets.amin(dim=1).double(), buckets.amax(dim=1).double()
    unit = (mx - mn) / levels
    bound = (
        unit * (0.5 + 8 * levels * 2.0**-24)
        + 2.0**-21 * torch.maximum(mn.abs(), mx.abs())
        + 2.0**-149 * (levels + 1)
    ) * (1 + 2.0**-22)
    err = torch_ops_codec.bucket_max((d - x).abs_(), bucket).double()
    return _within(err, bound, "maxmin unit / 2")


def _cast(rel: float, tiny: float):
    def run(x, d, p) -> Result:
        xd = x.double()
        return _within((d.double() - xd).abs(), xd.abs() * rel + tiny, "half an ulp")

    return run


def _signsgd(x, d, p) -> Result:
    return _exact(d, torch.where(x < 0, -1.0, 1.0), "sign")


def _tbq(x, d, p) -> Result:
    tau = torch.tensor(p["tau"], dtype=torch.float32)
    want = torch.where(x >= tau, tau, torch.where(x <= -tau, -tau, torch.zeros(())))
    return _exact(d, want, "tbq")


def _threshold(x, d, p) -> Result:
    keep = x.abs() >= torch.tensor(p["tau"], dtype=torch.float32)
    return _exact(d, torch.where(keep, x, torch.zeros(())), "threshold")


def _group_means(x, p, signed: bool) -> Result:
    bucket = int(p["bucket_size"])
    xr, valid = rows(x.double(), bucket), _valid(x, bucket)
    neg = xr < 0
    scale = xr.abs().amax(1, keepdim=True)
    if signed:  # onebit: the mean of the value's sign group
        pos = valid & ~neg
        m_neg = xr.where(neg, 0).sum(1, True) / neg.sum(1, True).clamp(min=1)
        m_pos = xr.where(pos, 0).sum(1, True) / pos.sum(1, True).clamp(min=1)
        return torch.where(neg, m_neg, m_pos), scale, valid
    mean_abs = xr.abs().sum(1, True) / valid.sum(1, True)  # efsignsgd: +-mean |x|
    return torch.where(neg, -mean_abs, mean_abs), mean_abs, valid


def _means(signed: bool):
    def run(x, d, p) -> Result:
        want, scale, valid = _group_means(x, p, signed)
        err = (rows(d.double(), int(p["bucket_size"])) - want).abs().where(valid, 0)
        return _within(err, scale * 2.0**-12 + 1e-30, "bucket mean")

    return run


def _terngrad(x, d, p) -> Result:
    bucket = int(p["bucket_size"])
    xr, dr = rows(x.double(), bucket), rows(d.double(), bucket)
    s = xr.abs().amax(1, keepdim=True)
    if p["clip"] > 0:
        n = _valid(x, bucket).sum(1, keepdim=True)
        s = torch.minimum(s, p["clip"] * (xr.square().sum(1, True) / n).sqrt())
    tol = s * 2.0**-20
    level = (dr == 0) | ((dr.abs() - s).abs() <= tol)
    ok, why = _within((~level | (dr * xr < 0)).double(), torch.zeros(()), "0 or s * sign(x)")
    if not ok:
        return ok, why
    bound = s + tol if p["clip"] == 0 else s + xr.abs() + tol
    return _within((dr - xr).abs(), bound, "|x' - x| <= s")


def _qsgd(x, d, p) -> Result:
    bucket, levels = int(p["bucket_size"]), (1 << (int(p["bits"]) - 1)) - 1
    xr, dr = rows(x.double(), bucket), rows(d.double(), bucket)
    step = torch.linalg.vector_norm(xr, dim=1, keepdim=True) / levels
    ok, why = _within((dr * xr < 0).double(), torch.zeros(()), "sign")
    return _within((dr - xr).abs(), step * (1 + 2.0**-18) + 1e-30, "one level") if ok else (ok, why)


def _sparse(count: Callable[[int, dict], Tuple[int, int]], by_magnitude: bool, scaled=False):
    def run(x, d, p) -> Result:
        n = x.numel()
        sent = d != 0
        m = int(sent.sum())
        lo, hi = count(n, p)
        if not lo <= m <= hi:
            return False, f"{m} values carried, expected {lo}..{hi}"
        want = x[sent]
        if scaled and p.get("scale"):
            want = want * torch.tensor(n / m, dtype=torch.float32)
        ok, why = _exact(d[sent], want, "carried value")
        if ok and by_magnitude and 0 < m < n:
            kept, dropped = float(x[sent].abs().min()), float(x[~sent].abs().max())
            if not kept >= dropped:
                return False, f"kept |x| {kept:.4g} < dropped |x| {dropped:.4g}"
        return ok, why

    return run


def _k_exact(key: str, invert: bool = False):
    def count(n: int, p: dict) -> Tuple[int, int]:
        k = k_of(1 - p[key] if invert else p[key], n)
        return k, k

    return count


def _k_capped(key: str, invert: bool = False):
    def count(n: int, p: dict) -> Tuple[int, int]:
        return 0, min(n, 2 * k_of(1 - p[key] if invert else p[key], n))

    return count


def _sparseloco(x, d, p) -> Result:
    """Per chunk: k(ratio, L) values carried, the largest |x|, each within half a step of its
    level over [min, max] of the kept |x| (1 bit: within max - min) with the sign of x."""
    chunk, bits = int(p["chunk"]), int(p["bits"])
    xr, dr, valid = rows(x.double(), chunk), rows(d.double(), chunk), _valid(x, chunk)
    sent = dr != 0
    want = torch.tensor([k_of(p["ratio"], int(v)) for v in valid.sum(1)])
    if not torch.equal(sent.sum(1), want):
        return False, f"carried per chunk {sent.sum(1).tolist()[:4]}..., expected {want[0]}..."
    mag = xr.abs()
    lo = mag.where(sent, math.inf).amin(1, keepdim=True)
    hi = mag.where(sent, 0).amax(1, keepdim=True)
    dropped = mag.where(valid & ~sent, 0).amax(1, keepdim=True)
    if not bool((lo >= dropped).all()):
        return False, "a dropped |x| above a kept one"
    step = (hi - lo) if bits == 1 else (hi - lo) / ((1 << (bits - 1)) - 1) / 2
    ok, why = _within((dr * xr < 0).double(), torch.zeros(()), "sign")
    err = (dr - xr).abs().where(sent, 0)
    return _within(err, step * (1 + 2.0**-18) + hi * 2.0**-22, "half a step") if ok else (ok, why)


CHECKS: Dict[str, Callable[[torch.Tensor, torch.Tensor, dict], Result]] = {
    "maxmin": _maxmin,
    "fp16": _cast(2.0**-11, 2.0**-25),
    "bf16": _cast(2.0**-8, 2.0**-134),
    "signsgd": _signsgd,
    "signum": _signsgd,
    "onebit": _means(signed=True),
    "efsignsgd": _means(signed=False),
    "terngrad": _terngrad,
    "qsgd": _qsgd,
    "tbq": _tbq,
    "topk": _sparse(_k_exact("ratio"), by_magnitude=True),
    "randomk": _sparse(_k_exact("ratio"), by_magnitude=False, scaled=True),
    "threshold": _threshold,
    "dgc": _sparse(_k_capped("ratio"), by_magnitude=True),
    "graddrop": _sparse(_k_capped("drop", invert=True), by_magnitude=True),
    "sparseloco": _sparseloco,
}


def check(name: str, x: torch.Tensor, decoded: torch.Tensor, params: dict) -> Check:
    """Judges ``decoded`` (fp32, 1-D) against ``x`` for compressor ``name`` with ``params``."""
    if decoded.shape != x.shape:
        return Check(math.nan, False, f"decoded shape {tuple(decoded.shape)} != {tuple(x.shape)}")
    max_err = float((decoded - x).abs().max()) if x.numel() else 0.0
    ok, detail = CHECKS[name](x, decoded, params)
    return Check(max_err, ok, detail)
