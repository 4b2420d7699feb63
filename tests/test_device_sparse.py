"""The sparse device codecs (torch_cgx/device/codecs/sparse.py) against the native codecs: the
same payload bytes for the same (x, seed, stream, shared), the same decoded values bit for bit,
the native parameter validation, decode validation without out-of-bounds writes, and no host
reads but the documented size read (docs/gpu-codecs.md, "Sparse compressors on the device")."""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

from torch_cgx import compressors
from torch_cgx.device import codecs
from torch_cgx.device.codecs import sparse_select as sel
from torch_cgx.device.codecs.base import rng_key

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SIZES = [0, 1, 7, 1000, 70001]
BITS = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}

# parameter sets per compressor: defaults, k = 1, k = n, and values between
PARAMS = {
    "topk": [{}, {"ratio": 1e-9}, {"ratio": 1.0}, {"ratio": 0.3}],
    "randomk": [{}, {"ratio": 1e-9}, {"ratio": 1.0, "scale": 1}, {"ratio": 0.7, "scale": 1}],
    "threshold": [{}, {"tau": 0}, {"tau": 1.5}, {"tau": 1e30}],
    "dgc": [{}, {"ratio": 1e-9}, {"ratio": 1.0}, {"ratio": 0.05, "sample_rate": 1.0}],
    "graddrop": [{}, {"drop": 0.0}, {"drop": 0.9, "sample_rate": 0.5}],
}


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """Byte checks, not speed: one intra-op thread (on a loaded 2-core machine torch's
    two-thread kernels wait on each other many times longer than they compute)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _inputs(n: int, dtype: torch.dtype, gen: torch.Generator):
    """Normal values; ties (few distinct magnitudes, zeros and -0); NaN / +-Inf among normals."""
    normal = torch.randn(n, generator=gen)
    ties = torch.randint(-3, 4, (n,), generator=gen).float() * 0.5
    ties[::5] = -0.0
    special = normal.clone()
    if n:
        at = torch.randint(0, n, (max(1, n // 50),), generator=gen)
        special[at[::3]] = float("nan")
        special[at[1::3]] = float("inf")
        special[at[2::3]] = -float("inf")
    return [("normal", normal.to(dtype)), ("ties", ties.to(dtype)), ("special", special.to(dtype))]


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit, except that a NaN need only be a NaN: torch's and the native dtype
    conversions produce different NaN payloads (docs/gpu-codecs.md)."""
    if a.dtype != b.dtype or not torch.equal(a.isnan(), b.isnan()):
        return False
    keep = ~a.isnan()
    return torch.equal(a[keep].view(BITS[a.dtype]), b[keep].view(BITS[b.dtype]))


def _target(n: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """An accumulator for decode_add_ with -0 and NaN entries (left untouched where not carried)."""
    out = torch.randn(n, generator=gen)
    out[1::4] = -0.0
    out[2::9] = float("nan")
    return out.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(PARAMS))
def test_bytes_and_values_equal_native(name, dtype):
    gen = torch.Generator().manual_seed(hash((name, str(dtype))) % 2**31)
    for params in PARAMS[name]:
        native, device = compressors.get(name, **params), codecs.get(name, **params)
        for n in SIZES:
            assert device.encoded_size(n, dtype) == native.encoded_size(n, dtype)
            for kind, x in _inputs(n, dtype, gen):
                what = f"{name} {params} n={n} {kind}"
                seed, stream, shared = 7 + n, 3, 11
                want = native.encode(x, seed=seed, stream=stream, shared=shared)
                got = device.encode(x, seed=seed, stream=stream, shared=shared)
                assert torch.equal(got, want), what
                assert bool(device.header_ok(got, n, dtype)), what
                assert _same_bits(device.decode(got, n, dtype), native.decode(want, dtype=dtype))
                acc = _target(n, dtype, gen)
                want_acc = native.decode_add_(acc.clone(), want)
                assert _same_bits(device.decode_add_(acc, got), want_acc), what


