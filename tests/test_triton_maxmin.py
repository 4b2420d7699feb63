"""Triton max-min (torch_cgx/device/triton/maxmin.py) under Triton's interpreter on CPU tensors,
against the native codec (``torch_cgx.compressors.get("maxmin", ...)``): payload bytes exactly,
decode_add and the fp32 values as values (NaN equal to NaN: a GPU writes its canonical NaN).

Sampled, to stay within about 40 s on a 2-core machine (the interpreter runs a program in about
a millisecond): every bits, dtype and lever (raw tail, stochastic, clip) in 48 deterministic
cases over bucket sizes 1, 3, 8, 512, 513 and sizes 1, 7, B - 1, B + 1, 3B + 5, with small
launch sizes in half of them (several programs, a masked last one, buckets longer than a
program's tile); NaN / Inf / constant / denormal / huge-range buckets; buckets of 2^20 values.
``CGX_TRITON_SWEEP=1`` adds the exhaustive sweep (bits x dtype x size x bucket x levers, and a
clipped 2^20 bucket): about an hour here.

Skipped where triton is not importable, or where ``TRITON_INTERPRET`` is set to something else
than "1" (on a GPU machine: these tests compare CPU tensors, which only the interpreter runs).
"""

import os

_SET_HERE = "TRITON_INTERPRET" not in os.environ
os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

import importlib.util  # noqa: E402
import itertools  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402


def _restore_environment():
    """The other test modules keep their environment (CPU tensors take the reference there)."""
    if _SET_HERE:
        os.environ.pop("TRITON_INTERPRET", None)


if importlib.util.find_spec("triton") is None:
    _restore_environment()
    pytest.skip("triton is not installed (pip install triton)", allow_module_level=True)
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("TRITON_INTERPRET is not '1': these tests run the kernels on CPU tensors under "
                "Triton's interpreter", allow_module_level=True)  # fmt: skip

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from codec_testing import DTYPES, special_input  # noqa: E402
from device_engine_reads import host_syncs  # noqa: E402

from torch_cgx import compressors  # noqa: E402
from torch_cgx.device import codecs, kernels  # noqa: E402
from torch_cgx.device.codecs import maxmin  # noqa: E402
from torch_cgx.device.triton import maxmin_kernels  # noqa: E402  (decorated under the interpreter)
from torch_cgx.device.triton.maxmin import TritonMaxMin  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _interpreter():
    """TRITON_INTERPRET=1 while this module's tests run, where this module set it (the kernels
    and the planted helpers below were decorated under it; ``available`` reads it)."""
    if _SET_HERE:
        os.environ["TRITON_INTERPRET"] = "1"
    yield
    _restore_environment()


pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's overflow notes
LEVERS = list(itertools.product([0, 1], [0, 1], [0, 1]))  # raw tail, stochastic, clip
DEFAULT = TritonMaxMin()
SMALL = TritonMaxMin(tile=64, codes=64, decode=64)  # several programs per tensor and bucket
SWEEP = os.environ.get("CGX_TRITON_SWEEP") == "1"


def _params(bits, bucket, lever):
    skip, stochastic, clip = lever
    return dict(bits=bits, bucket_size=bucket, skip_incomplete_buckets=skip,
                stochastic=stochastic, clip=clip)  # fmt: skip


def _differ(got: torch.Tensor, want: torch.Tensor):
    """Index of the first element whose bits differ (NaN equal to any NaN), or None."""
    g, w = got.float().reshape(-1), want.float().reshape(-1)
    nan = torch.isnan(g) & torch.isnan(w)
    bad = ((g.view(torch.int32) != w.view(torch.int32)) & ~nan).nonzero()
    return int(bad[0]) if bad.numel() else None


