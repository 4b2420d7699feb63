"""Every registered compressor in plain torch ops: the peers of
``python -m benchmarks.codec --compressors``.

Written the way GRACE (Xu et al. 2021) and HiPress's PyTorch path write their compressors: one
vectorized torch expression per step, temporaries allocated as ordinary torch code does, bits
packed with shift-or passes (as :mod:`benchmarks.torch_ops_codec` does for max-min). Each
compressor is one ``encode(x, p, gen) -> Encoded`` / ``decode_add_(out, enc, p)`` pair in
:data:`OPS`, keyed by the registry name; ``p`` holds the compressor's parameters (registry
defaults filled in), ``gen`` is the ``torch.Generator`` of the stochastic ones.

The representation is comparable with docs/FORMAT.md (same scalars per bucket, same bits per
value, signs and codes packed LSB first, (u32 index, value) pairs), but not byte-identical:

- no 32-byte envelope, and the scalars and codes are separate tensors (``Encoded.wire``);
- no NaN / Inf handling (no non-finite flag, no NaN scalars);
- terngrad, qsgd, randomk, dgc and graddrop draw their randomness from ``torch.rand`` /
  ``randint`` / ``randperm`` instead of the counter-based generator: other values, same law;
- topk's indices come out of ``torch.topk`` unsorted (ours ascending);
- randomk follows GRACE: the indices (``torch.randperm(n)[:k]``) stay with the sender as
  context (``Encoded.ctx``) and decode uses them, where ours regenerates them from the key;
- maxmin is :mod:`torch_ops_codec` (bits 1, 2, 4, 8) and qsgd packs only bits 2, 4, 8;
- sparseloco (bits 1, 2, 4, 8) keeps its indices in the buffer's numbering as context (the
  wire's are chunk-relative) and decodes a chunk-NaN case as plain arithmetic does.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, NamedTuple, Tuple

import torch

from benchmarks import torch_ops_codec

__all__ = ["OPS", "Encoded", "TorchOps", "k_of", "pack_bits", "rows", "unpack_bits"]


class Encoded(NamedTuple):
    wire: Tuple[torch.Tensor, ...]  # what would travel
    ctx: Tuple[torch.Tensor, ...] = ()  # what the sender keeps (randomk's indices)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.wire)


class TorchOps(NamedTuple):
    encode: Callable[[torch.Tensor, dict, torch.Generator], Encoded]
    decode_add_: Callable[[torch.Tensor, Encoded, dict], torch.Tensor]


def k_of(fraction: float, n: int) -> int:
    """docs/FORMAT.md "Counts from fractions": ceil(f n - 1e-6) clamped to [1, n]."""
    return 0 if n == 0 else min(n, max(1, math.ceil(fraction * n - 1e-6)))


# ---- packing and bucketing ------------------------------------------------------------------


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 ``codes`` (each < 2^bits, bits in 1, 2, 4, 8) into a LSB-first bit stream."""
    per_byte = 8 // bits
    if per_byte == 1:
        return codes
    pad = -codes.numel() % per_byte
    if pad:
        codes = torch.cat([codes, codes.new_zeros(pad)])
    groups = codes.view(-1, per_byte)
    packed = groups[:, 0].clone()
    for j in range(1, per_byte):
        packed.bitwise_or_(groups[:, j].bitwise_left_shift(j * bits))
    return packed


def unpack_bits(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """The first ``n`` codes of :func:`pack_bits`'s stream, as uint8."""
    if bits == 8:
        return packed[:n]
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8)
    return (packed.unsqueeze(1) >> shifts).bitwise_and_((1 << bits) - 1).view(-1)[:n]


def rows(x: torch.Tensor, bucket: int) -> torch.Tensor:
    """``x`` (values, or decoded codes) as (buckets, bucket), zero-padded; bucket 0: one row."""
    bucket = bucket or max(1, x.numel())
    pad = -x.numel() % bucket
    if pad:
        x = torch.cat([x, x.new_zeros(pad)])
    return x.view(-1, bucket)


