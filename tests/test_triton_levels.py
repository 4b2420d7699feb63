"""TritonLevels (torch_cgx/device/triton/levels.py): the Triton kernels of qsgd, terngrad, onebit,
efsignsgd, signsgd, signum and tbq against the NATIVE compressors (``compressors.get``): payload
bytes equal, decode_add equal to the native decode_add (NaN as NaN: GPUs write the canonical NaN),
into an output of the input's dtype and, for fp16 / bf16, into a float32 one (the engine's sums).

Runs under Triton's interpreter on CPU tensors (TRITON_INTERPRET=1 is set below, before triton is
imported, and only while this module's tests run; skipped where triton is not installed). With
``TRITON_INTERPRET=0`` on a machine with a GPU the same tests run the compiled kernels on CUDA
tensors (and the no-synchronisation test).

The interpreter runs about a millisecond per program, so the configurations are sampled: each of
CONFIGS with sizes 0, 1, 13, 300, 777, 2100 and one past its second bucket (or 1100), dtypes, input
kinds and block settings in rotation (small blocks: several programs, masked tails in every kernel),
every other case on the kernels' int64 index variant (the others on the int32 one GPUs run below
2^31 indices). ``CGX_TRITON_SWEEP=1`` runs the exhaustive sweep instead (every configuration x 11
sizes x 3 dtypes x 4 input kinds x 3 block settings, where they run at most 400 programs; 19 minutes
under the interpreter on 2 cores, 6,000+ cases).
"""

import importlib.util
import itertools
import os
import pathlib

import pytest
import torch
from codec_testing import assert_same
from triton_testing import interpreted_kernels, poison_empty, wide_indices

from torch_cgx import compressors
from torch_cgx.device import codecs, kernels
from torch_cgx.device.triton.levels import TritonLevels

levels_kernels, DEVICE, _interpreter = interpreted_kernels("levels_kernels")


# IEEE overflow and NaN (3e38 * 7 = Inf, Inf - Inf = NaN, as native) make numpy warn
pytestmark = [
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]
SWEEP = os.environ.get("CGX_TRITON_SWEEP") == "1"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
BIG = 1037  # a bucket longer than the default block (1024) and than a loop iteration (64)
KINDS = ["gauss", "grid", "special", "cancel"]
CONFIGS = [
    ("qsgd", {"bits": 2, "bucket_size": 0}),
    ("qsgd", {"bits": 4, "bucket_size": 7}),
    ("qsgd", {"bits": 8, "bucket_size": 64}),
    ("qsgd", {"bits": 3, "bucket_size": BIG}),  # codes straddle bytes
    ("qsgd", {"bits": 5, "bucket_size": 1}),
    ("terngrad", {"bucket_size": 512}),
    ("terngrad", {"bucket_size": 0, "clip": 2.5}),
    ("terngrad", {"bucket_size": 7, "clip": 1.5}),
    ("terngrad", {"bucket_size": 64, "clip": 0.5}),
    ("onebit", {"bucket_size": 1}),
    ("onebit", {"bucket_size": 512}),
    ("onebit", {"bucket_size": 0}),
    ("efsignsgd", {}),  # bucket_size 0
    ("efsignsgd", {"bucket_size": 64}),
    ("efsignsgd", {"bucket_size": 4294967295}),
    ("signsgd", {}),
    ("signum", {}),
    ("tbq", {}),
    ("tbq", {"tau": 0.37}),
    ("tbq", {"tau": 1e-30}),
]
IDS = [n + "".join(f"-{k}={v}" for k, v in p.items()) for n, p in CONFIGS]
# onebit's means of this row differ when the lanes are added in another order (-64 vs 0)
CANCEL = [0.0, 2.0**60, 0.0, 0.0, -100.0, -60.0, 100.0, 100.0]
SPECIALS = [float("nan"), float("inf"), float("-inf"), -0.0, 0.0, 1e-40, -3.0e38, 3.0e38, 1e-45]


