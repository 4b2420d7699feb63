"""Constants and helpers shared by the codec tests (test_codec.py, test_codec_validation.py)."""

from __future__ import annotations

import zlib

import codec_oracle as oracle
import numpy as np
import pytest
import torch

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DTYPE_IDS = ["fp32", "fp16", "bf16"]
NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
SIZES = [0, 1, 7, 8, 9, 100, 513]
BUCKETS = [1, 3, 8, 100, 512]
ALL_BITS = list(range(1, 9))


# ---- helpers -----------------------------------------------------------------------------------


def rng(*key) -> np.random.Generator:
    """A generator seeded from the test's parameters (stable across runs, unlike hash())."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def raw_of(t: torch.Tensor) -> np.ndarray:
    """The oracle's view of a tensor: float32 values, or the uint16 bits of fp16 / bf16."""
    t = t.contiguous().reshape(-1)
    if t.dtype == torch.float32:
        return t.numpy()
    return t.view(torch.int16).numpy().view(np.uint16)


def as_bytes(payload: torch.Tensor) -> bytes:
    return payload.numpy().tobytes()


def from_bytes(data: bytes) -> torch.Tensor:
    return torch.tensor(list(data), dtype=torch.uint8)


def oracle_decode(payload: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Spec decode of a (valid) payload, rounded to ``dtype`` by torch (round to nearest even)."""
    return torch.from_numpy(oracle.decode(as_bytes(payload))).to(dtype)


def assert_same(got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    """Bit-for-bit equality of floating tensors (the sign of zero included), any NaN matching any
    NaN: the comparison for decoded values, since GPU arithmetic returns the canonical NaN (fp32
    0x7fffffff, fp16 0x7fff) where x86 keeps the operand's payload (0x7fc00000). Tensors on any
    device. (Payload bytes, whose NaN patterns are written explicitly, compare exactly.)"""
    assert got.dtype == want.dtype, what
    assert got.shape == want.shape, what
    got, want = got.detach().cpu(), want.detach().cpu()
    g = got.float().contiguous().numpy().view(np.uint32).reshape(-1)
    w = want.float().contiguous().numpy().view(np.uint32).reshape(-1)
    g_nan = np.isnan(got.float().reshape(-1).numpy())
    w_nan = np.isnan(want.float().reshape(-1).numpy())
    bad = np.flatnonzero((g_nan != w_nan) | (~g_nan & (g != w)))
    if bad.size:
        i = bad[0]
        pytest.fail(
            f"{what}: {bad.size} of {g.size} elements differ, first at {i}: "
            f"got {got.reshape(-1)[i].item()!r}, want {want.reshape(-1)[i].item()!r}"
        )


def random_input(n: int, dtype: torch.dtype, gen: np.random.Generator) -> torch.Tensor:
    """Gaussian values, or (half of the time) small integers: exact grid points, rounding ties
    and constant buckets."""
    if gen.random() < 0.5:
        x = gen.standard_normal(n) * 3.0 + 1.0
    else:
        x = gen.integers(-4, 5, n).astype(np.float64)
    return torch.from_numpy(x.astype(np.float32)).to(dtype)


def no_negative_zero(x: np.ndarray) -> np.ndarray:
    """-0.0 + 0.0 = +0.0. FORMAT.md leaves the sign of a bucket minimum that is both -0.0 and
    +0.0 open (see test_signed_zero_minimum), so byte comparisons avoid -0.0."""
    return x + np.float32(0.0)


def special_input(kind: str, n: int, gen: np.random.Generator) -> np.ndarray:
    """float32 inputs that exercise the corners of the spec."""
    if kind == "denormal":  # buckets narrower than L / FLT_MAX: the fp64 path
        x = np.where(
            gen.random(n) < 0.5,
            gen.standard_normal(n) * 1e-40,
            gen.integers(-3, 4, n) * 2.0**-149,
        )
    elif kind == "huge":  # ranges wider than FLT_MAX
        x = gen.uniform(-3e38, 3e38, n)
        x[:2] = [-3e38, 3e38]
    elif kind == "wide":  # ranges just over FLT_MAX, |mn| + L * |unit| under 2 * FLT_MAX
        x = gen.uniform(-1.75e38, 1.75e38, n)
    elif kind == "offset":  # large offset, small spread
        x = 1e4 + gen.standard_normal(n) * 1e-2
    elif kind == "nonfinite":
        x = gen.standard_normal(n)
        x[gen.random(n) < 0.02] = np.nan
        x[gen.random(n) < 0.02] = np.inf
        x[gen.random(n) < 0.02] = -np.inf
    elif kind == "mixed_scale":  # wide and narrow buckets side by side
        x = gen.standard_normal(n) * 10.0 ** gen.integers(-30, 30, n)
    else:
        raise ValueError(kind)
    return no_negative_zero(x.astype(np.float32))
