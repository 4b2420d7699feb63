"""Bad input to torch_cgx.codec: every malformed argument and payload gives a clear ValueError,
never a crash or an out-of-bounds read (docs/FORMAT.md, "Validation on decode")."""

from __future__ import annotations

import math
import re

import codec_oracle as oracle
import numpy as np
import pytest
import torch
from codec_testing import (
    DTYPE_IDS,
    DTYPES,
    NAMES,
    as_bytes,
    assert_same,
    from_bytes,
    oracle_decode,
    rng,
)

from torch_cgx import codec

# ---- 6. bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize("bits", [0, 9, -1, 16])
def test_bad_bits(bits):
    x = torch.ones(10)
    msg = re.escape(f"bits must be in [1, 8], got {bits}")
    with pytest.raises(ValueError, match=msg):
        codec.encode(x, bits=bits)
    with pytest.raises(ValueError, match=msg):
        codec.encoded_size(10, bits=bits)


@pytest.mark.parametrize("bucket", [0, -3, 2**32])
def test_bad_bucket_size(bucket):
    msg = re.escape(f"bucket_size must be in [1, 2^32 - 1], got {bucket}")
    with pytest.raises(ValueError, match=msg):
        codec.encode(torch.ones(10), bucket_size=bucket)
    with pytest.raises(ValueError, match=msg):
        codec.encoded_size(10, bucket_size=bucket)


@pytest.mark.parametrize(
    "dtype", [torch.float64, torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64]
)
def test_unsupported_dtype(dtype):
    x = torch.zeros(8, dtype=dtype)
    with pytest.raises(
        ValueError, match=rf"float32, float16 or bfloat16, got {re.escape(str(dtype))}"
    ):
        codec.encode(x)
    with pytest.raises(ValueError, match=re.escape(str(dtype))):
        codec.encoded_size(8, dtype=dtype)
    p = codec.encode(torch.zeros(8))
    with pytest.raises(ValueError, match=rf"out must be .*got {re.escape(str(dtype))}"):
        codec.decode(p, out=x)
    with pytest.raises(ValueError, match=rf"out must be .*got {re.escape(str(dtype))}"):
        codec.decode_add_(x, p)
    with pytest.raises(ValueError, match=re.escape(str(dtype))):
        codec.decode(p, dtype=dtype)


@pytest.mark.parametrize(
    "obj", [[1.0, 2.0], np.ones(4, np.float32), 3.0, None], ids=["list", "ndarray", "float", "None"]
)
def test_non_tensor_input(obj):
    name = type(obj).__name__
    with pytest.raises(TypeError, match=f"tensor must be a torch.Tensor, got {name}"):
        codec.encode(obj)
    p = codec.encode(torch.zeros(4))
    with pytest.raises(TypeError, match=f"out must be a torch.Tensor, got {name}"):
        codec.decode_add_(obj, p)


@pytest.mark.parametrize("seed,stream", [(-1, 0), (0, -1), (2**64, 0), (0, 2**64)])
def test_seed_and_stream_range(seed, stream):
    with pytest.raises(ValueError, match=re.escape("seed and stream must be in [0, 2^64)")):
        codec.encode(torch.ones(4), stochastic=True, seed=seed, stream=stream)


GOOD_N = 100


def good_payload() -> bytearray:
    x = torch.arange(GOOD_N, dtype=torch.float32) % 17 - 8
    return bytearray(as_bytes(codec.encode(x, bits=3, bucket_size=10)))


def _set(offset: int, *values: int):
    def corrupt(b: bytearray) -> bytearray:
        b[offset : offset + len(values)] = bytes(values)
        return b

    return corrupt


