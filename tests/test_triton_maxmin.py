"""Triton max-min (torch_cgx/device/triton/maxmin.py) against the native codec
(``torch_cgx.compressors.get("maxmin", ...)``): payload bytes exactly, decode_add (into fp32,
fp16 and bf16 outputs, from payloads of any dtype, read from an odd, a 4- or an 8-aligned
address: the decoder's byte and word paths) and the fp32 values as values (NaN equal to NaN: a
GPU writes its canonical NaN). The paths a tile's place selects (full tiles, the tail tile):
tests/test_triton_maxmin_paths.py.

Runs under Triton's interpreter on CPU tensors (TRITON_INTERPRET=1 is set below, before triton
is imported, and only while this module's tests run); with ``TRITON_INTERPRET=0`` on a machine
with a GPU the same tests run the compiled kernels on CUDA tensors (the GPU check's device step)
and the no-synchronisation test under ``torch.cuda.set_sync_debug_mode("error")`` too. Skipped
where triton is not installed or the kernels cannot run.

Sampled, to stay within about 40 s on a 2-core machine (the interpreter runs a program in about a
millisecond): every bits, dtype and lever (raw tail, stochastic, clip) in 48 deterministic cases
over bucket sizes 1, 3, 8, 512, 513 and sizes 1, 7, B - 1, B + 1, 3B + 5, half of them with small
launch sizes (several programs, a masked last one, buckets longer than a program's tile), half
(another split) on the kernels' int64 index variant (INDEX32_LIMIT lowered to 0; the others on the
int32 one GPUs run below 2^31 indices); NaN / Inf / constant / denormal / huge-range buckets;
buckets of 2^20 and 65537 values; every payload byte written (poisoned torch.empty). The clip's fp64
sums are compared with ``lane_sum`` directly (the payload shows their order only by chance); planted
defects (wrong lane orders, masks one element too long: copies of the kernels with one edit) are
caught by these checks: tests/test_triton_maxmin_defects.py; the compiled code's rounding:
tests/test_triton_maxmin_ptx.py. ``CGX_TRITON_SWEEP=1`` adds
the exhaustive sweep (bits x dtype x size x bucket x levers, and a clipped 2^20 bucket; collected
only then): about 11 minutes per bits here, 1.5 hours in all.
"""

import itertools
import os

import numpy as np
import pytest
import torch
from codec_testing import DTYPES, random_input, special_input
from device_engine_reads import host_syncs
from triton_testing import interpreted_kernels, poison_empty, wide_indices

from torch_cgx import compressors
from torch_cgx.device import codecs, kernels
from torch_cgx.device.codecs import maxmin
from torch_cgx.device.triton.maxmin import TritonMaxMin

maxmin_kernels, DEVICE, _interpreter = interpreted_kernels("maxmin_kernels")


pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's overflow notes
LEVERS = list(itertools.product([0, 1], [0, 1], [0, 1]))  # raw tail, stochastic, clip
DEFAULT = TritonMaxMin()
SMALL = TritonMaxMin(tile=64, codes=64, decode=64, sub=16)  # several programs a tensor and bucket
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