def make_input(n: int, dtype, kind: str, seed: int) -> torch.Tensor:
    """``n`` values of ``dtype`` (built in fp32 / fp64 on the host): Gaussian over decades,
    small integers (ties, constant and zero buckets), Gaussian with the SPECIALS sprinkled in,
    or Gaussian behind the CANCEL row. Returned as the first ``n`` values of a longer tensor
    (its storage goes on), on DEVICE."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n + 8, generator=g, dtype=torch.float64)
    if kind == "grid":
        x = torch.randint(-2, 3, (n + 8,), generator=g).double()
    else:
        x = x * 10.0 ** (torch.arange(n + 8) // 37 % 7 - 3)
    if kind == "special" and n:
        at = torch.randint(0, n, (len(SPECIALS),), generator=g)
        for i, v in zip(at.tolist(), SPECIALS):
            x[i] = v
    if kind == "cancel":
        x[: min(n, 8)] = torch.tensor(CANCEL[: min(n, 8)], dtype=torch.float64)
    return x.to(torch.float32).to(dtype).to(DEVICE)[:n]


def check(impl, name, params, x, seed=3, stream=5) -> None:
    """Bytes and decode_add of ``impl`` equal the native compressor's (AssertionError); the
    payload decoded from a fresh tensor (32-bit word reads) and from an odd address (bytes)."""
    native, codec = compressors.get(name, **params), codecs.get(name, **params)
    what = f"{name} {params} {x.dtype} n={x.numel()}"
    want = native.encode(x.cpu(), seed=seed, stream=stream)
    got = impl.encode(codec, x, seed, stream)
    assert got.device == x.device and got.dtype == torch.uint8, what
    got = got.cpu()
    assert got.numel() == want.numel(), f"{what}: {got.numel()} bytes, want {want.numel()}"
    if not torch.equal(got, want):
        bad = (got != want).nonzero().view(-1)
        raise AssertionError(f"{what}: {bad.numel()} bytes differ, first {bad[:6].tolist()}")
    n = x.numel()
    unaligned = torch.zeros(want.numel() + 3, dtype=torch.uint8, device=DEVICE)[3:]
    unaligned.copy_(want)  # a payload at an odd address: the kernels read it byte by byte
    aligned = want.to(DEVICE, copy=True)  # a fresh tensor: 32-bit words
    outs = dict.fromkeys((x.dtype, torch.float32))  # fp32 inputs: one view, by n's parity
    views = [aligned, unaligned] if len(outs) == 2 else [(aligned, unaligned)[n % 2]]
    for od, payload in zip(outs, views):
        acc = (torch.arange(n, dtype=torch.float32) % 13 - 6.0).to(od)
        acc[::7] = -0.0
        ref = native.decode_add_(acc.clone(), want)
        dtype = None if od == x.dtype else x.dtype
        out = impl.decode_add_(codec, acc.to(DEVICE), payload, dtype=dtype)
        assert_same(out.cpu(), ref, f"{what} decode_add into {od}")


def impls():
    """The default blocks; small ones (several programs per kernel, masked tails); the
    smallest (one bucket per program of the scalars kernel, as a GPU runs few large buckets)."""
    return [
        TritonLevels(),
        TritonLevels(block=64, buckets_per_program=2),
        TritonLevels(block=8, buckets_per_program=1),
    ]


def programs(n: int, size: int, which: int) -> float:
    """About how many programs impls()[which] runs for n values in buckets of ``size``."""
    nb = -(-n // size) if size else 1
    return (0, nb / 2 + 2 * n / 64, nb + 2 * n / 8)[which]


def cases(name, params):
    """(n, dtype, input kind, which of impls()); small blocks where their program count stays
    small (the interpreter runs about a millisecond per program)."""
    size = params.get("bucket_size", 512 if name not in ("signsgd", "signum", "tbq") else 0)
    past = 9 * size + 5 if size <= 8 else (2 * size + 5 if size <= 600 else 1100)
    past = 1100 if size == 0 else past
    if SWEEP:
        sizes = [0, 1, 7, 8, 9, 13, 64, 65, 300, BIG, 2100]
        for n, dtype, kind, which in itertools.product(sizes, DTYPES, KINDS, range(3)):
            if programs(n, size, which) <= 400:
                yield n, dtype, kind, which
        return
    for k, n in enumerate([0, 1, 13, 300, past, 777, 2100]):
        which = k % 3
        while programs(n, size, which) > 80:
            which -= 1
        yield n, DTYPES[k % 3], KINDS[(k + len(name)) % 4], which


@pytest.mark.parametrize("name,params", CONFIGS, ids=IDS)
def test_native_bytes_and_values(name, params, monkeypatch):
    """Every other case on the int64 index variant of the kernels (otherwise only where an
    index may reach 2^31: the int32 one runs here)."""
    both = impls()
    for i, (n, dtype, kind, which) in enumerate(cases(name, params)):
        x = make_input(n, dtype, kind, seed=1000 * len(name) + i)
        with monkeypatch.context() as mp:
            if i % 2:
                wide_indices(mp)
            check(both[which], name, params, x, seed=11 + i, stream=2**63 + i)


@pytest.mark.parametrize("name", ["signsgd", "tbq"])
def test_the_non_finite_flag(name):
    """Any NaN / Inf / -Inf, in the first, a middle or the last program, sets flag bit 0 (the
    atomic OR); finite extremes never do (-3.4e38 with tau 1e-30, denormals)."""
    impl = TritonLevels(block=64)
    params = {"tau": 1e-30} if name == "tbq" else {}
    for at, v in [(0, "nan"), (700, "inf"), (1299, "-inf")]:
        x = make_input(1300, torch.float32, "gauss", seed=at)
        x[at] = float(v)
        check(impl, name, params, x)
        assert int(impl.encode(codecs.get(name, **params), x, 0, 0)[7]) == 1
    x = torch.tensor([-3.4e38, 3.4e38, 1e-45, -1e-40, 0.0, -0.0] * 50, device=DEVICE)
    check(impl, name, params, x)
    assert int(impl.encode(codecs.get(name, **params), x, 0, 0)[7]) == 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_special_buckets(dtype):
    """Zero, -0.0, constant, denormal, huge (qsgd's norm overflows to Inf: codes 0) and
    non-finite buckets of eight values, per bucketed codec."""
    rows = [[0.0] * 8, [-0.0] * 8, [0.75] * 8, [1e-40, -3e-41] * 4, [3e38, -3e38] * 4,
            [1.0, float("nan")] * 4, [-1e-45] * 8, [2.0**-130, 5.0] * 4]  # fmt: skip
    x = torch.tensor(sum(rows, []), dtype=torch.float32).to(dtype).to(DEVICE)
    impl = TritonLevels()
    for name, params in [("qsgd", {"bucket_size": 8}), ("terngrad", {"bucket_size": 8}),
                         ("terngrad", {"bucket_size": 8, "clip": 1.0}),
                         ("onebit", {"bucket_size": 8}), ("efsignsgd", {"bucket_size": 8}),
                         ("tbq", {"tau": 1e-30}), ("signsgd", {})]:  # fmt: skip
        check(impl, name, params, x)


def test_every_payload_byte_is_written(monkeypatch):
    """The payload comes from torch.empty: poisoned here, the bytes are still the native ones."""
    poison_empty(monkeypatch)
    impl = TritonLevels(block=64, buckets_per_program=2)
    for name, params in CONFIGS[:: len(CONFIGS) // 7]:
        check(impl, name, params, make_input(203, torch.float16, "special", 5))


def any_payload(name, params, flag: int, g, n: int = 150) -> torch.Tensor:
    """A payload no encoder writes, which the native decoder accepts: random codes (the sign bit
    with level 0, every level; 2-bit formats without the rejected code 3), scalars +-0.0, NaN,
    Inf, denormal, huge; flag bit 0 (signsgd / tbq) = ``flag``."""
    picks = torch.tensor([0.0, -0.0, 1.5, -2.0, float("nan"), float("inf"), 1e-40, 3e38])
    codec = codecs.get(name, **params)
    p = compressors.get(name, **params).encode(torch.zeros(n), seed=0, stream=0).clone()
    p[7] = flag if codec.flag_mask else 0
    at = 32 + 4 * codec.scalars * (codec.layout(n).count if codec.scalars else 0)
    p[32:at] = picks[torch.randint(0, 8, ((at - 32) // 4,), generator=g)].view(torch.uint8)
    body = torch.randint(0, 256, (p.numel() - at,), generator=g, dtype=torch.int32)
    if codec.bits == 2:  # code 3 -> 2
        body = body ^ (body & (body >> 1) & 0x55)
    p[at:] = body.to(torch.uint8)
    return p


def check_decode(impl, name, params, payload) -> None:
    """decode_add of ``payload`` equals the native one, into -0.0 and other values."""
    native, codec = compressors.get(name, **params), codecs.get(name, **params)
    n = 150
    out = torch.tensor([-0.0, 0.0, 1.0, -1e-45, 7.0] * (n // 5))
    ref = native.decode_add_(out.clone(), payload)
    got = impl.decode_add_(codec, out.to(DEVICE), payload.to(DEVICE))
    assert_same(got.cpu(), ref, f"{name} {params} decode_add")


@pytest.mark.parametrize("flag", [0, 1])
def test_decode_of_any_code_bytes(flag):
    g = torch.Generator().manual_seed(flag)
    for name, params in CONFIGS[::2]:
        check_decode(TritonLevels(block=64), name, params, any_payload(name, params, flag, g))


def test_protocol():
    impl = TritonLevels()
    assert impl.name == "triton-levels" and impl.applies(DEVICE)
    assert not impl.applies(torch.device("meta"))
    # derived from the device codecs (codecs.family): the dense fusable ones, registry order
    assert impl.codecs == ("signsgd", "signum", "onebit", "efsignsgd", "terngrad", "qsgd", "tbq")
    for size in (0, 1, 65537, 4294967295):
        assert impl.supports(codecs.get("qsgd", bucket_size=size), torch.bfloat16)
    for name in ("maxmin", "fp16", "topk"):
        assert not impl.supports(codecs.get(name), torch.float32)
    impl.load()
    impl.load()
    codec = codecs.get("qsgd")
    empty = impl.encode(codec, torch.zeros(0, device=DEVICE), 1, 2)
    assert torch.equal(
        empty.cpu(), compressors.get("qsgd").encode(torch.zeros(0), seed=1, stream=2)
    )
    out = torch.ones(10, device=DEVICE)
    with pytest.raises(ValueError, match="payload of 31 bytes"):
        impl.decode_add_(codec, out, torch.zeros(31, dtype=torch.uint8, device=DEVICE))
    with pytest.raises(ValueError, match="block"):
        TritonLevels(block=12)


def test_selected_through_the_codec_dispatch(monkeypatch):
    """Registered as a fused implementation, it passes kernels.py's self-check (mode 'fused':
    a failure raises) and the codecs' encode / decode_add_ run it."""
    monkeypatch.setenv("CGX_DEVICE_KERNELS", "fused")
    impl = TritonLevels()
    calls = []
    monkeypatch.setattr(impl, "encode", lambda *a, _f=impl.encode: calls.append(1) or _f(*a))
    with kernels.use_implementations([impl]):
        for name, params in [("qsgd", {"bucket_size": 64}), ("signsgd", {})]:
            codec, x = codecs.get(name, **params), make_input(300, torch.float16, "gauss", 7)
            got = codec.encode(x, seed=1, stream=2).cpu()
            assert torch.equal(
                got, compressors.get(name, **params).encode(x.cpu(), seed=1, stream=2)
            )
            out = codec.decode_add_(torch.zeros(300, device=DEVICE), got.to(DEVICE), torch.float16)
            ref = compressors.get(name, **params).decode_add_(torch.zeros(300), got)
            assert_same(out.cpu(), ref, name)
        assert kernels.fallbacks() == {}
    assert len(calls) >= 4  # two self-check encodes (signsgd: with a NaN too) and the calls


