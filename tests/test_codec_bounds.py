"""Tests of torch_cgx.codec against docs/FORMAT.md: the error bounds and stochastic rounding
(the exact bytes and values against the numpy oracle: tests/test_codec.py)."""

from __future__ import annotations

import math

import codec_oracle as oracle
import numpy as np
import pytest
import torch
from codec_testing import (
    ALL_BITS,
    DTYPE_IDS,
    DTYPES,
    as_bytes,
    assert_same,
    raw_of,
    rng,
    special_input,
)

from torch_cgx import codec

# ---- 3. error bounds ---------------------------------------------------------------------------


def bound_input(kind: str, n: int, gen: np.random.Generator) -> torch.Tensor:
    if kind == "normal":
        return torch.from_numpy((gen.standard_normal(n) * 3 + 1).astype(np.float32))
    if kind == "fp16":
        return torch.from_numpy((gen.standard_normal(n) * 1000).astype(np.float32)).half()
    if kind == "bf16":
        return torch.from_numpy((gen.standard_normal(n) * 1e30).astype(np.float32)).bfloat16()
    return torch.from_numpy(special_input(kind, n, gen))


def check_bound(x: torch.Tensor, p: torch.Tensor, bits: int, bucket: int, stochastic: bool):
    xf = x.float().numpy().astype(np.float64)
    y = codec.decode(p, dtype=torch.float32).numpy().astype(np.float64)
    assert np.isfinite(y).all(), f"non-finite decode: {y[~np.isfinite(y)][:4]}"
    nq = codec.inspect(p)["count"]
    if codec.inspect(p)["skip_incomplete_buckets"]:
        nq -= nq % bucket
    bound = oracle.error_bound(x.float().numpy()[:nq], bits, bucket)
    if stochastic:  # |x' - x| < unit plus the same rounding terms
        L = (1 << bits) - 1
        X = x.float().numpy()[:nq].astype(np.float64)
        unit = np.repeat([np.ptp(X[s : s + bucket]) / L for s in range(0, nq, bucket)], bucket)[:nq]
        bound = bound + 0.5 * unit
    err = np.abs(y[:nq] - xf[:nq])
    worst = int(np.argmax(err - bound)) if nq else 0
    assert (err <= bound).all(), (
        f"element {worst}: x={xf[worst]!r} decoded={y[worst]!r} error={err[worst]!r} "
        f"bound={bound[worst]!r}"
    )
    assert np.array_equal(y[nq:], xf[nq:]), "raw tail must come back exactly"


@pytest.mark.parametrize("bits", ALL_BITS)
@pytest.mark.parametrize("kind", ["normal", "offset", "fp16", "bf16", "denormal", "mixed_scale"])
def test_nearest_error_bound(kind, bits):
    gen = rng("bound", kind, bits)
    for bucket in (1, 3, 8, 100, 512):
        for skip in (False, True):
            x = bound_input(kind, 1029, gen)
            p = codec.encode(x, bits, bucket, skip_incomplete_buckets=skip)
            check_bound(x, p, bits, bucket, stochastic=False)


@pytest.mark.parametrize("bits", [1, 2, 5, 8])
@pytest.mark.parametrize("kind", ["normal", "offset", "fp16", "denormal"])
def test_stochastic_error_bound(kind, bits):
    gen = rng("sbound", kind, bits)
    for bucket in (1, 3, 100, 512):
        x = bound_input(kind, 1029, gen)
        p = codec.encode(x, bits, bucket, stochastic=True, seed=bucket, stream=bits)
        check_bound(x, p, bits, bucket, stochastic=True)


@pytest.mark.parametrize("bits", range(2, 9))
def test_huge_range_decodes_finite_within_bound(bits):
    # Ranges of 6.8e38 (the fp32 maximum is 3.4e38) and, in the second half, of 3.5e38.
    x = torch.tensor(
        [-3e38, 3e38, 1e38, 0.0, -2.5e38, 1.0, 3.4e38, -3.4e38]
        + [-1.75e38, 1.75e38, 0.0, 1e-30, -1e38, 1.7e38, 1.74e38, -1.7e38]
    )
    for bucket in (4, 8, 16):
        for stochastic in (False, True):
            p = codec.encode(x, bits, bucket, stochastic=stochastic, seed=1)
            check_bound(x, p, bits, bucket, stochastic)


