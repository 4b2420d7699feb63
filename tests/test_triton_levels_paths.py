"""TritonLevels' load and launch paths (torch_cgx/device/triton/levels_kernels.py) against the
native compressors, under Triton's interpreter (the preamble of tests/test_triton_levels.py,
whose helpers these tests use): the unmasked full tiles and the masked tails of the codes and
sums, the one-launch encode (``encode_kernel``) and the two-launch one, and decode_add from a
4-aligned payload (32-bit word reads) and from one at an odd byte offset of a larger tensor (the
byte path); every kind. A recording stand-in for the kernels module shows which path ran."""

import importlib.util
import pathlib
import sys

import pytest
import test_triton_levels as base  # (skips this module where that one skips)
import torch
from triton_testing import interpreted_kernels

from torch_cgx.device import codecs
from torch_cgx.device.triton.levels import FUSED_VALUES, TritonLevels

levels_kernels, DEVICE, _interpreter = interpreted_kernels("levels_kernels")
pytestmark = base.pytestmark


class Recorder:
    """The kernels module, recording every launch as (kernel name, keyword arguments)."""

    def __init__(self, module) -> None:
        self.module, self.launches = module, []

    def __getattr__(self, name):
        kernel = getattr(self.module, name)
        if not name.endswith("_kernel"):
            return kernel
        launches = self.launches

        class Grid:
            def __getitem__(self, grid):
                def run(*args, **kwargs):
                    launches.append((name, kwargs))
                    return kernel[grid](*args, **kwargs)

                return run

        return Grid()


def recording(**options) -> TritonLevels:
    impl = TritonLevels(**options)
    impl.load()
    impl._k = Recorder(levels_kernels)
    return impl


def launched(impl, name: str) -> list:
    return [kw for kernel, kw in impl._k.launches if kernel == name]


# (name, params, n): buckets whose rows fill whole unrolled iterations (64, 128, the whole
# tensor: unmasked sums, vector loads) and shorter ones (masked only); odd bucket counts (the
# last program's padding bucket); codes of 1 to 8 bits, 3 straddling bytes and words
PATHS = [
    ("qsgd", {"bits": 4, "bucket_size": 64}, 1100),
    ("qsgd", {"bits": 3, "bucket_size": 40}, 700),
    ("qsgd", {"bits": 8, "bucket_size": 0}, 700),
    ("terngrad", {"bucket_size": 24, "clip": 2.0}, 610),
    ("terngrad", {"bucket_size": 128}, 777),
    ("onebit", {"bucket_size": 128}, 1030),
    ("efsignsgd", {"bucket_size": 13}, 333),
    ("signsgd", {}, 1100),
    ("signum", {}, 300),
    ("tbq", {"tau": 0.3}, 1100),
]
PATH_IDS = [f"{n}-{'-'.join(f'{k}={v}' for k, v in p.items())}-{m}" for n, p, m in PATHS]


@pytest.mark.parametrize("name,params,n", PATHS, ids=PATH_IDS)
def test_tiles_launches_and_decode_alignment(name, params, n):
    """Payload bytes and decode_add (from an aligned and an odd-offset payload) equal native's
    with the one-launch encode where it applies and the two-launch one (blocks of 256: full
    tiles and a tail), fp16 and bf16 inputs."""
    codec = codecs.get(name, **params)
    for i, one in enumerate((True, False)):
        impl = recording(block=256, buckets_per_program=2, one_launch=one)
        x = base.make_input(n, (torch.float16, torch.bfloat16)[i], "special", n + i)
        base.check(impl, name, params, x, seed=i, stream=3)
        fused = launched(impl, "encode_kernel")
        if codec.scalars:
            plan = impl._scalars_plan(codec, codec.layout(n), DEVICE)
            assert bool(fused) == (one and plan["fused"])
            assert bool(launched(impl, "scalars_kernel")) == (not fused)
        assert bool(launched(impl, "codes_kernel")) == (not fused)
        assert [kw["WORDS"] for kw in launched(impl, "decode_kernel")] == [True, False]


