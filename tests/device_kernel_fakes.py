"""What the fused-kernel selection tests share (tests/test_device_kernels.py, _levels.py): fake
kernels on CPU tensors (the reference itself, optionally corrupted), the ``device_kernels`` mode
setter, a codec round trip, and the real kernels for the GPU tests."""

from __future__ import annotations

import os

import pytest
import torch

from torch_cgx.device import kernels


class FakeKernel:
    """Mixin before a kernels.Fused* protocol: a 'kernel' on CPU tensors that counts its calls."""

    default_name = "fake"

    def __init__(self, name=None, corrupt_encode=False, corrupt_decode=False, drop_flag=False,
                 load_error=None, encode_error=None, corrupt_widening=False):  # fmt: skip
        self.name = name or self.default_name
        self.corrupt_encode, self.corrupt_decode = corrupt_encode, corrupt_decode
        self.drop_flag = drop_flag  # a kernel that never sets the non-finite flag
        self.load_error = load_error
        self.encode_error = encode_error  # a kernel that raises (a fault, a launch error)
        self.corrupt_widening = corrupt_widening  # wrong only into an out wider than the payload
        self.loads = self.encodes = self.decodes = 0

    def applies(self, device):
        return device.type == "cpu"

    def load(self):
        self.loads += 1
        if self.load_error:
            raise OSError(self.load_error)

    def encode(self, codec, x, seed, stream, shared=0):
        self.encodes += 1
        if self.encode_error:
            raise RuntimeError(self.encode_error)
        p = codec.reference_encode(x, seed=seed, stream=stream)
        if self.corrupt_encode:
            p[-1] ^= 1  # one bit of the last code byte
        if self.drop_flag:
            p[7] = 0
        return p

    def decode_add_(self, codec, out, payload, dtype=None):
        self.decodes += 1
        if dtype is None:
            codec.reference_decode_add_(out, payload)
        else:  # a payload of another dtype than out's (16-bit payloads into fp32 sums)
            codec.reference_decode_add_(out, payload, dtype=dtype)
        if self.corrupt_decode or (self.corrupt_widening and dtype not in (None, out.dtype)):
            out[out.numel() // 2] += 1
        return out


def kernel_mode(monkeypatch):
    """Fixture body (``mode = pytest.fixture(kernel_mode, name="mode")``): ``mode("auto")`` sets
    CGX_DEVICE_KERNELS and resets the selection's caches; both undone afterwards."""

    def set_mode(value):
        monkeypatch.setenv("CGX_DEVICE_KERNELS", value)
        kernels.reset()

    yield set_mode
    monkeypatch.delenv("CGX_DEVICE_KERNELS", raising=False)
    kernels.reset()


def roundtrip(codec, n=1000, dtype=torch.float32):
    """(x, its payload, decode_add of it onto zeros) through the codec's dispatch."""
    x = torch.randn(n).to(dtype)
    p = codec.encode(x, seed=3, stream=4)
    out = torch.zeros(n, dtype=dtype)
    codec.decode_add_(out, p)
    return x, p, out


def default_kernels_on_a_gpu():
    """(the CUDA device, ``kernels._defaults()``: the Triton kernels) for a GPU test of the real
    kernels; a skip without CUDA or without triton (a failure under ``CGX_TEST_REQUIRE_CUDA=1``:
    the GPU check)."""
    from test_device_maxmin import cuda_or_skip

    cuda = cuda_or_skip()
    impls = kernels._defaults()
    missing = [i.name for i in impls if not i.applies(cuda)]
    if missing:
        why = f"{', '.join(missing)} cannot run on {cuda} (triton is not installed)"
        if os.environ.get("CGX_TEST_REQUIRE_CUDA") == "1":
            pytest.fail(f"CGX_TEST_REQUIRE_CUDA=1, but {why}")
        pytest.skip(why)
    return cuda, impls
