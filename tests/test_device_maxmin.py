"""The max-min device codec (torch_cgx/device/codecs/maxmin.py) on CPU tensors: byte for byte the
native codec (torch_cgx.codec) for every lever, and the native decoder's values."""

from __future__ import annotations

import itertools
import math
import os

import numpy as np
import pytest
import torch
from codec_testing import ALL_BITS, DTYPE_IDS, DTYPES, assert_same, rng, special_input

from torch_cgx import codec
from torch_cgx.device import codecs
from torch_cgx.device.codecs import maxmin

SIZES = [0, 1, 7, 8, 9, 1000, 70001]
BUCKETS = [1, 3, 7, 8, 512, 513, 1000]
LEVERS = list(itertools.product([0, 1], [0, 1], [0, 1]))  # raw tail, stochastic, clip


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tensor ops on one thread: on a loaded 2-core machine torch's two threads cost more than
    they give on these sizes (the results do not depend on it)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _device(bits, bucket_size, skip=0, stochastic=0, clip=0):
    return codecs.get("maxmin", bits=bits, bucket_size=bucket_size,
                      skip_incomplete_buckets=skip, stochastic=stochastic, clip=clip)  # fmt: skip


def _native(x, bits, bucket_size, skip=0, stochastic=0, clip=0, seed=0, stream=0):
    flags = {"skip_incomplete_buckets": bool(skip), "clip": bool(clip)}
    return codec.encode(x, bits, bucket_size, stochastic=bool(stochastic), seed=seed,
                        stream=stream, **flags)  # fmt: skip


def _check(x, bits, bucket_size, skip=0, stochastic=0, clip=0, seed=0, stream=0, what=""):
    """Device encode == native encode; device values == native decode (fp32)."""
    dev = _device(bits, bucket_size, skip, stochastic, clip)
    got = dev.encode(x, seed=seed, stream=stream)
    want = _native(x, bits, bucket_size, skip, stochastic, clip, seed, stream)
    assert got.dtype == torch.uint8 and got.numel() == dev.encoded_size(x.numel(), x.dtype), what
    if not torch.equal(got, want):
        first = int((got != want).nonzero()[0]) if got.numel() == want.numel() else -1
        pytest.fail(f"{what}: {got.numel()} vs {want.numel()} bytes, first difference at {first}")
    assert_same(dev.values(want, x.numel(), x.dtype), codec.decode(want, dtype=torch.float32), what)
    return want


