"""The max-min codec in plain torch ops: the baseline of ``python -m benchmarks.codec``.

This is how one would write the codec in PyTorch without a native kernel, in the style of
PyTorch's quantization DDP communication hooks: view the buffer as ``(buckets, bucket_size)``,
take ``amin`` / ``amax`` per bucket, compute the step (``unit``), quantize with a chain of
vectorized (mostly in-place) ops, cast to uint8 and pack ``8 / bits`` codes per byte with shifts
and ors. Decoding unpacks with shifts and masks, dequantizes and adds into the output.

It is not byte-compatible with docs/FORMAT.md (no header, different fp rounding order, no
non-finite handling): it is a speed baseline. Its payload is one uint8 tensor:

    meta   nb * 8 bytes   per bucket (min: f32, unit: f32)
    codes  ceil(nb * bucket_size * bits / 8) bytes, code i in bits [i*bits, (i+1)*bits)

Only ``bits`` in {1, 2, 4, 8} are supported (codes never straddle a byte).
"""

from __future__ import annotations

import torch

__all__ = ["encode", "decode_add_", "encoded_size", "max_abs_error_ok"]

SUPPORTED_BITS = (1, 2, 4, 8)


def _check_bits(bits: int) -> None:
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"torch-ops codec supports bits in {SUPPORTED_BITS}, got {bits}")


def _layout(numel: int, bits: int, bucket_size: int):
    nb = -(-numel // bucket_size)
    per_byte = 8 // bits
    code_bytes = -(-(nb * bucket_size) // per_byte)
    return nb, per_byte, code_bytes


def encoded_size(numel: int, bits: int = 4, bucket_size: int = 512) -> int:
    """Payload bytes of :func:`encode` for ``numel`` values."""
    _check_bits(bits)
    nb, _, code_bytes = _layout(numel, bits, bucket_size)
    return 8 * nb + code_bytes


def _bucketed(x: torch.Tensor, bucket_size: int) -> torch.Tensor:
    """``x`` as ``(buckets, bucket_size)``, the last bucket padded with its own last value (which
    leaves its min and max unchanged)."""
    flat = x.reshape(-1)
    pad = -flat.numel() % bucket_size
    if pad:
        flat = torch.cat([flat, flat[-1:].expand(pad)])
    return flat.view(-1, bucket_size)


def encode(x: torch.Tensor, bits: int = 4, bucket_size: int = 512) -> torch.Tensor:
    """Quantizes the fp32 tensor ``x`` (nearest rounding) into a uint8 payload."""
    _check_bits(bits)
    levels = (1 << bits) - 1
    buckets = _bucketed(x.float(), bucket_size)
    nb, per_byte, code_bytes = _layout(x.numel(), bits, bucket_size)

    mn = buckets.amin(dim=1, keepdim=True)
    mx = buckets.amax(dim=1, keepdim=True)
    rng = mx - mn
    unit = rng / levels
    inv = torch.where(rng > 0, levels / rng, torch.zeros_like(rng))  # constant bucket: codes 0

    # q = clamp(round((x - mn) / unit), 0, L); the argument of the cast is >= 0, so truncation
    # after adding 0.5 is rounding to nearest.
    q = (buckets - mn).mul_(inv).add_(0.5).clamp_(0, levels).to(torch.uint8).view(-1)

    payload = torch.empty(8 * nb + code_bytes, dtype=torch.uint8)
    meta = payload[: 8 * nb].view(torch.float32).view(nb, 2)
    meta[:, 0:1] = mn
    meta[:, 1:2] = unit
    codes = payload[8 * nb :]
    if per_byte == 1:
        codes.copy_(q)
        return payload
    pad = -q.numel() % per_byte
    if pad:
        q = torch.cat([q, q.new_zeros(pad)])
    groups = q.view(-1, per_byte)  # column j holds the codes stored in bits [j*bits, (j+1)*bits)
    codes.copy_(groups[:, 0])
    for j in range(1, per_byte):  # at most 7 vectorized shift-or passes, not a loop over values
        codes.bitwise_or_(groups[:, j].bitwise_left_shift(j * bits))
    return payload


def decode_add_(
    out: torch.Tensor, payload: torch.Tensor, bits: int = 4, bucket_size: int = 512
) -> torch.Tensor:
    """``out += decode(payload)`` for an fp32 ``out`` with the encoded element count."""
    _check_bits(bits)
    numel = out.numel()
    nb, per_byte, code_bytes = _layout(numel, bits, bucket_size)
    if payload.numel() != 8 * nb + code_bytes:
        raise ValueError(f"payload has {payload.numel()} bytes, expected {8 * nb + code_bytes}")
    meta = payload[: 8 * nb].view(torch.float32).view(nb, 2)
    codes = payload[8 * nb :]
    if per_byte == 1:
        q = codes
    else:
        shifts = torch.arange(0, 8, bits, dtype=torch.uint8)
        q = (codes.unsqueeze(1) >> shifts).bitwise_and_((1 << bits) - 1).view(-1)
    q = q[: nb * bucket_size].view(nb, bucket_size)
    values = q.to(torch.float32).mul_(meta[:, 1:2]).add_(meta[:, 0:1])
    flat = out.view(-1)
    if numel == nb * bucket_size:
        flat.view(nb, bucket_size).add_(values)
    else:
        flat.add_(values.view(-1)[:numel])
    return out


def bucket_max(values: torch.Tensor, bucket_size: int) -> torch.Tensor:
    """Per-bucket maximum of a non-negative 1-D tensor (the last bucket may be partial)."""
    pad = -values.numel() % bucket_size
    if pad:
        values = torch.cat([values, values.new_zeros(pad)])
    return values.view(-1, bucket_size).amax(dim=1)


def max_abs_error_ok(x: torch.Tensor, bits: int = 4, bucket_size: int = 512) -> bool:
    """Round-trips ``x`` and checks that every decoded value is within ``unit / 2`` of the input
    (plus the fp32 rounding of the arithmetic): the benchmark's verify mode for this codec."""
    x = x.float().reshape(-1)
    decoded = decode_add_(torch.zeros_like(x), encode(x, bits, bucket_size), bits, bucket_size)
    buckets = _bucketed(x, bucket_size)
    mn = buckets.amin(dim=1).double()
    mx = buckets.amax(dim=1).double()
    levels = (1 << bits) - 1
    unit = (mx - mn) / levels
    # A few fp32 roundings (relative 2^-24 each) of values up to max(|mn|, |mx|) and of t <= L;
    # the error itself is computed in fp32 (one more rounding of at most 2^-24 of it).
    slack = 2.0**-21 * torch.maximum(mn.abs(), mx.abs()) + unit * (8 * levels * 2.0**-24)
    err = bucket_max(decoded.sub_(x).abs_(), bucket_size).double()
    return bool((err <= (unit / 2 + slack) * (1 + 2.0**-22)).all())
