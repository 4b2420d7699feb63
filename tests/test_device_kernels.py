"""The fused-kernel selection (torch_cgx/device/kernels.py) on CPU tensors, with injected fake
kernels: a correct one is used, a wrong one fails its self-check (auto: one warning naming it
and the reference from then on; fused: RuntimeError), a kernel that cannot load likewise; on a
GPU, the default implementations (the Triton kernels) pass their self-check for max-min."""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch
from device_kernel_fakes import FakeKernel, default_kernels_on_a_gpu, kernel_mode, roundtrip

from torch_cgx.device import codecs, kernels


class Fake(FakeKernel, kernels.FusedMaxMin):
    default_name = "fake"


mode = pytest.fixture(kernel_mode, name="mode")


def test_a_correct_kernel_is_used_after_one_self_check(mode):
    mode("auto")
    fake = Fake()
    codec = codecs.get("maxmin", bits=3, bucket_size=100, stochastic=1)
    with kernels.use_implementations([fake]), warnings.catch_warnings():
        warnings.simplefilter("error")
        x, p, out = roundtrip(codec)
        assert torch.equal(p, codec.reference_encode(x, seed=3, stream=4))
        roundtrip(codec)
        # one self-check (1 encode + 1 decode_add), then the two calls of each round trip
        assert (fake.encodes, fake.decodes, fake.loads) == (3, 3, 4)
        (key, outcome), = kernels.decisions().items()  # fmt: skip
        assert key == ("fake", "maxmin", "cpu", torch.float32, 3, 100, 2) and outcome == "fused"
        roundtrip(codecs.get("maxmin", bits=3, bucket_size=100), dtype=torch.bfloat16)
        assert len(kernels.decisions()) == 2  # a new (dtype, flags): checked again


@pytest.mark.parametrize("broken", ["encode", "decode"])
def test_auto_warns_once_naming_the_kernel_and_falls_back(mode, broken):
    mode("auto")
    fake = Fake("wrong-kernel", corrupt_encode=broken == "encode",
                corrupt_decode=broken == "decode")  # fmt: skip
    codec = codecs.get("maxmin", bits=4, bucket_size=64, skip_incomplete_buckets=1)
    with kernels.use_implementations([fake]):
        with pytest.warns(RuntimeWarning) as record:
            x, p, out = roundtrip(codec, n=777)
            roundtrip(codec, n=777)
        assert len(record) == 1
        message = str(record[0].message)
        assert "wrong-kernel" in message and "failed its self-check" in message
        assert "bits=4, bucket_size=64" in message and "reference" in message
        assert ("encode differs" if broken == "encode" else "decode_add differs") in message
        # the reference was used: exact payload and values
        assert torch.equal(p, codec.reference_encode(x, seed=3, stream=4))
        want = torch.zeros(777)
        codec.reference_decode_add_(want, p)
        assert torch.equal(out, want)
        assert fake.encodes == 1  # the self-check only
        assert list(kernels.decisions().values())[0].startswith("reference: ")


def test_fused_mode_raises_on_a_wrong_kernel_and_keeps_raising(mode):
    mode("fused")
    codec = codecs.get("maxmin", bits=2, bucket_size=8)
    with kernels.use_implementations([Fake("wrong-kernel", corrupt_encode=True)]):
        for _ in range(2):
            with pytest.raises(RuntimeError, match="wrong-kernel .*failed its self-check"):
                codec.encode(torch.randn(50))
    with kernels.use_implementations([Fake("good-kernel")]):
        roundtrip(codec)  # a correct kernel passes in fused mode


@pytest.mark.parametrize("setting", ["auto", "fused"])
def test_a_kernel_that_cannot_load_warns_once_or_raises(mode, setting):
    mode(setting)
    fake = Fake("absent-kernel", load_error="kernel module: cannot open shared object")
    codec = codecs.get("maxmin")
    with kernels.use_implementations([fake]):
        if setting == "fused":
            with pytest.raises(RuntimeError, match="absent-kernel: unavailable .*cannot open"):
                codec.encode(torch.randn(10))
            return
        with pytest.warns(RuntimeWarning, match="absent-kernel: unavailable") as record:
            for _ in range(3):
                roundtrip(codec, n=600)
        assert len(record) == 1 and fake.loads == 1 and fake.encodes == 0