def mismatch(impl, x, bits, bucket, lever, seed=1, stream=2, out_dtype=None):
    """Why ``impl`` differs from the native codec on ``x`` (encode bytes, decode_add into
    ``out_dtype``, values), or None."""
    dev = codecs.get("maxmin", **_params(bits, bucket, lever))
    nat = compressors.get("maxmin", **_params(bits, bucket, lever))
    want = nat.encode(x, seed, stream)
    got = impl.encode(dev, x.reshape(-1), seed, stream)
    if got.dtype != torch.uint8 or got.shape != want.shape:
        return f"encode gave {got.dtype} {tuple(got.shape)}, want {want.numel()} bytes"
    if not torch.equal(got, want):
        i = int((got != want).nonzero()[0])
        return f"encode: byte {i} of {want.numel()} is {int(got[i])}, want {int(want[i])}"
    n = x.numel()
    out_dtype = out_dtype or x.dtype
    g = torch.Generator().manual_seed(n)
    out = (torch.randn(n, generator=g) * 4.0).to(out_dtype)
    ref = out.clone()
    nat.decode_add_(ref, want)
    impl.decode_add_(dev, out, want, dtype=x.dtype)
    at = _differ(out, ref)
    if at is not None:
        return f"decode_add into {out_dtype}: element {at} is {out[at]}, want {ref[at]}"
    values, ref_values = impl.values(dev, want, n, x.dtype), nat.decode(want, dtype=torch.float32)
    at = _differ(values, ref_values)
    if at is not None:
        return f"values: element {at} is {values[at]}, want {ref_values[at]}"
    return None


def check(impl, x, bits, bucket, lever, what="", **kw):
    why = mismatch(impl, x, bits, bucket, lever, **kw)
    if why is not None:
        pytest.fail(f"{what} {x.dtype} n={x.numel()} bits={bits} B={bucket} levers={lever}: {why}")


def random_input(n, dtype, g):
    """Gaussian values, or small integers (rounding ties, grid points, constant buckets)."""
    if g.random() < 0.5:
        x = g.standard_normal(n) * 3.0 + 1.0
    else:
        x = g.integers(-4, 5, n).astype(np.float64)
    return torch.from_numpy(x.astype(np.float32)).to(dtype)


def _cases():
    """48 cases: each (bits, dtype) twice, levers and sizes spread over them."""
    g = np.random.default_rng(36)
    cases = []
    for bits, d in itertools.product(range(1, 9), range(3)):
        for half in (0, 4):
            bucket = int(g.choice([1, 3, 8, 512, 513]))
            n = int(g.choice([1, 7, max(1, bucket - 1), bucket + 1, 3 * bucket + 5]))
            lever = LEVERS[(bits + 3 * d + half) % 8]
            cases.append((bits, d, bucket, n, lever, (bits + d + half) % 2, (bits + half) % 3))
    return cases


@pytest.mark.parametrize("bits,d,bucket,n,lever,small,out", _cases())
def test_sampled_configurations_match_the_native_codec(bits, d, bucket, n, lever, small, out):
    g = np.random.default_rng([bits, d, bucket, n])
    x = random_input(n, DTYPES[d], g)
    seed, stream = int(g.integers(2**63)), int(g.integers(2**63))
    check(SMALL if small else DEFAULT, x, bits, bucket, lever, seed=seed, stream=stream,
          out_dtype=DTYPES[out])  # fmt: skip


@pytest.mark.parametrize("kind", ["denormal", "huge", "wide", "offset", "nonfinite", "mixed_scale"])
def test_extreme_values_match(kind):
    """Both paths of step 4 (denormal buckets and ranges past FLT_MAX take the fp64 one), the
    1-bit step overflow, non-finite buckets (NaN metadata bits), both decode formulas."""
    g = np.random.default_rng(list(kind.encode()))
    for k in range(4):
        bits, dtype = int(g.integers(1, 9)), DTYPES[k % 3]
        x = torch.from_numpy(special_input(kind, 1100, g)).to(dtype)
        bucket, lever = (7, 512)[k % 2], LEVERS[int(g.integers(8))]
        check(SMALL if k % 2 else DEFAULT, x, bits, bucket, lever, seed=3, stream=bits,
              out_dtype=DTYPES[(k + 1) % 3], what=kind)  # fmt: skip


