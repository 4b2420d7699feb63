"""Fused max-min in Triton: :class:`TritonMaxMin`, the
:class:`torch_cgx.device.fused.FusedMaxMin` protocol, byte for byte the native codec and
torch_cgx/device/codecs/maxmin.py, with every lever: bits 1..8, every bucket size, the raw tail,
stochastic rounding, the clipped range, fp32 / fp16 / bf16 input (the kernels:
``maxmin_kernels.py``, imported by :meth:`TritonMaxMin.load`; importing this module does not
import triton).

Encode: the 24 header bytes are copied from the codec's cached device constant
(``MaxMin.header``), ``scalars_kernel`` writes the per-bucket metadata (and per-bucket scratch:
step 4's fp64 ``inv`` and its path), ``codes_kernel`` the code stream, and the raw tail is a
device-to-device copy of the input's bytes. Where a program holds whole buckets (the default
bucket sizes) ``encode_kernel`` does both passes in one launch, reading the input from memory
once. decode_add / values: ``decode_kernel``, one pass (the metadata and codes read as words
where the payload's address is 8- or 4-aligned, byte by byte otherwise). A tile inside the
tensor loads and stores unmasked (vector accesses); a bucket size that is a multiple of 8 has
the buckets' scalars read once per group of eight (``GROUP_META``).
Sizes, grids and kernel variants come from element counts and the codec's parameters only: no
host synchronisation, every launch on the current stream of the tensor's device. Every kernel
has an int32 index variant (``IDX64=False``: no 64-bit integer arithmetic, the bucket index a
multiply-high by ``divisor(bucket_size)``) where the extents the launch lists stay below
``INDEX32_LIMIT`` (2^31; torch_cgx/device/triton/__init__.py), the int64 one otherwise.
"""

from __future__ import annotations

import contextlib
import math

import torch

from torch_cgx.device.codecs.maxmin import CLIP_SIGMAS, HEADER_BYTES
from torch_cgx.device.fused import FusedMaxMin
from torch_cgx.device.triton import divisor, index64, lanes

__all__ = ["TritonMaxMin"]

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)

# Launch sizes (values per program). "gpu": NOT measured (no GPU has run these kernels yet):
# the fewest instructions a value in the one-launch encode's sm_90 SASS at 4 warps (the results log,
# "Instructions per value": tile 4096 / codes 2048 ~26, 2048 / 1024 ~35; 8192 takes 150
# registers a thread); a sweep on a GPU (tile x codes x decode x num_warps, per bits and bucket
# size) replaces them here: put its winners into TUNED, keyed by (bits, bucket_size), which
# overrides these per configuration. "interpreter": programs run one after the other (about a
# millisecond each), so as few as possible.
LAUNCH = {
    "gpu": {"tile": 4096, "codes": 2048, "decode": 1024, "num_warps": 4},
    "interpreter": {"tile": 65536, "codes": 8192, "decode": 8192, "num_warps": 1},
}
TUNED: dict = {}
GPU_PROGRAMS = 1024  # buckets per scalars program shrink until about this many programs


def _pow2_ceil(v: int) -> int:
    return 1 << (max(int(v), 1) - 1).bit_length()


def _pow2_floor(v: int) -> int:
    return 1 << (max(int(v), 1).bit_length() - 1)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _bits_view(t: torch.Tensor) -> torch.Tensor:
    """bf16 tensors travel as their int16 bits (the kernels convert them by integer arithmetic)."""
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


