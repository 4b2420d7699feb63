"""Tests of torch_cgx.codec against docs/FORMAT.md.

The C++ gtests (csrc/tests/) pin a few hand-made payloads and properties of the torch-free core.
These tests exercise the torch-facing API and compare it with an independent numpy transcription
of the spec (tests/codec_oracle.py): same bytes on encode, same values on decode.
"""

from __future__ import annotations

import math

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

# ---- 1. encode == the spec, byte for byte ------------------------------------------------------


def test_oracle_generator_matches_published_splitmix64():
    # SplitMix64 seeded with 0 (Steele, Lea & Flood; Vigna's splitmix64.c) first outputs this.
    assert oracle.splitmix64(0) == 0xE220A8397B1DCDAF
    assert oracle.fmix32(0) == 0
    # The vectorized generator is the literal one, including element indices >= 2^32.
    idx = np.array([0, 1, 7, 8, 2**31, 2**32 - 1, 2**32, 2**32 + 9, 2**40 + 3, 2**48 - 1])
    for seed, stream in [(0, 0), (1, 0), (0, 1), (2**64 - 1, 12345), (987654321, 2**63)]:
        want = [oracle.uniform(seed, stream, int(i)) for i in idx]
        got = oracle.uniform_array(seed, stream, idx)
        assert got.tolist() == want
        assert all(0.0 <= u < 1.0 for u in want)


@pytest.mark.parametrize("stochastic", [False, True], ids=["nearest", "stochastic"])
def test_tiny_golden(stochastic):
    # fp16 [0, 1, 2, 3], 2 bits, bucket 4: min 0, unit 1, codes 0 1 2 3 -> 0b11100100. The inputs
    # sit exactly on levels, so stochastic rounding (r < 1) cannot move them: same codes, flag 2.
    x = torch.tensor([0.0, 1.0, 2.0, 3.0], dtype=torch.float16)
    got = codec.encode(x, bits=2, bucket_size=4, stochastic=stochastic, seed=3, stream=4)
    want = (
        b"CGXQ"
        + bytes([1, 1, 2, 2 if stochastic else 0])
        + bytes([4, 0, 0, 0, 0, 0, 0, 0])
        + bytes([4, 0, 0, 0, 0, 0, 0, 0])
        + bytes([0, 0, 0, 0, 0x00, 0x00, 0x80, 0x3F])
        + bytes([0xE4])
    )
    assert got.dtype == torch.uint8 and got.dim() == 1
    assert as_bytes(got) == want