def test_constant_buckets_signed_zeros_and_16_bit_extremes():
    zeros = torch.tensor([-0.0, 0.0, -0.0, 1.0] + [5.0] * 8 + [-0.0] * 8 + [0.0, -0.0] * 4)
    for bits in range(1, 9):
        check(DEFAULT, zeros, bits, 8, LEVERS[bits % 8], what="zeros")
    half = torch.tensor([65504.0, -65504.0, 6e-8, -6e-8, 0.0, 1.0, 2.0, 3.0], dtype=torch.float16)
    bf = torch.tensor([3.38e38, -3.38e38, 1e-39, 0.0, 1.0, -1.0, 7.0, 8.0], dtype=torch.bfloat16)
    for x, bits in itertools.product((half, bf), (1, 4, 8)):
        check(DEFAULT, x, bits, 3, (0, 0, 0), what="16-bit extremes")
        check(DEFAULT, x, bits, 8, (0, 1, 1), out_dtype=torch.float32, what="16-bit extremes")


def test_buckets_longer_than_a_program():
    """Buckets of 2^20 and 2^20 + 1 values (loops of 16 and 17 tiles), and clipped buckets of
    513 and 1000 values over 64-value tiles (the min / max loop and the row loop of the sums)."""
    g = np.random.default_rng(20)
    x = torch.from_numpy((g.standard_normal((1 << 20) + 6) * 2.0).astype(np.float32))
    check(DEFAULT, x[: (1 << 20) + 3], 5, 1 << 20, (0, 1, 0), what="2^20")
    check(DEFAULT, x.to(torch.bfloat16), 2, (1 << 20) + 1, (1, 0, 0), what="2^20 + 1")
    y = torch.from_numpy((g.standard_normal(3 * 1000 + 7) * 5.0).astype(np.float32))
    check(SMALL, y[:1541], 3, 513, (1, 1, 1), what="clipped 513")
    check(SMALL, y.to(torch.float16), 6, 1000, (0, 0, 1), what="clipped 1000")


def test_empty_and_tiny_inputs():
    for bucket, lever in itertools.product((1, 8, 512), LEVERS[::3]):
        check(DEFAULT, torch.zeros(0), 4, bucket, lever, what="empty")
        check(SMALL, torch.tensor([2.5], dtype=torch.float16), 7, bucket, lever, what="one value")


# ---- the clip's lane order ---------------------------------------------------------------------


