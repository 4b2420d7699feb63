"""The fused-kernel selection (torch_cgx/device/kernels.py) for the dense codecs qsgd, terngrad,
onebit, efsignsgd, signsgd, signum and tbq, on CPU tensors with injected fake kernels (a correct
one is used after one self-check; a wrong one: auto warns once naming it and uses the reference,
fused raises), and on a GPU the default implementations (the Triton kernels) against the CPU
codec."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
import torch
from codec_testing import assert_same
from device_kernel_fakes import FakeKernel, default_kernels_on_a_gpu, kernel_mode, roundtrip

from torch_cgx.device import codecs, kernels


class FakeLevels(FakeKernel, kernels.FusedLevels):
    default_name = "fake-levels"


mode = pytest.fixture(kernel_mode, name="mode")


CODECS = [
    ("qsgd", dict(bits=3, bucket_size=100)),
    ("qsgd", dict(bits=8, bucket_size=4097)),
    ("terngrad", dict(bucket_size=64)),
    ("terngrad", dict(bucket_size=64, clip=2.5)),
    ("onebit", dict(bucket_size=33)),
    ("efsignsgd", dict(bucket_size=512)),
    ("signsgd", {}),
    ("signum", {}),
    ("tbq", dict(tau=0.5)),
]


@pytest.mark.parametrize("name,params", CODECS)
def test_a_correct_kernel_is_used_after_one_self_check(mode, name, params):
    mode("auto")
    fake = FakeLevels()
    codec = codecs.get(name, **params)
    with kernels.use_implementations([fake]), warnings.catch_warnings():
        warnings.simplefilter("error")
        x, p, out = roundtrip(codec)
        assert torch.equal(p, codec.reference_encode(x, seed=3, stream=4))
        want = torch.zeros(1000)
        codec.reference_decode_add_(want, p)
        assert torch.equal(out, want)
        roundtrip(codec)
        # one self-check (a second encode, with a NaN, for the flagging codecs), two round trips
        assert (fake.encodes, fake.decodes) == (3 + bool(codec.flag_mask), 3)
        ((key, outcome),) = kernels.decisions().items()
        assert key == ("fake-levels", name, "cpu", torch.float32, codec.bits, codec.bucket_size,
                       codec.param1) and outcome == "fused"  # fmt: skip
        roundtrip(codec, dtype=torch.bfloat16)
        assert len(kernels.decisions()) == 2  # a new dtype: checked again


def test_other_codecs_take_the_reference_silently(mode):
    mode("fused")
    fake = FakeLevels(corrupt_encode=True)
    with kernels.use_implementations([fake]), warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in ("fp16", "maxmin", "topk"):
            roundtrip(codecs.get(name))
    assert fake.encodes == 0 and kernels.decisions() == {}


@pytest.mark.parametrize("name,params", CODECS)
@pytest.mark.parametrize("broken", ["encode", "decode"])
def test_auto_warns_once_naming_the_kernel_and_falls_back(mode, name, params, broken):
    mode("auto")
    fake = FakeLevels("wrong-levels", corrupt_encode=broken == "encode",
                      corrupt_decode=broken == "decode")  # fmt: skip
    codec = codecs.get(name, **params)
    with kernels.use_implementations([fake]):
        with pytest.warns(RuntimeWarning) as record:
            x, p, out = roundtrip(codec, n=777)
            roundtrip(codec, n=777)
        assert len(record) == 1
        message = str(record[0].message)
        assert "wrong-levels" in message and "failed its self-check" in message
        assert f"for {name} (float32, bits={codec.bits}" in message
        assert ("encode differs" if broken == "encode" else "decode_add differs") in message
        assert torch.equal(p, codec.reference_encode(x, seed=3, stream=4))
        want = torch.zeros(777)
        codec.reference_decode_add_(want, p)
        assert torch.equal(out, want)
        assert fake.encodes == 1 + (broken == "decode" and bool(codec.flag_mask))  # the check's


@pytest.mark.parametrize("name,params", [c for c in CODECS if c[0] in ("signsgd", "signum", "tbq")])
def test_the_self_check_catches_a_kernel_that_drops_the_non_finite_flag(mode, name, params):
    mode("auto")
    codec = codecs.get(name, **params)
    with kernels.use_implementations([FakeLevels("flagless", drop_flag=True)]):
        with pytest.warns(RuntimeWarning, match="encode \\(with a NaN\\) differs .* from byte 7 "):
            roundtrip(codec)
        x = torch.randn(10)
        x[3] = float("inf")
        out = torch.zeros(10)
        codec.decode_add_(out, codec.encode(x))  # the reference: every value NaN
        assert torch.isnan(out).all()


@pytest.mark.parametrize("name,params", CODECS[::2])
def test_fused_mode_raises_on_a_wrong_kernel(mode, name, params):
    mode("fused")
    codec = codecs.get(name, **params)
    with kernels.use_implementations([FakeLevels("wrong-levels", corrupt_decode=True)]):
        for _ in range(2):
            with pytest.raises(RuntimeError, match="wrong-levels .*failed its self-check"):
                codec.encode(torch.randn(50))
    with kernels.use_implementations([FakeLevels("good-levels")]):
        roundtrip(codec)


def test_bad_payloads_are_rejected_before_any_kernel(mode):
    mode("fused")
    fake = FakeLevels()
    codec = codecs.get("qsgd")
    with kernels.use_implementations([fake]):
        p = codec.encode(torch.randn(100))
        with pytest.raises(ValueError, match="payload corrupt"):
            codec.decode_add_(torch.zeros(101), p)
        with pytest.raises(ValueError, match="dtype must be"):
            codec.decode_add_(torch.zeros(100, dtype=torch.float64), p)
        with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
            codec.encode(torch.zeros(4, dtype=torch.int32))
    assert fake.decodes == 1  # the self-check's


def test_the_fused_kernels_pass_their_self_check_on_a_gpu(mode):
    """On a GPU, the default implementations in mode fused: every configuration checked and
    taking the Triton kernel, the payloads the CPU codec's bytes and the decoded values its
    values."""
    from torch_cgx import compressors

    cuda, impls = default_kernels_on_a_gpu()
    mode("fused")
    configs = [("qsgd", dict(bits=b)) for b in (2, 4, 8)]
    configs += [("terngrad", dict(clip=c)) for c in (0.0, 2.5)]
    configs += [("onebit", {}), ("efsignsgd", {})]
    configs = [(n, p, bucket) for (n, p), bucket in itertools.product(configs, (1, 7, 512, 4097))]
    configs += [(n, p, nan) for n, p in [("signsgd", {}), ("signum", {}), ("tbq", dict(tau=0.3))]
                for nan in (False, True)]  # fmt: skip
    with kernels.use_implementations(impls):
        for (name, params, bucket), dtype in itertools.product(
            configs, (torch.float32, torch.float16, torch.bfloat16)
        ):
            x = torch.randn(20011).to(dtype)
            x[5000:5100] = 0
            if isinstance(bucket, bool):  # no bucket size; with / without a NaN (the flag)
                x[12345] = float("nan") if bucket else x[12345]
                params, bucket = dict(params), int(bucket)
            else:
                params = dict(params, bucket_size=bucket)
            c = codecs.get(name, **params)
            got = c.encode(x.to(cuda), seed=9, stream=bucket)
            native = compressors.get(name, **params)
            want = native.encode(x, seed=9, stream=bucket)
            assert torch.equal(got.cpu(), want), (name, params, dtype, bucket)
            out = torch.randn(20011).to(dtype)
            dev_out = out.to(cuda)
            c.decode_add_(dev_out, got)
            ref = native.decode_add_(out, want)
            assert_same(dev_out, ref, f"{name} {params} {dtype}")  # NaN as NaN: GPUs canonicalise
        assert kernels.decisions() and set(kernels.decisions().values()) == {"fused"}
        assert {key[0] for key in kernels.decisions()} == {"triton-levels"}


def _from_bits(values, dtype):
    """A tensor of ``dtype`` with the given bit patterns."""
    unsigned, signed = (np.uint32, np.int32) if dtype.itemsize == 4 else (np.uint16, np.int16)
    return torch.from_numpy(np.array(values, dtype=unsigned).view(signed)).view(dtype)


@pytest.mark.parametrize(
    "dtype,canonical,x86,one,zero",
    [
        (torch.float32, 0x7FFFFFFF, 0x7FC00000, 0x3F800000, 0x80000000),
        (torch.float16, 0x7FFF, 0x7E00, 0x3C00, 0x8000),
        (torch.bfloat16, 0x7FFF, 0x7FC0, 0x3F80, 0x8000),
    ],
)
def test_decoded_values_compare_nan_as_nan_and_everything_else_bitwise(dtype, canonical, x86, one,
                                                                       zero):  # fmt: skip
    """The helper the GPU tests compare decoded values with: a GPU's canonical NaN equals x86's
    NaN (and a negative one); -0.0 differs from +0.0, a one-ulp change and a NaN from a number
    do not pass."""
    assert_same(_from_bits([canonical, one], dtype), _from_bits([x86, one], dtype))
    assert_same(_from_bits([canonical | zero], dtype), _from_bits([x86], dtype))  # sign of a NaN
    for got, want in [([zero], [0]), ([one + 1], [one]), ([canonical], [one])]:
        with pytest.raises(pytest.fail.Exception, match="1 of 1 elements differ"):
            assert_same(_from_bits(got, dtype), _from_bits(want, dtype))


# ---- a bucket summed serially on a GPU: named once, with what to change ----------------------


def test_serial_buckets_are_the_lane_summed_ones_past_the_limit():
    from torch_cgx.device.codecs.fused import SERIAL_VALUES, serial_bucket

    cuda, big = torch.device("cuda"), SERIAL_VALUES + 1
    whole = codecs.get("efsignsgd")  # its default bucket_size 0: the whole tensor
    message = serial_bucket(whole, big, cuda)
    assert "efsignsgd with bucket_size=0" in message and f"{big} values" in message
    assert "set bucket_size" in message
    assert serial_bucket(whole, big, torch.device("cpu")) == ""  # the host engine's own speed
    assert serial_bucket(whole, SERIAL_VALUES, cuda) == ""
    assert serial_bucket(codecs.get("efsignsgd", bucket_size=512), big, cuda) == ""
    for name, params in [("qsgd", dict(bucket_size=0)), ("onebit", dict(bucket_size=0)),
                         ("terngrad", dict(bucket_size=0, clip=2.5))]:  # fmt: skip
        assert serial_bucket(codecs.get(name, **params), big, cuda), name
    for name, params in [("terngrad", dict(bucket_size=0)), ("signsgd", {}), ("tbq", {}),
                         ("maxmin", dict(bits=4, bucket_size=4 * big))]:  # fmt: skip
        assert serial_bucket(codecs.get(name, **params), big, cuda) == "", name  # order-free


def test_a_serial_bucket_warns_once_and_still_encodes(monkeypatch):
    """Through the codecs' one dispatch: one SlowPathWarning per configuration, the payload
    unchanged (here on CPU tensors with the GPU's answer stubbed in)."""
    from torch_cgx import compressors, warn
    from torch_cgx.device.codecs import fused

    monkeypatch.setattr(warn, "_warned", set())
    monkeypatch.setattr(fused, "serial_bucket", lambda codec, n, device: "slow, for a test")
    codec, x = codecs.get("efsignsgd"), torch.randn(1000)
    with pytest.warns(warn.SlowPathWarning, match="torch_cgx: slow, for a test"):
        got = codec.encode(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        codec.encode(x)  # once per process and configuration
    assert torch.equal(got, compressors.get("efsignsgd").encode(x))


def test_a_whole_tensor_efsignsgd_warns_on_a_gpu():
    from test_device_maxmin import cuda_or_skip

    from torch_cgx import warn

    cuda = cuda_or_skip()
    warn._warned.discard(("serial-bucket", "efsignsgd", 0))
    with pytest.warns(warn.SlowPathWarning, match="efsignsgd with bucket_size=0"):
        codecs.get("efsignsgd").encode(torch.randn((1 << 20) + 8, device=cuda))