GOOD_SIZE = 24 + 8 * 10 + math.ceil(GOOD_N * 3 / 8)
CORRUPTIONS = {
    "magic": (_set(0, ord("X")), "bad magic"),
    "magic_last": (_set(3, ord("q")), "bad magic"),
    "version_2": (_set(4, 2), "format version 2, this build reads version 1"),
    "version_0": (_set(4, 0), "format version 0"),
    "dtype_3": (_set(5, 3), "unknown dtype code 3"),
    "dtype_255": (_set(5, 255), "unknown dtype code 255"),
    "bits_0": (_set(6, 0), r"bits 0 not in \[1, 8\]"),
    "bits_9": (_set(6, 9), r"bits 9 not in \[1, 8\]"),
    "bits_4": (_set(6, 4), "truncated"),  # valid bits, but more bytes than there are
    "bits_2": (_set(6, 2), "trailing bytes"),
    "flags_8": (_set(7, 8), "unknown flags 0x8"),
    "flags_80": (_set(7, 0x80), "unknown flags 0x80"),
    "bucket_0": (_set(8, 0, 0, 0, 0), "bucket size 0"),
    "bucket_5": (_set(8, 5), "truncated"),
    "reserved": (_set(13, 1), "reserved field is not 0"),
    "count_2^48+": (_set(22, 1, 0), r"exceeds 2\^48"),
    "count_101": (_set(16, 101), "truncated"),
    "truncated_1": (
        lambda b: b[:-1],
        f"truncated: header describes {GOOD_SIZE} bytes, got {GOOD_SIZE - 1}",
    ),
    "truncated_header": (lambda b: b[:10], "shorter than the 24-byte header"),
    "empty": (lambda b: b[:0], "truncated"),
    "trailing_1": (lambda b: b + b"\0", f"1 trailing bytes after the {GOOD_SIZE}"),
    "trailing_9": (lambda b: b + bytes(9), "9 trailing bytes"),
}


@pytest.mark.parametrize("entry", ["decode", "decode_out", "decode_add_", "inspect"])
@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_corrupt_header_or_length_is_rejected(case, entry):
    corrupt, fragment = CORRUPTIONS[case]
    assert len(good_payload()) == GOOD_SIZE
    p = from_bytes(corrupt(good_payload()))
    out = torch.full((GOOD_N,), 3.25)
    with pytest.raises(ValueError, match=fragment):
        if entry == "decode":
            codec.decode(p)
        elif entry == "decode_out":
            codec.decode(p, out=out)
        elif entry == "decode_add_":
            codec.decode_add_(out, p)
        else:
            codec.inspect(p)
    assert (out == 3.25).all(), "a rejected payload must not touch the output"


@pytest.mark.parametrize("shape", [(99,), (101,), (10, 11), (0,)], ids=str)
def test_wrong_output_element_count(shape):
    p = from_bytes(good_payload())
    msg = f"payload holds {GOOD_N} elements but the output has {math.prod(shape)}"
    for dtype in DTYPES:
        out = torch.full(shape, 3.0, dtype=dtype)
        with pytest.raises(ValueError, match=msg):
            codec.decode(p, out=out)
        with pytest.raises(ValueError, match=msg):
            codec.decode_add_(out, p)
        assert (out == 3.0).all()
    codec.decode(p, out=torch.empty(4, 25))  # the right count in any shape is fine


@pytest.mark.parametrize(
    "make",
    [
        lambda p: p.to(torch.int8),
        lambda p: p.float(),
        lambda p: p.to(torch.int32),
        lambda p: bytes(p.numpy()),
        lambda p: p.numpy(),
    ],
    ids=["int8", "float32", "int32", "bytes", "ndarray"],
)
def test_payload_must_be_uint8_tensor(make):
    p = make(from_bytes(good_payload()))
    msg = "payload must be a uint8 tensor"
    with pytest.raises(ValueError, match=msg):
        codec.decode(p)
    with pytest.raises(ValueError, match=msg):
        codec.decode_add_(torch.zeros(GOOD_N), p)
    with pytest.raises(ValueError, match=msg):
        codec.inspect(p)


