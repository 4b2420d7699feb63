"""Planted defects in the Triton max-min kernels (torch_cgx/device/triton/maxmin_kernels.py,
maxmin_buckets.py and the bits.py they share): a copy of the kernels with one edit (a wrong lane
order of the clip's fp64 sums, a mask one element too long, a program stopping a group short; a
defect in one of the paths a tile's place or the payload's address selects: full-tile loads,
scalars per group, the decoder's words) must fail the checks of tests/test_triton_maxmin.py,
whose helpers run here (payload bytes and decoded values against the native codec, the sums
against ``lane_sum``), where the original passes them: the checks reach every path. Moved out
of that module to keep it readable; the same environment rules.

Runs under Triton's interpreter on CPU tensors (TRITON_INTERPRET=1 is set below, before triton
is imported, and only while this module's tests run); with ``TRITON_INTERPRET=0`` on a machine
with a GPU the mutants are compiled and run on CUDA tensors. Skipped where triton is not
installed or the kernels cannot run.
"""

import importlib.util
import pathlib
import sys
import types

import numpy as np
import pytest
import torch
from codec_testing import DTYPES, special_input
from test_triton_maxmin import DEFAULT, _mixed, _sums_differ, mismatch
from triton_testing import interpreted_kernels, poison_empty

from torch_cgx.device.triton.maxmin import TritonMaxMin

bits, maxmin_buckets, maxmin_decode, maxmin_kernels, DEVICE, _interpreter = interpreted_kernels(
    "bits", "maxmin_buckets", "maxmin_decode", "maxmin_kernels"
)


pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's overflow notes


# ---- planted defects: a copy of the kernels with one edit ------------------------------------


def _load(path: pathlib.Path, src: str):
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # importable by the kernels' copy
    spec.loader.exec_module(module)
    return module


def mutant(tmp_path, *edits, in_decode=False, **launch) -> TritonMaxMin:
    """TritonMaxMin(**launch) running a copy of maxmin_kernels.py, maxmin_buckets.py and bits.py
    (the kernels' copy importing the others' copies; ``in_decode``: of maxmin_decode.py, for the
    decode kernel) with each ``(old, new)`` edit made once, in whichever of them holds it
    (modules of their own: compiled or interpreted like the originals)."""
    mods = [maxmin_decode] if in_decode else [maxmin_buckets, bits, maxmin_kernels]
    srcs = [pathlib.Path(m.__file__).read_text() for m in mods]
    for old, new in edits:
        assert sum(src.count(old) for src in srcs) == 1, old
        srcs = [src.replace(old, new) for src in srcs]
    tag = len(list(tmp_path.iterdir()))
    impl = TritonMaxMin(**launch)
    if in_decode:  # the encode kernels of the original, the decode kernel of the copy
        module = _load(tmp_path / f"maxmin_decode_mutant_{tag}.py", srcs[0])
        impl._k = types.ModuleType("maxmin_kernels_mixed")
        impl._k.__dict__.update(vars(maxmin_kernels), decode_kernel=module.decode_kernel)
        return impl
    kernels = srcs[2]
    for stem, src in (("maxmin_buckets", srcs[0]), ("bits", srcs[1])):
        copy = _load(tmp_path / f"{stem}_mutant_{tag}.py", src)
        kernels = kernels.replace(f"from torch_cgx.device.triton.{stem} import",
                                  f"from {copy.__name__} import")  # fmt: skip
    impl._k = _load(tmp_path / f"maxmin_kernels_mutant_{tag}.py", kernels)
    return impl