def mismatch(impl, x, bits, bucket, lever, seed=1, stream=2, out_dtype=None, at=3):
    """Why ``impl`` differs from the native codec on the CPU tensor ``x`` (encode bytes of ``x``
    on DEVICE; decode_add into ``out_dtype`` and the values of the native payload, read from
    byte ``at`` of a larger tensor: 3, an odd address, takes the decoder's byte path; 0 and 4
    its 64- and 32-bit word paths), or None."""
    dev = codecs.get("maxmin", **_params(bits, bucket, lever))
    nat = compressors.get("maxmin", **_params(bits, bucket, lever))
    want = nat.encode(x, seed, stream)
    got = impl.encode(dev, x.to(DEVICE).reshape(-1), seed, stream)
    if got.device.type != DEVICE.type or got.dtype != torch.uint8 or got.shape != want.shape:
        return f"encode gave {got.dtype} {tuple(got.shape)} on {got.device}, want {want.numel()}"
    got = got.cpu()
    if not torch.equal(got, want):
        i = int((got != want).nonzero()[0])
        return f"encode: byte {i} of {want.numel()} is {int(got[i])}, want {int(want[i])}"
    n = x.numel()
    odd = torch.zeros(want.numel() + 8, dtype=torch.uint8, device=DEVICE)[at : at + want.numel()]
    odd.copy_(want)  # any alignment (torch's allocations are 64-byte aligned)
    out_dtype = out_dtype or x.dtype
    out = (torch.randn(n, generator=torch.Generator().manual_seed(n)) * 4.0).to(out_dtype)
    out[::5] = -0.0
    ref = nat.decode_add_(out.clone(), want)
    got = impl.decode_add_(dev, out.to(DEVICE), odd, dtype=x.dtype).cpu()
    at = _differ(got, ref)
    if at is not None:
        return f"decode_add into {out_dtype}: element {at} is {got[at]}, want {ref[at]}"
    values, ref_values = impl.values(dev, odd, n, x.dtype).cpu(), nat.decode(want)
    at = _differ(values, ref_values)
    if at is not None:
        return f"values: element {at} is {values[at]}, want {ref_values[at]}"
    return None


