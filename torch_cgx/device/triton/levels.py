"""Fused qsgd / terngrad / onebit / efsignsgd / signsgd / signum / tbq in Triton:
:class:`TritonLevels`, the :class:`torch_cgx.device.fused.FusedLevels` protocol, byte for
byte the native compressors (the kernels: ``levels_kernels.py``, imported by :meth:`load`).

Encode: the envelope's constant bytes are copied from ``constants.bytes_of`` (cached on the
device: no host copy per call); the bucketed codecs then run ``scalars_kernel`` (the per-bucket
f32 scalars, into the payload), and every codec ``codes_kernel`` (the code stream; signsgd,
signum and tbq OR the envelope's non-finite flag in); where a program's buckets end on a group
of eight and hold at most ``FUSED_VALUES`` values, ``encode_kernel`` does both in one launch
(``one_launch``). decode_add: ``decode_kernel`` reads the scalars, tbq's tau and the flag from
the payload, as 32-bit words where the payload is 4-aligned (a fresh tensor), else byte by
byte. Sizes, grids and kernel variants come from element counts and the codec's parameters
only: no host synchronisation, every launch on the caller's current stream (on the tensor's
device). Every kernel has an int32 index variant
(``IDX64=False``: no 64-bit integer arithmetic, the bucket index a multiply-high by
``divisor(size)``) where the extents the launch lists stay below ``INDEX32_LIMIT`` (2^31), the
int64 one otherwise.

Bucket sizes: every size the codecs allow, 0 (the whole tensor) included. A bucket is summed in
prim::stats' lane order by one program, whose eight lanes each add the bucket's rows of eight
in order: the cost is B / 64 dependent loop iterations (eight rows each) per bucket of B values,
several buckets per program when there are many (``buckets_per_program``). Large buckets are
therefore latency-bound: a whole-tensor bucket of 2^26 values is 2^20 serial iterations of one
program (no other order gives the native fp64 bits): on an H100, efsignsgd with bucket size 0
encoded 64 MB at 0.6 GB/s (benchmarks/results/), still 13x the tensor-op reference, at 8 rows a loop
trip; a program of one long bucket now takes ``LONG_UNROLL`` rows a trip (unmeasured), and the
first such encode of a CUDA tensor warns (torch_cgx/device/codecs/fused.py).
"""

from __future__ import annotations

import contextlib

import torch

from torch_cgx.device import constants
from torch_cgx.device.codecs.base import DTYPE_CODES
from torch_cgx.device.fused import FusedLevels
from torch_cgx.device.triton import divisor, index64, lanes

__all__ = ["TritonLevels"]

KINDS = {"qsgd": 0, "terngrad": 1, "onebit": 2, "efsignsgd": 3, "signsgd": 4, "signum": 4,
         "tbq": 5}  # fmt: skip
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
# a program of one bucket at least LONG_ROWS rows of eight long (32768 values: bucket_size 0 on
# a large tensor, say) sums LONG_UNROLL rows a loop trip: each lane's sum is one dependent fp64
# chain, and a trip of 8 rows pays a whole memory round trip for 64 values (0.6 GB/s on the
# H100 run); 64 rows a trip spread it over 512 (unmeasured)
LONG_ROWS, LONG_UNROLL = 1 << 12, 64
FUSED_VALUES = 1 << 13  # one launch where a program's buckets hold at most this many values:
# the codes of one program are a loop (a large single bucket: two launches, its codes in parallel)


def _le(value: int, nbytes: int) -> tuple:
    return tuple((value >> (8 * i)) & 0xFF for i in range(nbytes))


def envelope_bytes(codec, n: int, dtype: torch.dtype, device) -> torch.Tensor:
    """The envelope of a payload of ``n`` values with flags 0 (``DenseCodec.expected_envelope``'s
    bytes), a shared cached constant: copy it, never write into it."""
    values = (
        (ord("C"), ord("G"), ord("X"), ord("C"), 1, DTYPE_CODES[dtype], codec.compressor_id, 0)
        + _le(n, 8)
        + _le(codec.body_size(n), 8)
        + _le(codec.bucket_size, 4)
        + _le(codec.param1, 4)
    )
    return constants.bytes_of(values, torch.device(device))


def _bits_view(t: torch.Tensor) -> torch.Tensor:
    """bf16 tensors travel as their int16 bits (the kernels convert them by integer arithmetic)."""
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


def _pow2_at_most(v: int) -> int:
    return 1 << (max(v, 1).bit_length() - 1)