def test_reference_mode_never_loads_a_kernel(mode):
    mode("reference")
    fake = Fake()
    with kernels.use_implementations([fake]), warnings.catch_warnings():
        warnings.simplefilter("error")
        roundtrip(codecs.get("maxmin"))
    assert fake.loads == 0 and kernels.decisions() == {}


def test_clip_is_not_covered_and_takes_the_reference_silently(mode):
    mode("fused")
    fake = Fake(corrupt_encode=True)
    with kernels.use_implementations([fake]), warnings.catch_warnings():
        warnings.simplefilter("error")
        roundtrip(codecs.get("maxmin", clip=1))
    assert fake.loads == 0


def test_bad_setting_names_the_variable(mode):
    mode("sometimes")
    with pytest.raises(ValueError, match="CGX_DEVICE_KERNELS must be auto, fused or reference"):
        kernels.mode()


def test_self_check_buffer_covers_full_partial_and_constant_buckets():
    for bucket in (1, 3, 8, 512, 1000, 1 << 17, 1 << 20):
        n = kernels.check_size(bucket)
        assert n <= (1 << 19) + 3
        assert n % 8  # a partial code byte at every bits but 8
        if bucket <= 1 << 17:
            assert n >= 2 * bucket and (n % bucket or bucket == 1)
    x = kernels._check_input(kernels.check_size(64), 64, torch.float32, "cpu")
    assert bool((x[64:128] == 0.75).all()) and x[0] == 0 and x[:64].abs().max() < 1


def test_the_fused_kernels_pass_their_self_check_on_a_gpu(mode):
    """On a GPU, the default implementations in mode fused: every max-min configuration is
    checked and takes the Triton kernel, and the payloads are the CPU codec's bytes."""
    from torch_cgx import compressors

    cuda, impls = default_kernels_on_a_gpu()
    mode("fused")
    levers = [(8, dict()), (4097, dict(skip_incomplete_buckets=1, stochastic=1)),
              (512, dict(clip=1))]  # fmt: skip
    with kernels.use_implementations(impls):
        for bits, dtype, (bucket, lever) in itertools.product(
            (1, 3, 8), (torch.float32, torch.float16, torch.bfloat16), levers
        ):
            x = torch.randn(20000).to(dtype)
            params = dict(bits=bits, bucket_size=bucket, **lever)
            got = codecs.get("maxmin", **params).encode(x.to(cuda), seed=9, stream=bits)
            want = compressors.get("maxmin", **params).encode(x, seed=9, stream=bits)
            assert torch.equal(got.cpu(), want), (params, dtype)
        assert kernels.decisions() and set(kernels.decisions().values()) == {"fused"}
        assert {key[0] for key in kernels.decisions()} == {"triton-maxmin"}


FAULT = "CUDA error: an illegal memory access was encountered"


@pytest.mark.parametrize("setting", ["auto", "fused"])
def test_a_fault_that_leaves_the_context_unusable_raises_in_every_mode(mode, monkeypatch, setting):
    """A kernel raises and the context probe fails too (a sticky device-side fault): the
    reference could not run either, so RuntimeError naming the kernel, never a warning."""
    mode(setting)
    probes = []
    monkeypatch.setattr(kernels, "_context_usable", lambda d: probes.append(d) or False,
                        raising=False)  # fmt: skip
    codec = codecs.get("maxmin", bits=4, bucket_size=64)
    with kernels.use_implementations([Fake("faulting", encode_error=FAULT)]):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(RuntimeError) as info:
                codec.encode(torch.randn(100))
    message = str(info.value)
    assert "faulting for maxmin (float32, bits=4, bucket_size=64" in message
    assert FAULT in message and "context" in message and "unusable" in message
    assert "reference tensor operations cannot run" in message
    assert "CGX_DEVICE_KERNELS=reference" in message
    assert probes == [torch.device("cpu")]


