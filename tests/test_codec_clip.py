"""The clipped range of max-min (``clip=True``, docs/FORMAT.md "Clipped range"): the same bytes
as the numpy oracle, the mean squared error of Gaussian data that Max's optimal uniform quantizer
predicts, and the structure of what decodes (every value inside its bucket's clipped range, every
value that was inside it within half a step)."""

from __future__ import annotations

import codec_oracle as oracle
import numpy as np
import pytest
import torch
from codec_testing import (
    ALL_BITS,
    BUCKETS,
    DTYPE_IDS,
    DTYPES,
    NAMES,
    SIZES,
    as_bytes,
    assert_same,
    oracle_decode,
    random_input,
    raw_of,
    rng,
    special_input,
)

from torch_cgx import codec

# Max (1960), Table I: mean squared error of the optimal uniform quantizer of a unit Gaussian
# with 2, 4, 8, 16 levels.
MAX_MSE = {1: 0.3634, 2: 0.1188, 3: 0.03744, 4: 0.01154}


@pytest.mark.parametrize("bits", ALL_BITS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_clipped_encode_matches_oracle(dtype, bits):
    gen = rng("clip", dtype, bits)
    for n in SIZES + [2049]:
        for bucket in BUCKETS + [13, 1000]:
            x = random_input(n, dtype, gen)
            stochastic, skip = (bool(v) for v in gen.integers(0, 2, 2))
            seed = int(gen.integers(0, 2**63))
            got = codec.encode(x, bits, bucket, stochastic=stochastic, seed=seed, stream=n,
                               skip_incomplete_buckets=skip, clip=True)  # fmt: skip
            want = oracle.encode(raw_of(x), NAMES[dtype], bits, bucket, stochastic, seed, n, skip,
                                 clip=True)  # fmt: skip
            what = f"n={n} bucket={bucket} stochastic={stochastic} skip={skip}"
            assert as_bytes(got) == want, what
            assert_same(codec.decode(got), oracle_decode(got, dtype), what)


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("kind", ["denormal", "huge", "wide", "offset", "nonfinite", "mixed_scale"])
def test_clipped_extreme_values_match_oracle(kind, bits):
    gen = rng("clip-extreme", kind, bits)
    for n, bucket in [(100, 1), (100, 3), (257, 8), (300, 100), (1000, 512)]:
        x = special_input(kind, n, gen)
        got = codec.encode(torch.from_numpy(x), bits, bucket, clip=True)
        assert as_bytes(got) == oracle.encode(x, "float32", bits, bucket, clip=True), (n, bucket)
        assert_same(codec.decode(got), oracle_decode(got), f"n={n} bucket={bucket}")


def test_clipped_long_buckets_match_oracle():
    gen = rng("clip-long")
    for n, bucket in [(4099, 7), (12345, 2047), (12345, 5000), (3001, 2**32 - 1)]:
        x = torch.from_numpy(gen.standard_normal(n).astype(np.float32) * 3 + 1)
        got = codec.encode(x, 2, bucket, clip=True)
        assert as_bytes(got) == oracle.encode(raw_of(x), "float32", 2, bucket, clip=True), n


@pytest.mark.parametrize("bits", [1, 2, 3, 4])
def test_gaussian_error_is_the_optimal_uniform_quantizers(bits):
    # 2000 buckets of 512 unit-Gaussian values: max-min spans about 6 sigma per bucket; the
    # clipped range is Max's optimum, whose error the table gives (sampling error ~1 %, the
    # per-bucket mean and sigma estimates add ~0.5 %).
    x = torch.from_numpy(rng("clip-mse", bits).standard_normal(512 * 2000).astype(np.float32))
    mse = {}
    for clip in (False, True):
        mse[clip] = float((codec.decode(codec.encode(x, bits, 512, clip=clip)) - x).square().mean())
    assert abs(mse[True] / MAX_MSE[bits] - 1) < 0.05, mse
    assert mse[True] < mse[False] * {1: 0.1, 2: 0.4, 3: 0.65, 4: 0.9}[bits], mse


def test_what_decodes_lies_in_the_clipped_range():
    gen = rng("clip-structure")
    x = gen.standard_t(3, 512 * 64).astype(np.float32)  # heavy tails: most buckets clip
    bits, L = 2, 3
    p = codec.encode(torch.from_numpy(x), bits, 512, clip=True)
    info = codec.inspect(p)
    assert info["clipped"] and not info["stochastic"]
    meta = np.frombuffer(as_bytes(p)[24 : 24 + 64 * 8], np.float32).reshape(64, 2)
    lo, unit = meta[:, 0].astype(np.float64), meta[:, 1].astype(np.float64)
    y = codec.decode(p).numpy().astype(np.float64).reshape(64, 512)
    X = x.astype(np.float64).reshape(64, 512)
    hi = lo + L * unit
    tol = (np.abs(lo) + L * unit)[:, None] * 2.0**-22  # decoding rounds to fp32
    assert (y >= lo[:, None] - tol).all() and (y <= hi[:, None] + tol).all()
    assert (hi - lo < X.max(1) - X.min(1)).sum() >= 60  # the tails are clipped
    inside = (X >= lo[:, None]) & (X <= hi[:, None])
    err = np.abs(y - X)
    assert (err <= unit[:, None] * 0.5 + tol)[inside].all()
    outside = ~inside
    nearest = np.where(X < lo[:, None], lo[:, None], hi[:, None])
    assert (np.abs(y - nearest) <= tol)[outside].all() and outside.sum() > 64


def test_clip_flag_is_informational_and_unknown_flags_still_fail():
    x = torch.randn(1000)
    plain, clipped = codec.encode(x, 3, 100), codec.encode(x, 3, 100, clip=True)
    assert as_bytes(clipped)[7] == oracle.FLAG_CLIPPED and as_bytes(plain)[7] == 0
    assert codec.inspect(clipped)["clipped"] and not codec.inspect(plain)["clipped"]
    bad = clipped.clone()
    bad[7] = oracle.FLAG_CLIPPED | 8
    with pytest.raises(ValueError, match="unknown flags"):
        codec.decode(bad)


def test_constant_and_nonfinite_buckets_are_unchanged_by_clip():
    x = torch.tensor([2.5] * 100 + [float("nan")] + [1.0] * 99)
    for bits in (1, 4):
        a, b = codec.encode(x, bits, 100), codec.encode(x, bits, 100, clip=True)
        assert as_bytes(a)[8:] == as_bytes(b)[8:]