@pytest.mark.parametrize(
    "bits,bucket,skip", [(5, 7, False), (1, 1, False), (8, 64, True), (3, 512, True)]
)
def test_random_body_corruption_decodes_like_the_spec(bits, bucket, skip):
    # After the header and length checks any metadata or code bytes are valid input: decoding
    # them never crashes and follows the spec formula (possibly to Inf or NaN).
    gen = rng("fuzz", bits, bucket, skip)
    x = torch.from_numpy(gen.standard_normal(333).astype(np.float32))
    good = as_bytes(codec.encode(x, bits, bucket, skip_incomplete_buckets=skip))
    for _trial in range(150):
        bad = bytearray(good)
        for _ in range(int(gen.integers(1, 9))):
            bad[int(gen.integers(24, len(bad)))] = int(gen.integers(0, 256))
        p = from_bytes(bytes(bad))
        want = oracle_decode(p)
        assert_same(codec.decode(p), want, "decode")
        acc = torch.ones(333, dtype=torch.float16)
        codec.decode_add_(acc, p)
        assert_same(acc, (torch.ones(333) + want).half(), "decode_add_")


def test_random_header_corruption_is_rejected_or_decoded():
    gen = rng("header fuzz")
    x = torch.from_numpy(gen.standard_normal(96).astype(np.float32))
    good = as_bytes(codec.encode(x, 4, 16))
    accepted = 0
    for _trial in range(400):
        bad = bytearray(good)
        bad[int(gen.integers(0, 24))] = int(gen.integers(0, 256))
        p = from_bytes(bytes(bad))
        try:
            y = codec.decode(p, dtype=torch.float32)
        except ValueError:
            continue
        accepted += 1  # a header that is still self-consistent: decoded as the spec says
        assert_same(y, oracle_decode(p))
    assert accepted > 0


# ---- 7. inspect --------------------------------------------------------------------------------


@pytest.mark.parametrize("stochastic", [False, True], ids=["nearest", "stochastic"])
@pytest.mark.parametrize("skip", [False, True], ids=["quantize_tail", "raw_tail"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_inspect_returns_the_header(dtype, skip, stochastic):
    for n, bits, bucket in [(37, 3, 8), (0, 8, 1), (1000, 1, 512), (5, 6, 2**32 - 1)]:
        p = codec.encode(
            torch.ones(n, dtype=dtype),
            bits,
            bucket,
            stochastic=stochastic,
            skip_incomplete_buckets=skip,
            clip=bits == 3,
        )
        info = codec.inspect(p)
        assert info == {
            "dtype": NAMES[dtype],
            "bits": bits,
            "bucket_size": bucket,
            "skip_incomplete_buckets": skip,
            "stochastic": stochastic,
            "clipped": bits == 3,
            "count": n,
        }
        parsed = oracle.parse_header(as_bytes(p))
        assert parsed["flags"] == (1 if skip else 0) | (2 if stochastic else 0) | (
            4 if bits == 3 else 0
        )
        assert parsed["bucket_size"] == bucket and parsed["count"] == n


def test_set_num_threads(restore_threads):
    assert codec.num_threads() >= 1
    codec.set_num_threads(1)
    assert codec.num_threads() == 1
    codec.set_num_threads(2)
    assert codec.num_threads() == 2


def test_encode_into_a_preallocated_payload():
    x = torch.randn(5000)
    want = codec.encode(x, 3, 100)
    out = torch.full((codec.encoded_size(5000, 3, 100),), 7, dtype=torch.uint8)
    got = codec.encode(x, 3, 100, out=out)
    assert got.data_ptr() == out.data_ptr() and torch.equal(out, want)
    with pytest.raises(ValueError, match="needs exactly"):
        codec.encode(x, 3, 100, out=torch.empty(out.numel() - 1, dtype=torch.uint8))
    with pytest.raises(ValueError, match="uint8"):
        codec.encode(x, 3, 100, out=torch.empty(out.numel(), dtype=torch.int8))
    with pytest.raises(ValueError, match="1-D"):
        codec.encode(x, 3, 100, out=torch.empty(1, out.numel(), dtype=torch.uint8))
