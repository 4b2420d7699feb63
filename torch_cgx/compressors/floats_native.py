"""The MX formats' native CPU path (csrc/core/float_formats.h through ``_C.mx_encode`` /
``_C.mx_decode_into``): used for CPU tensors once it has given the tensor operations' bytes and
values on a probe (per element format and rounding, at first use); where it does not, the
reference runs, with a warning."""

from __future__ import annotations

from typing import Dict, Tuple

import torch

from torch_cgx.compressors.python import Context
from torch_cgx.warn import warn_once

__all__ = ["decode", "decode_add_", "encode", "usable"]

_CHECKED: Dict[Tuple, bool] = {}
_SPECIAL = {"": 0, "fn": 1, "ieee": 2}


def _element(c) -> tuple:
    e = c.element
    return (e.ebits, e.mbits, e.bias, float(e.max), e.emax, _SPECIAL[e.special])


def encode(c, x: torch.Tensor, ctx: Context) -> torch.Tensor:
    from torch_cgx import _C

    out = c.new_body(c.body_size(x.numel()), x.device)
    return _C.mx_encode(x.contiguous(), _element(c), c.block, bool(c.p["stochastic"]),
                        ctx.seed, ctx.stream, out)  # fmt: skip


def decode(c, body: torch.Tensor, numel: int) -> torch.Tensor:
    from torch_cgx import _C

    out = torch.empty(numel, dtype=torch.float32)
    _C.mx_decode_into(body.contiguous(), _element(c), c.block, out, False)
    return out


def decode_add_(c, acc: torch.Tensor, body: torch.Tensor) -> torch.Tensor:
    from torch_cgx import _C

    if acc.dtype != torch.float32 or not acc.is_contiguous():
        return acc.add_(decode(c, body, acc.numel()))
    _C.mx_decode_into(body.contiguous(), _element(c), c.block, acc.view(-1), True)
    return acc


def _probe() -> torch.Tensor:
    g = torch.Generator().manual_seed(11)
    x = torch.randn(32 * 40 + 7, generator=g) * torch.exp(3 * torch.randn(32 * 40 + 7, generator=g))
    x[32:64] = 0.0
    x[70], x[100], x[140], x[150] = float("inf"), float("nan"), 2.0**-140, -0.0
    x[200:232] = torch.ldexp(torch.ones(32), torch.arange(-20, 12))  # binade edges
    return x


def usable(c, device) -> bool:
    """Whether the native path serves compressor ``c`` on ``device`` (checked once per element
    format and rounding against the reference; a mismatch warns and keeps the reference)."""
    if torch.device(device).type != "cpu":
        return False
    key = (_element(c), c.block, bool(c.p["stochastic"]))
    if key not in _CHECKED:
        _CHECKED[key] = False  # the reference, while the probe runs
        _CHECKED[key] = _agrees(c)
    return _CHECKED[key]


def _agrees(c) -> bool:
    x, ctx = _probe(), Context(3, 5, 0)
    try:
        want = c.reference_encode(x, ctx)
        got = encode(c, x, ctx)
        same = torch.equal(got, want)
        if same:
            ref = c.reference_decode(want, x.numel())
            mine = decode(c, want, x.numel())
            same = torch.equal(ref.view(torch.int32), mine.view(torch.int32)) or bool(
                ((ref == mine) | (ref.isnan() & mine.isnan())).all()
            )
    except (AttributeError, RuntimeError, ValueError) as e:  # an extension without the kernels
        _warn(c, f"failed its check ({type(e).__name__}: {e})")
        return False
    if not same:
        _warn(c, "differs from the tensor operations on the probe")
    return same


def _warn(c, why: str) -> None:
    warn_once(("mx-native", c.name), f"{c.name}: the native MX path {why}; using tensor "
              "operations", category=RuntimeWarning)  # fmt: skip