LANE_REST = "total = total + tl.sum(tl.where(col[None, :] == j, acc, 0.0), axis=1)"
LANE_ORDERS = {
    "lane 0, then 7 down to 1": [(LANE_REST, LANE_REST.replace("== j", "== 8 - j"))],
    "pairwise (prim::stats')": [
        ("    for j in tl.static_range(1, 8):\n        " + LANE_REST,
         "    total = total + tl.sum(tl.where(col[None, :] == 1, acc, 0.0), axis=1)\n"
         "    l23 = tl.sum(tl.where((col[None, :] >> 1) == 1, acc, 0.0), axis=1)\n"
         "    l45 = tl.sum(tl.where((col[None, :] >> 1) == 2, acc, 0.0), axis=1)\n"
         "    l67 = tl.sum(tl.where((col[None, :] >> 1) == 3, acc, 0.0), axis=1)\n"
         "    total = (total + l23) + (l45 + l67)"),
    ],
}  # fmt: skip


@pytest.mark.parametrize("order", list(LANE_ORDERS))
def test_a_wrong_lane_order_is_caught(tmp_path, order):
    x = _mixed(64 * 16, 7)
    assert _sums_differ(DEFAULT, 64, x) == 0
    assert _sums_differ(mutant(tmp_path, *LANE_ORDERS[order]), 64, x) > 0


def test_a_mask_off_by_one_is_caught(tmp_path, monkeypatch):
    """A bucket's mask one element too long (``at < hi`` reaching the next bucket's first: where
    a tile is exactly a bucket wide, 8 or 512 values, its own bounds hide it), the code
    stream's store mask one byte too long (over the raw tail's first byte), and a program of
    the one-launch encode stopping a group short of its buckets' end (bytes left unwritten:
    the payload comes poisoned, or torch.empty could hand back the right bytes of the
    previous encode)."""
    poison_empty(monkeypatch)
    x = torch.from_numpy(np.random.default_rng(5).standard_normal(203).astype(np.float32))
    span = mutant(tmp_path, ("hi = tl.minimum(lo + size, nq)",
                             "hi = tl.minimum(lo + size + 1, nq)"))  # fmt: skip
    codes = mutant(tmp_path, ("& (at < nbytes))", "& (at <= nbytes))"))
    short = mutant(tmp_path, ("e1 = tl.minimum(e0 + BB * size, nq)",
                              "e1 = tl.minimum(e0 + BB * size - 8, nq)"), tile=64)  # fmt: skip
    cases = ((span, 5, (0, 0, 0)), (span, 100, (0, 1, 1)), (codes, 13, (1, 0, 0)),
             (short, 8, (0, 0, 0)))  # fmt: skip
    for impl, bucket, lever in cases:
        assert mismatch(TritonMaxMin(**impl.fixed), x, 3, bucket, lever) is None
        assert mismatch(impl, x, 3, bucket, lever) is not None, (bucket, lever)


# ---- the paths of a tile's place and the payload's address (test_triton_maxmin_paths.py) -------

