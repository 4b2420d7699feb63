"""Every registered compressor, generically (the registry decides what runs here): sizes, dtypes,
odd and empty sizes, error bounds and definitions derived per compressor, unbiasedness within 5
sigma for the unbiased stochastic ones, non-finite input never decoding to finite output,
corrupted payloads raising ValueError (always for a checked header byte), identical bytes across
thread counts and instruction sets."""

from __future__ import annotations

import math

import pytest
import torch

import torch_cgx  # noqa: F401  (loads the extension, applies process settings)
from benchmarks import compressor_checks
from torch_cgx import _C, codec, compressors

NAMES = compressors.native.names()  # written in Python: tests/test_python_compressors.py
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def sample(n: int, dtype=torch.float32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    scale = 1 + torch.arange(n) % 7
    return (torch.randn(n, generator=g) * scale).to(dtype)


def _buckets(x: torch.Tensor, bucket: int):
    bucket = bucket or max(x.numel(), 1)
    return [x[i : i + bucket] for i in range(0, x.numel(), bucket)]


def _per_bucket(x: torch.Tensor, bucket: int, fn) -> torch.Tensor:
    return torch.cat([fn(b).expand(b.numel()) for b in _buckets(x, bucket)]) if x.numel() else x


# Per compressor (default parameters): the largest |decode(encode(x)) - x| allowed per element,
# derived from its definition (docs/FORMAT.md), with fp32 slack, where it is below |x| (a bound
# of |x| or more cannot tell a decode to zeros). Every compressor is also judged by its
# definition (benchmarks.compressor_checks: onebit's and efsignsgd's means, terngrad's levels,
# the sure codes at |x| = s and their count, random-k's count and values, the sampled
# compressors' selection, ...), which a decode to zeros or a scaled decode fails.
def _bound_maxmin(x):
    return _per_bucket(
        x, 512, lambda b: (b.max() - b.min()) / 15 / 2 * 1.001 + 1e-6 * b.abs().max()
    )


BOUNDS = {
    "maxmin": _bound_maxmin,
    "fp16": lambda x: x.abs() * 2**-11 + 2**-25,
    "bf16": lambda x: x.abs() * 2**-8 + 2**-134,
    "qsgd": lambda x: _per_bucket(x, 512, lambda b: b.norm() / 7) * 1.00001 + 1e-6 * x.abs(),
    "tbq": lambda x: torch.where(x.abs() >= 1, x.abs() - 1, x.abs()),
}

# What decode(encode(x)) must equal exactly, where the definition leaves no freedom.
EXACT = {
    "signsgd": lambda x: torch.where(x < 0, -1.0, 1.0),
    "signum": lambda x: torch.where(x < 0, -1.0, 1.0),
    "efsignsgd": lambda x: torch.where(x < 0, -1.0, 1.0) * x.abs().double().mean().float(),
    "tbq": lambda x: torch.where(x >= 1, 1.0, torch.where(x <= -1, -1.0, 0.0)),
}

STOCHASTIC_UNBIASED = {"terngrad": {}, "qsgd": {}, "maxmin": {"stochastic": 1}}


@pytest.mark.parametrize("name", NAMES)
def test_sizes_dtypes_and_odd_lengths(name):
    c = compressors.get(name)
    for dtype in DTYPES:
        for n in (0, 1, 2, 7, 31, 1000, 4099):
            x = sample(n, dtype, n)
            p = c.encode(x, seed=1, stream=2, shared=3)
            assert p.dtype == torch.uint8 and p.dim() == 1
            size = c.encoded_size(n, dtype)
            assert p.numel() == size if c.traits["fixed_size"] else p.numel() <= size
            assert c.numel(p) == n
            for out_dtype in DTYPES:
                y = c.decode(p, dtype=out_dtype)
                assert y.dtype == out_dtype and y.shape == (n,)
            y = c.decode(p)
            acc = torch.linspace(-1, 1, n)
            want = acc + y
            assert torch.equal(c.decode_add_(acc, p), want) or n == 0


@pytest.mark.parametrize("name", NAMES)
def test_round_trip_within_its_bound(name):
    assert name in compressor_checks.CHECKS, f"give {name} a check of its definition"
    c = compressors.get(name)
    x = sample(20000, seed=5)
    y = c.decode(c.encode(x, seed=3, stream=4, shared=5))
    if name in BOUNDS:
        bound, err = BOUNDS[name](x), (y - x).abs()
        assert bool((err <= bound).all()), f"{name}: max excess {(err - bound).max():.3g}"
    if name in EXACT:
        assert torch.equal(y, EXACT[name](x)), f"{name} differs from its definition"
    params = {p["name"]: p["default"] for p in compressors.params(name)}
    judged = compressor_checks.check(name, x, y, params)
    assert judged.ok, f"{name}: {judged.detail}"


@pytest.mark.parametrize("name", sorted(STOCHASTIC_UNBIASED))
def test_unbiased_within_five_sigma(name):
    c = compressors.get(name, **STOCHASTIC_UNBIASED[name])
    assert not c.traits["biased"]
    x = sample(64, seed=9)
    runs = torch.stack([c.decode(c.encode(x, seed=7, stream=s)) for s in range(3000)]).double()
    mean, sem = runs.mean(0), runs.std(0) / math.sqrt(runs.shape[0])
    z = ((mean - x.double()).abs() / sem.clamp(min=1e-12))[sem > 0]
    assert bool((z < 5).all()), f"{name}: largest |bias| / sigma = {z.max():.2f}"
    assert (runs.std(0) > 0).any(), "not stochastic at all"


@pytest.mark.parametrize("name", NAMES)
def test_non_finite_input_never_decodes_to_finite(name):
    c = compressors.get(name)
    for bad in (float("nan"), float("inf"), -float("inf")):
        x = sample(1000, seed=2)
        x[123] = bad
        y = c.decode(c.encode(x, seed=1, stream=1, shared=1))
        assert not bool(torch.isfinite(y).all()), f"{name} hid a {bad}"


@pytest.mark.parametrize("name", NAMES)
def test_corrupted_payloads_raise_value_error(name):
    c = compressors.get(name)
    x = sample(777, seed=4)
    p = c.encode(x, seed=1, stream=2, shared=3)
    for cut in (0, 5, 31, p.numel() - 1):
        with pytest.raises(ValueError):
            c.decode(p[:cut].clone())
    with pytest.raises(ValueError):
        c.decode(p, out=torch.empty(776))
    other = compressors.get("fp16" if name != "fp16" else "bf16").encode(x)
    with pytest.raises(ValueError):
        c.decode(other)
    # Header bytes every decode checks (docs/FORMAT.md): a change to any one of them raises.
    checked = _always_checked(name)
    for i in sorted(checked):
        for flip in (0x01, 0x80, 0xFF):
            bad = p.clone()
            bad[i] ^= flip
            with pytest.raises(ValueError):
                c.decode(bad, out=torch.empty(777))
    # Three random bytes changed: ValueError (always when a checked byte changed), or 777 values
    # (corrupt scalars and codes decode to some values, in bounds: nothing else is raised).
    g = torch.Generator().manual_seed(0)
    raised = 0
    for _ in range(200):
        bad = p.clone()
        pos = torch.randint(0, p.numel(), (3,), generator=g)
        bad[pos] ^= torch.randint(1, 256, (3,), generator=g, dtype=torch.uint8)
        try:
            y = c.decode(bad, out=torch.empty(777))
        except ValueError:
            raised += 1
            continue
        assert not checked & set(pos.tolist()), f"{name}: bytes {pos.tolist()} went unnoticed"
        assert y.shape == (777,) and y.dtype == torch.float32
    assert raised > 0  # the checked bytes are hit too


def _always_checked(name: str) -> set:
    """max-min: magic, version, bits (the size follows them), reserved, count; the others'
    envelope: magic, version, compressor id, count, body size."""
    if name == "maxmin":
        return set(range(5)) | {6} | set(range(12, 24))
    return set(range(5)) | {6} | set(range(8, 24))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", NAMES)
def test_same_bytes_for_every_thread_count_and_isa(name, dtype):
    """Payloads and decoded bits agree across thread counts and instruction sets, also with
    NaN / Inf / -0 / subnormal values in a few buckets."""
    c = compressors.get(name)
    x = sample(300_001, seed=8)
    x[1000:1003] = torch.tensor([float("nan"), float("inf"), -0.0])
    x[5000:5002] = torch.tensor([1e-40, -1e-42])
    x = x.to(dtype)
    before, isa = codec.num_threads(), _C.isa()
    try:
        outs, decoded = [], []
        for threads, avx2 in ((1, False), (2, True), (3, True)):
            codec.set_num_threads(threads)
            _C.set_isa(avx2)
            outs.append(c.encode(x, seed=1, stream=2, shared=3))
            acc = torch.linspace(-1, 1, x.numel())
            c.decode_add_(acc, outs[0])
            decoded.append(acc.view(torch.int32))
        assert all(torch.equal(o, outs[0]) for o in outs)
        assert all(torch.equal(d, decoded[0]) for d in decoded)
    finally:
        codec.set_num_threads(before)
        _C.set_isa(isa == "avx2")


def test_api_errors_are_clear():
    assert NAMES[:4] == ["maxmin", "fp16", "bf16", "signsgd"]
    with pytest.raises(ValueError, match="unknown compressor 'nope'"):
        compressors.get("nope")
    with pytest.raises(ValueError, match="qsgd parameter bits must be in"):
        compressors.get("qsgd", bits=1)
    with pytest.raises(ValueError, match="has no parameter 'bitz'"):
        compressors.get("maxmin", bitz=3)
    with pytest.raises(ValueError, match="must be an integer"):
        compressors.get("maxmin", bits=2.5)
    with pytest.raises(ValueError, match="must be a number"):
        compressors.get("maxmin", bits="4")
    c = compressors.get("maxmin", bits=2)
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        c.encode(torch.ones(4, dtype=torch.int32))
    with pytest.raises(ValueError, match="1-D uint8"):
        c.decode(torch.ones(4))
    assert [p["name"] for p in compressors.params("maxmin")] == [
        "bits", "bucket_size", "skip_incomplete_buckets", "stochastic", "clip",
    ]  # fmt: skip
    assert repr(c) == "compressors.get('maxmin', bits=2)"


def test_maxmin_compressor_is_the_codec_byte_for_byte():
    x = sample(10_000, seed=6)
    for bits, bucket in ((4, 512), (2, 128), (8, 1000)):
        c = compressors.get("maxmin", bits=bits, bucket_size=bucket)
        assert torch.equal(c.encode(x), codec.encode(x, bits=bits, bucket_size=bucket))
    clipped = compressors.get("maxmin", bits=2, bucket_size=128, clip=1)
    assert torch.equal(clipped.encode(x), codec.encode(x, bits=2, bucket_size=128, clip=True))


def _topk(x, ratio=0.01):
    keep = torch.zeros_like(x, dtype=torch.bool)
    keep[x.abs().topk(math.ceil(ratio * x.numel())).indices] = True
    return torch.where(keep, x, 0.0)


EXACT.update(
    {
        "topk": _topk,
        "threshold": lambda x: torch.where(x.abs() >= 0.01, x, 0.0),
    }
)


def test_encode_into_out_buffer():
    """encode(out=) writes the same payload into a caller's buffer (a view of its first bytes);
    a wrong buffer is a clear ValueError and leaves the buffer untouched."""
    x = sample(10_007)
    for name in ("qsgd", "topk", "fp16"):
        c = compressors.get(name)
        buf = torch.full((c.encoded_size(x.numel()) + 5,), 0xAB, dtype=torch.uint8)
        p = c.encode(x, seed=1, stream=2, out=buf)
        assert torch.equal(p, c.encode(x, seed=1, stream=2))
        assert p.data_ptr() == buf.data_ptr()
        assert (buf[p.numel() :] == 0xAB).all()
    c = compressors.get("qsgd")
    need = c.encoded_size(x.numel())
    small = torch.zeros(need - 1, dtype=torch.uint8)
    with pytest.raises(
        ValueError, match=f"out holds {need - 1} bytes, the payload needs up to {need}"
    ):
        c.encode(x, out=small)
    assert (small == 0).all()
    with pytest.raises(ValueError, match="out must be a 1-D uint8 tensor"):
        c.encode(x, out=torch.zeros(need, dtype=torch.int32))
    with pytest.raises(ValueError, match="contiguous"):
        c.encode(x, out=torch.zeros(2 * need, dtype=torch.uint8)[::2])
    raw = torch.zeros(4 * x.numel() + need, dtype=torch.uint8)
    with pytest.raises(ValueError, match="overlaps"):
        c.encode(raw[: 4 * x.numel()].view(torch.float32), out=raw[8:])
