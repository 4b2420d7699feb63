"""The sparseloco device codec (torch_cgx/device/codecs/sparseloco.py) against the native codec:
the same payload bytes, the same decoded values bit for bit (decode and decode_add_), the native
parameter validation, decode validation without out-of-bounds writes, and no host reads
(docs/gpu-codecs.md, "sparseloco on the device")."""

from __future__ import annotations

import struct

import pytest
import torch
from test_device_sparse import _HostReads, _same_bits, _target

from torch_cgx import compressors
from torch_cgx.device import codecs
from torch_cgx.device.codecs import sparse_select as sel
from torch_cgx.device.codecs.sparseloco import sequential_sum

NAME = "sparseloco"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SIZES = [0, 1, 7, 4096, 10000]
# defaults (a short last chunk of 10000); short tails of every size; bits 1, 2, 8; u32 indices
# (chunk > 65536: one chunk, shorter than chunk); k = L (ratio 1); k = 1 (tiny ratio)
PARAMS = [
    {},
    {"chunk": 1000, "ratio": 0.05},
    {"chunk": 3000, "ratio": 0.1, "bits": 8},
    {"chunk": 7, "ratio": 0.3, "bits": 1},
    {"chunk": 333, "ratio": 0.2, "bits": 1},
    {"chunk": 70000, "ratio": 0.01, "bits": 3},
    {"chunk": 64, "ratio": 1.0, "bits": 2},
    {"chunk": 512, "ratio": 1e-9, "bits": 4},
]


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """Byte checks, not speed: one intra-op thread (see tests/test_device_sparse.py)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _inputs(n: int, dtype: torch.dtype, gen: torch.Generator):
    """Normal values; ties (few distinct magnitudes, -0); magnitudes over a wide exponent range
    (the fp64 mean of bits = 1 rounds at many steps); NaN / +-Inf among normals."""
    normal = torch.randn(n, generator=gen)
    ties = torch.randint(-3, 4, (n,), generator=gen).float() * 0.5
    ties[::5] = -0.0
    wide = normal * torch.exp2(torch.randint(-30, 30, (n,), generator=gen).float())
    special = normal.clone()
    if n:
        at = torch.randint(0, n, (max(1, n // 300),), generator=gen)
        special[at[::3]] = float("nan")
        special[at[1::3]] = float("inf")
        special[at[2::3]] = -float("inf")
    cases = [("normal", normal), ("ties", ties), ("wide", wide), ("special", special)]
    return [(kind, x.to(dtype)) for kind, x in cases]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_bytes_and_values_equal_native(dtype):
    gen = torch.Generator().manual_seed(DTYPES.index(dtype))
    for params in PARAMS:
        native, device = compressors.get(NAME, **params), codecs.get(NAME, **params)
        for n in SIZES:
            assert device.encoded_size(n, dtype) == native.encoded_size(n, dtype)
            for kind, x in _inputs(n, dtype, gen):
                what = f"{params} n={n} {kind}"
                want = native.encode(x, seed=3, stream=4)
                got = device.encode(x, seed=3, stream=4)
                assert torch.equal(got, want), what
                assert got.numel() == device.encoded_size(n, dtype), what
                assert bool(device.header_ok(got, n, dtype)), what
                assert _same_bits(device.decode(got, n, dtype), native.decode(want, dtype=dtype))
                acc = _target(n, dtype, gen)
                want_acc = native.decode_add_(acc.clone(), want)
                assert _same_bits(device.decode_add_(acc, got), want_acc), what


def test_encoded_size_of_large_counts_without_data():
    """The fixed size is a function of (n, ratio, chunk, bits), up to the format's 2^48."""
    for params in PARAMS:
        native, device = compressors.get(NAME, **params), codecs.get(NAME, **params)
        for n in (2**32 + 5, 2**40 + 12345, 2**48):
            assert device.encoded_size(n) == native.encoded_size(n), (params, n)
    with pytest.raises(ValueError, match="numel"):
        codecs.get(NAME).encoded_size(2**48 + 1)


def test_ties_go_to_the_lower_index_in_every_chunk():
    """Equal magnitudes everywhere: each chunk keeps its first k positions (prim::top_k)."""
    chunk, ratio = 100, 0.05
    x = torch.full((1050,), -0.25)
    x[::2] = 0.25
    got = codecs.get(NAME, chunk=chunk, ratio=ratio).encode(x)
    assert torch.equal(got, compressors.get(NAME, chunk=chunk, ratio=ratio).encode(x))
    nc, k, k_tail = 11, sel.count_for(ratio, chunk), sel.count_for(ratio, 50)
    kept = 10 * k + k_tail
    index = got[32 + 8 * nc : 32 + 8 * nc + 2 * kept].view(torch.int16).long()
    want = torch.cat([torch.arange(k).repeat(10), torch.arange(k_tail)])
    assert torch.equal(index, want)