def test_one_bit_step_beyond_fp32_makes_the_bucket_non_finite():
    # FORMAT.md step 3: with 1 bit the step is the whole range; past FLT_MAX it cannot be stored,
    # so the bucket decodes to NaN (never to silently wrong finite values); others are unharmed.
    x = torch.tensor([-3e38, 3e38, 1e38, 0.0, 1.0, 2.0, 3.0, 4.0])
    p = codec.encode(x, 1, 4)
    meta = np.frombuffer(as_bytes(p)[24:40], "<u4").reshape(2, 2)
    assert (meta[0] == 0x7FC00000).all()
    y = codec.decode(p)
    assert torch.isnan(y[:4]).all() and torch.isfinite(y[4:]).all()
    assert as_bytes(p) == oracle.encode(raw_of(x), "float32", 1, 4)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_constant_buckets_decode_exactly(dtype):
    big = {torch.float32: 3e38, torch.float16: 65504.0, torch.bfloat16: 3e38}[dtype]
    levels = [0.0, 1.0, -2.5, 1e-40, -1e-45, big, -big, 1234.5678, 6e-8, 1e-3]
    x = torch.tensor(levels).to(dtype).repeat_interleave(12)
    for bits in ALL_BITS:
        for stochastic in (False, True):
            p = codec.encode(x, bits, 12, stochastic=stochastic, seed=bits)
            meta = np.frombuffer(as_bytes(p)[24 : 24 + 8 * len(levels)], "<f4").reshape(-1, 2)
            assert (meta[:, 1] == 0).all()
            # Value equality (a constant bucket of -0.0 would come back as +0.0: -0 + 0*0 = +0).
            assert torch.equal(codec.decode(p), x)
            assert torch.equal(codec.decode(p, dtype=torch.float32), x.float())