def test_the_one_launch_encode_is_the_default_for_short_buckets():
    """The default: one launch where a program's buckets hold at most FUSED_VALUES values (a
    bucket of 2^17 values: two launches)."""
    impl = recording()  # under the interpreter up to 64 buckets per program (1024 of <= 8)
    x = base.make_input(1300, torch.float32, "gauss", 1)
    cases = [({"bucket_size": 64}, True), ({"bucket_size": 7}, True),
             ({"bucket_size": 1 << 17}, False), ({"bucket_size": 0}, True)]  # fmt: skip
    for params, fused in cases:
        base.check(impl, "efsignsgd", params, x)
        assert bool(launched(impl, "encode_kernel")) == fused, params
        impl._k.launches.clear()


def test_the_launch_plan():
    """One launch where a program's buckets end on a group of eight (or there is one program)
    and hold at most FUSED_VALUES values; the sums' alignment: a power of two <= 8 dividing the
    bucket size, 8 for one bucket in one program."""
    cuda = torch.device("cuda")  # the GPU plan: about 1024 programs
    impl = TritonLevels()
    qsgd = codecs.get("qsgd", bucket_size=512)
    plan = impl._scalars_plan(qsgd, qsgd.layout(1 << 24), cuda)
    assert (plan["bb"], plan["fused"], plan["align"]) == (16, True, 8)
    big = codecs.get("qsgd", bucket_size=FUSED_VALUES * 2)
    assert not impl._scalars_plan(big, big.layout(1 << 24), cuda)["fused"]
    whole = codecs.get("qsgd", bucket_size=0)
    plan = impl._scalars_plan(whole, whole.layout(1001), cuda)
    assert (plan["bb"], plan["grid"], plan["fused"], plan["align"]) == (1, 1, True, 8)
    odd = codecs.get("onebit", bucket_size=12)
    plan = TritonLevels(buckets_per_program=2)._scalars_plan(odd, odd.layout(1000), cuda)
    assert (plan["fused"], plan["align"]) == (True, 4)  # 24 values per program
    plan = TritonLevels(buckets_per_program=1)._scalars_plan(odd, odd.layout(1000), cuda)
    assert not plan["fused"]  # a program's buckets end mid-group
    assert not TritonLevels(one_launch=False)._scalars_plan(qsgd, qsgd.layout(4096), cuda)["fused"]


def test_the_scalars_tile_follows_the_warp_width(monkeypatch):
    """A warp's (bb, 8) tile holds four values a thread (one 16-byte vector load a row): 16
    buckets a warp on 32 lanes (NVIDIA), 32 on 64 (AMD's CDNA); buckets of <= 8 values 64 a
    program, on 4 or 2 warps; the one-launch codes a group of eight a thread."""
    import torch_cgx.device.triton.levels as L

    cuda, n = torch.device("cuda"), 1 << 24
    qsgd, tiny = codecs.get("qsgd", bucket_size=512), codecs.get("qsgd", bucket_size=8)
    want = {32: [(16, 1, 32), (64, 4, 128)], 64: [(32, 1, 64), (64, 2, 128)]}
    for width, plans in want.items():
        monkeypatch.setattr(L, "lanes", lambda device, width=width: width)
        got = [TritonLevels()._scalars_plan(c, c.layout(n), cuda) for c in (qsgd, tiny)]
        assert [(p["bb"], p["warps"], p["threads"]) for p in got] == plans, width
        assert all(p["bb"] * 8 == 4 * p["threads"] for p in got)


def test_a_long_bucket_sums_long_trips():
    """A program of one bucket of at least LONG_ROWS rows sums LONG_UNROLL rows a loop trip
    (each lane one dependent chain: fewer memory round trips), in full trips and a masked
    last one, with the native bytes (efsignsgd's and qsgd's whole tensor, 2^15 + 777 values);
    shorter or shared buckets keep 8 rows a trip."""
    from torch_cgx.device.triton.levels import LONG_ROWS, LONG_UNROLL

    n, cuda = 8 * LONG_ROWS + 777, torch.device("cuda")
    for name, params in [("efsignsgd", {}), ("qsgd", {"bits": 4, "bucket_size": 0})]:
        codec = codecs.get(name, **params)
        impl = recording()
        assert impl._scalars_plan(codec, codec.layout(n), cuda)["unroll"] == LONG_UNROLL
        assert impl._scalars_plan(codec, codec.layout(n - 800), cuda)["unroll"] == 8
        base.check(impl, name, params, base.make_input(n, torch.float32, "gauss", 3))
        assert [kw["UNROLL"] for kw in launched(impl, "scalars_kernel")] == [LONG_UNROLL]
    shared = codecs.get("qsgd", bucket_size=1 << 16)  # 16 buckets a program on a GPU
    plan = TritonLevels()._scalars_plan(shared, shared.layout(1 << 30), cuda)
    assert (plan["bb"], plan["unroll"]) == (16, 8)