def _reference_sums(x: torch.Tensor, bucket: int) -> torch.Tensor:
    """codecs/maxmin.py's fp64 S(x) and S((x - mean)^2) of the full buckets."""
    rows = x[: x.numel() // bucket * bucket].double().view(-1, bucket)
    total = maxmin.lane_sum(rows)
    mean = maxmin._div(total, bucket)
    dev = rows - mean[:, None]
    return torch.stack([total, maxmin.lane_sum(dev * dev)], 1)


def _mixed(n: int, seed: int) -> torch.Tensor:
    """Values over forty decades: any other order of additions changes the fp64 sums' bits."""
    g = np.random.default_rng(seed)
    return torch.from_numpy(
        (g.standard_normal(n) * 10.0 ** g.integers(-20, 20, n)).astype(np.float32)
    )


def _sums_differ(impl, bucket: int, x: torch.Tensor) -> int:
    """Full buckets whose kernel sums differ in any bit from the reference's."""
    codec = codecs.get("maxmin", bits=3, bucket_size=bucket, clip=1)
    got = impl.clip_sums(codec, x)[: x.numel() // bucket]
    return int((got.view(torch.int64) != _reference_sums(x, bucket).view(torch.int64)).any(1).sum())


def test_clip_sums_follow_the_lane_order():
    """The payload shows the order of the clip's fp64 sums only by chance (a relative change of
    2^-52 in the mean or variance moves an fp32 metadata rounding about once in 2^28 buckets),
    so the sums themselves are compared with the reference's ``lane_sum``, bit for bit."""
    for impl, bucket, n in ((DEFAULT, 8, 805), (DEFAULT, 64, 64 * 16 + 5), (SMALL, 513, 1030)):
        assert _sums_differ(impl, bucket, _mixed(n, bucket)) == 0, bucket


# Planted defects: @triton.jit helpers that replace the kernels' own (the interpreter looks a
# helper up in the module's globals at each call, so monkeypatch reaches into the kernels).


@triton.jit
def reversed_lanes(acc, col):
    """The lanes added lane 7 first."""
    total = tl.sum(tl.where(col[None, :] == 7, acc, 0.0), axis=1)
    for j in tl.static_range(1, 8):
        total = total + tl.sum(tl.where(col[None, :] == 7 - j, acc, 0.0), axis=1)
    return total


@triton.jit
def pairwise_lanes(acc, col):
    """prim::stats' pairwise order (the levels kernels'), not max-min's."""
    l0 = tl.sum(tl.where(col[None, :] == 0, acc, 0.0), axis=1)
    l1 = tl.sum(tl.where(col[None, :] == 1, acc, 0.0), axis=1)
    l2 = tl.sum(tl.where(col[None, :] == 2, acc, 0.0), axis=1)
    l3 = tl.sum(tl.where(col[None, :] == 3, acc, 0.0), axis=1)
    l4 = tl.sum(tl.where(col[None, :] == 4, acc, 0.0), axis=1)
    l5 = tl.sum(tl.where(col[None, :] == 5, acc, 0.0), axis=1)
    l6 = tl.sum(tl.where(col[None, :] == 6, acc, 0.0), axis=1)
    l7 = tl.sum(tl.where(col[None, :] == 7, acc, 0.0), axis=1)
    return ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))


@triton.jit
def span_one_too_long(b, size, nq):
    """A bucket's mask one element too long: ``at < hi`` reaches the next bucket's first."""
    lo = b * size
    return lo, tl.minimum(lo + size + 1, nq)


@pytest.mark.parametrize("planted", [reversed_lanes, pairwise_lanes], ids=["reversed", "pairwise"])
def test_a_wrong_lane_order_is_caught(monkeypatch, planted):
    x = _mixed(64 * 16, 7)
    assert _sums_differ(DEFAULT, 64, x) == 0
    monkeypatch.setattr(maxmin_kernels, "lane_total", planted)
    assert _sums_differ(DEFAULT, 64, x) > 0


def test_a_mask_off_by_one_is_caught(monkeypatch):
    """The bucket mask one element too long. (Where a tile is exactly a bucket wide, 8 or 512
    values, the tile's own bounds hide it: the defect changes nothing there.)"""
    x = torch.from_numpy(np.random.default_rng(5).standard_normal(203).astype(np.float32))
    cases = ((DEFAULT, 5, (0, 0, 0)), (SMALL, 5, (1, 1, 1)), (DEFAULT, 100, (0, 1, 1)))
    for impl, bucket, lever in cases:
        assert mismatch(impl, x, 4, bucket, lever) is None
    monkeypatch.setattr(maxmin_kernels, "bucket_span", span_one_too_long)
    for impl, bucket, lever in cases:
        assert mismatch(impl, x, 4, bucket, lever) is not None, (bucket, lever)


# ---- the protocol --------------------------------------------------------------------------------