# ---- the comparison catches planted faults ---------------------------------------------------

KERNELS = pathlib.Path(__file__).parents[1] / "torch_cgx/device/triton/levels_kernels.py"


def mutant(tmp_path, old: str, new: str) -> TritonLevels:
    """TritonLevels running a copy of the kernels with ``old`` replaced by ``new`` (once)."""
    src = KERNELS.read_text()
    assert src.count(old) == 1, old
    path = tmp_path / f"levels_kernels_mutant_{abs(hash(new))}.py"
    path.write_text(src.replace(old, new))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    impl = TritonLevels()
    impl._k = module
    return impl


def test_a_planted_mask_off_by_one_is_caught(tmp_path):
    impl = mutant(tmp_path, "mask=at < end, other=0)", "mask=at <= end, other=0)")
    x = make_input(60, torch.float32, "gauss", 1)
    check(TritonLevels(), "efsignsgd", {"bucket_size": 7}, x)
    with pytest.raises(AssertionError, match="bytes differ"):
        check(impl, "efsignsgd", {"bucket_size": 7}, x)


def test_a_planted_lane_order_is_caught(tmp_path):
    """Lanes added one after the other instead of prim::stats' pairs: the CANCEL row of the
    sampled inputs shows it (random data alone would hide it behind the fp32 rounding)."""
    tree = "return ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))"
    impl = mutant(tmp_path, tree, "return ((((((l0 + l1) + l2) + l3) + l4) + l5) + l6) + l7")
    x = make_input(64, torch.float32, "cancel", 1)
    check(TritonLevels(), "onebit", {"bucket_size": 64}, x)
    with pytest.raises(AssertionError, match="bytes differ"):
        check(impl, "onebit", {"bucket_size": 64}, x)