def test_a_non_finite_chunk_sends_nan_scalars_and_leaves_the_others():
    chunk = 256
    x = torch.randn(4 * chunk, generator=torch.Generator().manual_seed(5))
    x[chunk + 17] = float("inf")
    c = codecs.get(NAME, chunk=chunk)
    payload = c.encode(x)
    assert torch.equal(payload, compressors.get(NAME, chunk=chunk).encode(x))
    scalars = payload[32 : 32 + 8 * 4].view(torch.int32)
    assert scalars.tolist()[2:4] == [0x7FC00000] * 2  # C's NAN, both a and d of chunk 1
    out = c.decode(payload, x.numel())
    kept = out != 0
    assert out[chunk : 2 * chunk][kept[chunk : 2 * chunk]].isnan().all()
    assert out[:chunk].isfinite().all() and out[2 * chunk :].isfinite().all()


def test_sequential_sum_loop_and_cumsum_agree_with_the_native_order():
    """bits = 1: the fp64 sum in index order; the column loop (non-CPU devices) and CPU's cumsum
    give the left-to-right sum bit for bit, on values whose order changes the rounding."""
    gen = torch.Generator().manual_seed(1)
    v = (torch.randn(6, 300, generator=gen) * torch.exp2(torch.randint(-60, 60, (6, 300)))).abs()
    v = v.double()
    want = []
    for row in v.tolist():
        acc = 0.0
        for value in row:
            acc += value
        want.append(acc)
    want = torch.tensor(want, dtype=torch.float64)
    assert torch.equal(sequential_sum(v), want)
    assert torch.equal(sequential_sum(v, loop=True), want)
    assert not torch.equal(sequential_sum(v.flip(1)), want)  # the order matters for these


def test_bits_1_mean_sums_in_index_order():
    """bits = 1: the kept magnitudes' fp64 sum in index order decides the fp32 mean. With
    1, 2^-24 and two 2^-53, left to right each 2^-53 is a tie lost to even (the sum stays on
    fp32's midpoint 1 + 2^-24, rounding to 1); added first, they make 2^-52 and lift it to
    1 + 2^-23. Every order of the four in a chunk against the native."""
    import itertools

    values = [1.0, 2.0**-24, 2.0**-53, 2.0**-53]
    orders = sorted(set(itertools.permutations(values)))
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.tensor([v for order in orders for v in order]).to(dtype)
        params = {"chunk": 4, "ratio": 1.0, "bits": 1}
        got = codecs.get(NAME, **params).encode(x)
        assert torch.equal(got, compressors.get(NAME, **params).encode(x)), dtype
        a = got[32 : 32 + 8 * len(orders)].view(torch.float32)[::2]
        assert set(a.tolist()) == {0.25, (1 + 2.0**-23) / 4}, dtype


def test_quantization_error_within_half_a_step():
    """FORMAT.md's bound: a kept value decodes within d/2 (plus fp32 rounding) with its sign;
    bits = 1 within hi - lo; values not kept decode to 0."""
    chunk, ratio = 500, 0.1
    x = torch.randn(5000, generator=torch.Generator().manual_seed(2))
    rows = x.view(-1, chunk)
    k = sel.count_for(ratio, chunk)
    for bits in (1, 2, 8):
        out = codecs.get(NAME, chunk=chunk, ratio=ratio, bits=bits).decode(
            codecs.get(NAME, chunk=chunk, ratio=ratio, bits=bits).encode(x), x.numel()
        )
        out = out.view(-1, chunk)
        kept = out != 0
        assert torch.equal(kept.sum(1), torch.full((10,), k))
        mag = torch.where(kept, rows.abs(), torch.nan)
        lo, hi = mag.nan_to_num(float("inf")).amin(1), mag.nan_to_num(0).amax(1)
        bound = (hi - lo) if bits == 1 else (hi - lo) / ((1 << (bits - 1)) - 1) / 2
        err = (out - rows).abs().where(kept, torch.zeros(()))
        assert (err <= bound[:, None] * (1 + 1e-5) + 1e-6).all(), bits
        assert torch.equal(out.sign()[kept], rows.sign()[kept])