@pytest.mark.parametrize("offset", [1, 4, 7])
def test_decode_of_a_payload_inside_a_larger_tensor(offset):
    """A payload at ``offset`` bytes into a larger uint8 tensor: 4-aligned (words) or not
    (bytes); random codes the encoders never write (every level, the sign bit with level 0)."""
    g = torch.Generator().manual_seed(offset)
    for name, params in [("qsgd", {"bits": 5, "bucket_size": 16}), ("onebit", {"bucket_size": 9}),
                         ("terngrad", {"bucket_size": 32}), ("tbq", {})]:  # fmt: skip
        payload = base.any_payload(name, params, 0, g)
        big = torch.zeros(payload.numel() + 16, dtype=torch.uint8, device=DEVICE)
        view = big[offset : offset + payload.numel()]
        view.copy_(payload)
        impl = recording(block=32)
        base.check_decode(impl, name, params, view)
        assert launched(impl, "decode_kernel")[0]["WORDS"] == (offset % 4 == 0)


def parts_mutant(tmp_path, old: str, new: str) -> TritonLevels:
    """TritonLevels running copies of the kernels whose levels_parts.py has ``old`` replaced by
    ``new`` (once)."""
    here = pathlib.Path(levels_kernels.__file__)
    parts = here.with_name("levels_parts.py").read_text()
    assert parts.count(old) == 1, old
    modules = {}
    kernels = here.read_text().replace(
        "torch_cgx.device.triton.levels_parts", "levels_parts_mutant"
    )
    for stem, text in [("levels_parts_mutant", parts.replace(old, new)),
                       ("levels_kernels_mutant", kernels)]:  # fmt: skip
        path = tmp_path / f"{stem}.py"
        path.write_text(text)
        spec = importlib.util.spec_from_file_location(stem, path)
        modules[stem] = importlib.util.module_from_spec(spec)
        sys.modules[stem] = modules[stem]  # the kernels' import of the parts
        spec.loader.exec_module(modules[stem])
    del sys.modules["levels_parts_mutant"], sys.modules["levels_kernels_mutant"]
    impl = TritonLevels(block=64)  # full blocks of check_decode's 150 values
    impl._k = modules["levels_kernels_mutant"]
    return impl


def test_a_planted_word_shift_is_caught(tmp_path):
    """The word path is compared: codes read one bit off show."""
    impl = parts_mutant(tmp_path, "c = (w[:, None] >> bit[None, :]) & MASK",
                        "c = (w[:, None] >> (bit[None, :] ^ 1)) & MASK")  # fmt: skip
    params = {"bits": 4, "bucket_size": 16}
    p = base.any_payload("qsgd", params, 0, torch.Generator().manual_seed(0))
    base.check_decode(TritonLevels(block=64), "qsgd", params, p)
    with pytest.raises(pytest.fail.Exception, match="differ"):
        base.check_decode(impl, "qsgd", params, p)


def test_a_planted_one_bucket_scalar_is_caught(tmp_path):
    """A block inside one bucket reads its scalar once: a wrong one shows."""
    impl = base.mutant(tmp_path, "32 + 4 * k0, True", "36 + 4 * k0, True")
    params = {"bits": 4, "bucket_size": 512}  # check_decode's 150 values: one bucket
    p = base.any_payload("qsgd", params, 0, torch.Generator().manual_seed(1))
    base.check_decode(TritonLevels(), "qsgd", params, p)
    with pytest.raises(pytest.fail.Exception, match="differ"):
        base.check_decode(impl, "qsgd", params, p)


def test_blocks_shorter_than_a_row_of_words_read_bytes():
    """Blocks of 8 or 16 values (a row of 32 codes is ``bits`` words: 6 bits, 16 codes are
    three words) decode byte by byte, whatever the payload's alignment."""
    params = {"bits": 6, "bucket_size": 16}
    p = base.any_payload("qsgd", params, 0, torch.Generator().manual_seed(2))
    for block in (8, 16):
        impl = recording(block=block)
        base.check_decode(impl, "qsgd", params, p)
        assert not launched(impl, "decode_kernel")[0]["WORDS"]
