"""torch_cgx.compression: every class round trips within the bound its math gives, payload sizes
are exact, ratios are hivemind's, policies choose as documented and bad input raises ValueError."""

from __future__ import annotations

import math

import pytest
import torch

from torch_cgx import compression as C

U = 2.0**-24  # fp32 unit roundoff


def wide(n, seed=0, low=-8, high=4):
    """Values of both signs spread over many binades."""
    g = torch.Generator().manual_seed(seed)
    scale = 10 ** (torch.rand(n, generator=g) * (high - low) + low)
    return torch.randn(n, generator=g) * scale


def info(x, key=None, role=C.TensorRole.UNSPECIFIED):
    return C.CompressionInfo.from_tensor(x, key=key, role=role)


def maxmin_bound(x: torch.Tensor, bucket: int, bits: int) -> torch.Tensor:
    """docs/FORMAT.md "Error bound" per element: unit (1/2 + 4 L 2^-24) + 2^-23 max(|mn|, |mx|)
    + 2^-149 (L + 1), with unit = fp32((max - min) / L) per bucket of `bucket` values."""
    levels = 2**bits - 1
    flat = x.reshape(-1).double()
    out = torch.empty_like(flat)
    for b in range(0, flat.numel(), bucket):
        part = flat[b : b + bucket]
        mn, mx = float(part.min()), float(part.max())
        unit = float(torch.tensor((mx - mn) / levels, dtype=torch.float32))
        out[b : b + bucket] = (
            unit * (0.5 + 4 * levels * U) + 2.0**-23 * max(abs(mn), abs(mx)) + 2.0**-149 * 256
        )
    return out


@pytest.mark.parametrize(
    "dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool]
)
def test_no_compression_is_bit_exact_for_every_dtype(dtype):
    x = (wide(60).reshape(3, 4, 5) * 100).to(dtype)
    p = C.NoCompression().compress(x)
    assert p.nbytes == x.numel() * x.element_size()
    back = C.NoCompression().extract(C.Payload.from_bytes(p.to_bytes()))
    assert back.dtype == dtype and back.shape == x.shape and torch.equal(back, x)
    assert C.NoCompression().estimate_compression_ratio(info(x)) == 1.0


def test_float16_rounds_once_and_clamps_finite_values():
    x = torch.cat([wide(5000), torch.tensor([7e4, -1e6, 65504.0, 2.0**-20])])
    p = C.Float16Compression().compress(x)
    assert p.method == "cgx/fp16" and p.nbytes == 32 + 2 * x.numel()
    y = C.extract(p)
    inside = x.abs() <= 65504
    # round to nearest: half an fp16 ulp, 2^-11 relative for normals, 2^-25 for subnormals
    bound = torch.maximum(x.abs() * 2.0**-11, torch.full_like(x, 2.0**-25))
    assert torch.all((y - x).abs()[inside] <= bound[inside])
    assert y[-4].item() == 65504.0 and y[-3].item() == -65504.0  # clamped
    special = torch.tensor([float("inf"), float("-inf"), float("nan"), 1.0])
    z = C.extract(C.Float16Compression().compress(special))
    assert z[0] == float("inf") and z[1] == float("-inf") and z[2].isnan() and z[3] == 1.0
    ratio = C.Float16Compression().estimate_compression_ratio
    assert ratio(info(x)) == 0.5 and ratio(info(x.double())) == 0.25
    assert ratio(info(x.half())) == 1.0
    d = C.extract(C.Float16Compression().compress(x[:10].double().requires_grad_()))
    assert d.dtype == torch.float64 and d.requires_grad


def test_scaled_float16_keeps_precision_of_offset_rows():
    g = torch.Generator().manual_seed(1)
    offsets = torch.tensor([0.0, 1000.0, -3.0, 1e-6]).reshape(4, 1)
    scales = torch.tensor([1.0, 1e-3, 1e-7, 1e-9]).reshape(4, 1)
    x = (torch.randn(4, 300, generator=g) * scales + offsets).float()
    p = C.ScaledFloat16Compression().compress(x)
    assert p.method == "meanstd16" and p.nbytes == 32 + 2 * x.numel() + 8 * 4
    y = C.extract(C.Payload.from_bytes(p.to_bytes()))
    xd = x.double()
    m = xd.mean(dim=1, keepdim=True)
    s = ((xd - m).norm(dim=1, keepdim=True) / math.sqrt(300)).clamp_min(2.0**-23)
    # fp16 of (x - m) / s: 2^-11 relative or 2^-25 absolute, times s; fp32 steps: a few U
    bound = (xd - m).abs() * (2.0**-11 + 2.0**-20) + s * 2.0**-24 + (xd.abs() + m.abs()) * 2**-22
    assert torch.all((y.double() - xd).abs() <= bound)
    plain = C.extract(C.Float16Compression().compress(x))
    assert (y - x).abs()[1].max() * 100 < (plain - x).abs()[1].max()  # the point of scaling
    for shape in [(), (0,), (3, 0), (2, 1)]:
        t = torch.full(shape, 2.5)
        assert torch.equal(C.extract(C.ScaledFloat16Compression().compress(t)), t)