@pytest.mark.parametrize("bits", ALL_BITS)
@pytest.mark.parametrize("skip", [False, True], ids=["quantize_tail", "raw_tail"])
@pytest.mark.parametrize("stochastic", [False, True], ids=["nearest", "stochastic"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_encode_matches_oracle(dtype, stochastic, skip, bits):
    gen = rng("encode", dtype, stochastic, skip, bits)
    for n in SIZES:
        for bucket in BUCKETS:
            x = random_input(n, dtype, gen)
            seed, stream = (int(v) for v in gen.integers(0, 2**64, 2, dtype=np.uint64))
            got = codec.encode(
                x,
                bits,
                bucket,
                stochastic=stochastic,
                seed=seed,
                stream=stream,
                skip_incomplete_buckets=skip,
            )
            want = oracle.encode(
                raw_of(x), NAMES[dtype], bits, bucket, stochastic, seed, stream, skip
            )
            assert as_bytes(got) == want, f"n={n} bucket={bucket} seed={seed} stream={stream}"


@pytest.mark.parametrize("bits", ALL_BITS)
@pytest.mark.parametrize("kind", ["denormal", "huge", "wide", "offset", "nonfinite", "mixed_scale"])
def test_encode_and_decode_match_oracle_on_extreme_values(kind, bits):
    gen = rng("extreme", kind, bits)
    for n, bucket in [(100, 1), (100, 3), (257, 8), (300, 100), (1000, 512)]:
        x = special_input(kind, n, gen)
        for stochastic in (False, True):
            what = f"n={n} bucket={bucket} stochastic={stochastic}"
            got = codec.encode(torch.from_numpy(x), bits, bucket, stochastic=stochastic, seed=n)
            want = oracle.encode(x, "float32", bits, bucket, stochastic, seed=n)
            assert as_bytes(got) == want, what
            assert_same(codec.decode(got), oracle_decode(got), what)


@pytest.mark.parametrize("values", [[-0.0, 0.0, 1.0], [0.0, -0.0, 1.0], [0.0] * 9 + [-0.0, 2.0]])
def test_signed_zero_minimum(values):
    # Which zero is the minimum is not specified (the two compare equal), and the metadata may
    # hold either; the decoded values do not depend on it: -0 + q * unit == +0 + q * unit.
    x = np.array(values, dtype=np.float32)
    p = codec.encode(torch.from_numpy(x), bits=2, bucket_size=512)
    mn = as_bytes(p)[24:28]
    assert mn in (bytes(4), bytes([0, 0, 0, 0x80]))
    want = oracle.decode(oracle.encode(x, "float32", 2, 512))
    assert_same(codec.decode(p), torch.from_numpy(want))
    assert_same(codec.decode(p), oracle_decode(p))


@pytest.mark.parametrize("bits", [1, 3, 4, 7, 8])
def test_encode_matches_oracle_on_long_buckets(bits):
    # Buckets longer than the encoder's internal tiles, odd sizes, the largest bucket size.
    gen = rng("long", bits)
    for n, bucket in [(4099, 7), (12345, 2047), (12345, 5000), (3001, 2**32 - 1)]:
        x = torch.from_numpy(gen.standard_normal(n).astype(np.float32))
        for stochastic in (False, True):
            for skip in (False, True):
                got = codec.encode(
                    x,
                    bits,
                    bucket,
                    stochastic=stochastic,
                    seed=bits,
                    stream=n,
                    skip_incomplete_buckets=skip,
                )
                want = oracle.encode(raw_of(x), "float32", bits, bucket, stochastic, bits, n, skip)
                assert as_bytes(got) == want, f"n={n} bucket={bucket}"


# ---- 2. decode and decode_add_ -----------------------------------------------------------------


def sample_payloads(dtype: torch.dtype, key: str):
    """Payloads of every flavour: raw tail, non-finite and constant buckets, wide and denormal
    buckets, stochastic rounding, all bit widths."""
    gen = rng("payloads", dtype, key)
    for bits in ALL_BITS:
        n = int(gen.integers(1, 400))
        bucket = int(gen.choice([1, 3, 8, 100, 512]))
        x = gen.standard_normal(n) * 10.0 ** gen.integers(-3, 4)
        x[gen.random(n) < 0.01] = np.nan
        x[: min(n, bucket)] = x[0]  # a constant first bucket
        if dtype == torch.float32:  # a denormal bucket and a bucket wider than FLT_MAX
            x[bucket : 2 * bucket] = gen.standard_normal(len(x[bucket : 2 * bucket])) * 1e-40
            x[2 * bucket : 3 * bucket] = gen.uniform(-3e38, 3e38, len(x[2 * bucket : 3 * bucket]))
        t = torch.from_numpy(x.astype(np.float32)).to(dtype)
        yield codec.encode(
            t,
            bits,
            bucket,
            stochastic=bool(bits & 2),
            seed=bits,
            skip_incomplete_buckets=bool(bits & 4),
        )


@pytest.mark.parametrize("out_dtype", DTYPES, ids=["out_" + i for i in DTYPE_IDS])
@pytest.mark.parametrize("in_dtype", DTYPES, ids=["in_" + i for i in DTYPE_IDS])
def test_decode_matches_oracle(in_dtype, out_dtype):
    for p in sample_payloads(in_dtype, "decode"):
        info = codec.inspect(p)
        want = oracle_decode(p, out_dtype)
        assert_same(codec.decode(p, dtype=out_dtype), want, f"decode {info}")
        out = torch.full((info["count"],), 7.0, dtype=out_dtype)
        assert codec.decode(p, out=out) is out
        assert_same(out, want, f"decode(out=) {info}")


@pytest.mark.parametrize("out_dtype", DTYPES, ids=["out_" + i for i in DTYPE_IDS])
@pytest.mark.parametrize("in_dtype", DTYPES, ids=["in_" + i for i in DTYPE_IDS])
def test_decode_add_is_one_rounding_of_the_fp32_sum(in_dtype, out_dtype):
    gen = rng("add", in_dtype, out_dtype)
    for p in sample_payloads(in_dtype, "add"):
        n = codec.inspect(p)["count"]
        # Wide accumulators: fp16 sums overflow to Inf, bf16 sums round.
        acc = torch.from_numpy(
            (gen.standard_normal(n) * 10.0 ** gen.integers(0, 5)).astype(np.float32)
        )
        acc[: n // 3] = 65000.0
        acc = acc.to(out_dtype)
        want = (acc.float() + codec.decode(p, dtype=torch.float32)).to(out_dtype)
        assert codec.decode_add_(acc, p) is acc
        assert_same(acc, want, f"decode_add_ {codec.inspect(p)}")


def test_decode_add_matches_the_documented_formula():
    # fp32 payload: decode(p) is x' itself, so out += decode(p) is the reference as written.
    x = torch.linspace(300.0, -300.0, 1000)
    p = codec.encode(x, bits=5, bucket_size=64)
    for dtype in DTYPES:
        out = torch.linspace(65400.0, -65400.0, 1000).to(dtype)
        want = (out.float() + codec.decode(p).float()).to(dtype)
        assert torch.isinf(want).any() == (dtype == torch.float16)  # fp16 sums overflow
        codec.decode_add_(out, p)
        assert_same(out, want, str(dtype))


@pytest.mark.parametrize("add", [False, True], ids=["decode", "decode_add_"])
@pytest.mark.parametrize("layout", ["transposed", "strided_slice", "offset_slice", "column_of_3d"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_decode_into_views(dtype, layout, add):
    gen = rng("views", dtype, layout, add)
    if layout == "transposed":
        base = torch.full((6, 7), -5.0, dtype=dtype)
        view = base.t()  # 7 x 6, not contiguous
    elif layout == "strided_slice":
        base = torch.full((90,), -5.0, dtype=dtype)
        view = base[1::3]
    elif layout == "offset_slice":
        base = torch.full((60,), -5.0, dtype=dtype)
        view = base[11:53]  # contiguous, storage offset 11
    else:
        base = torch.full((3, 7, 4), -5.0, dtype=dtype)
        view = base[:, :, 2]
    n = view.numel()
    x = torch.from_numpy(gen.standard_normal(n).astype(np.float32))
    p = codec.encode(x, bits=4, bucket_size=5)
    decoded = codec.decode(p, dtype=torch.float32)
    if add:
        start = torch.from_numpy(gen.standard_normal(n).astype(np.float32)).to(dtype)
        view.copy_(start.reshape(view.shape))
        want = (start.float() + decoded).to(dtype)
    else:
        want = decoded.to(dtype)
    untouched = torch.ones_like(base, dtype=torch.bool)
    untouched.as_strided(view.shape, view.stride(), view.storage_offset()).fill_(False)
    before = base.clone()

    result = codec.decode_add_(view, p) if add else codec.decode(p, out=view)
    assert result is view
    # Elements are written in view's row-major order; nothing else in the storage changes.
    assert_same(view.reshape(-1), want, layout)
    assert torch.equal(base[untouched], before[untouched])


@pytest.mark.parametrize("in_dtype", DTYPES, ids=DTYPE_IDS)
def test_decode_dtype_default_and_override(in_dtype):
    x = torch.randn(100, generator=torch.Generator().manual_seed(1)).to(in_dtype) * 1000
    p = codec.encode(x, bits=8, bucket_size=16, skip_incomplete_buckets=True)
    default = codec.decode(p)
    assert default.dtype == in_dtype and default.shape == (100,)
    full = codec.decode(p, dtype=torch.float32)
    assert_same(default, full.to(in_dtype))
    assert_same(full, oracle_decode(p))
    for dtype in DTYPES:
        got = codec.decode(p, dtype=dtype)
        assert got.dtype == dtype and got.shape == (100,)
        assert_same(got, full.to(dtype), str(dtype))
    assert_same(full[96:], x[96:].float())  # the raw tail comes back exactly


def test_decode_out_is_keyword_only():
    # decode_add_(out, payload) puts the destination first; decode takes it by keyword only, so
    # the two can never be confused positionally.
    x = torch.randn(64)
    p = codec.encode(x, bits=8, bucket_size=16)
    out = torch.empty(64)
    with pytest.raises(TypeError):
        codec.decode(p, out)
    assert codec.decode(p, out=out) is out
    acc = torch.zeros(64)
    assert codec.decode_add_(acc, p) is acc and torch.equal(acc, out)


@pytest.mark.parametrize("shape", [(), (1,), (3, 4), (4, 3), (2, 3, 5), (5, 0), (7, 1, 9)], ids=str)
def test_any_shape_is_read_row_major(shape):
    gen = rng("shape", shape)
    x = torch.from_numpy(np.asarray(gen.standard_normal(shape), dtype=np.float32))
    for bucket in (1, 4, 512):
        p = codec.encode(x, bits=3, bucket_size=bucket, stochastic=True, seed=9)
        flat = codec.encode(x.reshape(-1), bits=3, bucket_size=bucket, stochastic=True, seed=9)
        assert torch.equal(p, flat)
        assert codec.inspect(p)["count"] == x.numel()
        out = torch.empty(shape)
        codec.decode(p, out=out)
        assert_same(out.reshape(-1), codec.decode(p))
    if x.dim() >= 2:  # a transposed (non-contiguous) input is read in its own row-major order
        xt = x.transpose(0, -1)
        before = xt.clone()
        got = codec.encode(xt, bits=5, bucket_size=3)
        assert torch.equal(got, codec.encode(xt.contiguous().reshape(-1), bits=5, bucket_size=3))
        assert as_bytes(got) == oracle.encode(xt.contiguous().reshape(-1).numpy(), "float32", 5, 3)
        assert torch.equal(xt, before)  # input untouched


def test_empty_buffer():
    for dtype in DTYPES:
        p = codec.encode(torch.empty(0, dtype=dtype))
        assert len(p) == 24
        assert codec.decode(p).shape == (0,) and codec.decode(p).dtype == dtype
        out = torch.empty(0, dtype=torch.float32)
        assert codec.decode_add_(out, p) is out


def test_payload_may_be_a_view():
    x = torch.randn(50, generator=torch.Generator().manual_seed(2))
    p = codec.encode(x, bits=6, bucket_size=7)
    spread = torch.zeros(2 * len(p), dtype=torch.uint8)
    spread[::2] = p
    assert_same(codec.decode(spread[::2]), codec.decode(p))
    assert codec.inspect(spread[::2]) == codec.inspect(p)


# ---- 5. wire size ------------------------------------------------------------------------------


@pytest.mark.parametrize("bits", ALL_BITS)
def test_encoded_size(bits):
    sizes = [0, 1, 2, 7, 8, 9, 15, 16, 17, 100, 511, 512, 513, 1000, 4097]
    for n in sizes:
        for bucket in (1, 2, 3, 7, 8, 100, 512, 1000):
            plain = 24 + 8 * math.ceil(n / bucket) + math.ceil(n * bits / 8)
            for dtype in DTYPES:
                x = torch.zeros(n, dtype=dtype)
                assert codec.encoded_size(n, bits, bucket, dtype) == plain
                assert len(codec.encode(x, bits, bucket)) == plain
                nq = n - n % bucket
                raw = (
                    24 + 8 * (nq // bucket) + math.ceil(nq * bits / 8) + (n - nq) * x.element_size()
                )
                assert codec.encoded_size(n, bits, bucket, dtype, True) == raw
                assert len(codec.encode(x, bits, bucket, skip_incomplete_buckets=True)) == raw


def test_encoded_size_is_proportional_to_bits_and_has_defaults():
    # Eight codes take exactly `bits` bytes: with n a multiple of 8, the code section is n*b/8.
    for bits in ALL_BITS:
        assert codec.encoded_size(4096, bits, 512) - codec.encoded_size(0, bits, 512) == (
            8 * 8 + 4096 * bits // 8
        )
    assert codec.encoded_size(1000) == 24 + 8 * 2 + 500  # 4 bits, buckets of 512
    assert codec.encoded_size(2**48, 8, 2**32 - 1) == 24 + 8 * 65537 + 2**48
    with pytest.raises(ValueError, match=r"element count must be in \[0, 2\^48\]"):
        codec.encoded_size(2**48 + 1)
    with pytest.raises(ValueError, match="element count"):
        codec.encoded_size(-1)