ONE = "bucket_of(tl.maximum(g * 8 - 8, 0), "  # a group takes the previous group's bucket
LOOP = "static_range(CHUNK // SUB):\n                v ="  # the tiles of a full chunk
# name -> (edits, decode?, cases (bits, bucket, n, dtype, payload offset)): a defect in one path
# only, and cases that must show it (64-value launch sizes: full tiles and tail tiles)
PATHS = {
    "codes: full tile": ([("v = widen(tl.load(x_ptr + i), BF16)",
                           "v = widen(tl.load(x_ptr + i), BF16) * 0.5")], False,
                         [(3, 8, 349, 0, 3), (3, 13, 300, 1, 3)]),
    "scalars: full chunk": ([("v = widen(tl.load(x_ptr + at + j * SUB), BF16)",
                              "v = widen(tl.load(x_ptr + at + j * SUB), BF16) * 0.5")], False,
                            [(4, 512, 1100, 0, 3)]),
    "scalars: masked chunk": ([("v = tl.where(m, v, first)", "v = tl.where(m, v * 0.5, first)")],
                              False, [(4, 100, 250, 0, 3)]),
    "scalars: a chunk's last tile": ([(LOOP, LOOP.replace("):", " - 1):"))], False,
                                     [(4, 512, 1100, 0, 3)]),
    "codes: scalars per group": ([("bucket_of(g * 8, size, ", ONE + "size, ")], False,
                                 [(5, 8, 349, 2, 3), (5, 512, 1100, 1, 3)]),
    "decode: codes as words": ([("grp = group_word(pay_ptr, at[:, None], BITS)",
                                 "grp = group_word(pay_ptr, at[:, None], BITS) ^ 1")],
                               True, [(5, 64, 300, 0, 0), (7, 27, 300, 1, 4)]),
    # at an odd address every block, at an aligned one the tail block only
    "decode: codes byte by byte": ([("other=0).to(tl.uint64)\n    for j",
                                     "other=0).to(tl.uint64) ^ 1\n    for j")],
                                   True, [(3, 64, 300, 0, 3), (6, 27, 290, 2, 0)]),
    "decode: 64-bit metadata": ([("mn_bits = (w & 0xFFFFFFFF)", "mn_bits = (w & 0xFFBFFFFF)")],
                                True, [(3, 27, 200, 0, 0)]),
    "decode: 32-bit metadata": ([("mn_bits = tl.load(p, mask=mask, other=0)",
                                  "mn_bits = tl.load(p, mask=mask, other=0) ^ 0x400000")],
                                True, [(3, 27, 200, 0, 4)]),
    "decode: metadata per group": ([("bucket_of(g * 8, size.to(IT), ", ONE + "size.to(IT), ")],
                                   True,
                                   [(6, 64, 300, 2, 3)]),
    "decode: full block of out": ([("tl.store(out_ptr + i, val)\n",
                                    "tl.store(out_ptr + i, val + val)\n")],
                                  True, [(2, 13, 130, 1, 3)]),
}  # fmt: skip


@pytest.mark.parametrize("path", list(PATHS))
def test_a_defect_in_one_path_is_caught(tmp_path, path):
    """The cases of test_triton_maxmin_paths.py reach each path: a defect there shows."""
    edits, decode, cases = PATHS[path]
    impl = mutant(tmp_path, *edits, in_decode=decode, tile=64, codes=64, decode=64, sub=16)
    for bits, bucket, n, d, at in cases:
        g = np.random.default_rng([bits, n])  # every group of eight on a scale of its own
        x = torch.from_numpy(g.standard_normal(n) * 1.5 ** (np.arange(n) // 8 % 40)).to(DTYPES[d])
        assert mismatch(TritonMaxMin(**impl.fixed), x, bits, bucket, (0, 0, 0), at=at) is None
        assert mismatch(impl, x, bits, bucket, (0, 0, 0), at=at) is not None, (bits, bucket, at)


def test_a_defect_in_the_full_clip_rows_is_caught(tmp_path):
    x = _mixed(64 * 6 + 5, 64)
    edit = ("d = e * e  # two roundings", "d = e * e * 2.0  # two roundings")
    assert _sums_differ(mutant(tmp_path, edit, tile=64), 64, x) > 0


@pytest.mark.parametrize("kind", ["denormal", "huge"])
def test_a_defect_in_the_fp64_path_per_group_is_caught(tmp_path, kind):
    """Step 4's fp64 path with each group's inv loaded once, a (G, 1) column (a bucket size that
    is a multiple of 8: the one-launch encode, through L2, and the codes kernel): buckets
    narrower than L / FLT_MAX or wider than FLT_MAX."""
    edits = [('mask=km, other=0.0, cache_modifier=".cg")',
              'mask=km, other=0.0, cache_modifier=".cg") * 0.5'),
             ("mask=km, other=0.0)\n", "mask=km, other=0.0) * 0.5\n")]  # fmt: skip
    impl = mutant(tmp_path, *edits, tile=64, codes=64, decode=64)
    x = torch.from_numpy(special_input(kind, 300, np.random.default_rng(len(kind))))
    for bucket in (8, 128):
        assert mismatch(TritonMaxMin(**impl.fixed), x, 4, bucket, (0, 0, 0)) is None
        assert mismatch(impl, x, 4, bucket, (0, 0, 0)) is not None, bucket