@pytest.mark.parametrize("n", [1, 1000, 10000])
def test_uniform8bit_one_range_per_tensor(n):
    x = wide(n, seed=n, low=-3, high=1)
    p = C.Uniform8BitQuantization().compress(x)
    assert p.method == "cgx/maxmin" and p.params == {"bits": 8, "bucket_size": n}
    assert p.nbytes == 24 + 8 + n  # one (min, unit) pair and one byte a value
    y = C.extract(p)
    assert torch.all((y - x).abs().double() <= maxmin_bound(x, n, 8))
    assert C.Uniform8BitQuantization().estimate_compression_ratio(info(x)) == 0.25
    b = C.Uniform8BitQuantization(bucket_size=300).compress(x)
    assert b.nbytes == 24 + 8 * math.ceil(n / 300) + n
    assert torch.all((C.extract(b) - x).abs().double() <= maxmin_bound(x, 300, 8))


def test_blockwise_has_one_range_per_block():
    x = wide(10000, seed=3, low=-3, high=0)
    x[5000] = 1e4  # an outlier widens only its own block
    p = C.BlockwiseQuantization().compress(x)
    assert p.params == {"bits": 8, "bucket_size": 4096} and p.nbytes == 24 + 8 * 3 + 10000
    err = (C.extract(p) - x).abs().double()
    assert torch.all(err <= maxmin_bound(x, 4096, 8))
    assert err[:4096].max() < 0.05 < 1 < err[4096:8192].max()  # only its block sees the outlier
    assert C.BlockwiseQuantization(512).compress(x).nbytes == 24 + 8 * 20 + 10000
    assert C.BlockwiseQuantization().estimate_compression_ratio(info(x.half())) == 0.5


def test_quantile8bit_bins_are_quantiles_and_decode_to_their_means():
    x = wide(20000, seed=4, low=-2, high=2)
    p = C.Quantile8BitQuantization().compress(x.reshape(100, 200))
    assert p.method == "quantile8" and p.nbytes == 4 * 256 + x.numel()
    y = C.extract(p).reshape(-1)
    values, inverse, counts = torch.unique(y, return_inverse=True, return_counts=True)
    assert values.numel() <= 256 and counts.max() <= x.numel() / 256 + 2  # equal populations
    order = torch.argsort(x)
    assert torch.all(y[order][1:] >= y[order][:-1])  # monotone
    for k in range(values.numel()):
        members = x[inverse == k].double()
        assert torch.isclose(members.mean().float(), values[k], rtol=1e-6, atol=0)
        # each value is decoded to its bin's mean: off by at most the bin's spread
        assert (members - values[k].double()).abs().max() <= members.max() - members.min()
    const = torch.full((50,), -1.25)
    assert torch.equal(C.extract(C.Quantile8BitQuantization().compress(const)), const)
    odd = torch.tensor([1.0, float("nan"), 2.0, float("inf"), 3.0])
    z = C.extract(C.Quantile8BitQuantization().compress(odd))
    assert not z[1].isfinite() and not z[3].isfinite()
    assert C.Quantile8BitQuantization().estimate_compression_ratio(info(x)) == 0.25


def test_cgx_compression_wraps_any_compressor():
    x = wide(5000, seed=5, low=-3, high=0)
    c = C.CGXCompression("maxmin", bits=4, bucket_size=256)
    p = c.compress(x)
    assert torch.all((C.extract(p) - x).abs().double() <= maxmin_bound(x, 256, 4))
    assert c.estimate_compression_ratio(info(x)) == p.nbytes / (4 * x.numel())  # exact
    q1, q2 = C.CGXCompression("qsgd", bits=4, seed=7), C.CGXCompression("qsgd", bits=4, seed=7)
    a, b = q1.compress(x), q1.compress(x)
    assert not torch.equal(a.data, b.data)  # a new stream per call
    assert torch.equal(q2.compress(x).data, a.data)  # reproducible from the seed
    t = C.extract(C.CGXCompression("topk", ratio=0.1).compress(x))
    assert int((t != 0).sum()) == 500
    with pytest.raises(ValueError, match="unknown compressor"):
        C.CGXCompression("nope")
    with pytest.raises(ValueError, match="bits"):
        C.CGXCompression("maxmin", bits=9)
    with pytest.raises(ValueError, match="seed"):
        C.CGXCompression("maxmin", seed=-1)


def test_size_policy_uses_the_whole_tensor_and_its_boundary():
    small, big = C.NoCompression(), C.Uniform8BitQuantization()
    policy = C.SizeAdaptiveCompression(1000, small, big)
    at, below = torch.randn(1000), torch.randn(999)
    assert policy.choose_compression(info(at)) is big
    assert policy.choose_compression(info(below)) is small
    assert policy.compress(at).method == "cgx/maxmin" and policy.compress(below).method == "none"
    part = info(at).get_part(1, 100)  # a part of a big tensor is compressed as the big one
    assert policy.compress(at[:100], part).method == "cgx/maxmin"
    assert policy.estimate_compression_ratio(info(at)) == 0.25
    assert policy.estimate_compression_ratio(info(below)) == 1.0
    assert torch.equal(policy.extract(policy.compress(below)), below)


