"""The dense compressors' device codecs (torch_cgx/device/codecs/dense.py, signs.py, levels.py) on
CPU tensors: the native codec's bytes for the same (input, seed, stream), its decoded values bit
for bit (NaN payloads included) into fp32 / fp16 / bf16, the native parameters and messages, the
host-side size checks, header_ok, and no value ever read back to the host."""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

from torch_cgx import compressors
from torch_cgx.device import codecs
from torch_cgx.device.codecs import dense

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SIZES = [0, 1, 7, 8, 9, 1000, 70001]
NAMES = list(dense.CODECS)
# (name, parameters): every compressor, bucket sizes 0 (whole tensor) / odd / default
CONFIGS = [
    ("fp16", {}),
    ("bf16", {}),
    ("signsgd", {}),
    ("signum", {}),
    ("onebit", {}),
    ("onebit", {"bucket_size": 0}),
    ("onebit", {"bucket_size": 7}),
    ("efsignsgd", {}),
    ("efsignsgd", {"bucket_size": 9}),
    ("efsignsgd", {"bucket_size": 4294967295}),
    ("terngrad", {}),
    ("terngrad", {"bucket_size": 0, "clip": 2.5}),
    ("terngrad", {"bucket_size": 100, "clip": 1.5}),
    ("qsgd", {}),
    ("qsgd", {"bits": 2, "bucket_size": 0}),
    ("qsgd", {"bits": 8, "bucket_size": 33}),
    ("tbq", {}),
    ("tbq", {"tau": 0.25}),
]
CONFIG_IDS = [n + "".join(f"-{k}={v}" for k, v in p.items()) for n, p in CONFIGS]


@pytest.fixture(autouse=True)
def _one_thread():
    """Byte checks, not speed: one intra-op thread (on a loaded 2-core machine two-thread kernels
    mostly wait for each other)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def bits_of(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(-1).view(torch.uint8)


def check_same(name: str, params: dict, x: torch.Tensor, out_dtypes=DTYPES, **keys) -> None:
    """Encode, decode and decode_add_ of the device codec equal the native codec's, bitwise."""
    native, device = compressors.get(name, **params), codecs.get(name, **params)
    want = native.encode(x, **keys)
    got = device.encode(x, **keys)
    what = f"{name} {params} {x.dtype} n={x.numel()} {keys}"
    assert got.dtype == torch.uint8 and got.dim() == 1, what
    assert got.numel() == device.encoded_size(x.numel(), x.dtype) == want.numel(), what
    assert torch.equal(got, want), f"{what}: bytes {(got != want).nonzero().view(-1)[:8]}"
    assert bool(device.header_ok(got, x.numel(), x.dtype)), what
    for od in out_dtypes:
        ref = native.decode(want, out=torch.empty(x.numel(), dtype=od))
        dec = device.decode(got, x.numel(), od)
        assert dec.dtype == od and torch.equal(bits_of(dec), bits_of(ref)), f"{what} -> {od}"
        acc = (torch.arange(x.numel(), dtype=torch.float32) % 13 - 6.5).to(od)
        ref = native.decode_add_(acc.clone(), want)
        add = device.decode_add_(acc.clone(), got)
        assert torch.equal(bits_of(add), bits_of(ref)), f"{what} += -> {od}"


@pytest.mark.parametrize("name,params", CONFIGS, ids=CONFIG_IDS)
def test_native_bytes_and_values(name, params):
    g = torch.Generator().manual_seed(len(CONFIG_IDS[CONFIGS.index((name, params))]))
    for n in SIZES:
        for dtype in DTYPES:
            x = (torch.randn(n, generator=g) * 3).to(dtype)
            if n > 9:
                x[3], x[4] = 0.0, -0.0
            # the large size: every output dtype for fp32 input, fp32 output for the others
            outs = DTYPES if n < 70001 or dtype == torch.float32 else [torch.float32]
            check_same(name, params, x, outs, seed=n + 1, stream=7)