@pytest.mark.parametrize("shape", [(1, 1), (3, 2), (10, 10), (50, 49), (1000, 1), (1000, 999)])
def test_random_k_is_floyd(shape):
    """The data-parallel Floyd gives prim::random_k's indices: read back from a native randomk
    payload of a tensor whose values are the indices' bit patterns (keys of many seeds)."""
    n, k = shape
    x = torch.arange(n, dtype=torch.int32).view(torch.float32)
    ratio = k / n
    native = compressors.get("randomk", ratio=ratio)
    assert sel.count_for(ratio, n) == k
    for seed in range(40):
        want = native.encode(x, seed=seed, shared=seed * 7)[32:].view(torch.int32).long()
        assert torch.equal(sel.random_k(n, k, *rng_key(seed, seed * 7)), want), (shape, seed)


def test_random_k_is_floyd_on_the_native_hash_set_path():
    """n above 2^25 with a small k: the native keeps the taken set in a hash set (not a bitmap);
    the picks are the same."""
    n, k = 2**25 + 4096, 300
    x = torch.arange(n, dtype=torch.int32).view(torch.float32)
    native = compressors.get("randomk", ratio=k / n)
    want = native.encode(x, seed=9, shared=4)[32:].view(torch.int32).long()
    assert torch.equal(sel.random_k(n, k, *rng_key(9, 4)), want)


def test_random_k_from_a_payload_key_on_the_device():
    """Decode regenerates the indices from the payload's key words (0-d tensors)."""
    n, k = 5000, 1234
    k0, k1 = rng_key(5, 6)
    host = sel.random_k(n, k, k0, k1)
    assert torch.equal(sel.random_k(n, k, torch.tensor(k0), torch.tensor(k1)), host)
    assert host.unique().numel() == k and int(host.max()) < n


def test_dgc_cap_takes_the_exact_top_k_with_ties_to_the_lower_index():
    """Equal magnitudes everywhere: every value passes the threshold, the cap C = 2k keeps the
    lowest indices (prim::top_k's tie rule), like the native codec."""
    x = torch.full((70001,), -0.25)
    for name, params in (("dgc", {"ratio": 0.01}), ("graddrop", {"drop": 0.99})):
        got = codecs.get(name, **params).encode(x, seed=1, stream=2)
        assert torch.equal(got, compressors.get(name, **params).encode(x, seed=1, stream=2))
        m = 2 * sel.count_for(0.01, x.numel())
        assert torch.equal(got[32 : 32 + 4 * m].view(torch.int32).long(), torch.arange(m))


@pytest.mark.parametrize("name", list(PARAMS))
def test_parameters_are_validated_like_the_native(name):
    assert codecs.get(name).params == {p["name"]: p["default"] for p in compressors.params(name)}
    bad = [{"nope": 1}, {list(codecs.get(name).params)[0]: -1.0}, {"ratio": 0}, {"drop": 1}]
    bad += [{"scale": 0.5}, {"sample_rate": 0}, {"tau": "x"}]
    for params in bad:
        try:
            compressors.get(name, **params)
        except ValueError as e:
            with pytest.raises(ValueError) as got:
                codecs.get(name, **params)
            assert str(got.value) == str(e)


