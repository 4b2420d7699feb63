"""Checks for compressors users write (and the built-in ones): what the generic suites hold every
compressor to, for one configured compressor.

>>> from torch_cgx import compressors, testing
>>> compressors.register("mine", Mine)
>>> testing.check_compressor(compressors.get("mine"))   # AssertionError names what failed
"""

from __future__ import annotations

from typing import Iterable, Union

import torch

__all__ = ["check_compressor"]

_SIZES = (0, 1, 7, 64, 1000, 4099)


def check_compressor(compressor: Union[str, object], sizes: Iterable[int] = _SIZES,
                     device: Union[str, torch.device] = "cpu",
                     draws: int = 200) -> None:  # fmt: skip
    """Raises AssertionError naming the first check ``compressor`` (a name, or what
    ``torch_cgx.compressors.get`` returned) fails: payload sizes as declared; the round trip
    within its declared bound (``bound(x)`` of a Python compressor) and finite; encodes
    deterministic in (values, seed, stream, shared); ``decode_add_`` adds the decoded values
    once; truncated, extended, re-headed and mistyped payloads rejected with ValueError; fp16 and
    bf16 inputs; unbiasedness over ``draws`` streams where the compressor claims it (not
    ``biased``) and draws at random."""
    from torch_cgx import compressors

    c = compressors.get(compressor) if isinstance(compressor, str) else compressor
    device = torch.device(device)
    for n in sizes:
        x = _values(n, device)
        _round_trip(c, x)
        _rejects(c, x)
        for dtype in (torch.float16, torch.bfloat16):
            y = c.decode(c.encode(x.to(dtype), seed=3, stream=1))
            assert y.numel() == n and bool(y.isfinite().all()), f"{c!r}: {dtype} round trip"
    if not c.traits["biased"]:
        _unbiased(c, _values(1000, device), draws)


def _values(n: int, device) -> torch.Tensor:
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g) * torch.exp(torch.randn(n, generator=g))
    return x.to(device)


def _round_trip(c, x: torch.Tensor) -> None:
    n = x.numel()
    p = c.encode(x, seed=5, stream=2, shared=9)
    assert p.dtype == torch.uint8 and p.dim() == 1, f"{c!r}: the payload is not 1-D uint8"
    size = c.encoded_size(n)
    fixed = c.traits["fixed_size"]
    assert p.numel() == size if fixed else p.numel() <= size, (
        f"{c!r}: {p.numel()} payload bytes for {n} values, encoded_size says {size}"
    )
    again = c.encode(x.clone(), seed=5, stream=2, shared=9)
    assert torch.equal(p, again), f"{c!r}: two encodes of the same values differ"
    y = c.decode(p)
    assert y.shape == (n,) and bool(y.isfinite().all()), f"{c!r}: decode of {n} values"
    impl = getattr(c, "impl", None)
    bound = impl.bound(x) if impl is not None else None
    if bound is not None:
        err = float((y.double() - x.double()).norm())
        assert err <= bound, f"{c!r}: round-trip error {err:.4g} above its bound {bound:.4g}"
    acc = torch.randn(n, generator=torch.Generator().manual_seed(1)).to(x.device)
    want = acc + y
    c.decode_add_(acc, p)
    assert torch.equal(acc, want), f"{c!r}: decode_add_ does not add the decoded values once"


def _rejects(c, x: torch.Tensor) -> None:
    p = c.encode(x, seed=1)
    bad = {
        "truncated": p[:-1],
        "extended": torch.cat([p, p.new_zeros(1)]),
        "mistyped": p.to(torch.int32),
    }
    if p.numel():
        flipped = p.clone()
        flipped[0] ^= 0xFF
        bad["re-headed"] = flipped
    for what, payload in bad.items():
        try:
            c.decode(payload)
        except ValueError:
            continue
        raise AssertionError(f"{c!r}: a {what} payload of {x.numel()} values decoded")


def _unbiased(c, x: torch.Tensor, draws: int) -> None:
    ys = torch.stack([c.decode(c.encode(x, seed=7, stream=s)).double() for s in range(draws)])
    if bool((ys == ys[0]).all()):
        return  # deterministic (nearest rounding): unbiasedness is a claim of random draws only
    err = ys - x.double()
    # E|mean - x|^2 = E|x' - x|^2 / draws for independent draws: 1.5x its estimate (1000 values)
    limit = 1.5 * float(err.square().sum(1).mean() / draws) ** 0.5 + 1e-12
    got = float(err.mean(0).norm())
    assert got <= limit, f"{c!r}: claims to be unbiased; mean error {got:.4g} > {limit:.4g}"
