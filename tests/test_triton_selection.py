"""The fused-kernel selection with Triton's kernels (torch_cgx/device/kernels.py): under Triton's
interpreter, ``fused`` mode runs them on CPU tensors through the codecs' one dispatch (the
decisions name the Triton implementation; the bytes are the native codec's), ``auto`` keeps CPU
tensors on the reference, and without the interpreter CPU tensors never reach them."""

import importlib.util
import os

import pytest
import torch

from torch_cgx import compressors
from torch_cgx.device import codecs, kernels

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed (scripts/install-deps.sh installs it)",
                allow_module_level=True)  # fmt: skip

CASES = [("maxmin", dict(bits=4, bucket_size=128), "triton-maxmin"),
         ("qsgd", dict(bits=4, bucket_size=64), "triton-levels"),
         ("signum", {}, "triton-levels")]  # fmt: skip


@pytest.fixture
def mode(monkeypatch):
    """Sets TRITON_INTERPRET and CGX_DEVICE_KERNELS for one test; selection caches reset."""

    def set_mode(interpret: bool, kernels_mode: str) -> None:
        if interpret:
            monkeypatch.setenv("TRITON_INTERPRET", "1")
        else:
            monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        monkeypatch.setenv("CGX_DEVICE_KERNELS", kernels_mode)
        kernels.reset()

    yield set_mode
    kernels.reset()


def _encode(name, params):
    x = torch.randn(1000, generator=torch.Generator().manual_seed(3))
    got = codecs.get(name, **params).encode(x, seed=5, stream=6)
    assert torch.equal(got, compressors.get(name, **params).encode(x, 5, 6, 0))


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "0", reason="compiled mode (a GPU)")
def test_fused_mode_runs_triton_on_cpu_tensors_under_the_interpreter(mode):
    mode(True, "fused")
    for name, params, impl in CASES:
        _encode(name, params)
        assert [k[0] for k in kernels.decisions() if k[1] == name] == [impl]
    assert set(kernels.decisions().values()) == {"fused"} and kernels.fallbacks() == {}


@pytest.mark.parametrize("interpret, kernels_mode", [(True, "auto"), (False, "fused")])
def test_cpu_tensors_stay_on_the_reference(mode, interpret, kernels_mode):
    mode(interpret, kernels_mode)
    for name, params, _ in CASES:
        _encode(name, params)
        assert kernels.fused_for(codecs.get(name, **params), torch.device("cpu"),
                                 torch.float32) is None  # fmt: skip
    assert kernels.decisions() == {}
