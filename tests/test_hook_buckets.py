"""The backend's fused bucket call (``reduce_bucket``, csrc/torch/bucket_call.h): every preset
gives the same bytes and residuals through it as through the Python staging it replaces (one
native call per part, ``core.NATIVE_BUCKETS = False``), on 2 real ranks; bad parts raise
ValueError naming the problem."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from dist_helpers import run_ranks


class _Bucket:
    """What the hooks read of DDP's ``GradBucket``."""

    def __init__(self, params, index, last, buffer):
        self._params, self._index, self._last, self._buffer = params, index, last, buffer

    def buffer(self):
        return self._buffer

    def parameters(self):
        return self._params

    def index(self):
        return self._index

    def is_last(self):
        return self._last


def _model():
    torch.manual_seed(0)
    # Layers of 4100 and 1000 values: not whole buckets of 512 (padding), a bias and a norm
    # (exact), and a weight of 2048 (a whole number of buckets).
    return torch.nn.Sequential(
        torch.nn.Linear(41, 100), torch.nn.LayerNorm(100), torch.nn.Linear(100, 10),
        torch.nn.Linear(10, 204), torch.nn.Linear(204, 10, bias=False),
    )  # fmt: skip


def _groups(model):
    params = list(reversed(list(model.parameters())))
    return [params[:3], params[3:6], params[6:]]  # three gradient buckets, the last one alone


def _run(rank, make, native, dtype, steps=2):
    from torch_cgx.hooks import core

    core.NATIVE_BUCKETS = native
    model = _model()
    state, hook = make(model)
    gen = torch.Generator().manual_seed(100 + rank)
    outs = []
    groups = _groups(model)
    for _ in range(steps):
        for i, params in enumerate(groups):
            n = sum(p.numel() for p in params)
            buf = torch.randn(n, generator=gen).to(dtype)
            if i == 1:
                buf[7] = 40.0  # an outlier: the rotation and the clip matter
            fut = hook(state, _Bucket(params, i, i == len(groups) - 1, buf))
            out = fut.wait()
            assert out is buf  # the hook's value is the bucket's buffer, reduced in place
            outs.append(out.clone())
    subs = getattr(state, "states", None)
    subs = list(subs.values()) if subs else [state]
    residuals = [{k: v.clone() for k, v in s.residuals.items()} for s in subs]
    momenta = [{k: v.clone() for k, v in getattr(s, "momenta", {}).items()} for s in subs]
    return outs, residuals, momenta, getattr(state, "layer_bits", None)


def _presets():
    from torch_cgx import CGXState, cgx_hook
    from torch_cgx.compression import (
        NoCompression,
        SizeAdaptiveCompression,
        Uniform8BitQuantization,
    )
    from torch_cgx.compression.ddp import PolicyState, policy_hook
    from torch_cgx.hooks import CompressionState, compression_hook

    p4 = {"bits": 4, "bucket_size": 512}
    policy = SizeAdaptiveCompression(1500, NoCompression(), Uniform8BitQuantization())
    return {
        "cgx default": lambda m: (CGXState(None, 512, p4, module=m), cgx_hook),
        "cgx feedback": lambda m: (
            CGXState(None, 512, p4, error_feedback=True, module=m),
            cgx_hook,
        ),  # fmt: skip
        "cgx no split": lambda m: (
            CGXState(None, 512, p4, split_layers=False, error_feedback=True, module=m),
            cgx_hook,
        ),  # fmt: skip
        "cgx legacy": lambda m: (CGXState(None, 512, p4, legacy=True), cgx_hook),
        "cgx 1 bit": lambda m: (
            CGXState(None, 512, {"bits": 1, "bucket_size": 512}, module=m),
            cgx_hook,
        ),  # fmt: skip
        "cgx adaptive": lambda m: (
            CGXState(None, 512, p4, adaptive_bits=3, adapt_every=2, error_feedback=True, module=m),
            cgx_hook,
        ),  # fmt: skip
        "maxmin": lambda m: (CompressionState(None, "maxmin", p4, module=m), compression_hook),
        "topk": lambda m: (
            CompressionState(None, "topk", {"ratio": 0.05}, module=m),
            compression_hook,
        ),  # fmt: skip
        "dgc": lambda m: (
            CompressionState(None, "dgc", {"ratio": 0.05}, module=m),
            compression_hook,
        ),  # fmt: skip
        "policy": lambda m: (PolicyState(m, policy), policy_hook),
    }