def test_a_planted_negation_is_caught(tmp_path):
    """Triton's ``-v`` is 0 - v (+0.0 for +0.0, where C writes -0.0): the kernels flip the sign
    bit instead; a sign-bit code of level 0 (qsgd) shows the difference."""
    impl = mutant(tmp_path, "return (v.to(tl.uint32, bitcast=True) ^ 0x80000000)", "return (-v)")
    params = {"bits": 8, "bucket_size": 64}
    p = any_payload("qsgd", params, 0, torch.Generator().manual_seed(0))
    check_decode(TritonLevels(), "qsgd", params, p)
    with pytest.raises(pytest.fail.Exception, match="differ"):
        check_decode(impl, "qsgd", params, p)


@pytest.mark.skipif(DEVICE.type != "cuda", reason="CUDA only (TRITON_INTERPRET=0 on a GPU)")
def test_no_host_synchronisation_on_a_gpu():
    impl = TritonLevels()
    x = make_input(5000, torch.bfloat16, "gauss", 3)
    for name, params in CONFIGS:
        codec = codecs.get(name, **params)
        impl.encode(codec, x, 0, 0)  # compile outside the check
        out = torch.zeros(5000, device=DEVICE)
        impl.decode_add_(codec, out, impl.encode(codec, x, 0, 0), dtype=torch.bfloat16)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            impl.decode_add_(codec, out, impl.encode(codec, x, 1, 2), dtype=torch.bfloat16)
        finally:
            torch.cuda.set_sync_debug_mode("default")