def check(impl, x, bits, bucket, lever, what="", **kw):
    why = mismatch(impl, x, bits, bucket, lever, **kw)
    if why is not None:
        pytest.fail(f"{what} {x.dtype} n={x.numel()} bits={bits} B={bucket} levers={lever}: {why}")


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
def test_sampled_configurations_match_the_native_codec(bits, d, bucket, n, lever, small, out,
                                                       monkeypatch):  # fmt: skip
    if (bits // 2 + d) % 2:  # half the cases, over every launch, lever and dtype
        wide_indices(monkeypatch)
    g = np.random.default_rng([bits, d, bucket, n])
    x = random_input(n, DTYPES[d], g)
    seed, stream = int(g.integers(2**63)), int(g.integers(2**63))
    check(SMALL if small else DEFAULT, x, bits, bucket, lever, seed=seed, stream=stream,
          out_dtype=DTYPES[out], at=(3, 0, 4)[(bits + d) % 3])  # fmt: skip


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


def test_stochastic_rounding_past_the_top_is_clamped():
    """A bucket's maximum at t = L exactly (range L: inv 1) and an r with fl(L + r) = L + 1: the
    code is clamped to L (8 bits: one draw in 2^17; the seed found by search, 4096 values).
    Without that clamp the code 256 would be cut to 0."""
    from codec_oracle import uniform_array

    n, top = 4096, np.float32(255)
    seed = next(s for s in range(1000) if (top + uniform_array(s, 7, np.arange(n)) == 256).any())
    x = np.where(top + uniform_array(seed, 7, np.arange(n)) == 256, top, np.float32(0))
    for impl in (DEFAULT, SMALL):
        check(impl, torch.from_numpy(x), 8, 512, (0, 1, 0), seed=seed, stream=7, what="L + r")


def test_constant_buckets_signed_zeros_and_16_bit_extremes():
    zeros = torch.tensor([-0.0, 0.0, -0.0, 1.0] + [5.0] * 8 + [-0.0] * 8 + [0.0, -0.0] * 4)
    for bits in range(1, 9):
        check(DEFAULT, zeros, bits, 8, LEVERS[bits % 8], what="zeros")
    half = torch.tensor([65504.0, -65504.0, 6e-8, -6e-8, 0.0, 1.0, 2.0, 3.0], dtype=torch.float16)
    bf = torch.tensor([3.38e38, -3.38e38, 1e-39, 0.0, 1.0, -1.0, 7.0, 8.0], dtype=torch.bfloat16)
    for x, bits in itertools.product((half, bf), (1, 4, 8)):
        check(DEFAULT, x, bits, 3, (0, 0, 0), what="16-bit extremes")
        check(DEFAULT, x, bits, 8, (0, 1, 1), out_dtype=torch.float32, what="16-bit extremes")


def test_buckets_longer_than_a_program(monkeypatch):
    """Buckets of 2^17 values over tiles of 8192 (a loop of 16 tiles) and 65537 values (2 tiles
    of the interpreter's 65536), and clipped buckets of 513 and 1000 values over 64-value tiles
    (the min / max loop and the row loop of the sums); the 2^17 bucket on the int64 index
    variant."""
    g = np.random.default_rng(20)
    x = torch.from_numpy((g.standard_normal(2 * 65537 + 5) * 2.0).astype(np.float32))
    with monkeypatch.context() as mp:
        wide_indices(mp)
        check(TritonMaxMin(tile=8192), x[: (1 << 17) + 3], 5, 1 << 17, (0, 1, 0), what="2^17")
    check(DEFAULT, x.to(torch.bfloat16), 2, 65537, (1, 0, 0), what="65537")
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
    got = impl.clip_sums(codec, x.to(DEVICE)).cpu()[: x.numel() // bucket]
    return int((got.view(torch.int64) != _reference_sums(x, bucket).view(torch.int64)).any(1).sum())


def test_clip_sums_follow_the_lane_order():
    """The payload shows the order of the clip's fp64 sums only by chance (a relative change of
    2^-52 in the mean or variance moves an fp32 metadata rounding about once in 2^28 buckets),
    so the sums themselves are compared with the reference's ``lane_sum``, bit for bit."""
    for impl, bucket, n in ((DEFAULT, 8, 805), (DEFAULT, 64, 64 * 16 + 5), (SMALL, 513, 1030)):
        assert _sums_differ(impl, bucket, _mixed(n, bucket)) == 0, bucket


# ---- the protocol --------------------------------------------------------------------------------


def test_the_fused_protocol():
    impl = TritonMaxMin()
    assert impl.name == "triton-maxmin" and impl.applies(DEVICE)
    assert not impl.applies(torch.device("meta"))
    for lever in LEVERS:
        codec = codecs.get("maxmin", **_params(3, 64, lever))
        assert all(impl.supports(codec, dt) for dt in DTYPES)
        assert not impl.supports(codec, torch.float64)
    assert not impl.supports(codecs.get("qsgd", bits=4), torch.float32)
    impl.load()
    codec = codecs.get("maxmin", bits=3, bucket_size=8, skip_incomplete_buckets=1)
    payload = impl.encode(codec, torch.ones(9, device=DEVICE), 0, 0)
    with pytest.raises(ValueError, match="payload"):
        impl.decode_add_(codec, torch.zeros(17, device=DEVICE), payload)
    with pytest.raises(ValueError, match="payload"):  # a raw tail of fp16 values is shorter
        impl.decode_add_(codec, torch.zeros(9, device=DEVICE), payload, dtype=torch.float16)
    with pytest.raises(ValueError, match="contiguous"):
        impl.decode_add_(codec, torch.zeros(9, 2, device=DEVICE)[:, 0], payload)
    with pytest.raises(ValueError, match="float32"):
        impl.encode(codec, torch.ones(3, dtype=torch.float64, device=DEVICE), 0, 0)
    with pytest.raises(ValueError, match="power of two"):
        TritonMaxMin(codes=12)
    with pytest.raises(ValueError, match="sub must be a power of two"):
        TritonMaxMin(sub=4)
    out = torch.zeros(9, dtype=torch.bfloat16, device=DEVICE)
    assert impl.decode_add_(codec, out, payload, dtype=torch.float32) is out
    assert torch.equal(out.cpu(), torch.ones(9, dtype=torch.bfloat16))


def test_passes_the_kernels_self_check_through_the_codec(monkeypatch):
    """Registered as the fused implementation, the kernel passes kernels.py's self-check (mode
    'fused': CPU tensors take a Triton kernel in that mode only, and a failed check raises) and
    the codec's encode / decode_add_ (codecs/fused.py's dispatch, dtype given where it differs
    from out's) run it, with the native bytes."""
    monkeypatch.setenv("CGX_DEVICE_KERNELS", "fused")
    impl = TritonMaxMin()
    with kernels.use_implementations([impl]):
        for lever, dtype in ((LEVERS[7], torch.bfloat16), (LEVERS[2], torch.float32)):
            codec = codecs.get("maxmin", **_params(5, 24, lever))
            x = random_input(61, dtype, np.random.default_rng(61))
            payload = codec.encode(x.to(DEVICE), seed=4, stream=5)
            assert kernels.fused_for(codec, DEVICE, dtype) is impl
            nat = compressors.get("maxmin", **_params(5, 24, lever))
            assert torch.equal(payload.cpu(), nat.encode(x, 4, 5))
            out = codec.decode_add_(torch.zeros(61, device=DEVICE), payload, dtype=dtype)
            assert _differ(out.cpu(), nat.decode_add_(torch.zeros(61), payload.cpu())) is None
        assert kernels.fallbacks() == {}
        assert all(v == "fused" for v in kernels.decisions().values()), kernels.decisions()


def test_every_payload_byte_is_written(monkeypatch):
    """The payload comes from torch.empty: poisoned here, the bytes are still the native ones."""
    poison_empty(monkeypatch)
    g = np.random.default_rng(8)
    for bits, bucket, lever in ((3, 13, (1, 1, 0)), (7, 5, (0, 0, 1)), (1, 512, (0, 1, 1))):
        x = random_input(203, DTYPES[bits % 3], g)
        check(SMALL, x, bits, bucket, lever, what="poisoned")


def test_no_host_synchronisation():
    """Nothing reads a tensor's values on the host or copies host data to the device (the
    recorders of the device engine's no-sync tests; the header is the cached constant); on a
    GPU also under ``torch.cuda.set_sync_debug_mode("error")``."""
    impl = TritonMaxMin()
    codec = codecs.get("maxmin", **_params(3, 7, (1, 1, 1)))
    x = random_input(100, torch.float16, np.random.default_rng(1)).to(DEVICE)
    payload = impl.encode(codec, x, 1, 2)  # warm: compiled, the header constant cached
    out = torch.zeros(100, device=DEVICE)
    calls = (lambda: impl.encode(codec, x, 1, 2),
             lambda: impl.decode_add_(codec, out, payload, dtype=torch.float16),
             lambda: impl.values(codec, payload, 100, torch.float16))  # fmt: skip
    for fn in calls:
        fn()
        assert host_syncs(fn) == {"reads": [], "uploads": []}
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for fn in calls:
                fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")


# ---- the exhaustive sweep (CGX_TRITON_SWEEP=1) ---------------------------------------------------


if SWEEP:  # collected only then: a skipped test fails the GPU check's device step

    @pytest.mark.parametrize("bits", range(1, 9))
    def test_sweep(bits):
        g = np.random.default_rng(bits)
        sizes, buckets = [0, 1, 7, 8, 9, 1000, 70001], [1, 3, 7, 8, 512, 513, 1000]
        for d, n, bucket, lever in itertools.product(range(3), sizes, buckets, LEVERS):
            x = random_input(n, DTYPES[d], g)
            for impl in (DEFAULT, SMALL) if n < 5000 else (DEFAULT,):
                check(impl, x, bits, bucket, lever, seed=bits, stream=n,
                      out_dtype=DTYPES[(d + 1) % 3])  # fmt: skip
        x = torch.from_numpy((g.standard_normal((1 << 20) + 9) * 3).astype(np.float32))
        check(DEFAULT, x, bits, 1 << 20, (0, 1, 1), what="clipped 2^20")
