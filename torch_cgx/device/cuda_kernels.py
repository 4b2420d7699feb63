"""csrc/cuda's fused kernels through ctypes (:class:`CudaMaxMin`, :class:`CudaLevels`, both from
``libcgx_cuda_capi.so``, found by :func:`library_candidates`; the protocols: fused.py).
kernels.py decides when one is used (the setting, the self-check, the fallback)."""

from __future__ import annotations

import ctypes
import os
import pathlib
from typing import List

import torch

from torch_cgx.device.fused import FusedLevels, FusedMaxMin

__all__ = ["CudaLevels", "CudaMaxMin", "library_candidates"]

CAPI_VERSION = 2  # 2: the levels kinds 4..6 (signsgd, signum, tbq)
_ROOT = pathlib.Path(__file__).resolve().parents[2]


def library_candidates() -> List[pathlib.Path]:
    """Where :class:`CudaMaxMin` looks for the library, in order: ``CGX_CUDA_LIBRARY`` (a file),
    then ``libcgx_cuda_capi.so`` beside this package's ``_C``, in ``build/gpu`` and ``build/core``
    of a source checkout (``make gpu-build`` writes ``build/gpu``)."""
    env = os.environ.get("CGX_CUDA_LIBRARY", "").strip()
    if env:
        return [pathlib.Path(env)]
    name = "libcgx_cuda_capi.so"
    return [
        _ROOT / "torch_cgx" / name,
        _ROOT / "build" / "gpu" / name,
        _ROOT / "build" / "core" / name,
    ]


def _open_library():
    """The first of :func:`library_candidates` that exists, loaded and version-checked, with
    its path; OSError / RuntimeError otherwise."""
    found = [p for p in library_candidates() if p.is_file()]
    if not found:
        where = ", ".join(str(p) for p in library_candidates())
        raise OSError(f"library not found (looked at {where}; build it with make gpu-build "
                      "or set CGX_CUDA_LIBRARY)")  # fmt: skip
    lib = ctypes.CDLL(str(found[0]))
    if lib.cgx_cuda_capi_version() != CAPI_VERSION:
        raise RuntimeError(f"{found[0]} has C ABI version {lib.cgx_cuda_capi_version()}, "
                           f"this torch_cgx needs {CAPI_VERSION}")  # fmt: skip
    lib.cgx_cuda_capi_last_error.restype = ctypes.c_char_p
    return lib, found[0]


class _Library:
    """What the ctypes implementations share: the library handle, CUDA tensors only, and the
    C ABI's status codes turned into RuntimeError with the library's message."""

    name = ""

    def __init__(self) -> None:
        self._lib = None

    def applies(self, device: torch.device) -> bool:
        return device.type == "cuda"

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            message = self._lib.cgx_cuda_capi_last_error().decode(errors="replace")
            raise RuntimeError(f"{self.name} {what}: {message}")


class CudaMaxMin(_Library, FusedMaxMin):
    """csrc/cuda's max-min kernels through ctypes; CUDA tensors only, no clipped range."""

    name = "cuda-maxmin (libcgx_cuda_capi.so)"

    def load(self) -> None:
        if self._lib is not None:
            return
        lib, path = _open_library()
        i64, u64, ptr, c_int = ctypes.c_int64, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_int
        lib.cgx_cuda_capi_maxmin_encode.argtypes = [ptr, c_int, i64, c_int, i64, c_int, c_int,
                                                    u64, u64, ptr, u64, ptr]  # fmt: skip
        lib.cgx_cuda_capi_maxmin_decode.argtypes = [ptr, u64, ptr, c_int, i64, c_int, c_int, i64,
                                                    c_int, c_int, ptr, ptr]  # fmt: skip
        if not lib.cgx_cuda_capi_available():
            raise RuntimeError(f"{path} loaded but reports no usable CUDA device")
        self._lib = lib

    def encode(self, codec, x, seed, stream):
        from torch_cgx.device.codecs.base import DTYPE_CODES

        n = x.numel()
        out = torch.empty(codec.encoded_size(n, x.dtype), dtype=torch.uint8, device=x.device)
        with torch.cuda.device(x.device):  # the kernels launch on the current device
            cuda_stream = torch.cuda.current_stream(x.device).cuda_stream
            self._check(self._lib.cgx_cuda_capi_maxmin_encode(
                x.data_ptr(), DTYPE_CODES[x.dtype], n, codec.bits, codec.bucket_size,
                int(codec.raw_tail), int(codec.stochastic), seed, stream, out.data_ptr(),
                out.numel(), cuda_stream), "encode")  # fmt: skip
        return out

    def decode_add_(self, codec, out, payload, dtype=None):
        from torch_cgx.device.codecs.base import DTYPE_CODES

        code = DTYPE_CODES[out.dtype]  # the output's dtype; the payload's (its raw tail) below
        source = DTYPE_CODES[out.dtype if dtype is None else dtype]
        # no error flag: the caller checks header_ok(); a mismatching header leaves out as it was
        with torch.cuda.device(out.device):
            cuda_stream = torch.cuda.current_stream(out.device).cuda_stream
            self._check(self._lib.cgx_cuda_capi_maxmin_decode(
                payload.data_ptr(), payload.numel(), out.data_ptr(), code, out.numel(), source,
                codec.bits, codec.bucket_size, int(codec.raw_tail), 1, None, cuda_stream),
                "decode_add")  # fmt: skip
        return out