class TritonMaxMin(FusedMaxMin):
    """The Triton max-min kernels: CUDA tensors where triton is installed, CPU tensors under
    Triton's interpreter (``TRITON_INTERPRET=1``). Every max-min configuration, clip included.

    ``tile``: values per program of the scalars kernel (``BB`` buckets of ``CHUNK`` values, both
    powers of two; a longer bucket is a loop); ``codes`` / ``decode``: values per program of the
    codes and decode kernels (powers of two >= 8); ``sub``: the columns of the scalars loop's
    tiles (a power of two >= 8, at most a chunk; default on a GPU 4 x lanes x warps / buckets,
    at least 4 x lanes: a warp's row 16 bytes of fp32 a thread, 128 columns on NVIDIA, 256 on
    AMD's 64-lane CDNA; under the interpreter the chunk). None: :data:`LAUNCH` (and
    :data:`TUNED`)."""

    name = "triton-maxmin"

    def __init__(self, tile=None, codes=None, decode=None, num_warps=None, sub=None) -> None:
        for what, v in (("tile", tile), ("codes", codes), ("decode", decode), ("sub", sub)):
            if v is not None and (v < 8 or v & (v - 1)):
                raise ValueError(f"{what} must be a power of two >= 8, got {v}")
        self.fixed = {"tile": tile, "codes": codes, "decode": decode, "num_warps": num_warps,
                      "sub": sub}  # fmt: skip
        self._k = None

    def applies(self, device: torch.device) -> bool:
        from torch_cgx.device.triton import available

        return available(torch.device(device))

    def supports(self, codec, dtype: torch.dtype) -> bool:
        return codec.name == "maxmin" and dtype in _FLOATS

    def load(self) -> None:
        """Imports triton and the kernels (ImportError where triton is missing)."""
        if self._k is None:
            from torch_cgx.device.triton import maxmin_kernels

            self._k = maxmin_kernels

    # ---- launch plumbing ------------------------------------------------------------------------

    def launch(self, codec, device: torch.device) -> dict:
        """The launch sizes for ``codec`` on ``device`` (constructor > TUNED > LAUNCH)."""
        kind = "gpu" if device.type == "cuda" else "interpreter"
        plan = dict(LAUNCH[kind])
        if kind == "gpu":
            plan.update(TUNED.get((codec.bits, codec.bucket_size), {}))
        plan.update({k: v for k, v in self.fixed.items() if v is not None})
        return plan

    @staticmethod
    def _on(device: torch.device):
        """Launches go to the current stream of the tensor's device."""
        return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()

    @staticmethod
    def _options(device: torch.device, num_warps: int) -> dict:
        """Launch options: no fused multiply-add (every fp32 / fp64 operation rounds once), and
        on NVIDIA no flush of fp32 denormals in libdevice functions (Triton's default flushes)."""
        opts = {"enable_fp_fusion": False, "num_warps": num_warps}
        if device.type == "cuda" and torch.version.hip is None:
            opts["enable_reflect_ftz"] = False
        return opts

    # ---- encode ---------------------------------------------------------------------------------

    def encode(self, codec, x: torch.Tensor, seed: int, stream: int, shared: int = 0):
        """The payload of the 1-D contiguous ``x`` on its device (FORMAT.md's layout); ``shared``,
        the fused implementations' common signature, draws nothing here."""
        from torch_cgx.device.codecs.base import rng_key

        self.load()
        if x.dtype not in _FLOATS:
            raise ValueError(f"{self.name}: dtype must be float32, float16 or bfloat16")
        x = x.reshape(-1)
        n, dev = x.numel(), x.device
        nq, nb = codec.layout(n)
        out = torch.empty(codec.encoded_size(n, x.dtype), dtype=torch.uint8, device=dev)
        out[:HEADER_BYTES].copy_(codec.header(n, x.dtype, dev))
        codes_at = HEADER_BYTES + 8 * nb  # 8-aligned in the fresh payload: the codes' word stores
        tail_at = codes_at + (nq * codec.bits + 7) // 8
        if nq < n:  # the raw tail: the input's own bytes
            out[tail_at:].copy_(x[nq:].view(torch.uint8))
        if nq == 0:
            return out
        plan = self.launch(codec, dev)
        meta = out[HEADER_BYTES:codes_at].view(torch.int32)  # offset 24: 4-aligned
        inv = torch.empty(nb, dtype=torch.float64, device=dev)
        sel = torch.empty(nb, dtype=torch.float32, device=dev)
        xb, bf16 = _bits_view(x), x.dtype == torch.bfloat16
        opts = self._options(dev, plan["num_warps"])
        k0, k1 = rng_key(seed, stream) if codec.stochastic else (0, 0)
        block = max(8, plan["codes"])
        codes = dict(BITS=codec.bits, STOCH=codec.stochastic, BF16=bf16, G=block // 8,
                     BP=_pow2_ceil(codec.bits), GROUP_META=codec.bucket_size % 8 == 0)  # fmt: skip
        sp = self._scalars_plan(codec, nq, nb, plan, dev, x.element_size())
        nbytes = tail_at - codes_at
        div = divisor(codec.bucket_size)  # bucket_of's (magic, shift) in the int32 variant
        with self._on(dev):
            if sp["fused"]:  # one launch: the input read once
                # code tiles no longer than a program's values (a longer one is all masked)
                held = _pow2_floor(max(8, sp["meta"]["BB"] * codec.bucket_size))
                codes["G"] = min(block, held) // 8
                self._k.encode_kernel[(sp["grid"],)](
                    xb, meta, inv, sel, out[codes_at:], nq, codec.bucket_size, sp["span"], nb,
                    nbytes, k0, k1, *div, **sp["meta"], **codes, **opts)  # fmt: skip
            else:
                self._scalars(codec, xb, bf16, nq, nb, meta, inv, sel, None, plan)
                self._k.codes_kernel[(_cdiv(nq, block),)](
                    xb, meta, inv, sel, out[codes_at:], nq, codec.bucket_size, nbytes, k0, k1,
                    *div, **codes, IDX64=sp["meta"]["IDX64"], CLIP=codec.clip, **opts)  # fmt: skip
        return out

    @staticmethod
    def _scalars_plan(
        codec, nq: int, nb: int, plan: dict, device: torch.device, itemsize: int
    ) -> dict:
        """The scalars pass's tile: ``BB`` buckets of ``CHUNK`` values per program (a longer
        bucket is a loop), its grid, and whether the codes can follow in the same launch
        (``fused``: a bucket fits the tile, and each program's buckets end on a group of eight
        or there is one program). ``IDX64``: the int64 variant of every encode kernel, where an
        index may reach 2^31: the scalars' tiles (the padding buckets of the last program
        included), the codes' elements (a program's groups past ``nq``), the metadata words
        (of every lane's bucket, the padding lanes' too). ``ALIGN``: the largest power of two
        dividing the bucket size, up to 16 bytes of input (the buckets' starts: the alignment
        hint of the unmasked vector loads)."""
        size, span = codec.bucket_size, min(codec.bucket_size, nq)
        chunk = min(_pow2_ceil(span), _pow2_floor(plan["tile"]))
        bb = min(max(1, plan["tile"] // chunk), _pow2_ceil(nb))
        if device.type == "cuda":
            bb = min(bb, _pow2_floor(max(1, nb // GPU_PROGRAMS)))
        rows = (span + 7) // 8
        grid = _cdiv(nb, bb)
        fused = span <= chunk and ((bb * size) % 8 == 0 or grid == 1)
        unroll = min(8, _pow2_ceil(rows))
        # the min / max loop's (BB, SUB) tiles: on a GPU a warp's row in one bucket, the warps
        # on the buckets where BB >= the warps (else on a bucket's columns); one tile under the
        # interpreter (its programs run op by op)
        if plan.get("sub"):
            sub = min(chunk, plan["sub"])
        elif device.type == "cuda":
            row = 4 * lanes(device)  # a warp's row: 16 bytes of fp32 a thread
            sub = min(chunk, max(row, row * plan["num_warps"] // bb))
        else:
            sub = chunk
        block = max(8, plan["codes"])  # the metadata word 2 k of every lane's bucket k, too
        wide = index64((nb + bb) * size + chunk + 16 * unroll + 64, nq + block + 64,
                       2 * max(nb + bb, (nq + block) // size + 1) + 2)  # fmt: skip
        meta = dict(LEVELS=(1 << codec.bits) - 1, CLIP=codec.clip, C=CLIP_SIGMAS[codec.bits],
                    BB=bb, CHUNK=chunk, SUB=sub, UNROLL=unroll, IDX64=wide,
                    ALIGN=math.gcd(size, 16 // itemsize))  # fmt: skip
        return {"grid": grid, "span": span, "fused": fused, "meta": meta}

    def _scalars(self, codec, xb, bf16, nq, nb, meta, inv, sel, sums, plan) -> None:
        """Launches ``scalars_kernel`` (``sums``: an (nb, 2) fp64 tensor for :meth:`clip_sums`)."""
        sp = self._scalars_plan(codec, nq, nb, plan, xb.device, xb.element_size())
        self._k.scalars_kernel[(sp["grid"],)](
            xb, meta, inv, sel, inv if sums is None else sums, nq, codec.bucket_size, sp["span"],
            nb, **sp["meta"], BF16=bf16, SUMS=sums is not None,
            **self._options(xb.device, plan["num_warps"]))  # fmt: skip

    def clip_sums(self, codec, x: torch.Tensor) -> torch.Tensor:
        """FORMAT.md's fp64 sums ``S(x)`` and ``S((x - mean)^2)`` of every bucket of ``x``, as
        the encode kernel computes them for a clipped codec: an (nb, 2) fp64 tensor (a check
        of the lane order, which a payload shows only by chance: codecs/maxmin.py's
        ``lane_sum`` gives the expected bits; the incomplete last bucket's are never used)."""
        self.load()
        if not codec.clip:
            raise ValueError(f"{self.name}: clip_sums needs a clipped codec (clip=1)")
        x = x.reshape(-1)
        nq, nb = codec.layout(x.numel())
        sums = torch.zeros(nb, 2, dtype=torch.float64, device=x.device)
        if nq:
            meta = torch.empty(2 * nb, dtype=torch.int32, device=x.device)
            inv = torch.empty(nb, dtype=torch.float64, device=x.device)
            sel = torch.empty(nb, dtype=torch.float32, device=x.device)
            with self._on(x.device):
                self._scalars(codec, _bits_view(x), x.dtype == torch.bfloat16, nq, nb, meta, inv,
                              sel, sums, self.launch(codec, x.device))  # fmt: skip
        return sums

    # ---- decode ---------------------------------------------------------------------------------

    def _decode(self, codec, out, payload, dtype, add: bool) -> None:
        self.load()
        n = out.numel()
        want = codec.encoded_size(n, dtype)
        if payload.dtype != torch.uint8 or payload.dim() != 1 or payload.numel() != want:
            raise ValueError(f"{self.name}: maxmin payload of {payload.numel()} bytes for {n} "
                             f"values of {dtype}, want {want} uint8")  # fmt: skip
        if payload.device != out.device:
            raise ValueError(f"payload is on {payload.device}, out on {out.device}")
        if n == 0:
            return
        nq, nb = codec.layout(n)
        codes_at = HEADER_BYTES + 8 * nb
        tail_at = codes_at + (nq * codec.bits + 7) // 8
        plan = self.launch(codec, out.device)
        block = max(8, plan["decode"])
        # every index below 2^31 (elements, the payload's bytes, the metadata of the padding
        # lanes' buckets): the int32 variant
        size = codec.bucket_size
        wide = index64(n + block + 64, want + 4 * block + 64, size,
                       24 + 8 * ((n + block) // size) + 64)  # fmt: skip
        payload = payload.contiguous()
        at = payload.data_ptr()  # the metadata and codes as words where it is 4- or 8-aligned
        word = 8 if at % 8 == 0 else 4 if at % 4 == 0 else 1
        with self._on(out.device):
            self._k.decode_kernel[(_cdiv(n, block),)](
                payload, _bits_view(out), n, nq, size, codes_at, tail_at,
                *divisor(size), BITS=codec.bits,
                TAIL_BYTES=dtype.itemsize if nq < n else 0, TAIL_BF16=dtype == torch.bfloat16,
                ADD=add, OUT_BF16=out.dtype == torch.bfloat16, BLOCK=block, IDX64=wide,
                WORD=word, GROUP_META=size % 8 == 0,
                **self._options(out.device, plan["num_warps"]))  # fmt: skip

    def decode_add_(self, codec, out: torch.Tensor, payload: torch.Tensor, dtype=None):
        """``out += decode(payload)`` in fp32, rounded once to out's dtype (fp32, fp16, bf16);
        ``out`` 1-D contiguous; ``dtype``: what the payload was encoded from (default out's).
        The header is not read (``codec.header_ok`` checks it)."""
        dtype = out.dtype if dtype is None else dtype
        if out.dtype not in _FLOATS or dtype not in _FLOATS:
            raise ValueError(f"{self.name}: dtypes must be float32, float16 or bfloat16")
        if not out.is_contiguous():
            raise ValueError(f"{self.name}: out must be contiguous")
        self._decode(codec, out.view(-1), payload, dtype, add=True)
        return out

    def values(self, codec, payload: torch.Tensor, numel: int, dtype: torch.dtype):
        """The decoded fp32 values of a payload of ``numel`` values of ``dtype`` (the codec's
        ``values``)."""
        if dtype not in _FLOATS:
            raise ValueError(f"{self.name}: dtype must be float32, float16 or bfloat16")
        out = torch.empty(numel, dtype=torch.float32, device=payload.device)
        self._decode(codec, out, payload, dtype, add=False)
        return out