@pytest.mark.parametrize("bits", ALL_BITS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_encode_is_the_native_codecs_bytes(dtype, bits):
    """Every size, bucket size and lever combination (raw tail, stochastic, clip) on random
    input: Gaussian or small integers (ties, grid points, constant buckets)."""
    g = rng("device maxmin", bits, str(dtype))
    for n, bucket in itertools.product(SIZES, BUCKETS):
        if g.random() < 0.5:
            x = g.standard_normal(n) * 3.0 + 1.0
        else:
            x = g.integers(-4, 5, n).astype(np.float64)
        x = torch.from_numpy(x.astype(np.float32)).to(dtype)
        # each combination at least once per bits / dtype, the rest sampled: a full product of
        # 8 levers x 49 shapes x 24 configurations would take minutes here
        for lever in LEVERS if n in (9, 1000) else [LEVERS[int(g.integers(len(LEVERS)))]]:
            seed, stream = int(g.integers(2**63)), int(g.integers(2**63))
            _check(x, bits, bucket, *lever, seed=seed, stream=stream,
                   what=f"n={n} B={bucket} levers={lever}")  # fmt: skip


KINDS = ["denormal", "huge", "wide", "offset", "nonfinite", "mixed_scale"]


@pytest.mark.parametrize("kind", KINDS)
def test_extreme_values_match(kind):
    """Both paths of step 4 (denormal buckets and ranges past FLT_MAX take the fp64 one),
    non-finite buckets, 1-bit step overflow, both decode paths, every bits and dtype."""
    g = rng("device maxmin extreme", kind)
    for bits, dtype in itertools.product(ALL_BITS, DTYPES):
        x = torch.from_numpy(special_input(kind, 1100, g)).to(dtype)
        for bucket, lever in ((7, LEVERS[int(g.integers(8))]), (512, LEVERS[int(g.integers(8))])):
            _check(x, bits, bucket, *lever, seed=3, stream=bits, what=f"{kind} {dtype} b={bits}")


def test_constant_zero_and_signed_zero_buckets():
    """Constant buckets (metadata (mn, 0), codes 0), zero minima stored as +0.0 whatever the
    zeros' signs, and fp16 / bf16 extremes."""
    x = torch.tensor([-0.0, 0.0, -0.0, 1.0] + [5.0] * 8 + [-0.0] * 8 + [0.0, -0.0] * 4)
    for bits, lever in itertools.product(ALL_BITS, LEVERS):
        _check(x, bits, 8, *lever, what=f"zeros b={bits} {lever}")
    half = torch.tensor([65504.0, -65504.0, 6e-8, -6e-8, 0.0, 1.0, 2.0, 3.0], dtype=torch.float16)
    bf = torch.tensor([3.38e38, -3.38e38, 1e-39, 0.0, 1.0, -1.0, 7.0, 8.0], dtype=torch.bfloat16)
    for x, bits in itertools.product((half, bf), ALL_BITS):
        _check(x, bits, 3, what=f"{x.dtype} extremes b={bits}")
        _check(x, bits, 8, 0, 1, what=f"{x.dtype} extremes stochastic b={bits}")


def test_clip_sums_over_long_buckets_use_the_lane_order():
    """Buckets longer than LOOP_ROWS * 8 take the cumsum branch of lane_sum (sequential on the
    CPU); both branches give FORMAT.md's order, checked against a Python loop too."""
    g = rng("device maxmin clip long")
    x = torch.from_numpy((g.standard_normal(3 * 4096 + 100) * 1e3).astype(np.float32))
    for bits in (2, 4, 8):
        _check(x, bits, 4096, 0, 0, 1, what=f"clip 4096 b={bits}")
        _check(x, bits, 2051, 1, 1, 1, seed=1, stream=2, what=f"clip 2051 b={bits}")
    v = torch.from_numpy(g.standard_normal((3, 1037)) * 10.0 ** g.integers(-5, 5, (3, 1037)))
    for row in range(3):
        lanes = [0.0] * 8
        for i, value in enumerate(v[row].tolist()):
            lanes[i % 8] += value
        want = 0.0
        for s in lanes:
            want += s
        for loop_rows in (0, 10**6):
            assert maxmin.lane_sum(v, loop_rows)[row].item() == want


@pytest.mark.parametrize("out_dtype", DTYPES, ids=DTYPE_IDS)
def test_decode_add_rounds_once_like_the_native_decoder(out_dtype):
    """decode and decode_add_ into each dtype, from payloads with raw tails, non-finite buckets
    and both decode paths; fp16 sums past 65504 become Inf."""
    g = rng("device maxmin decode_add", str(out_dtype))
    for kind, bits, bucket in itertools.product(("mixed_scale", "nonfinite", "huge"), (1, 4, 8),
                                                (3, 512)):  # fmt: skip
        x = torch.from_numpy(special_input(kind, 1030, g)).to(out_dtype)
        if kind == "mixed_scale" and out_dtype == torch.float16:
            x = torch.from_numpy(g.standard_normal(1030).astype(np.float32) * 3e4).half()
        dev = _device(bits, bucket, skip=1)
        payload = _native(x, bits, bucket, skip=1)
        out0 = torch.from_numpy((g.standard_normal(1030) * 4e4).astype(np.float32)).to(out_dtype)
        got, want = out0.clone(), out0.clone()
        dev.decode_add_(got, payload)
        codec.decode_add_(want, payload)
        assert_same(got, want, f"decode_add {kind} b={bits} B={bucket}")
        assert_same(dev.decode(payload, 1030, out_dtype), codec.decode(payload), f"decode {kind}")


def test_header_ok_compares_every_field_but_the_informational_flags():
    dev = _device(4, 8, skip=1, stochastic=1, clip=1)
    x = torch.randn(21)
    p = dev.encode(x, seed=1)
    assert dev.header(21, torch.float32).tolist() == p[:24].tolist()
    assert bool(dev.header_ok(p, 21, torch.float32))
    assert not bool(dev.header_ok(p, 22, torch.float32))  # count
    assert not bool(dev.header_ok(p, 21, torch.float16))  # dtype
    assert not bool(dev.header_ok(p[:23], 21, torch.float32))
    for offset in [0, 3, 4, 5, 6, 8, 11, 12, 15, 16, 23]:
        bad = p.clone()
        bad[offset] ^= 1
        assert not bool(dev.header_ok(bad, 21, torch.float32)), offset
    bad = p.clone()
    bad[7] ^= maxmin.FLAG_RAW_TAIL
    assert not bool(dev.header_ok(bad, 21, torch.float32))
    for flag in (maxmin.FLAG_STOCHASTIC, maxmin.FLAG_CLIPPED):
        other = p.clone()
        other[7] ^= flag
        assert bool(dev.header_ok(other, 21, torch.float32))


def test_encoded_size_is_the_native_one():
    for n, bucket, bits, skip, dtype in itertools.product(
        SIZES, BUCKETS, (1, 5, 8), (0, 1), DTYPES
    ):
        want = codec.encoded_size(n, bits, bucket, dtype, bool(skip))
        assert _device(bits, bucket, skip).encoded_size(n, dtype) == want


def test_bad_input_raises_clear_errors():
    for bad in ({"bits": 0}, {"bits": 9}, {"bucket_size": 0}, {"bucket_size": 2**32},
                {"stochastic": 2}, {"bits": 2.5}, {"clip": "yes"}):  # fmt: skip
        with pytest.raises(ValueError, match="maxmin parameter"):
            codecs.get("maxmin", **bad)
    with pytest.raises(ValueError, match="no parameter 'rounding'"):
        codecs.get("maxmin", rounding=1)
    dev = _device(4, 8)
    with pytest.raises(ValueError, match="dtype"):
        dev.encode(torch.zeros(4, dtype=torch.float64))
    with pytest.raises(TypeError, match="torch.Tensor"):
        dev.encode([1.0, 2.0])
    with pytest.raises(ValueError, match="seed"):
        dev.encode(torch.zeros(4), seed=-1)
    p = dev.encode(torch.randn(20))
    with pytest.raises(ValueError, match="holds 40 bytes"):
        dev.values(p[:40], 20, torch.float32)
    with pytest.raises(ValueError, match="holds"):
        dev.decode_add_(torch.zeros(21), p)
    with pytest.raises(ValueError, match="uint8"):
        dev.values(p.float(), 20, torch.float32)
    with pytest.raises(ValueError, match="dtype"):
        dev.decode_add_(torch.zeros(20, dtype=torch.float64), p)
    with pytest.raises(TypeError, match="out must be a torch.Tensor"):
        dev.decode_add_([0.0] * 20, p)
    with pytest.raises(ValueError, match="payload is on meta, out on cpu"):
        dev.decode_add_(torch.zeros(20), p.to("meta"))


def test_encode_reads_any_shape_in_row_major_order():
    x = torch.randn(6, 50).t()  # not contiguous
    dev = _device(3, 16, stochastic=1)
    assert torch.equal(dev.encode(x, seed=2, stream=1), _native(x, 3, 16, 0, 1, 0, 2, 1))
    assert math.isclose(dev.encoded_size(300), codec.encoded_size(300, 3, 16))


def cuda_or_skip() -> torch.device:
    """The CUDA device, or a skip (a failure under ``CGX_TEST_REQUIRE_CUDA=1``: the GPU check)."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if os.environ.get("CGX_TEST_REQUIRE_CUDA") == "1":
        pytest.fail("CGX_TEST_REQUIRE_CUDA=1, but torch sees no CUDA device")
    pytest.skip("no CUDA device")


@pytest.mark.parametrize("kernels_mode", ["reference", "auto"])
def test_cuda_tensors_give_the_native_bytes(monkeypatch, kernels_mode):
    """On a GPU: the tensor operations (reference) and whatever auto selects give the CPU
    codec's bytes and values for CUDA tensors (docs/gpu.md says which formulations may not)."""
    cuda = cuda_or_skip()
    from torch_cgx.device import kernels

    monkeypatch.setenv("CGX_DEVICE_KERNELS", kernels_mode)
    kernels.reset()
    g = rng("device maxmin cuda", kernels_mode)
    try:
        for bits, dtype, bucket, lever in itertools.product(
            (1, 4, 8), DTYPES, (7, 512, 1000), LEVERS
        ):
            x = torch.from_numpy(special_input("mixed_scale", 3001, g)).to(dtype)
            dev = _device(bits, bucket, *lever)
            want = _native(x, bits, bucket, *lever, seed=5, stream=6)
            got = dev.encode(x.to(cuda), seed=5, stream=6)
            assert got.device.type == "cuda"
            assert torch.equal(got.cpu(), want), (bits, dtype, bucket, lever)
            out0 = torch.from_numpy(g.standard_normal(3001).astype(np.float32)).to(dtype)
            out, ref = out0.to(cuda), out0.clone()
            dev.decode_add_(out, want.to(cuda))
            codec.decode_add_(ref, want)
            assert_same(out.cpu(), ref, f"decode_add {bits} {dtype} {bucket} {lever}")
    finally:
        kernels.reset()


def test_code_packing_is_the_shared_bit_stream():
    """maxmin's word-wise packing gives base.pack_bits' stream (FORMAT.md "Codes"), and unpacking
    ignores whatever follows the stream."""
    from torch_cgx.device.codecs.base import pack_bits

    g = torch.Generator().manual_seed(3)
    for bits, n in itertools.product(ALL_BITS, (0, 1, 7, 8, 9, 100, 1001)):
        c = torch.randint(0, 1 << bits, (n,), dtype=torch.int32, generator=g)
        packed = maxmin.pack_codes(c, bits)
        assert torch.equal(packed, pack_bits(c, bits)), (bits, n)
        trailing = torch.cat([packed, torch.full((5,), 255, dtype=torch.uint8)])
        assert torch.equal(maxmin.unpack_codes(trailing, n, bits), c), (bits, n)