@pytest.mark.parametrize("name", list(PARAMS))
def test_bad_payloads(name):
    """Sizes that no payload of (n, dtype) has raise ValueError on the host; corrupt bytes give
    header_ok False; out-of-range indices write nothing out of bounds."""
    params = {"ratio": 0.1} if name in ("topk", "randomk", "dgc") else {}
    c, n = codecs.get(name, **params), 1000
    x = torch.randn(n)
    good = c.encode(x, seed=1)
    for size in (0, 31, good.numel() - 1):
        with pytest.raises(ValueError, match=f"{name}"):
            c.decode(good[:size], n)
        assert not bool(c.header_ok(good[:size], n, torch.float32))
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        c.encode(x.long())
    with pytest.raises(ValueError, match="seed"):
        c.encode(x, seed=-1)
    with pytest.raises(ValueError, match="dtype"):
        c.encoded_size(n, torch.float64)
    for offset, value in ((0, ord("X")), (6, 99), (7, 0x80), (8, 1), (16, 1)):
        bad = good.clone()
        bad[offset] ^= value
        assert not bool(c.header_ok(bad, n, torch.float32)), (name, offset)
    assert not bool(c.header_ok(good, n + 1, torch.float32))
    if name == "randomk":  # a payload of the other scale setting
        assert not bool(codecs.get(name, scale=1, **params).header_ok(good, n, torch.float32))
        return
    m = (good.numel() - 32) // 8
    for index in (n, 2**32 - 1):  # out of range at the end: no write past out
        bad = good.clone()
        bad[32 + 4 * (m - 1) : 32 + 4 * m] = torch.tensor([index]).view(torch.uint8)[:4]
        assert not bool(c.header_ok(bad, n, torch.float32))
        guard = torch.zeros(n + 8)
        c.decode_add_(guard[:n], bad)
        assert torch.equal(guard[n:], torch.zeros(8))
        assert c.decode(bad, n).numel() == n
    bad = good.clone()  # not ascending
    bad[32:36], bad[36:40] = good[36:40], good[32:36]
    assert not bool(c.header_ok(bad, n, torch.float32))


class _HostReads(TorchFunctionMode):
    """Records the calls that move tensor values to the host or read a data-dependent size."""

    READS = {"item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__"}
    SIZES = {"nonzero", "masked_select", "unique", "unique_consecutive", "argwhere"}

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        to_cpu = name == "to" and any(
            str(a) == "cpu" for a in list(args[1:]) + list(kwargs.values())
        )
        if name in self.READS or name in self.SIZES or to_cpu:
            self.seen.append(name)
        return func(*args, **kwargs)


def test_no_host_reads_but_the_documented_size_read():
    t = torch.ones(3)
    with _HostReads() as probe:  # the probe sees each kind of read
        t.sum().item(), t.tolist(), t.cpu(), bool(t[0]), int(t[0]), float(t[0]), t.to("cpu")
        torch.nonzero(t)
    assert set(probe.seen) == {
        "item",
        "tolist",
        "cpu",
        "__bool__",
        "__int__",
        "__float__",
        "to",
    } | {"nonzero"}
    x = torch.randn(70001)
    x[5] = float("nan")
    for name, params in [("topk", {}), ("randomk", {"scale": 1}), ("threshold", {})] + [
        ("dgc", {"ratio": 0.01}),
        ("graddrop", {}),
    ]:
        c = codecs.get(name, **params)
        with _HostReads() as probe:
            payload = c.encode(x, seed=1, stream=2, shared=3)
        assert probe.seen == ([] if c.fixed_size else ["nonzero"]), name
        with _HostReads() as probe:
            c.decode(payload, x.numel())
            c.decode_add_(torch.zeros_like(x), payload)
            ok = c.header_ok(payload, x.numel(), x.dtype)
        assert probe.seen == [], name
        assert bool(ok)


@pytest.mark.parametrize("name", list(PARAMS))
def test_decode_add_into_a_strided_view(name):
    """``out`` need not be contiguous: the carried positions of the view are updated, like the
    native decode_add_, and the storage between its elements is untouched."""
    x = torch.randn(1000)
    payload = codecs.get(name).encode(x, seed=2, stream=1, shared=4)
    base = torch.randn(2000)
    between = base[1::2].clone()
    want = compressors.get(name).decode_add_(base[::2].clone(), payload)
    codecs.get(name).decode_add_(base[::2], payload)
    assert _same_bits(base[::2], want)
    assert _same_bits(base[1::2], between)
