"""TritonSparse (torch_cgx/device/triton/sparse.py): the Triton kernels of topk, randomk,
threshold, dgc, graddrop and sparseloco (its keys, scalars, indices and code stream) against the
NATIVE compressors (``compressors.get``): payload bytes equal, decode_add equal to the native
one; and through the codecs' dispatch (``CGX_DEVICE_KERNELS=fused``: the first-use self-check,
then the kernels).

Runs under Triton's interpreter on CPU tensors (TRITON_INTERPRET=1 is set below, before triton is
imported, and only while this module's tests run; skipped where triton is not installed). The
sizes are sampled (odd, past a block, a masked tail in every launch), with 32 values per program
in every other case (several programs per launch) and the default 1024 in the others.
"""

import pytest
import torch
from triton_testing import interpreted_kernels, poison_empty, wide_indices

from torch_cgx import compressors
from torch_cgx.device import codecs, kernels
from torch_cgx.device.codecs import sparse_select as sel
from torch_cgx.device.codecs.base import rng_key
from torch_cgx.device.triton.sparse import TritonSparse

sparse_kernels, DEVICE, _interpreter = interpreted_kernels("sparse_kernels")


# sparseloco's levels: a chunk of equal magnitudes divides by d = 0, as native (numpy warns)
pytestmark = [
    pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]


@pytest.fixture
def fused(monkeypatch):
    """``CGX_DEVICE_KERNELS=fused``; the fixture's value enters a TritonSparse of ``block`` values
    per program as the only implementation."""
    monkeypatch.setenv("CGX_DEVICE_KERNELS", "fused")
    kernels.reset()

    def use(block: int):
        return kernels.use_implementations([TritonSparse(block=block)])

    return use


CONFIGS = [
    ("topk", {}),
    ("topk", {"ratio": 0.3}),
    ("randomk", {}),
    ("randomk", {"ratio": 0.7, "scale": 1}),
    ("threshold", {"tau": 0.5}),
    ("threshold", {"tau": 1e30}),  # nothing selected: the envelope only
    ("dgc", {}),
    ("dgc", {"ratio": 0.05, "sample_rate": 0.2}),
    ("graddrop", {"drop": 0.9, "sample_rate": 0.5}),
    ("sparseloco", {"chunk": 64}),
    ("sparseloco", {"ratio": 0.1, "chunk": 100, "bits": 3}),
    ("sparseloco", {"ratio": 0.2, "chunk": 50, "bits": 1}),  # the fp64 mean
    ("sparseloco", {"ratio": 0.5, "chunk": 70000, "bits": 8}),  # u32 indices, tail only
]
IDS = [n + "".join(f"-{k}={v}" for k, v in p.items()) for n, p in CONFIGS]
SIZES = [1, 13, 300, 777, 2100, 1025, 0]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def make_input(n: int, dtype, kind: str, seed: int) -> torch.Tensor:
    """Gaussian values; ties (few distinct magnitudes, -0); or NaN / +-Inf among Gaussians."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g)
    if kind == "ties":
        x = torch.randint(-3, 4, (n,), generator=g).float() * 0.5
        x[::5] = -0.0
    elif kind == "special" and n:
        at = torch.randint(0, n, (max(3, n // 50),), generator=g)
        x[at[::3]], x[at[1::3]], x[at[2::3]] = float("nan"), float("inf"), -float("inf")
    return x.to(dtype).to(DEVICE)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit, a NaN only needing to be a NaN (the native dtype conversions differ)."""
    if not torch.equal(a.isnan(), b.isnan()):
        return False
    keep = ~a.isnan()
    bits = torch.int32 if a.element_size() == 4 else torch.int16
    return torch.equal(a[keep].view(bits), b[keep].view(bits))


@pytest.mark.parametrize("name,params", CONFIGS, ids=IDS)
def test_bytes_and_decode_equal_native(name, params, monkeypatch):
    """The kernels' payload is the native one, byte for byte; decode_add (randomk: the kernels'
    draws) the native values. 128 values per program in every other case (several programs)."""
    poison_empty(monkeypatch)  # a payload byte the kernels leave unwritten shows
    native, codec = compressors.get(name, **params), codecs.get(name, **params)
    impls = {block: TritonSparse(block=block) for block in (128, 1024)}
    for case, n in enumerate(SIZES):
        dtype = DTYPES[(case + len(name)) % 3]
        kind = ("normal", "ties", "special")[case % 3]
        impl = impls[128 if case % 2 else 1024]
        x = make_input(n, dtype, kind, case)
        what = f"{name} {params} {dtype} n={n} {kind} block={impl.block}"
        want = native.encode(x.cpu(), seed=5 + n, stream=3, shared=11)
        got = impl.encode(codec, x, 5 + n, 3, shared=11)
        assert torch.equal(got.cpu(), want), what
        acc = make_input(n, dtype, "normal", 99)
        want_acc = native.decode_add_(acc.cpu().clone(), want)
        assert _same(impl.decode_add_(codec, acc, got).cpu(), want_acc), what