class TritonLevels(FusedLevels):
    """The Triton kernels of qsgd, terngrad, onebit, efsignsgd, signsgd, signum and tbq: CUDA
    tensors where triton is installed, CPU tensors under Triton's interpreter
    (``TRITON_INTERPRET=1``). Every bucket size, 0 included.

    ``block``: values per program of the codes and decode kernels (a power of two >= 8);
    ``buckets_per_program``: buckets summed per program of the scalars kernel (a power of two);
    None: on a GPU enough for about 1024 programs (at most half a warp's lanes: 16 on NVIDIA,
    32 on AMD's 64-lane CDNA; or 64 for buckets of <= 8 values), under the interpreter
    (programs run one after the other) up to 64 (1024).
    ``one_launch``: scalars and codes in one launch (``encode_kernel``) wherever a program's
    buckets end on a group of eight (True), never (False), or (None) there where a program's
    buckets also hold at most ``FUSED_VALUES`` values (its codes: a few tiles)."""

    name = "triton-levels"

    @property
    def codecs(self):
        from torch_cgx.device.codecs import family

        return family("levels")

    def __init__(self, block: int = 1024, buckets_per_program=None, one_launch=None) -> None:
        if block < 8 or block & (block - 1):
            raise ValueError(f"block must be a power of two >= 8, got {block}")
        bb = buckets_per_program
        if bb is not None and (bb < 1 or bb & (bb - 1)):
            raise ValueError(f"buckets_per_program must be a power of two, got {bb}")
        self.block = block
        self.buckets_per_program = bb
        self.one_launch = one_launch
        self.unroll = 8  # rows of eight per iteration of a bucket's sum (fewer for short ones)
        self._k = None

    def applies(self, device: torch.device) -> bool:
        from torch_cgx.device.triton import available

        return available(torch.device(device))

    def supports(self, codec, dtype: torch.dtype) -> bool:
        return codec.name in self.codecs and dtype in _FLOATS

    def load(self) -> None:
        """Imports triton and the kernels (ImportError where triton is missing)."""
        if self._k is None:
            from torch_cgx.device.triton import levels_kernels

            self._k = levels_kernels

    def _bb(self, nb: int, size: int, device: torch.device) -> int:
        if self.buckets_per_program is not None:
            return self.buckets_per_program
        if device.type != "cuda":  # the interpreter: programs run one after the other
            return min(1024 if size <= 8 else 64, 1 << (nb - 1).bit_length())
        # a warp's (bb, 8) tile at four values a thread: 16 buckets on 32 lanes, 32 on 64 (AMD's
        # CDNA); a bucket of one row leaves lanes idle: more buckets
        cap = 64 if size <= 8 else lanes(device) // 2
        return min(cap, _pow2_at_most(nb // 1024))  # about 1024 programs or more

    @staticmethod
    def _on(device: torch.device):
        """Launches go to the current stream of the tensor's device."""
        return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()

    @staticmethod
    def _options(device: torch.device) -> dict:
        """Launch options: no fused multiply-add (every fp32 / fp64 operation rounds once), and
        on NVIDIA no flush of fp32 denormals in libdevice functions (Triton's default flushes)."""
        opts = {"enable_fp_fusion": False}
        if device.type == "cuda" and torch.version.hip is None:
            opts["enable_reflect_ftz"] = False
        return opts

    @staticmethod
    def _meta(codec) -> dict:
        """The codec's constexpr arguments (LEVELS / NEG: prim::Levels' levels and neg_add)."""
        bits = codec.bits
        levels = (1 << (bits - 1)) - 1 if codec.name == "qsgd" else 1
        neg = 1 << (bits - 1) if codec.name == "qsgd" else 1
        return {"KIND": KINDS[codec.name], "BITS": bits, "LEVELS": levels, "NEG": neg}

    def encode(self, codec, x: torch.Tensor, seed: int, stream: int, shared: int = 0):
        """The payload of ``x`` (``shared``: the fused implementations' common signature; the
        level and sign formats draw nothing shared)."""
        from torch_cgx.device.codecs.base import rng_key

        self.load()
        if not x.is_contiguous():
            raise ValueError(f"{self.name}: the input must be contiguous")
        k, n, dev = self._k, x.numel(), x.device
        out = torch.empty(codec.encoded_size(n, x.dtype), dtype=torch.uint8, device=dev)
        out[:32].copy_(envelope_bytes(codec, n, x.dtype, dev))
        if n == 0:
            return out
        meta = self._meta(codec)
        layout = codec.layout(n) if codec.scalars else None
        nb = layout.count if layout else 0
        scal_end = 32 + 4 * codec.scalars * nb  # 4-aligned: the codes' word stores
        scal = out[32:scal_end].view(torch.int32) if nb else out[:8].view(torch.int32)
        size = layout.size if layout else 1
        xb, bf16 = _bits_view(x), x.dtype == torch.bfloat16
        k0, k1 = rng_key(seed, stream)
        opts = self._options(dev)
        groups = self.block // 8
        codes = dict(**meta, BF16=bf16, G=groups, BP=1 << (codec.bits - 1).bit_length())
        nbytes = (n * codec.bits + 7) // 8
        with self._on(dev):
            if nb:
                sp = self._scalars_plan(codec, layout, dev)
                args = (xb, out, scal)
                if sp["fused"]:  # one launch: the scalars stay in L2, the input is read once
                    codes["G"] = min(groups, sp["threads"])  # a group of 8 values a thread
                    k.encode_kernel[(sp["grid"],)](
                        *args, out[scal_end:], n, size, nb, nbytes, k0, k1, *divisor(size),
                        CLIP=sp["clip"], BB=sp["bb"], UNROLL=sp["unroll"], ALIGN=sp["align"],
                        **codes, IDX64=sp["wide"] or index64(n + self.block + 64, size),
                        num_warps=sp["warps"], **opts)  # fmt: skip
                    return out
                k.scalars_kernel[(sp["grid"],)](
                    *args, n, size, nb, KIND=meta["KIND"], CLIP=sp["clip"], BF16=bf16,
                    BB=sp["bb"], UNROLL=sp["unroll"], IDX64=sp["wide"], ALIGN=sp["align"],
                    num_warps=sp["warps"], **opts)  # fmt: skip
            k.codes_kernel[(_cdiv(n, self.block),)](
                xb, out, scal, out[scal_end:], out[:8].view(torch.int32), n, size, nbytes, k0, k1,
                *divisor(size), **codes, IDX64=index64(n + self.block + 64, size), num_warps=4,
                **opts)  # fmt: skip
        return out

    def _scalars_plan(self, codec, layout, device: torch.device) -> dict:
        """The scalars pass's launch: ``bb`` buckets per program, ``grid`` programs, ``unroll``
        rows per iteration (``LONG_UNROLL`` in a program of one long bucket), ``warps`` (one per
        lanes / 2 buckets, at most 4: a row of the (bb, 8) tile is four values a thread, a vector
        load where aligned; ``threads``: lanes x warps), ``align`` (a power of two <= 8 dividing
        every bucket's start), ``wide`` (its int64 variant: the tiles of every program, the last
        one's padding buckets, the scalars), and ``fused``: the codes in the same launch
        (``one_launch``; None: where a program's buckets hold at most ``FUSED_VALUES`` values),
        where each program's buckets end on a group of eight or there is one (its codes then in
        tiles of a group of eight values per thread)."""
        nb, size = layout.count, layout.size
        bb = self._bb(nb, size, device)
        grid = _cdiv(nb, bb)
        rows = (layout.width + 7) // 8
        unroll = LONG_UNROLL if bb == 1 and rows >= LONG_ROWS else self.unroll
        unroll = min(unroll, 1 << (rows - 1).bit_length())
        wide = index64((nb + bb) * size + 16 * unroll + 64, 2 * (nb + bb) + 2)
        align = 8 if nb == 1 and bb == 1 else min(8, size & -size)  # one bucket: at 0
        fits = (bb * size) % 8 == 0 or grid == 1
        want = self.one_launch if self.one_launch is not None else bb * size <= FUSED_VALUES
        clip = codec.name == "terngrad" and codec.clip > 0
        width = lanes(device)
        warps = max(1, min(4, bb * 2 // width))  # (bb, 8): 4 values a thread, one vector load
        return {"bb": bb, "grid": grid, "unroll": unroll, "wide": wide, "align": align,
                "fused": fits and want, "clip": clip, "warps": warps,
                "threads": width * warps}  # fmt: skip

    def decode_add_(self, codec, out: torch.Tensor, payload: torch.Tensor, dtype=None):
        """``out += decode(payload)``; ``dtype`` (the payload's source dtype) changes no byte the
        kernel reads (only the envelope's dtype byte: ``header_ok`` checks the envelope), so it
        is used for the size check only."""
        self.load()
        n = out.numel()
        want = codec.encoded_size(n, out.dtype if dtype is None else dtype)
        if not (out.is_contiguous() and payload.is_contiguous()):
            raise ValueError(f"{self.name}: out and the payload must be contiguous")
        if payload.dtype != torch.uint8 or payload.numel() != want:
            raise ValueError(f"{self.name}: {codec.name} payload of {payload.numel()} bytes "
                             f"for {n} values, want {want} uint8")  # fmt: skip
        if n == 0:
            return out
        layout = codec.layout(n) if codec.scalars else None
        codes_at = 32 + 4 * codec.scalars * (layout.count if layout else 0)
        size = layout.size if layout else 1
        # every index below 2^31 (elements, the payload's bytes, the scalars of the padding
        # lanes' buckets): the int32 variant
        scalars = 40 + 8 * ((n + self.block) // size) + 64 if layout else 0
        wide = index64(n + self.block + 64, want + self.block + 64, size, scalars)
        # whole words: a 4-aligned payload (the stream at 32 + 4 s nb), blocks of whole rows
        # (32 codes: ``bits`` words)
        words = payload.data_ptr() % 4 == 0 and self.block >= 32
        with self._on(out.device):
            self._k.decode_kernel[(_cdiv(n, self.block),)](
                payload, _bits_view(out), n, size, codes_at, *divisor(size), **self._meta(codec),
                BF16=out.dtype == torch.bfloat16, BLOCK=self.block, IDX64=wide, WORDS=words,
                num_warps=4, **self._options(out.device))  # fmt: skip
        return out


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b