def test_parameters_are_validated_like_the_native():
    assert codecs.get(NAME).params == {p["name"]: p["default"] for p in compressors.params(NAME)}
    bad = [{"nope": 1}, {"ratio": 0}, {"ratio": 1.5}, {"chunk": 0}, {"chunk": 2.5}]
    bad += [{"bits": 0}, {"bits": 9}, {"ratio": "x"}]
    for params in bad:
        with pytest.raises(ValueError) as native:
            compressors.get(NAME, **params)
        with pytest.raises(ValueError) as device:
            codecs.get(NAME, **params)
        assert str(device.value) == str(native.value)


def _index_at(payload: torch.Tensor, nc: int, j: int, value: int) -> torch.Tensor:
    bad = payload.clone()
    at = 32 + 8 * nc + 2 * j
    bad[at : at + 2] = torch.tensor([value], dtype=torch.int32).view(torch.uint8)[:2]
    return bad


def test_bad_payloads():
    """Sizes no payload of (n, dtype) has raise ValueError on the host; corrupt headers (other
    parameters in param0 / param1 included), indices out of their chunk or not ascending give
    header_ok False; no write lands outside ``out``."""
    chunk, ratio, n = 100, 0.05, 1000
    c = codecs.get(NAME, chunk=chunk, ratio=ratio)
    x = torch.randn(n, generator=torch.Generator().manual_seed(3))
    good = c.encode(x)
    for size in (0, 31, good.numel() - 1):
        with pytest.raises(ValueError, match=NAME):
            c.decode(good[:size], n)
        assert not bool(c.header_ok(good[:size], n, torch.float32))
    with pytest.raises(ValueError, match="1-D uint8"):
        c.decode(good.float(), n)
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        c.encode(x.double())
    with pytest.raises(ValueError, match="seed"):
        c.encode(x, seed=-1)
    with pytest.raises(ValueError, match="dtype"):
        c.encoded_size(n, torch.float64)
    for offset, flip in (
        (0, 88),
        (4, 1),
        (5, 1),
        (6, 99),
        (7, 1),
        (8, 1),
        (16, 1),
        (24, 1),
        (28, 1),
    ):
        bad = good.clone()
        bad[offset] ^= flip
        assert not bool(c.header_ok(bad, n, torch.float32)), offset
    assert not bool(c.header_ok(good, n, torch.float16))
    nc, k = n // chunk, sel.count_for(ratio, chunk)
    assert bool(c.header_ok(good, n, torch.float32))
    # out of its chunk (into the next one's range; past u16's chunk length), not ascending
    for j, value in ((k - 1, chunk), (9 * k + k - 1, 0xFFFF), (1, 0)):
        bad = _index_at(good, nc, j, value)
        assert not bool(c.header_ok(bad, n, torch.float32)), (j, value)
        guard = torch.zeros(n + 8)
        c.decode_add_(guard[:n], bad)
        assert torch.equal(guard[n:], torch.zeros(8))
        assert c.decode(bad, n).numel() == n
    bad = _index_at(good, nc, k - 1, chunk)  # chunk 0's index 100 does not write chunk 1's 0
    assert torch.equal(c.decode(bad, n)[chunk:], c.decode(good, n)[chunk:])
    acc = torch.zeros(n)
    assert torch.equal(c.decode_add_(acc, bad)[chunk:], c.decode(good, n)[chunk:])


def test_no_host_reads():
    x = torch.randn(10000)
    x[5] = float("nan")
    for params in ({}, {"chunk": 1000, "bits": 1}, {"chunk": 70000, "bits": 8}):
        c = codecs.get(NAME, **params)
        with _HostReads() as probe:
            payload = c.encode(x, seed=1, stream=2, shared=3)
            c.decode(payload, x.numel())
            c.decode_add_(torch.zeros_like(x), payload)
            ok = c.header_ok(payload, x.numel(), x.dtype)
        assert probe.seen == [], params
        assert bool(ok)


def test_decode_add_into_a_strided_view():
    x = torch.randn(1000)
    params = {"chunk": 300, "ratio": 0.1}
    payload = codecs.get(NAME, **params).encode(x)
    base = torch.randn(2000)
    between = base[1::2].clone()
    want = compressors.get(NAME, **params).decode_add_(base[::2].clone(), payload)
    codecs.get(NAME, **params).decode_add_(base[::2], payload)
    assert _same_bits(base[::2], want)
    assert _same_bits(base[1::2], between)


def test_strided_input_encodes_like_its_copy():
    x = torch.randn(3000)
    c = codecs.get(NAME, chunk=256)
    assert torch.equal(c.encode(x[::3]), compressors.get(NAME, chunk=256).encode(x[::3].clone()))
    assert struct.unpack("<II", bytes(c.encode(x)[24:32].tolist())) == (256, 2)
