"""The float formats (fp8, mxfp8, mxfp6, mxfp4, nvfp4; torch_cgx/compressors/floats.py): every
element code round-trips, nearest rounding is torch's own cast for FP8, the scales and elements
are torchao's byte for byte for finite input (its FLOOR mode and NVFP4 quantizer), non-finite
blocks decode to NaN, stochastic rounding is unbiased (torch_cgx.testing), and the formats' sizes
are their bits per value."""

from __future__ import annotations

import pytest
import torch

from torch_cgx import compressors, testing
from torch_cgx.compressors import floats
from torch_cgx.compressors.blocks import unpack_bits


def _heavy(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp(2 * torch.randn(n, generator=g))
    x[::97] = 0.0  # zeros, and a whole zero block
    x[64:96] = 0.0
    return x


@pytest.mark.parametrize("name", sorted(floats.ELEMENTS))
def test_every_code_round_trips_and_fp8_is_torchs_cast(name):
    e = floats.ELEMENTS[name]
    table = e.table("cpu")
    finite = table.isfinite()
    codes = torch.arange(1 << e.bits, dtype=torch.int32)
    assert torch.equal(e.quantize(table)[finite], codes[finite])
    if name in ("e4m3", "e5m2"):
        dtype = torch.float8_e4m3fn if name == "e4m3" else torch.float8_e5m2
        x = _heavy(50000).clamp(-e.max, e.max)
        assert torch.equal(e.quantize(x), x.to(dtype).view(torch.uint8).int())
        assert torch.equal(table[finite], codes.to(torch.uint8).view(dtype).float()[finite])


@pytest.mark.parametrize("spec", [("mxfp8", 0, "e4m3"), ("mxfp8", 1, "e5m2"), ("mxfp6", 0, "e3m2"),
                                  ("mxfp6", 1, "e2m3"), ("mxfp4", None, "e2m1")])  # fmt: skip
def test_mx_bytes_are_torchaos(spec):
    mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
    name, element, kind = spec
    params = {} if element is None else {"element": element}
    c = compressors.get(name, **params)
    x = _heavy(32 * 200)
    body = c.encode(x)[16:]
    dtype = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "e3m2": "fp6_e3m2",
             "e2m3": "fp6_e2m3", "e2m1": torch.float4_e2m1fn_x2}[kind]  # fmt: skip
    scale, data = mx.to_mx(x, dtype, 32, mx.ScaleCalculationMode.FLOOR)
    assert torch.equal(body[:200], scale.view(torch.uint8))
    bits = floats.ELEMENTS[kind].bits
    if bits == 6:  # torchao keeps one 6-bit code a byte
        assert torch.equal(unpack_bits(body[200:], x.numel(), 6).to(torch.uint8), data)
    else:
        assert torch.equal(body[200:], data.view(torch.uint8).reshape(-1))


def test_nvfp4_bytes_are_torchaos():
    nv = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor")
    x = _heavy(16 * 300, 1)
    body = compressors.get("nvfp4").encode(x)[16:]
    tensor = nv.per_tensor_amax_to_scale(x.abs().amax())
    scales, data = nv.nvfp4_quantize(x.view(1, -1), 16, tensor)
    assert torch.equal(body[:4].view(torch.float32), tensor.reshape(1))
    assert torch.equal(body[4:304], scales.view(torch.uint8).reshape(-1))
    assert torch.equal(body[304:], data.reshape(-1))


@pytest.mark.parametrize("name", ["fp8", "mxfp8", "mxfp6", "mxfp4", "nvfp4"])
def test_sizes_non_finite_and_the_checks(name):
    c = compressors.get(name)
    bits = {"fp8": 8, "mxfp8": 8.25, "mxfp6": 6.25, "mxfp4": 4.25, "nvfp4": 4.5}[name]
    n = 32 * 1024
    extra = {"fp8": 32, "nvfp4": 32}.get(name, 0)  # one fp32 scale a payload
    assert c.encoded_size(n) == 16 + (bits * n + extra) / 8
    x = _heavy(n)
    x[5], x[40] = float("inf"), float("nan")
    y = c.decode(c.encode(x))
    assert bool(y[5].isnan()) and bool(y[40].isnan())  # never finite
    if name.startswith("mx"):  # only their blocks: the others' scale covers the payload
        assert bool(y[64:].isfinite().all())
    for params in ({}, {"stochastic": 1}):
        testing.check_compressor(compressors.get(name, **params), draws=100)


@pytest.mark.parametrize("spec", [("mxfp8", {}), ("mxfp8", {"element": 1}), ("mxfp6", {}),
                                  ("mxfp6", {"element": 1, "stochastic": 1}), ("mxfp4", {}),
                                  ("mxfp4", {"stochastic": 1})])  # fmt: skip
def test_the_native_mx_path_is_the_tensor_operations(spec):
    from torch_cgx.compressors import floats_native

    name, params = spec
    c = compressors.get(name, **params).impl
    assert floats_native.usable(c, "cpu")  # it passed its first-use check
    ctx = compressors.Context(4, 9, 0)
    for n in (1, 31, 33, 32 * 700 + 5, 32 * 2100 + 3):  # the last: two of the pool's tasks
        for scale in (1.0, 1e-35, 1e35):
            x = _heavy(n, n) * scale
            if n > 100:
                x[3], x[50], x[99] = float("nan"), float("-inf"), 2.0**-149
            assert torch.equal(c.encode(x, ctx), c.reference_encode(x, ctx))
        body = torch.randint(0, 256, (c.body_size(n),), dtype=torch.uint8,
                             generator=torch.Generator().manual_seed(n))  # fmt: skip
        want, got = c.reference_decode(body, n), c.decode(body, n)
        acc = torch.randn(n, generator=torch.Generator().manual_seed(1))
        added = c.decode_add_(acc.clone(), body)
        for a, b in ((want, got), (acc + want, added)):
            assert torch.equal(a.view(torch.int32), b.view(torch.int32)) or bool(
                ((a == b) | (a.isnan() & b.isnan())).all()
            )


def test_a_native_path_that_disagrees_warns_and_is_not_used(monkeypatch):
    from torch_cgx import _C
    from torch_cgx.compressors import floats_native

    c = compressors.get("mxfp8", element=1, stochastic=1).impl
    monkeypatch.setattr(floats_native, "_CHECKED", {})
    real = _C.mx_encode
    monkeypatch.setattr(_C, "mx_encode", lambda *a: real(*a).roll(1))  # wrong bytes
    with pytest.warns(RuntimeWarning, match="native MX path differs"):
        assert not floats_native.usable(c, "cpu")
    x = _heavy(4096)
    assert torch.equal(
        c.encode(x, compressors.Context()), c.reference_encode(x, compressors.Context())
    )