@pytest.mark.parametrize("name", ["topk", "randomk", "dgc", "sparseloco"])
def test_dispatch_self_checks_then_fuses(name, fused):
    """Through the codec: the first use self-checks (fp32 and bf16 here), then the kernels run
    (the decision says so) and give the native bytes; decode_add too for randomk."""
    native, codec = compressors.get(name), codecs.get(name)
    with fused(1024):
        for dtype in (torch.float32, torch.bfloat16):
            x = make_input(2100, dtype, "special", 4)
            want = native.encode(x.cpu(), seed=1, stream=2, shared=3)
            assert torch.equal(codec.encode(x, seed=1, stream=2, shared=3).cpu(), want)
            acc = make_input(2100, dtype, "normal", 5)
            want_acc = native.decode_add_(acc.cpu().clone(), want)
            assert _same(codec.decode_add_(acc, want.to(DEVICE)).cpu(), want_acc)
        assert set(kernels.decisions().values()) == {"fused"}, kernels.decisions()
        assert {key[3] for key in kernels.decisions()} == {torch.float32, torch.bfloat16}
        # sparseloco's chunk selects its index width: part of what is self-checked
        assert {key[5] for key in kernels.decisions()} == {4096 if name == "sparseloco" else 0}


@pytest.mark.parametrize("wide", [False, True], ids=["int32", "int64"])
def test_sparseloco_both_index_variants(wide, monkeypatch):
    """sparseloco's per-chunk keys and codes: the in-chunk position and the chunk of a kept value
    32-bit (GPUs' default below 2^31) and 64-bit (INDEX32_LIMIT lowered), the native bytes."""
    if wide:
        wide_indices(monkeypatch)
    params = {"ratio": 0.05, "chunk": 96, "bits": 4}
    native, codec = compressors.get("sparseloco", **params), codecs.get("sparseloco", **params)
    x = make_input(1000, torch.float16, "ties", 8)
    want = native.encode(x.cpu(), seed=1, stream=2)
    assert torch.equal(TritonSparse(block=256).encode(codec, x, 1, 2).cpu(), want)


@pytest.mark.parametrize("n,k", [(1, 1), (5, 2), (100, 99), (1000, 37), (700, 500)])
def test_random_k_kernels(n, k):
    """The draws, the repeat flags and the pointer-jumping rounds give prim::random_k (the
    reference, itself checked against the native one): host keys and a payload's key bytes
    (at an odd address)."""
    impl = TritonSparse(block=128)
    impl.load()
    for seed in range(2):
        k0, k1 = rng_key(seed, 77)
        want = sel.random_k(n, k, k0, k1)
        assert torch.equal(impl._prims.random_k(n, k, (k0, k1), device=DEVICE).cpu(), want)
        raw = torch.tensor([k0, k1], dtype=torch.int64).to(torch.int32).view(torch.uint8)
        at_odd = torch.cat([torch.zeros(1, dtype=torch.uint8), raw]).to(DEVICE)[1:]
        assert torch.equal(impl._prims.random_k(n, k, at_odd, device=DEVICE).cpu(), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_nan_if_flagged_writes_only_under_the_flag(dtype):
    """randomk's non-finite flag: every element NaN where the payload has it (several programs
    and a masked tail: 300 values, 128 per program), ``out`` bitwise untouched where it has not
    (a NaN with another payload in it stays as it is)."""
    impl = TritonSparse(block=128)
    impl.load()
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    for flags in (0, 1, 2, 3):
        payload = torch.zeros(40, dtype=torch.uint8, device=DEVICE)
        payload[7] = flags
        out = torch.randn(300).to(dtype).to(DEVICE)
        out.view(bits)[5] = -1  # a NaN (all bits set) that is not the dtype's quiet NaN
        want = sel.REFERENCE.nan_if_flagged(out.clone(), payload)
        before = out.clone()
        got = impl._prims.nan_if_flagged(out, payload)
        assert got is out
        if flags & 2:
            assert got.float().isnan().all() and want.float().isnan().all()
        else:
            assert torch.equal(got.view(bits), before.view(bits))
            assert torch.equal(want.view(bits), before.view(bits))


def test_selection_and_fallback(fused, monkeypatch):
    """A kernel whose bytes differ fails its first-use self-check: ``fused`` raises, ``auto``
    warns and keeps the reference (a kernel outside torch_cgx.device.triton applies to CPU
    tensors in ``auto`` too)."""

    class Broken(TritonSparse):
        def encode(self, codec, x, seed, stream, shared=0):
            out = super().encode(codec, x, seed, stream, shared)
            out[-1] ^= 1
            return out

    codec = codecs.get("topk")
    x = make_input(300, torch.float32, "normal", 1)
    with kernels.use_implementations([Broken()]):
        with pytest.raises(RuntimeError, match="triton-sparse for topk"):
            codec.encode(x)
    monkeypatch.setenv("CGX_DEVICE_KERNELS", "auto")
    with kernels.use_implementations([Broken()]):
        with pytest.warns(RuntimeWarning, match="failed its self-check"):
            assert torch.equal(codec.encode(x), codec.reference_encode(x))
        assert "reference" in next(iter(kernels.decisions().values()))