# bf16 buffers: the presets whose staging converts (fp32 staging with residuals) or not.
_BF16 = ("cgx default", "cgx feedback", "cgx legacy", "maxmin", "policy")


def body_same_as_python_staging(rank, world, dtype_name):
    import torch_cgx  # noqa: F401  (registers the backend)

    dtype = getattr(torch, dtype_name)
    dist.init_process_group("cgx")
    for name, make in _presets().items():
        if dtype == torch.bfloat16 and name not in _BF16:
            continue
        fused, staged = _run(rank, make, True, dtype), _run(rank, make, False, dtype)
        for a, b in zip(fused[0], staged[0]):
            assert torch.equal(a, b), name
        for part in (1, 2):  # residuals, momenta
            for ra, rb in zip(fused[part], staged[part]):
                assert ra.keys() == rb.keys(), name
                for k in ra:
                    assert torch.equal(ra[k], rb[k]), (name, k)
        assert fused[3] == staged[3], name  # adaptive bits: the same choice
        if name == "cgx adaptive":
            assert fused[3], "bits were chosen after the first step (parts per bit width next)"
        if name in ("cgx feedback", "maxmin", "topk"):
            assert fused[1][0], name  # residuals were kept
        # identical on every rank
        gathered = [None] * world
        dist.all_gather_object(gathered, [t.sum().item() for t in fused[0]])
        assert gathered[0] == gathered[1], name
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_fused_bucket_call_matches_python_staging(dtype_name):
    run_ranks(body_same_as_python_staging, 2, dtype_name, timeout=240)


def body_bad_parts(rank, world):
    from torch_cgx.hooks import core

    dist.init_process_group("cgx")  # the import above registered the backend
    backend = core.native_calls(None).refresh(None)
    options = core.native_calls(None).exact()
    buf = torch.zeros(100)

    def part(**kw):
        f = dict(stream=-1, offsets=[0], numels=[100], residuals=[], residuals_out=[], seeds=[],
                 bucket_size=1, split=False, fp32=False, whole=False)  # fmt: skip
        f.update(kw)
        return core.native_part(options, **f)

    cases = {
        "increasing": part(offsets=[0, 10], numels=[20, 5]),
        "inside the buffer": part(numels=[101]),
        "residuals: one per span": part(residuals=[None, None]),
        "residual 0 must be": part(residuals=[torch.zeros(99)]),
        "residual output 0 must be": part(residuals_out=[torch.zeros(100, dtype=torch.float64)]),
        "seeds: one per span": part(seeds=[1, 2]),
        "power of two": part(seeds=[1], bucket_size=100),
        "whole part must cover": part(numels=[50], whole=True),
        "stream must be": part(stream=-2),
    }
    for message, bad in cases.items():
        with pytest.raises(ValueError, match=message):
            backend.reduce_bucket(buf, [bad])
    with pytest.raises(AttributeError, match="offset"):  # the fields are named: no typo passes
        part(offset=[0])
    with pytest.raises(ValueError, match="1-D floating-point CPU buffer"):
        backend.reduce_bucket(torch.zeros(10, 10), [part()])
    # The group still works after the refusals.
    t = torch.full((100,), float(rank + 1))
    backend.reduce_bucket(t, [part(whole=True)]).wait()
    assert torch.equal(t, torch.full((100,), 1.5))
    dist.destroy_process_group()


def test_bad_bucket_parts_raise_value_error():
    run_ranks(body_bad_parts, 2, timeout=120)
