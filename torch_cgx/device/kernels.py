"""Fused kernels for the device codecs, never trusted blindly (issue 28, item 4; docs/gpu.md).

A *fused implementation* replaces a device codec's tensor operations (the *reference*) by a
kernel for the tensors it applies to. Today: max-min's CUDA kernels (csrc/cuda) through the C
ABI of ``libcgx_cuda_capi.so`` (:class:`CudaMaxMin`), and the fused qsgd / terngrad / onebit /
efsignsgd kernels of csrc/cuda/levels_cuda.cu through the same library (:class:`CudaLevels`).
The process setting ``device_kernels`` (``CGX_DEVICE_KERNELS``) selects:

- ``reference``: tensor operations only;
- ``auto`` (default): at the first use of each (implementation, device type, dtype, bits,
  bucket size, flags) the kernel encodes a small buffer on the caller's device and must give the
  reference's bytes, then decode-adds that payload and must give the reference's values (NaN
  equal to NaN); on a mismatch, an exception, or a library that is missing or fails to load, it
  warns once, naming the kernel and the reason, and the reference is used from then on;
- ``fused``: the same self-check, but a failure raises ``RuntimeError``.

Implementations are injectable (:func:`use_implementations`), so the selection logic runs in the
CPU test suite with fake kernels on CPU tensors (tests/test_device_kernels.py). The real one
applies to CUDA tensors only: CPU tensors take the reference without any warning, whatever the
mode. Configurations a kernel does not cover (max-min's clipped range) take the reference
silently.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pathlib
import threading
import warnings
from typing import Dict, Iterator, List, Optional, Sequence

import torch

__all__ = [
    "CudaLevels",
    "CudaMaxMin",
    "FusedLevels",
    "FusedMaxMin",
    "decisions",
    "fused_for",
    "implementations",
    "library_candidates",
    "mode",
    "reset",
    "use_implementations",
]

MODES = ("auto", "fused", "reference")
CAPI_VERSION = 1
_ROOT = pathlib.Path(__file__).resolve().parents[2]


class FusedMaxMin:
    """What a fused max-min implementation provides (duck-typed; subclass for documentation).

    ``load()`` raises (OSError, RuntimeError, ...) when the kernel cannot run in this process;
    ``encode`` returns the payload of ``x`` (1-D contiguous) on ``x``'s device, and
    ``decode_add_`` adds a payload's values to ``out`` (1-D contiguous, the payload's dtype),
    both enqueued on the device's current stream."""

    name = "fused maxmin"

    def applies(self, device: torch.device) -> bool:
        return False

    def supports(self, codec, dtype: torch.dtype) -> bool:
        return codec.name == "maxmin" and not codec.clip

    def load(self) -> None:
        pass

    def encode(self, codec, x: torch.Tensor, seed: int, stream: int) -> torch.Tensor:
        raise NotImplementedError

    def decode_add_(self, codec, out: torch.Tensor, payload: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


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


class CudaMaxMin(FusedMaxMin):
    """csrc/cuda's max-min kernels through ctypes; CUDA tensors only, no clipped range."""

    name = "cuda-maxmin (libcgx_cuda_capi.so)"

    def __init__(self) -> None:
        self._lib = None

    def applies(self, device: torch.device) -> bool:
        return device.type == "cuda"

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

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            message = self._lib.cgx_cuda_capi_last_error().decode(errors="replace")
            raise RuntimeError(f"{self.name} {what}: {message}")

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

    def decode_add_(self, codec, out, payload):
        from torch_cgx.device.codecs.base import DTYPE_CODES

        code = DTYPE_CODES[out.dtype]
        # no error flag: the caller checks header_ok(); a mismatching header leaves out as it was
        with torch.cuda.device(out.device):
            cuda_stream = torch.cuda.current_stream(out.device).cuda_stream
            self._check(self._lib.cgx_cuda_capi_maxmin_decode(
                payload.data_ptr(), payload.numel(), out.data_ptr(), code, out.numel(), code,
                codec.bits, codec.bucket_size, int(codec.raw_tail), 1, None, cuda_stream),
                "decode_add")  # fmt: skip
        return out


class FusedLevels(FusedMaxMin):
    """A fused implementation of the dense bucketed compressors qsgd, terngrad, onebit and
    efsignsgd (same protocol as :class:`FusedMaxMin`)."""

    name = "fused levels"
    codecs = ("qsgd", "terngrad", "onebit", "efsignsgd")
    # Eight threads sum a bucket in prim::stats' lane order (serial per lane, for the native
    # bytes): buckets beyond this, and bucket size 0 (the whole tensor), take the reference.
    max_bucket = 1 << 16

    def supports(self, codec, dtype: torch.dtype) -> bool:
        return codec.name in self.codecs and 0 < codec.bucket_size <= self.max_bucket


class CudaLevels(FusedLevels):
    """csrc/cuda/levels_cuda.cu's qsgd / terngrad / onebit / efsignsgd kernels through ctypes;
    CUDA tensors only."""

    name = "cuda-levels (libcgx_cuda_capi.so)"

    def __init__(self) -> None:
        self._lib = None

    def applies(self, device: torch.device) -> bool:
        return device.type == "cuda"

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

    @staticmethod
    def _config(codec):
        """(kind, bits, clip) of the C ABI: qsgd 0, terngrad 1, onebit 2, efsignsgd 3."""
        if codec.name == "qsgd":
            return 0, codec.bits, 0.0
        if codec.name == "terngrad":
            return 1, 2, float(codec.clip)
        return (2 if codec.name == "onebit" else 3), 1, 0.0

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            message = self._lib.cgx_cuda_capi_last_error().decode(errors="replace")
            raise RuntimeError(f"{self.name} {what}: {message}")

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

    def decode_add_(self, codec, out, payload):
        from torch_cgx.device.codecs.base import DTYPE_CODES

        kind, bits, clip = self._config(codec)
        with torch.cuda.device(out.device):
            cuda_stream = torch.cuda.current_stream(out.device).cuda_stream
            self._check(self._lib.cgx_cuda_capi_levels_decode_add(
                payload.data_ptr(), payload.numel(), out.data_ptr(), DTYPE_CODES[out.dtype],
                out.numel(), kind, bits, clip, codec.bucket_size, cuda_stream),
                "decode_add")  # fmt: skip
        return out


class _State:
    def __init__(self, impls: Sequence) -> None:
        self.lock = threading.RLock()
        self.impls = list(impls)
        self.mode: Optional[str] = None
        self.unavailable: Dict[int, str] = {}  # id(impl) -> why it cannot load
        self.checked: Dict[tuple, Optional[str]] = {}  # key -> None (passed) or the reason


_state = _State([CudaMaxMin(), CudaLevels()])


def mode() -> str:
    """The ``device_kernels`` process setting (``CGX_DEVICE_KERNELS``), read once per process
    (again after :func:`reset`)."""
    with _state.lock:
        if _state.mode is None:
            from torch_cgx import settings

            values, names = settings.read_env(("process",))
            raw = values.get("device_kernels", "auto")
            try:
                _state.mode = settings.BY_NAME["device_kernels"].check(raw)
            except ValueError as e:
                raise ValueError(f"{names['device_kernels']} {e}, got {raw!r}") from None
        return _state.mode


def implementations() -> List:
    return list(_state.impls)


def reset() -> None:
    """Forgets the mode, load failures and self-check results (the next use checks again)."""
    with _state.lock:
        _state.mode = None
        _state.unavailable.clear()
        _state.checked.clear()


@contextlib.contextmanager
def use_implementations(impls: Sequence) -> Iterator[None]:
    """Within the block, ``impls`` are the fused implementations (tests inject fakes here);
    caches are reset on entry and exit."""
    with _state.lock:
        before = _state.impls
        _state.impls = list(impls)
        reset()
    try:
        yield
    finally:
        with _state.lock:
            _state.impls = before
            reset()


def decisions() -> Dict[tuple, str]:
    """Each self-checked configuration and its outcome: ``"fused"`` or ``"reference: <why>"``."""
    with _state.lock:
        return {
            k: "fused" if why is None else f"reference: {why}" for k, why in _state.checked.items()
        }


def _variant(codec) -> int:
    """What else selects a kernel variant: max-min's flags, else the envelope's param1
    (terngrad's clip bits; qsgd's bits)."""
    return codec.flags if hasattr(codec, "flags") else codec.param1


def _describe(impl, codec, dtype) -> str:
    dt = str(dtype).replace("torch.", "")
    what = "flags" if hasattr(codec, "flags") else "param1"
    return (f"{impl.name} for {codec.name} ({dt}, bits={codec.bits}, "
            f"bucket_size={codec.bucket_size}, {what}={_variant(codec)})")  # fmt: skip


def _fail(what: str, reason: str, strict: bool) -> None:
    message = f"torch_cgx: fused kernel {what}: {reason}"
    if strict:
        raise RuntimeError(f"{message} (CGX_DEVICE_KERNELS=fused; 'auto' falls back to the "
                           "reference tensor operations)")  # fmt: skip
    warnings.warn(f"{message}; using the reference tensor operations", RuntimeWarning, stacklevel=4)


def fused_for(codec, device: torch.device, dtype: torch.dtype):
    """The fused implementation to use for ``codec`` on tensors of ``dtype`` on ``device``, or
    None for the reference (mode ``reference``, no implementation applies, or it failed)."""
    if mode() == "reference":
        return None
    impls = [i for i in _state.impls if i.applies(device) and i.supports(codec, dtype)]
    if not impls:
        return None
    impl = impls[0]
    strict = mode() == "fused"
    with _state.lock:
        if id(impl) in _state.unavailable:
            if strict:
                _fail(impl.name, _state.unavailable[id(impl)], True)
            return None
        try:
            impl.load()
        except Exception as e:  # noqa: BLE001 - any load failure means: not this kernel
            _state.unavailable[id(impl)] = why = f"unavailable ({type(e).__name__}: {e})"
            _fail(impl.name, why, strict)
            return None
        key = (impl.name, device.type, dtype, codec.bits, codec.bucket_size, _variant(codec))
        if key not in _state.checked:
            _state.checked[key] = why = _self_check(impl, codec, device, dtype)
            if why is not None:
                _fail(_describe(impl, codec, dtype), f"failed its self-check ({why})", strict)
        elif _state.checked[key] is not None and strict:
            _fail(
                _describe(impl, codec, dtype),
                f"failed its self-check ({_state.checked[key]})",
                True,
            )
        return impl if _state.checked[key] is None else None


def check_size(bucket_size: int) -> int:
    """Elements of the self-check buffer: two full buckets, half of one and 3 more (a raw tail
    or an incomplete bucket, and a partial code byte), at most 2^19 + 3; 4099 for bucket size 0
    (the whole tensor is one bucket)."""
    if bucket_size <= 0:
        return 4099
    if bucket_size > 1 << 17:
        return (1 << 19) + 3
    return 2 * bucket_size + bucket_size // 2 + 3


def _check_input(n: int, bucket_size: int, dtype, device) -> torch.Tensor:
    """Gaussian values over six decades (bucket by bucket), a constant second bucket and a zero;
    built on the host from a fixed seed and copied to the device."""
    bucket_size = bucket_size if bucket_size > 0 else n
    g = torch.Generator().manual_seed(20240528)
    x = torch.randn(n, generator=g, dtype=torch.float64)
    scale = 10.0 ** (torch.arange(n, dtype=torch.float64) // bucket_size % 7 - 3)
    x = x * scale
    if n >= 2 * bucket_size:
        x[bucket_size : 2 * bucket_size] = 0.75
    x[0] = 0.0
    return x.to(dtype).to(device)


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    both_nan = torch.isnan(a) & torch.isnan(b)
    bits = torch.int32 if a.element_size() == 4 else torch.int16
    return bool(((a.view(bits) == b.view(bits)) | both_nan).all())


def _self_check(impl, codec, device, dtype) -> Optional[str]:
    """None when ``impl`` gives the reference's bytes and values on a small buffer, else why."""
    n = check_size(codec.bucket_size)
    x = _check_input(n, codec.bucket_size, dtype, device)
    seed, stream = 0x5EED, 77
    try:
        want = codec.reference_encode(x, seed=seed, stream=stream)
        got = impl.encode(codec, x, seed, stream)
        if got.shape != want.shape or got.dtype != want.dtype:
            return f"encode gave {got.dtype} {tuple(got.shape)}, want {want.numel()} uint8"
        if not torch.equal(got, want):
            first = int((got != want).nonzero()[0])
            return f"encode differs from the reference from byte {first} of {want.numel()}"
        out0 = torch.randn(n, generator=torch.Generator().manual_seed(7)).to(dtype).to(device)
        ref, fused = out0.clone(), out0.clone()
        codec.reference_decode_add_(ref, want)
        impl.decode_add_(codec, fused, want)
        if not _same_values(fused, ref):
            return "decode_add differs from the reference"
    except Exception as e:  # noqa: BLE001 - a kernel that raises fails its check
        return f"raised {type(e).__name__}: {e}"
    return None
