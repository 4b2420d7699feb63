"""The paths of the Triton max-min kernels that depend on a tile's place and the payload's address
(torch_cgx/device/triton/maxmin_kernels.py, maxmin_decode.py), each reached with launch sizes
of 64 values (several programs per tensor and bucket) and compared with the native codec's
bytes and values (tests/test_triton_maxmin.py's ``check``): the encode side's unmasked (vector)
loads of a tile inside the tensor and its buckets (the codes, the one-launch encode's code
groups, the scalars' chunks and the clip's rows) and the masked ones of the tail tile; the
buckets' scalars once per group of eight (bucket sizes that are multiples of 8) or per element;
the decoder's metadata and codes as 64-bit / 32-bit words (a payload at an 8- or 4-aligned
address) or bytes (at an odd one), and its unmasked ``out`` accesses of a full block. That each
path runs is shown by tests/test_triton_maxmin_defects.py: a defect planted in one path only
fails these cases. Interpreted like tests/test_triton_maxmin.py (the same preamble).
"""

import numpy as np
import pytest
import torch
from codec_testing import DTYPES, random_input
from test_triton_maxmin import LEVERS, _mixed, _sums_differ, check
from triton_testing import interpreted_kernels, poison_empty, wide_indices

from torch_cgx.device import codecs
from torch_cgx.device.triton.maxmin import TritonMaxMin

maxmin_kernels, DEVICE, _interpreter = interpreted_kernels("maxmin_kernels")


pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's overflow notes
P64 = TritonMaxMin(tile=64, codes=64, decode=64, sub=16)  # the scalars' loop: 4 tiles a chunk
# (bits, bucket, n, lever): bucket 8 the one-launch encode with a group's scalars once (size a
# multiple of 8), 512 two launches (a bucket longer than the 64-value tile: full chunks, then
# full code tiles, scalars per group), 13 and 100 per element (100: full chunks and clip rows of
# a bucket that is not a multiple of 8), 24 one launch (three groups per bucket); n: full tiles
# and a tail tile, with and without the raw tail
CASES = [(3, 8, 349, (0, 1, 0)), (4, 512, 1541, (1, 0, 1)), (5, 13, 421, (1, 1, 0)),
         (7, 100, 333, (0, 0, 1)), (2, 24, 389, (1, 0, 0)), (8, 512, 1100, (0, 1, 1)),
         (1, 16, 640, (0, 0, 0)), (6, 40, 701, (1, 1, 1))]  # fmt: skip
ADDRESSES = (0, 4, 3, 6)  # the payload's byte offset: 64-bit, 32-bit words, bytes (odd, even)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_full_and_tail_tiles_match_the_native_codec(case, monkeypatch):
    """The dtypes and payload address kinds spread over the cases; odd cases on the int64
    variant."""
    bits, bucket, n, lever = CASES[case]
    if case % 2:
        wide_indices(monkeypatch)
    x = random_input(n, DTYPES[case % 3], np.random.default_rng([case, n]))
    at = ADDRESSES[case % len(ADDRESSES)]
    check(P64, x, bits, bucket, lever, seed=case, stream=n, at=at,
          out_dtype=DTYPES[(case // 3) % 3], what=f"at {at}")  # fmt: skip


def test_decode_word_paths_every_bits():
    """Every bits (the one to three 32-bit words of a group), 64-bit and 32-bit metadata words,
    a bucket a multiple of 8 and not, the raw tail in each dtype."""
    g = np.random.default_rng(9)
    for bits in range(1, 9):
        at, bucket = (0, 4)[bits % 2], (64, 27, 27, 64)[bits % 4]
        x = random_input(300, DTYPES[bits % 3], g)
        check(P64, x, bits, bucket, LEVERS[(bits * 3) % 8], at=at, what=f"at {at}")


def test_clip_rows_full_and_masked():
    """The clip's fp64 sums over full rows (unmasked loads: 64-value buckets, one per program)
    and a bucket's masked last rows (100 values: 13 rows), bit for bit the reference's."""
    for bucket, n in ((64, 64 * 6 + 5), (100, 100 * 4 + 7)):
        assert _sums_differ(P64, bucket, _mixed(n, bucket)) == 0, bucket


def test_every_payload_byte_is_written_with_full_tiles(monkeypatch):
    poison_empty(monkeypatch)
    g = np.random.default_rng(4)
    for bits, bucket, lever in ((3, 8, (0, 0, 0)), (5, 512, (1, 0, 1)), (6, 24, (1, 1, 0))):
        check(P64, random_input(400, DTYPES[bits % 3], g), bits, bucket, lever, what="poisoned")


class _Recorder:
    """The kernels of ``kernels``, launched as usual, each launch's keyword arguments recorded."""

    def __init__(self, kernels):
        self.kernels, self.launches = kernels, []

    def __getattr__(self, name):
        kernel = getattr(self.kernels, name)

        class Launcher:
            def __getitem__(_, grid):
                def launch(*args, **kwargs):
                    self.launches.append((name, kwargs))
                    return kernel[grid](*args, **kwargs)

                return launch

        return Launcher()


# (bucket size, dtype, ALIGN, GROUP_META)
HOST_CASES = [(512, torch.float32, 4, True), (512, torch.float16, 8, True),
              (12, torch.float32, 4, False), (100, torch.bfloat16, 4, False),
              (13, torch.float32, 1, False), (24, torch.float16, 8, True)]  # fmt: skip


def test_the_host_picks_the_paths():
    """ALIGN (the buckets' starts in elements, up to 16 bytes), GROUP_META (bucket size % 8 ==
    0) and the decoder's WORD (the payload's address: 8-, 4-aligned or neither)."""
    x = torch.arange(300, dtype=torch.float32).to(DEVICE) / 7.0
    for bucket, dtype, align, group in HOST_CASES:
        impl = TritonMaxMin(tile=64, codes=64, decode=64)
        impl.load()
        impl._k = _Recorder(impl._k)
        codec = codecs.get("maxmin", bits=3, bucket_size=bucket)
        payload = impl.encode(codec, x.to(dtype), 0, 0)
        for at, word in ((0, 8), (4, 4), (3, 1), (6, 1))[: 4 if bucket == 512 else 1]:
            view = torch.zeros(payload.numel() + 8, dtype=torch.uint8, device=DEVICE)
            view = view[at : at + payload.numel()]
            impl.values(codec, view.copy_(payload), 300, dtype)
            assert impl._k.launches[-1][1]["WORD"] == word, (bucket, at)
        kinds = {name: kw for name, kw in impl._k.launches}
        encode = kinds.get("encode_kernel") or {**kinds["scalars_kernel"], **kinds["codes_kernel"]}
        assert (encode["ALIGN"], encode["GROUP_META"]) == (align, group), bucket
        assert kinds["decode_kernel"]["GROUP_META"] == group, bucket