def special(kind: str, n: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g)
    if kind == "zeros":
        x.zero_()
    elif kind == "negzero":
        x.fill_(-0.0)
    elif kind in ("nan", "-nan", "inf", "-inf"):
        x[n // 2] = float(kind)
    elif kind == "huge":
        x *= 3e38
    elif kind == "tiny":
        x *= 1e-41  # fp32 denormals (zero in fp16)
    elif kind == "fp16-nan-payloads":  # a signalling NaN and a negative NaN with a payload
        h = x.half().view(torch.int16)
        h[n // 2], h[n - 1] = 0x7C01, -0x0201
        return h.view(torch.float16).to(dtype) if dtype != torch.float16 else h.view(dtype)
    return x.to(dtype)


@pytest.mark.parametrize(
    "kind", ["zeros", "negzero", "nan", "-nan", "inf", "-inf", "huge", "tiny", "fp16-nan-payloads"]
)
def test_special_values(kind):
    for name, params in CONFIGS:
        for n in (1, 9, 1000):
            for dtype in DTYPES:
                check_same(name, params, special(kind, n, dtype), seed=3, stream=n)


def test_conversions_every_bit_pattern():
    """fp16 / bf16 of random fp32 bit patterns (NaN payloads, denormals, overflow, the rounding
    boundaries) and of every 16-bit pattern, encoded and decoded."""
    g = torch.Generator().manual_seed(5)
    words = torch.randint(-(2**31), 2**31, (1 << 16,), generator=g, dtype=torch.int64)
    edges = [65504.0, 65519.99, 65520.0, 6.1e-5, 5.96e-8, 2.98e-8, 2.99e-8, 1e-45, 3.4e38]
    x = torch.cat([words.to(torch.int32).view(torch.float32), torch.tensor(edges)])
    every16 = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    for name in ("fp16", "bf16"):
        check_same(name, {}, torch.cat([x, -x]))
        for dtype in (torch.float16, torch.bfloat16):
            check_same(name, {}, every16.view(dtype))


def test_decode_add_into_nan_and_inf():
    """NaN and Inf already in ``out``: native bits. Where both the decoded value and ``out``
    are NaN, which payload the sum keeps is the compiler's choice (an addition's operands may
    be swapped; IEEE 754 leaves it open: seen to differ between GCC builds), so there the sum
    need only be NaN."""
    for name, params in CONFIGS:
        for dtype in DTYPES:
            x = torch.randn(1000)
            x[10], x[600] = float("nan"), -float("nan")
            native, device = compressors.get(name, **params), codecs.get(name, **params)
            payload = device.encode(x.to(dtype), seed=1)
            decoded = native.decode_add_(torch.zeros(1000), payload)
            for od in DTYPES:
                out = torch.randn(1000)
                out[10], out[20], out[600] = -float("nan"), float("nan"), float("inf")
                both = decoded.isnan() & out.isnan()
                ref = native.decode_add_(out.to(od), payload)
                got = device.decode_add_(out.to(od), payload)
                what = f"{name} {params} {dtype}->{od}"
                assert got.isnan().equal(ref.isnan()), what
                got[both], ref[both] = 0, 0
                assert torch.equal(bits_of(got), bits_of(ref)), what


def test_stochastic_keys():
    """terngrad / qsgd draw the max-min generator's uniforms: native bytes for extreme keys."""
    x = torch.randn(3001)
    for name, params in (("terngrad", {}), ("qsgd", {"bits": 3}), ("terngrad", {"clip": 2.0})):
        for seed, stream in ((0, 0), (2**64 - 1, 2**63 + 5), (12345, 2**32 + 1)):
            check_same(name, params, x, [torch.float32], seed=seed, stream=stream)
    a = codecs.get("qsgd").encode(x, seed=1, stream=0)
    assert not torch.equal(a, codecs.get("qsgd").encode(x, seed=1, stream=1))


def test_lane_order_matters():
    """onebit's means come from (sum x -+ sum |x|) / 2 with cancellation: an input where a plain
    left-to-right fp64 sum gives another mean than the eight-lane order, and the device codec
    gives the native (lane-ordered) one."""
    x = torch.tensor([1e15, -1.0, 3.0, -1e-3, 7.0, -2.5, 0.3, -1.7] * 40 + [1e-7, -3.3])
    total = total_abs = 0.0
    for v in (float(v) for v in x):  # left to right (Python 3.12's sum() compensates)
        total, total_abs = total + v, total_abs + abs(v)
    neg_sequential = (total - total_abs) / 2
    nneg = int((x < 0).sum())
    device = codecs.get("onebit", bucket_size=0).encode(x)
    native = compressors.get("onebit", bucket_size=0).encode(x)
    assert torch.equal(device, native)
    stored = float(device[32:36].clone().view(torch.float32)[0])
    assert stored != float(torch.tensor(neg_sequential / nneg, dtype=torch.float32))


def test_parameters_like_native():
    for name in NAMES:
        codec = codecs.get(name)
        want = {s["name"]: s["default"] for s in compressors.params(name)}
        assert codec.config == want, name
        for n in SIZES:
            for dtype in DTYPES:
                assert codec.encoded_size(n, dtype) == compressors.get(name).encoded_size(n, dtype)
    bad = [
        ("qsgd", {"bits": 9}),
        ("qsgd", {"bits": 1}),
        ("qsgd", {"bits": 2.5}),
        ("tbq", {"tau": 0}),
        ("tbq", {"tau": float("inf")}),
        ("onebit", {"bucket_size": -1}),
        ("onebit", {"bucket_size": 2**32}),
        ("terngrad", {"clip": float("nan")}),
        ("terngrad", {"clip": 1001}),
        ("efsignsgd", {"foo": 1}),
        ("fp16", {"bucket_size": 1}),
        ("signsgd", {"x": "1"}),
    ]
    for name, params in bad:
        with pytest.raises(ValueError) as native:
            compressors.get(name, **params)
        with pytest.raises(ValueError) as device:
            codecs.get(name, **params)
        assert str(device.value) == str(native.value), (name, params)


def test_bad_input():
    codec = codecs.get("qsgd")
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        codec.encode(torch.arange(4))
    with pytest.raises(ValueError, match="seed"):
        codec.encode(torch.ones(4), seed=-1)
    with pytest.raises(ValueError, match="stream"):
        codec.encode(torch.ones(4), stream=2**64)
    with pytest.raises(ValueError, match="numel"):
        codec.encoded_size(-1)
    with pytest.raises(ValueError, match="dtype"):
        codec.decode(codec.encode(torch.ones(4)), 4, torch.int32)


@pytest.mark.parametrize("name", NAMES)
def test_sizes_checked_on_the_host(name):
    codec = codecs.get(name)
    payload = codec.encode(torch.randn(100))
    for wrong in (payload[:-1], torch.cat([payload, payload[:1]]), payload[:31]):
        for call in (
            lambda p: codec.decode(p, 100),
            lambda p: codec.values(p, 100, torch.float32),
            lambda p: codec.decode_add_(torch.zeros(100), p),
        ):
            with pytest.raises(ValueError, match="payload"):
                call(wrong)
        assert not bool(codec.header_ok(wrong, 100, torch.float32))
    with pytest.raises(ValueError, match="payload"):
        codec.decode(payload, 99 if name in ("fp16", "bf16") else 1000)
    with pytest.raises(ValueError, match="uint8"):
        codec.decode(payload.view(torch.int8), 100)


@pytest.mark.parametrize("name", NAMES)
def test_header_ok(name):
    """header_ok: False for each corrupt envelope field, a count or dtype the receiver does not
    expect, unknown flags; flag bit 0 is fine where the compressor defines it."""
    codec = codecs.get(name)
    payload = codec.encode(torch.randn(100))
    assert bool(codec.header_ok(payload, 100, torch.float32))
    assert not bool(codec.header_ok(payload, 100, torch.float16))
    for offset in (0, 3, 4, 5, 6, 8, 13, 16, 24, 28, 31):
        bad = payload.clone()
        bad[offset] ^= 0x10
        assert not bool(codec.header_ok(bad, 100, torch.float32)), offset
    for flag, ok in ((1, codec.flag_mask & 1), (2, False), (0x80, False)):
        bad = payload.clone()
        bad[7] |= flag
        assert bool(codec.header_ok(bad, 100, torch.float32)) == bool(ok), flag


@pytest.mark.parametrize("name", ["terngrad", "tbq"])
def test_code3_flagged(name):
    """Code 3 of a 2-bit format: the native decoder raises; the device one decodes it to NaN and
    header_ok is False (a device-side check the caller reads when it synchronises anyway)."""
    codec = codecs.get(name)
    payload = codec.encode(torch.zeros(40))
    payload[-1] = 0xFF  # codes 36..39 = 3
    assert not bool(codec.header_ok(payload, 40, torch.float32))
    with pytest.raises(ValueError, match="code 3"):
        compressors.get(name).decode(payload)
    out = codec.decode(payload, 40)
    assert torch.isnan(out[36:]).all() and (out[:36] == 0).all()


class _HostReads(TorchFunctionMode):
    """Records every call that would copy a tensor's values to the host (a GPU synchronisation)."""

    _NAMES = {"item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__"}

    def __init__(self) -> None:
        super().__init__()
        self.seen = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        to_host = name == "to" and any(
            str(a) == "cpu" for a in list(args[1:]) + [kwargs.get("device")] if a is not None
        )
        if name in self._NAMES or to_host:
            self.seen.append(name)
        return func(*args, **kwargs)


def test_no_values_to_the_host():
    for name, params in CONFIGS:
        codec = codecs.get(name, **params)
        for dtype in DTYPES:
            x = torch.randn(1001).to(dtype)
            x[5] = float("nan")
            with _HostReads() as mode:
                p = codec.encode(x, seed=3, stream=4)
                codec.header_ok(p, 1001, dtype)
                codec.decode(p, 1001, dtype)
                codec.decode_add_(torch.zeros(1001, dtype=dtype), p)
                codec.values(p, 1001, dtype)
            assert mode.seen == [], f"{name} {params} {dtype}: {mode.seen}"
    with _HostReads() as mode:  # the recorder sees what it must
        bool(torch.ones(()) > 0)
        torch.ones(2).to("cpu")
    assert mode.seen == ["__bool__", "to"]


def test_registry():
    assert set(NAMES) == {"fp16", "bf16", "signsgd", "signum", "onebit", "efsignsgd"} | {
        "terngrad",
        "qsgd",
        "tbq",
    }
    for name in NAMES:
        codec = codecs.get(name)
        assert isinstance(codec, dense.CODECS[name]) and codec.name == name
        assert name in repr(codec)


def test_decode_add_into_a_strided_view():
    for name, params in CONFIGS[::3]:
        native, device = compressors.get(name, **params), codecs.get(name, **params)
        payload = device.encode(torch.randn(50))
        for od in DTYPES:
            base = torch.randn(10, 10).to(od)
            want, got = base.clone(), base.clone()
            native.decode_add_(want[:, ::2], payload)
            device.decode_add_(got[:, ::2], payload)
            assert torch.equal(bits_of(got), bits_of(want)), f"{name} {params} {od}"
