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
  ``s * sign(x)`` wherever ``|x| >= s`` (probability 1), and the count of nonzero codes within
  6 sigma of its expectation ``sum min(|x|, s) / s``;
- qsgd: same sign and level ``floor(t)`` or ``floor(t) + 1`` of ``t = L |x| / norm`` (``L =
  2^(bits-1) - 1``, a level is ``norm / L``), the levels' sum within 6 sigma of ``sum t``;
- topk / dgc / graddrop: carried values bit for bit, the count (``k``; 1 to ``2k``) and the
  selection by magnitude (every carried ``|x|`` >= every dropped one); randomk: the count and the
  values (times ``n / k`` with ``scale``); sparseloco: per chunk the count and the selection,
  the sign, and the nearest level (the kept mean at 1 bit).

- compressors written in Python: the L2 bound each declares (``CompressorBase.bound``).

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


def _six_sigma(count: torch.Tensor, mean: torch.Tensor, var: torch.Tensor, what: str) -> Result:
    """A sum of independent draws against its expectation: within 6 sigma (+1 for the
    discreteness), which a correct stochastic rounding misses with probability under 1e-8."""
    dev, slack = abs(float(count - mean)), 6 * math.sqrt(max(float(var), 0.0)) + 1
    return (True, "") if dev <= slack else (False, f"{what}: off by {dev:.1f} > {slack:.1f}")


def _terngrad(x, d, p) -> Result:
    bucket = int(p["bucket_size"])
    xr, dr, valid = rows(x.double(), bucket), rows(d.double(), bucket), _valid(x, bucket)
    s = xr.abs().amax(1, keepdim=True)
    if p["clip"] > 0:
        n = valid.sum(1, keepdim=True)
        s = torch.minimum(s, p["clip"] * (xr.square().sum(1, True) / n).sqrt())
    tol = s * 2.0**-20
    level = (dr == 0) | ((dr.abs() - s).abs() <= tol)
    ok, why = _within((~level | (dr * xr < 0)).double(), torch.zeros(()), "0 or s * sign(x)")
    if not ok:
        return ok, why
    # Code nonzero with probability min(|x|, s) / s: certain at |x| >= s (the bucket's largest).
    sure = valid & (xr.abs() >= s - tol) & (s > 0)
    ok, why = _within(sure.double() * (dr == 0).double(), torch.zeros(()), "|x| = s sent")
    if not ok:
        return ok, why
    prob = (xr.abs().minimum(s) / s.clamp(min=1e-300)).where(valid & (s > 0), 0)
    ok, why = _six_sigma((dr != 0).sum(), prob.sum(), (prob * (1 - prob)).sum(), "nonzero codes")
    if not ok:
        return ok, why
    bound = s + tol if p["clip"] == 0 else s + xr.abs() + tol
    return _within((dr - xr).abs(), bound, "|x' - x| <= s")


def _qsgd(x, d, p) -> Result:
    """Level l of |x'| = l * norm / L is floor(t) or floor(t) + 1 of t = L |x| / norm (the
    sign of x), and the levels sum to sum t within 6 sigma (E[l] = t: unbiased)."""
    bucket, levels = int(p["bucket_size"]), (1 << (int(p["bits"]) - 1)) - 1
    xr, dr = rows(x.double(), bucket), rows(d.double(), bucket)
    norm = torch.linalg.vector_norm(xr, dim=1, keepdim=True)
    ok, why = _within((dr * xr < 0).double(), torch.zeros(()), "sign")
    if not ok:
        return ok, why
    t = (levels * xr.abs() / norm.clamp(min=1e-300)).where(norm > 0, 0)
    lev = dr.abs() * levels / norm.clamp(min=1e-300)
    eps = t * 2.0**-20 + 2.0**-20  # the fp32 evaluation of t and of the decoded value
    whole = (lev - lev.round()).abs() <= eps
    lo, hi = (t - eps).floor().clamp(0, levels), ((t + eps).floor() + 1).clamp(max=levels)
    bad = ~whole | (lev.round() < lo) | (lev.round() > hi)
    ok, why = _within(bad.double(), torch.zeros(()), "level floor(t) or floor(t) + 1")
    if not ok:
        return ok, why
    f = t - t.floor()
    return _six_sigma(lev.round().sum(), t.sum(), (f * (1 - f)).sum(), "sum of levels")


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
    def count(n: int, p: dict) -> Tuple[int, int]:  # the largest |x| always passes (>= 1)
        return min(n, 1), min(n, 2 * k_of(1 - p[key] if invert else p[key], n))

    return count


def _sparseloco(x, d, p) -> Result:
    """Per chunk: k(ratio, L) values carried, the largest |x|, each at its level with the sign
    of x: the nearest of lo + l * step (l = 0..L, step = (hi - lo) / L over [lo, hi] of the kept
    |x|; either neighbour at a tie), or the mean of the kept |x| at 1 bit."""
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
    ok, why = _within((dr * xr < 0).double(), torch.zeros(()), "sign")
    if not ok:
        return ok, why
    tol = hi * 2.0**-20 + 1e-30
    if bits == 1:
        mean = mag.where(sent, 0).sum(1, True) / sent.sum(1, True).clamp(min=1)
        return _within((dr.abs() - mean).abs().where(sent, 0), tol, "the kept mean")
    levels = (1 << (bits - 1)) - 1
    step = (hi - lo) / levels
    pos = ((mag - lo) / step.clamp(min=1e-300)).where(step > 0, 0)
    near = (pos + 0.5).floor().clamp(0, levels)
    tie = ((pos - pos.floor() - 0.5).abs() <= 2.0**-16) & (pos.floor() < levels)
    err = torch.minimum(
        (dr.abs() - (lo + near * step)).abs(),
        (dr.abs() - (lo + pos.floor() * step)).abs().where(tie, math.inf),
    )
    return _within(err.where(sent, 0), tol, "its nearest level")


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
    ok, detail = (CHECKS[name] if name in CHECKS else _declared(name))(x, decoded, params)
    return Check(max_err, ok, detail)


def _declared(name: str) -> Callable[[torch.Tensor, torch.Tensor, dict], Result]:
    """A compressor written in Python: its own declared bound (``bound(x)``), the L2 error."""
    from torch_cgx import compressors

    if not compressors.is_python(name):
        raise KeyError(f"no check for compressor {name!r}")

    def judge(x: torch.Tensor, decoded: torch.Tensor, params: dict) -> Result:
        bound = compressors.get(name, **params).impl.bound(x)
        if bound is None:
            return True, "no bound declared"
        err = float((decoded.double() - x.double()).norm())
        return err <= bound, f"L2 error {err:.4g} <= its bound {bound:.4g}"

    return judge