def _add_rows(out: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``out += values`` for (buckets, bucket) ``values`` covering ``out`` plus padding."""
    n = out.numel()
    flat = out.view(-1)
    if values.numel() == n:
        flat.view_as(values).add_(values)
    else:
        flat.add_(values.view(-1)[:n])
    return out


def _ternary(q: torch.Tensor) -> torch.Tensor:
    """2-bit codes 0, 1, 2 -> 0, +1, -1 (float32)."""
    return (q & 1).to(torch.float32).sub_((q >> 1).to(torch.float32))


# ---- dense ----------------------------------------------------------------------------------


def _maxmin_enc(x, p, gen):
    return Encoded((torch_ops_codec.encode(x, int(p["bits"]), int(p["bucket_size"])),))


def _maxmin_dec(out, enc, p):
    return torch_ops_codec.decode_add_(out, enc.wire[0], int(p["bits"]), int(p["bucket_size"]))


def _cast_enc(dtype):
    return lambda x, p, gen: Encoded((x.to(dtype),))


def _cast_dec(out, enc, p):
    return out.add_(enc.wire[0])


def _signsgd_enc(x, p, gen):
    return Encoded((pack_bits((x < 0).view(torch.uint8), 1),))


def _signsgd_dec(out, enc, p):
    neg = unpack_bits(enc.wire[0], 1, out.numel())
    return out.add_(neg.to(torch.float32).mul_(-2).add_(1).view_as(out))


def _onebit_enc(x, p, gen):
    b = rows(x, int(p["bucket_size"]))
    neg = b < 0
    n_neg = neg.sum(1)
    n_pos = b.shape[1] - n_neg
    n_pos[-1] -= b.numel() - x.numel()  # the zero padding counted as non-negative
    means = torch.stack(
        [b.clamp(max=0).sum(1) / n_neg.clamp(min=1), b.clamp(min=0).sum(1) / n_pos.clamp(min=1)],
        dim=1,
    )
    return Encoded((means, pack_bits(neg.view(-1)[: x.numel()].view(torch.uint8), 1)))


def _onebit_dec(out, enc, p):
    means, bits = enc.wire
    neg = rows(unpack_bits(bits, 1, out.numel()), int(p["bucket_size"]))
    values = torch.where(neg.bool(), means[:, :1], means[:, 1:])
    return _add_rows(out, values)


def _efsign_enc(x, p, gen):
    b = rows(x, int(p["bucket_size"]))
    counts = torch.full((b.shape[0],), float(b.shape[1]))
    counts[-1] -= b.numel() - x.numel()
    scale = b.abs().sum(1) / counts
    return Encoded((scale, pack_bits((x < 0).view(torch.uint8), 1)))


def _efsign_dec(out, enc, p):
    scale, bits = enc.wire
    neg = rows(unpack_bits(bits, 1, out.numel()), int(p["bucket_size"]))
    signs = neg.to(torch.float32).mul_(-2).add_(1)
    return _add_rows(out, signs.mul_(scale[:, None]))


def _terngrad_enc(x, p, gen):
    b = rows(x, int(p["bucket_size"]))
    s = b.abs().amax(1, keepdim=True)
    if p["clip"] > 0:  # clip to c * sigma (sigma from the mean square; padding counts as 0)
        sigma = b.square().mean(1, keepdim=True).sqrt_()
        s = torch.minimum(s, sigma * p["clip"])
        b = torch.maximum(torch.minimum(b, s), -s)
    keep = torch.rand(b.shape, generator=gen).mul_(s) < b.abs()
    codes = keep.view(torch.uint8) << (b < 0).view(torch.uint8)  # 1: +s, 2: -s
    return Encoded((s.view(-1), pack_bits(codes.view(-1)[: x.numel()], 2)))


def _terngrad_dec(out, enc, p):
    s, codes = enc.wire
    q = rows(unpack_bits(codes, 2, out.numel()), int(p["bucket_size"]))
    return _add_rows(out, _ternary(q).mul_(s[:, None]))


def _qsgd_levels(p) -> Tuple[int, int]:
    bits = int(p["bits"])
    if bits not in (2, 4, 8):
        raise ValueError(f"torch-ops qsgd packs bits 2, 4, 8 only, got {bits}")
    return bits, (1 << (bits - 1)) - 1


def _qsgd_enc(x, p, gen):
    bits, s = _qsgd_levels(p)
    b = rows(x, int(p["bucket_size"]))
    norm = torch.linalg.vector_norm(b, dim=1, keepdim=True)
    inv = torch.where(norm > 0, s / norm, torch.zeros_like(norm))
    level = b.abs().mul_(inv).add_(torch.rand(b.shape, generator=gen)).floor_().clamp_(max=s)
    codes = level.to(torch.uint8).bitwise_or_((b < 0).view(torch.uint8) << (bits - 1))
    return Encoded((norm.view(-1), pack_bits(codes.view(-1)[: x.numel()], bits)))


def _qsgd_dec(out, enc, p):
    bits, s = _qsgd_levels(p)
    norm, codes = enc.wire
    q = rows(unpack_bits(codes, bits, out.numel()), int(p["bucket_size"]))
    sign = (q >> (bits - 1)).to(torch.float32).mul_(-2).add_(1)
    values = (q & s).to(torch.float32).mul_(sign).mul_(norm[:, None] / s)
    return _add_rows(out, values)


def _tbq_enc(x, p, gen):
    tau = p["tau"]
    codes = (x >= tau).view(torch.uint8) | ((x <= -tau).view(torch.uint8) << 1)
    return Encoded((pack_bits(codes, 2),))


def _tbq_dec(out, enc, p):
    q = unpack_bits(enc.wire[0], 2, out.numel())
    return out.add_(_ternary(q).mul_(p["tau"]).view_as(out))


# ---- sparse ---------------------------------------------------------------------------------


def _pairs(x: torch.Tensor, idx: torch.Tensor) -> Encoded:
    return Encoded((idx.to(torch.int32), x[idx]))


def _pairs_dec(out, enc, p):
    idx, values = enc.wire
    return out.index_add_(0, idx, values)


def _topk_enc(x, p, gen):
    k = k_of(p["ratio"], x.numel())
    return _pairs(x, torch.topk(x.abs(), k, sorted=False).indices)


def _randomk_enc(x, p, gen):
    idx = torch.randperm(x.numel(), generator=gen)[: k_of(p["ratio"], x.numel())]
    return Encoded((x[idx],), (idx,))


def _randomk_dec(out, enc, p):
    values = enc.wire[0]
    if p["scale"]:
        values = values * (out.numel() / values.numel())
    return out.index_add_(0, enc.ctx[0], values)


def _threshold_enc(x, p, gen):
    (idx,) = torch.where(x.abs() >= p["tau"])
    return _pairs(x, idx)


def _sampled_enc(x, k, p, gen):
    """DGC's selection: threshold from a sample, ``abs() >= thr``, at most 2k kept."""
    n = x.numel()
    mag = x.abs()
    s = max(k_of(p["sample_rate"], n), min(n, 1024))
    if s >= n:
        thr = torch.topk(mag, k, sorted=False).values.min()
    else:
        sample = mag[torch.randint(0, n, (s,), generator=gen)]
        thr = torch.topk(sample, math.ceil(k * s / n), sorted=False).values.min()
    (idx,) = torch.where(mag >= thr)
    cap = min(n, 2 * k)
    if idx.numel() > cap:
        idx = idx[torch.topk(mag[idx], cap, sorted=False).indices].sort().values
    return _pairs(x, idx)


def _dgc_enc(x, p, gen):
    return _sampled_enc(x, k_of(p["ratio"], x.numel()), p, gen)


def _graddrop_enc(x, p, gen):
    return _sampled_enc(x, k_of(1 - p["drop"], x.numel()), p, gen)


def _sparseloco_part(x, p, lo, hi, ch):
    """Top-k of each chunk of ``x[lo:hi]`` (chunks of ``ch``, all full), quantized (FORMAT.md)."""
    xr = x[lo:hi].view(-1, ch)
    bits = int(p["bits"])
    idx = torch.topk(xr.abs(), k_of(p["ratio"], ch), dim=1, sorted=False).indices
    v = xr.gather(1, idx)
    a, top = v.abs().amin(1, keepdim=True), v.abs().amax(1, keepdim=True)
    levels = (1 << (bits - 1)) - 1
    if bits == 1:
        a, step, level = v.abs().mean(1, keepdim=True), torch.zeros_like(a), torch.zeros_like(v)
    else:
        step = (top - a) / levels
        level = ((v.abs() - a) / step + 0.5).floor_().nan_to_num_(0).clamp_(0, levels)
    codes = level.to(torch.uint8) | ((v < 0).to(torch.uint8) << (bits - 1))
    return torch.cat([a, step], 1), (idx + lo + torch.arange(xr.shape[0]).unsqueeze(1) * ch), codes


def _sparseloco_enc(x, p, gen):
    n, ch = x.numel(), int(p["chunk"])
    full = n // ch * ch
    parts = [_sparseloco_part(x, p, 0, full, ch)] if full else []
    if n > full:
        parts.append(_sparseloco_part(x, p, full, n, n - full))
    scalars, idx, codes = (torch.cat([t[i].reshape(-1) for t in parts]) for i in range(3))
    small = torch.int16 if ch <= 65536 else torch.int32  # chunk-relative on the wire
    return Encoded((scalars, (idx % ch).to(small), pack_bits(codes, int(p["bits"]))), (idx,))


def _sparseloco_dec(out, enc, p):
    scalars, _, packed = enc.wire
    idx, bits = enc.ctx[0], int(p["bits"])
    codes = unpack_bits(packed, bits, idx.numel()).to(torch.int64)
    a, step = scalars.view(-1, 2)[idx // int(p["chunk"])].unbind(1)
    sign = 1 - 2 * (codes >> (bits - 1)).to(torch.float32)
    mag = a + (codes & ((1 << (bits - 1)) - 1)).to(torch.float32) * step
    return out.index_add_(0, idx, sign * mag)


OPS: Dict[str, TorchOps] = {
    "maxmin": TorchOps(_maxmin_enc, _maxmin_dec),
    "fp16": TorchOps(_cast_enc(torch.float16), _cast_dec),
    "bf16": TorchOps(_cast_enc(torch.bfloat16), _cast_dec),
    "signsgd": TorchOps(_signsgd_enc, _signsgd_dec),
    "signum": TorchOps(_signsgd_enc, _signsgd_dec),  # the sign of a momentum the caller keeps
    "onebit": TorchOps(_onebit_enc, _onebit_dec),
    "efsignsgd": TorchOps(_efsign_enc, _efsign_dec),
    "terngrad": TorchOps(_terngrad_enc, _terngrad_dec),
    "qsgd": TorchOps(_qsgd_enc, _qsgd_dec),
    "tbq": TorchOps(_tbq_enc, _tbq_dec),
    "topk": TorchOps(_topk_enc, _pairs_dec),
    "randomk": TorchOps(_randomk_enc, _randomk_dec),
    "threshold": TorchOps(_threshold_enc, _pairs_dec),
    "dgc": TorchOps(_dgc_enc, _pairs_dec),
    "graddrop": TorchOps(_graddrop_enc, _pairs_dec),
    "sparseloco": TorchOps(_sparseloco_enc, _sparseloco_dec),
}