def test_the_fused_protocol():
    impl = TritonMaxMin()
    assert impl.name == "triton-maxmin"
    assert impl.applies(torch.device("cpu"))  # under the interpreter
    for lever in LEVERS:
        codec = codecs.get("maxmin", **_params(3, 64, lever))
        assert all(impl.supports(codec, dt) for dt in DTYPES)
        assert not impl.supports(codec, torch.float64)
    assert not impl.supports(codecs.get("qsgd", bits=4), torch.float32)
    impl.load()
    codec = codecs.get("maxmin", bits=3, bucket_size=8, skip_incomplete_buckets=1)
    payload = impl.encode(codec, torch.ones(9), 0, 0)
    with pytest.raises(ValueError, match="payload"):
        impl.decode_add_(codec, torch.zeros(17), payload)
    with pytest.raises(ValueError, match="payload"):  # a raw tail of fp16 values is shorter
        impl.decode_add_(codec, torch.zeros(9), payload, dtype=torch.float16)
    with pytest.raises(ValueError, match="contiguous"):
        impl.decode_add_(codec, torch.zeros(9, 2)[:, 0], payload)
    with pytest.raises(ValueError, match="float32"):
        impl.encode(codec, torch.ones(3, dtype=torch.float64), 0, 0)
    out = torch.zeros(9, dtype=torch.bfloat16)
    assert impl.decode_add_(codec, out, payload, dtype=torch.float32) is out
    assert torch.equal(out, torch.ones(9, dtype=torch.bfloat16))


def test_passes_the_kernels_self_check_through_the_codec():
    """Registered as the fused implementation, the kernel passes kernels.py's self-check and
    the codec's encode / decode_add_ (codecs/fused.py's dispatch, dtype given where it differs
    from out's) run it, with the native bytes."""
    impl = TritonMaxMin()
    with kernels.use_implementations([impl]):
        for lever, dtype in ((LEVERS[7], torch.bfloat16), (LEVERS[2], torch.float32)):
            codec = codecs.get("maxmin", **_params(5, 24, lever))
            x = random_input(61, dtype, np.random.default_rng(61))
            payload = codec.encode(x, seed=4, stream=5)
            assert kernels.fused_for(codec, x.device, dtype) is impl
            nat = compressors.get("maxmin", **_params(5, 24, lever))
            assert torch.equal(payload, nat.encode(x, 4, 5))
            out, ref = torch.zeros(61), torch.zeros(61)
            codec.decode_add_(out, payload, dtype=dtype)
            nat.decode_add_(ref, payload)
            assert _differ(out, ref) is None
        assert all(v == "fused" for v in kernels.decisions().values()), kernels.decisions()


def test_no_host_reads_or_uploads():
    """Nothing reads a tensor's values on the host or copies host data to the device (the
    recorders of the device engine's no-sync tests; the header is the cached constant)."""
    impl = TritonMaxMin()
    codec = codecs.get("maxmin", **_params(3, 7, (1, 1, 1)))
    x = random_input(100, torch.float16, np.random.default_rng(1))
    payload = impl.encode(codec, x, 1, 2)  # warm: the header constant is cached
    out = torch.zeros(100)
    for fn in (lambda: impl.encode(codec, x, 1, 2),
               lambda: impl.decode_add_(codec, out, payload, dtype=torch.float16),
               lambda: impl.values(codec, payload, 100, torch.float16)):  # fmt: skip
        assert host_syncs(fn) == {"reads": [], "uploads": []}


# ---- the exhaustive sweep (CGX_TRITON_SWEEP=1) ---------------------------------------------------


@pytest.mark.skipif(not SWEEP, reason="the exhaustive sweep: CGX_TRITON_SWEEP=1 (about an hour)")
@pytest.mark.parametrize("bits", range(1, 9))
def test_sweep(bits):
    g = np.random.default_rng(bits)
    for d, n, bucket, lever in itertools.product(range(3), [0, 1, 7, 8, 9, 1000, 70001],
                                                 [1, 3, 7, 8, 512, 513, 1000], LEVERS):  # fmt: skip
        x = random_input(n, DTYPES[d], g)
        for impl in (DEFAULT, SMALL) if n < 5000 else (DEFAULT,):
            check(impl, x, bits, bucket, lever, seed=bits, stream=n, out_dtype=DTYPES[(d + 1) % 3])
    x = torch.from_numpy((g.standard_normal((1 << 20) + 9) * 3).astype(np.float32))
    check(DEFAULT, x, bits, 1 << 20, (0, 1, 1), what="clipped 2^20")


_restore_environment()  # last: the @triton.jit helpers above are decorated under the interpreter