def test_role_and_per_tensor_policies():
    grad, fp16 = C.Uniform8BitQuantization(), C.Float16Compression()
    role = C.RoleAdaptiveCompression(gradient=grad, optimizer=fp16)
    x = torch.randn(10)
    assert role.choose_compression(info(x, role=C.TensorRole.GRADIENT)) is grad
    assert role.choose_compression(info(x, role="optimizer")) is fp16
    assert isinstance(role.choose_compression(info(x, role="activation")), C.NoCompression)
    assert isinstance(role.choose_compression(info(x)), C.NoCompression)  # UNSPECIFIED
    with pytest.raises(ValueError, match="unknown tensor role"):
        role.choose_compression(info(x, role="weights"))
    table = C.PerTensorCompression({"w": grad, "b": fp16})
    assert table.choose_compression(info(x, key="b")) is fp16
    with pytest.raises(ValueError, match="no entry for key 'z'"):
        table.compress(x, info(x, key="z"))
    seq = C.PerTensorCompression([grad, fp16])
    assert seq.choose_compression(info(x, key=1)) is fp16
    with pytest.raises(ValueError, match="use a dict"):
        seq.choose_compression(info(x, key="w"))
    nested = C.RoleAdaptiveCompression(gradient=C.SizeAdaptiveCompression(5, fp16, grad))
    assert C.resolve(nested, info(x, role="gradient")) is grad


def test_bad_input_is_a_clear_value_error():
    with pytest.raises(ValueError, match="does not support torch.int64"):
        C.Float16Compression().compress(torch.arange(4))
    with pytest.raises(ValueError, match="torch.Tensor"):
        C.Uniform8BitQuantization().compress([1.0, 2.0])
    with pytest.raises(ValueError, match="expected a torch_cgx.compression.Payload"):
        C.extract(b"bytes")
    with pytest.raises(ValueError, match="no CGXP header"):
        C.Payload.from_bytes(b"\x00" * 20)
    p = C.Quantile8BitQuantization().compress(torch.randn(100))
    with pytest.raises(ValueError, match="quantile8 payload of"):
        C.extract(C.Payload(p.method, p.data[:-1], p.shape, p.dtype))
    with pytest.raises(ValueError, match="unknown payload method"):
        C.extract(C.Payload("zip", p.data, p.shape, p.dtype))
    with pytest.raises(ValueError, match="threshold"):
        C.SizeAdaptiveCompression(-1, C.NoCompression(), C.NoCompression())
    with pytest.raises(ValueError, match="greater_equal must be a torch_cgx.compression"):
        C.SizeAdaptiveCompression(1, C.NoCompression(), "fp16")
    with pytest.raises(ValueError, match="block_size"):
        C.BlockwiseQuantization(0)
    with pytest.raises(ValueError, match="mapping"):
        C.PerTensorCompression(C.NoCompression())


def test_policy_state_resolves_every_parameter_once():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    policy = C.RoleAdaptiveCompression(
        gradient=C.SizeAdaptiveCompression(1000, C.NoCompression(), C.Uniform8BitQuantization()),
        default=C.Float16Compression(),
    )
    state = C.PolicyState(model, policy)
    assert state.codec_of("0.weight") == ("maxmin", {"bits": 8})
    assert state.codec_of("0.bias") is None and state.codec_of("1.weight") is None
    assert len(state.states) == 2  # exact and max-min 8: one CompressionState each
    as_params = C.PolicyState(model, policy, role=C.TensorRole.PARAMETER)
    assert as_params.codec_of("0.weight") == ("fp16", {})
    with pytest.raises(ValueError, match="no compressed allreduce"):
        C.PolicyState(model, C.ScaledFloat16Compression())
    with pytest.raises(ValueError, match="no entry for key '0.bias'"):
        C.PolicyState(model, C.PerTensorCompression({"0.weight": C.NoCompression()}))
    with pytest.raises(ValueError, match="module must be"):
        C.PolicyState("model", policy)


@pytest.mark.parametrize(
    "make",
    [
        C.NoCompression,
        C.Float16Compression,
        C.ScaledFloat16Compression,
        C.Uniform8BitQuantization,
        C.BlockwiseQuantization,
        C.Quantile8BitQuantization,
        lambda: C.CGXCompression("topk", ratio=1.0),
    ],
)
def test_empty_scalar_and_16_bit_tensors_keep_shape_and_dtype(make):
    for t in [torch.zeros(0), torch.zeros(2, 0, 3), torch.tensor(3.5), torch.ones(7).half(),
              torch.ones(7).bfloat16()]:  # fmt: skip
        back = C.extract(C.Payload.from_bytes(make().compress(t).to_bytes()))
        assert back.shape == t.shape and back.dtype == t.dtype
        if t.numel():
            assert torch.equal(back, t)  # constant values are exact in every codec