@pytest.mark.parametrize("position", ["first", "middle", "last"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_nonfinite_bucket_decodes_to_nan(dtype, bad, position):
    bucket = 8
    gen = rng("nonfinite", dtype, bad, position)
    x = torch.from_numpy(gen.standard_normal(5 * bucket + 3).astype(np.float32)).to(dtype)
    clean = x.clone()
    k = 2  # the bucket that gets the bad value
    i = k * bucket + {"first": 0, "middle": 3, "last": bucket - 1}[position]
    x[i] = bad
    for bits in (1, 4, 8):
        p = codec.encode(x, bits, bucket)
        y = codec.decode(p, dtype=torch.float32)
        assert torch.isnan(y[k * bucket : (k + 1) * bucket]).all()
        # The other buckets decode exactly as they would without the bad value.
        want = codec.decode(codec.encode(clean, bits, bucket), dtype=torch.float32)
        others = torch.ones(x.numel(), dtype=torch.bool)
        others[k * bucket : (k + 1) * bucket] = False
        assert torch.isfinite(y[others]).all()
        assert_same(y[others], want[others])
        # decode_add_ propagates the NaN (AMP's GradScaler must see it).
        acc = torch.ones(x.numel(), dtype=dtype)
        codec.decode_add_(acc, p)
        assert torch.isnan(acc[k * bucket : (k + 1) * bucket]).all()
        assert not torch.isnan(acc[others]).any()


# ---- 4. stochastic rounding --------------------------------------------------------------------


@pytest.mark.parametrize("bits,frac", [(1, 0.3), (2, 0.3), (3, 0.9), (5, 0.125), (8, 0.6)])
def test_stochastic_rounding_is_unbiased(bits, frac):
    # Every bucket spans [0, 1] (its first two elements), so unit = 1 / L; the other elements lie
    # at frac of the way between two levels. A stochastic code rounds up with probability frac:
    # per-element error has mean 0 and sd unit * sqrt(frac * (1 - frac)), so the mean error of N
    # elements has sd sigma(N) = unit * sqrt(frac (1 - frac) / N). Nearest rounding errs by
    # -frac * unit (frac < 1/2) or (1 - frac) * unit on every element.
    L = (1 << bits) - 1
    unit = 1.0 / L
    bucket, n, seeds = 512, 1 << 15, 8
    gen = rng("unbiased", bits, frac)
    k = gen.integers(0, L, n)
    x = ((k + frac) / L).astype(np.float32)
    x[::bucket] = 0.0
    x[1::bucket] = 1.0
    keep = np.ones(n, dtype=bool)
    keep[::bucket] = keep[1::bucket] = False
    xt = torch.from_numpy(x)

    errors = []
    for s in range(seeds):
        p = codec.encode(xt, bits, bucket, stochastic=True, seed=1000 + s, stream=bits)
        y = codec.decode(p).numpy().astype(np.float64)
        errors.append((y - x)[keep])
    errors = np.concatenate(errors)
    sd = unit * math.sqrt(frac * (1 - frac))
    for count in (1 << 8, 1 << 12, 1 << 16, errors.size):
        sigma = sd / math.sqrt(count)
        mean = errors[:count].mean()
        assert abs(mean) < 5 * sigma, f"N={count}: mean error {mean} vs sigma {sigma}"
    # The spread is the one of a Bernoulli(frac) rounding: the 1/sqrt(N) rate above is the real one.
    assert errors.std() == pytest.approx(sd, rel=0.02)
    # Every element lands on one of its two neighbouring levels.
    assert np.all(np.abs(errors) < unit * (1 + 1e-5))

    p = codec.encode(xt, bits, bucket)  # nearest: biased, and the check above catches it
    nearest = (codec.decode(p).numpy().astype(np.float64) - x)[keep]
    want_bias = -frac * unit if frac < 0.5 else (1 - frac) * unit
    assert nearest.mean() == pytest.approx(want_bias, rel=1e-3)
    assert abs(nearest.mean()) > 50 * sd / math.sqrt(errors.size)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_stochastic_is_reproducible_per_seed_and_stream(dtype):
    x = torch.randn(5000, generator=torch.Generator().manual_seed(3)).to(dtype)

    def enc(seed, stream):
        return as_bytes(codec.encode(x, 3, 100, stochastic=True, seed=seed, stream=stream))

    a = enc(42, 7)
    assert enc(42, 7) == a
    others = {
        "stream": enc(42, 8),
        "seed": enc(43, 7),
        "swapped": enc(7, 42),
        "stream 2^63": enc(42, 7 | 1 << 63),
        "nearest": as_bytes(codec.encode(x, 3, 100)),
    }
    for what, b in others.items():
        assert len(b) == len(a)
        # Metadata is identical; only the codes differ, and in many places.
        assert b[24 : 24 + 8 * 50] == a[24 : 24 + 8 * 50], what
        differ = sum(u != v for u, v in zip(a[24 + 8 * 50 :], b[24 + 8 * 50 :]))
        assert differ > len(a) // 4, f"{what}: only {differ} code bytes differ"


@pytest.mark.parametrize("stochastic", [False, True], ids=["nearest", "stochastic"])
def test_same_bytes_whatever_the_thread_count(stochastic, restore_threads):
    n = (1 << 19) + 4321  # several parallel spans
    gen = rng("threads", stochastic)
    x = torch.from_numpy((gen.standard_normal(n) * 3).astype(np.float32))
    acc = torch.from_numpy(gen.standard_normal(n).astype(np.float32))
    results = []
    for threads in (1, 2):
        codec.set_num_threads(threads)
        assert codec.num_threads() == threads
        p = codec.encode(x, 3, 100, stochastic=stochastic, seed=17, stream=5)
        added = acc.clone()
        codec.decode_add_(added, p)
        results.append((as_bytes(p), codec.decode(p), added))
    (p1, y1, a1), (p2, y2, a2) = results
    assert p1 == p2
    assert p1 == oracle.encode(x.numpy(), "float32", 3, 100, stochastic, 17, 5)
    assert_same(y1, y2)
    assert_same(y1, torch.from_numpy(oracle.decode(p1)))
    assert_same(a1, a2)