@pytest.mark.parametrize("setting", ["auto", "fused"])
def test_a_kernel_that_raises_with_a_usable_context_fails_its_check(mode, monkeypatch, setting):
    """The probe succeeds: as any failed self-check (auto warns once and falls back, fused
    raises)."""
    mode(setting)
    monkeypatch.setattr(kernels, "_context_usable", lambda d: True, raising=False)
    codec = codecs.get("maxmin", bits=4, bucket_size=64)
    with kernels.use_implementations([Fake("raising", encode_error="launch failed")]):
        if setting == "fused":
            with pytest.raises(RuntimeError, match="raising .*failed its self-check \\(raised"):
                codec.encode(torch.randn(100))
            return
        with pytest.warns(RuntimeWarning, match="raised RuntimeError: launch failed") as record:
            x, p, out = roundtrip(codec, n=300)
            roundtrip(codec, n=300)
        assert len(record) == 1
        assert torch.equal(p, codec.reference_encode(x, seed=3, stream=4))


def test_the_context_probe_passes_off_cuda():
    assert kernels._context_usable(torch.device("cpu"))


def test_fallbacks_lists_every_fallback_with_its_reason(mode):
    mode("auto")
    good, wrong = Fake("good-kernel"), Fake("wrong-kernel", corrupt_decode=True)
    absent = Fake("absent-kernel", load_error="kernel module: cannot open")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with kernels.use_implementations([good]):
            roundtrip(codecs.get("maxmin", bits=3))
            assert kernels.fallbacks() == {}
        with kernels.use_implementations([wrong]):
            roundtrip(codecs.get("maxmin", bits=5, bucket_size=32))
            assert kernels.fallbacks() == {
                "wrong-kernel for maxmin (float32, bits=5, bucket_size=32, flags=0) on cpu":
                "reference: failed its self-check (decode_add differs from the reference)"
            }  # fmt: skip
        with kernels.use_implementations([absent]):
            roundtrip(codecs.get("maxmin"))
            ((what, why),) = kernels.fallbacks().items()
    assert what == "absent-kernel" and why.startswith("reference: unavailable (OSError: ")
    assert "fallbacks" in kernels.__all__


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_payloads_are_also_checked_decoding_into_float32(mode, dtype):
    """The engine adds fp16 / bf16 payloads into fp32 sums (decode_add_(..., dtype=)): the
    self-check of a 16-bit dtype decode-adds into float32 too, and a kernel wrong only there
    falls back; float32 itself has nothing wider to check."""
    mode("auto")
    codec = codecs.get("maxmin", bits=4, bucket_size=64)
    good = Fake("good-kernel")
    with kernels.use_implementations([good]), warnings.catch_warnings():
        warnings.simplefilter("error")
        x = torch.randn(300).to(dtype)
        p = codec.encode(x, seed=3, stream=4)
        assert good.decodes == 2  # the self-check: into dtype, then into float32
        acc = torch.zeros(300)
        codec.decode_add_(acc, p, dtype=dtype)  # the engine's call: both dtypes passed, fused
        want = torch.zeros(300)
        codec.reference_decode_add_(want, p, dtype=dtype)
        # the dispatch also wants float32's own self-check (1 decode), then the call itself
        assert good.decodes == 4 and torch.equal(acc, want)
    wrong = Fake("widening-kernel", corrupt_widening=True)
    with kernels.use_implementations([wrong]), warnings.catch_warnings():
        warnings.simplefilter("error")
        roundtrip(codec, dtype=torch.float32)  # no wider out: passes
        with pytest.warns(RuntimeWarning, match="widening-kernel .*decode_add into float32 diff"):
            x, p, out = roundtrip(codec, dtype=dtype)
        want = torch.zeros(1000, dtype=dtype)
        codec.reference_decode_add_(want, p)
        assert torch.equal(out, want)
        outcomes = sorted(kernels.decisions().values())
        assert outcomes[0] == "fused" and outcomes[1].startswith("reference: ")