class CudaLevels(_Library, FusedLevels):
    """csrc/cuda/levels_cuda.cu's qsgd / terngrad / onebit / efsignsgd / signsgd / signum / tbq
    kernels through ctypes; CUDA tensors only."""

    name = "cuda-levels (libcgx_cuda_capi.so)"
    # Eight threads sum a bucket in prim::stats' lane order (serial per lane, for the native
    # bytes): buckets beyond this, and bucket size 0 (the whole tensor), take the reference.
    max_bucket = 1 << 16

    def supports(self, codec, dtype: torch.dtype) -> bool:
        if codec.name not in self.codecs:
            return False
        return codec.scalars == 0 or 0 < codec.bucket_size <= self.max_bucket

    def load(self) -> None:
        if self._lib is not None:
            return
        lib, path = _open_library()
        i64, u64, ptr, c_int = ctypes.c_int64, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_int
        f32 = ctypes.c_float
        lib.cgx_cuda_capi_levels_encode.argtypes = [ptr, c_int, i64, c_int, c_int, f32, i64, u64,
                                                    u64, ptr, u64, ptr]  # fmt: skip
        lib.cgx_cuda_capi_levels_decode_add.argtypes = [ptr, u64, ptr, c_int, i64, c_int, c_int,
                                                        f32, i64, ptr]  # fmt: skip
        if not lib.cgx_cuda_capi_available():
            raise RuntimeError(f"{path} loaded but reports no usable CUDA device")
        self._lib = lib

    KINDS = {"qsgd": 0, "terngrad": 1, "onebit": 2, "efsignsgd": 3, "signsgd": 4, "signum": 5,
             "tbq": 6}  # fmt: skip

    @classmethod
    def _config(cls, codec):
        """(kind, bits, clip) of the C ABI (clip: terngrad's clip, tbq's tau)."""
        clip = {"terngrad": "clip", "tbq": "tau"}.get(codec.name)
        return cls.KINDS[codec.name], codec.bits, float(getattr(codec, clip)) if clip else 0.0

    def encode(self, codec, x, seed, stream):
        from torch_cgx.device.codecs.base import DTYPE_CODES

        n = x.numel()
        kind, bits, clip = self._config(codec)
        out = torch.empty(codec.encoded_size(n, x.dtype), dtype=torch.uint8, device=x.device)
        with torch.cuda.device(x.device):
            cuda_stream = torch.cuda.current_stream(x.device).cuda_stream
            self._check(self._lib.cgx_cuda_capi_levels_encode(
                x.data_ptr(), DTYPE_CODES[x.dtype], n, kind, bits, clip, codec.bucket_size, seed,
                stream, out.data_ptr(), out.numel(), cuda_stream), "encode")  # fmt: skip
        return out

    def decode_add_(self, codec, out, payload, dtype=None):
        """``dtype`` (the payload's source dtype) is not passed on: these payloads' bytes do not
        depend on it (f32 bucket scalars, then codes; only the envelope's dtype byte, which the
        kernel does not read: ``header_ok`` checks it), so the C ABI takes the output's only."""
        from torch_cgx.device.codecs.base import DTYPE_CODES

        kind, bits, clip = self._config(codec)
        with torch.cuda.device(out.device):
            cuda_stream = torch.cuda.current_stream(out.device).cuda_stream
            self._check(self._lib.cgx_cuda_capi_levels_decode_add(
                payload.data_ptr(), payload.numel(), out.data_ptr(), DTYPE_CODES[out.dtype],
                out.numel(), kind, bits, clip, codec.bucket_size, cuda_stream),
                "decode_add")  # fmt: skip
        return out
