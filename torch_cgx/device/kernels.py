"""Fused kernels for the device codecs, never trusted blindly (docs/gpu.md).

A *fused implementation* replaces a device codec's tensor operations (the *reference*) by a
kernel for the tensors it applies to, first found first: the Triton kernels of max-min
(:class:`~torch_cgx.device.triton.maxmin.TritonMaxMin`) and of qsgd / terngrad / onebit /
efsignsgd / signsgd / signum / tbq (:class:`~torch_cgx.device.triton.levels.TritonLevels`) on
CUDA tensors wherever triton is installed, and on CPU tensors under Triton's interpreter
(``TRITON_INTERPRET=1``) in ``fused`` mode only. Where triton is missing, the reference runs.
The process setting ``device_kernels`` (``CGX_DEVICE_KERNELS``) selects:

- ``reference``: tensor operations only;
- ``auto`` (default): at the first use of each (implementation, codec, device type, dtype, bits,
  bucket size, flags) the kernel encodes a small buffer on the caller's device and must give the
  reference's bytes (the reference computed on a CPU copy: the native order of its sums), then
  decode-adds that payload and must give the reference's values (NaN equal to NaN), for fp16 /
  bf16 also into a float32 output (the engine's sums); a codec that flags non-finite input in
  its envelope (signsgd, signum, tbq) also encodes the buffer with a NaN in it; on a mismatch,
  an exception, or a kernel that fails to load, it warns once, naming the kernel and the
  reason, and the reference is used from then on (:func:`fallbacks` lists these);
- ``fused``: the same self-check, but a failure raises ``RuntimeError``.

A kernel that raises on a CUDA device may have faulted (illegal address): such an error is sticky,
every later CUDA call in the process fails, the reference included. So after an exception the
self-check probes the device's context (:func:`_context_usable`); if the probe fails too, it
raises ``RuntimeError`` in every mode (restart with ``CGX_DEVICE_KERNELS=reference``).

Implementations are injectable (:func:`use_implementations`), so the selection logic runs in the
CPU test suite with fake kernels on CPU tensors (tests/test_device_kernels.py). The real ones
apply to CUDA tensors; CPU tensors take the reference without any warning, except Triton's
kernels under the interpreter in ``fused`` mode (tests/test_triton_*.py). Configurations a kernel
does not cover (``supports`` is false: another codec, another dtype) take the next
implementation or the reference silently.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from typing import Dict, Iterator, List, Optional, Sequence

import torch

from torch_cgx.device.fused import FusedLevels, FusedMaxMin

__all__ = [
    "FusedLevels",
    "FusedMaxMin",
    "decisions",
    "fallbacks",
    "fused_for",
    "implementations",
    "mode",
    "reset",
    "use_implementations",
]

MODES = ("auto", "fused", "reference")


class _State:
    def __init__(self, impls: Sequence) -> None:
        self.lock = threading.RLock()
        self.impls = list(impls)
        self.mode: Optional[str] = None
        self.unavailable: Dict[int, str] = {}  # id(impl) -> why it cannot load
        self.checked: Dict[tuple, Optional[str]] = {}  # key -> None (passed) or the reason
        self.fallen: Dict[str, str] = {}  # what fell back to the reference -> why


def _defaults() -> list:
    """The Triton kernels (any GPU with triton: no CUDA toolkit); the one fast path."""
    from torch_cgx.device.triton.levels import TritonLevels
    from torch_cgx.device.triton.maxmin import TritonMaxMin
    from torch_cgx.device.triton.sparse import TritonSparse

    return [TritonMaxMin(), TritonLevels(), TritonSparse()]


_state = _State(_defaults())


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
        _state.fallen.clear()


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


def fallbacks() -> Dict[str, str]:
    """Every fallback to the reference so far: a kernel that is unavailable (its name) or a
    configuration that failed its self-check (kernel, codec, dtype, bits, bucket size,
    flags or param1, device type) -> ``"reference: <why>"`` (in ``fused`` mode each of these
    also raised)."""
    with _state.lock:
        return {what: f"reference: {why}" for what, why in _state.fallen.items()}


def _variant(codec) -> int:
    """What else selects a kernel variant: max-min's flags, else the envelope's param1
    (terngrad's clip bits; qsgd's bits)."""
    return codec.flags if hasattr(codec, "flags") else getattr(codec, "param1", 0)


def _describe(impl, codec, dtype) -> str:
    dt = str(dtype).replace("torch.", "")
    what = "flags" if hasattr(codec, "flags") else "param1"
    return (f"{impl.name} for {codec.name} ({dt}, bits={getattr(codec, 'bits', 0)}, "
            f"bucket_size={_bucket(codec)}, {what}={_variant(codec)})")  # fmt: skip


def _bucket(codec) -> int:
    """The bucket size; sparseloco's chunk (its u16 / u32 indices; the self-check's buffer then
    holds full chunks and a tail); 0 for the other sparse codecs."""
    return getattr(codec, "bucket_size", getattr(codec, "chunk", 0))


def _fail(what: str, reason: str, strict: bool) -> None:
    message = f"torch_cgx: fused kernel {what}: {reason}"
    if strict:
        raise RuntimeError(f"{message} (CGX_DEVICE_KERNELS=fused; 'auto' falls back to the "
                           "reference tensor operations)")  # fmt: skip
    warnings.warn(f"{message}; using the reference tensor operations", RuntimeWarning, stacklevel=4)


def _applies(impl, device: torch.device) -> bool:
    """``impl.applies(device)``; a Triton kernel takes CPU tensors (under the interpreter) only in
    ``fused`` mode: that is how the tests, and anyone checking, run the kernels' source on a CPU,
    while ``auto`` keeps CPU tensors on the reference."""
    if not impl.applies(device):
        return False
    triton_impl = type(impl).__module__.startswith("torch_cgx.device.triton.")
    return device.type != "cpu" or not triton_impl or mode() == "fused"


def fused_for(codec, device: torch.device, dtype: torch.dtype):
    """The fused implementation to use for ``codec`` on tensors of ``dtype`` on ``device``, or
    None for the reference (mode ``reference``, no implementation applies, or it failed)."""
    if mode() == "reference":
        return None
    impls = [i for i in _state.impls if _applies(i, device) and i.supports(codec, dtype)]
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
            _state.fallen[impl.name] = why
            _fail(impl.name, why, strict)
            return None
        key = (impl.name, codec.name, device.type, dtype, getattr(codec, "bits", 0),
               _bucket(codec), _variant(codec))  # fmt: skip
        if key not in _state.checked:
            _state.checked[key] = why = _self_check(impl, codec, device, dtype)
            if why is not None:
                what = _describe(impl, codec, dtype)
                _state.fallen[f"{what} on {device.type}"] = f"failed its self-check ({why})"
                _fail(what, f"failed its self-check ({why})", strict)
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


def _compare(got: torch.Tensor, want: torch.Tensor, what: str) -> Optional[str]:
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"encode{what} gave {got.dtype} {tuple(got.shape)}, want {want.numel()} uint8"
    if not torch.equal(got, want):
        first = int((got != want).nonzero()[0])
        return f"encode{what} differs from the reference from byte {first} of {want.numel()}"
    return None


def _context_usable(device) -> bool:
    """Whether ``device``'s CUDA context still runs work, probed after a fused kernel raised: a
    device-side fault (illegal address) is sticky, every later CUDA call in the process fails.
    True off CUDA. (The CPU tests replace it.)"""
    device = torch.device(device)
    if device.type != "cuda":
        return True
    try:
        torch.cuda.synchronize(device)
    except Exception:  # noqa: BLE001 - any failure: the context is gone
        return False
    return True


def _context_lost(what: str, error: Exception, device) -> RuntimeError:
    return RuntimeError(
        f"torch_cgx: fused kernel {what} raised {type(error).__name__}: {error}; since then the "
        f"CUDA context of {device} is unusable (a device-side fault is sticky: every later CUDA "
        "call in this process fails), so the reference tensor operations cannot run in this "
        "process either. Restart with CGX_DEVICE_KERNELS=reference and report this"
    )


_SEED, _STREAM = 0x5EED, 77


def _self_check(impl, codec, device, dtype) -> Optional[str]:
    """None when ``impl`` gives the reference's bytes and values on a small buffer, else why;
    RuntimeError when an exception left the device's CUDA context unusable."""
    x = _check_input(check_size(_bucket(codec)), _bucket(codec), dtype, device)
    try:
        why, payload = _check_encode(impl, codec, x)
        return why or _check_decode(impl, codec, payload, dtype, device)
    except Exception as e:  # noqa: BLE001 - a kernel that raises fails its check
        if not _context_usable(device):
            raise _context_lost(_describe(impl, codec, dtype), e, device) from e
        return f"raised {type(e).__name__}: {e}"


def _check_encode(impl, codec, x: torch.Tensor):
    """(why the kernel's payload differs from the reference's or None, the reference payload on
    the CPU); a codec that flags non-finite input also encodes ``x`` with a NaN. The reference
    runs on a CPU copy: there it has the native bits, while on a GPU its fp64 lane sums go
    through a parallel scan (``cumsum``) that may group the additions otherwise."""
    host = x.cpu()
    want = codec.reference_encode(host, seed=_SEED, stream=_STREAM)
    why = _compare(impl.encode(codec, x, _SEED, _STREAM).cpu(), want, "")
    nan_check = getattr(codec, "flag_mask", 0) & 1 or getattr(codec, "self_check_nan", False)
    if why is None and nan_check:  # the non-finite flag (the sparse codecs: NaN's rank)
        host_nan = host.clone()
        host_nan[x.numel() // 2] = float("nan")
        want_nan = codec.reference_encode(host_nan, seed=_SEED, stream=_STREAM)
        got_nan = impl.encode(codec, host_nan.to(x.device), _SEED, _STREAM).cpu()
        why = _compare(got_nan, want_nan, " (with a NaN)")
    return why, want


def _check_decode(impl, codec, payload: torch.Tensor, dtype, device) -> Optional[str]:
    """Why the kernel's decode_add of ``payload`` (on the CPU, encoded from ``dtype``) differs
    from the reference's on the CPU, or None: into an ``out`` of ``dtype`` and, for fp16 /
    bf16, into a float32 ``out`` too (the engine accumulates 16-bit payloads in fp32)."""
    n = check_size(_bucket(codec))
    on_device = payload.to(device)
    for out_dtype in dict.fromkeys((dtype, torch.float32)):
        ref = torch.randn(n, generator=torch.Generator().manual_seed(7)).to(out_dtype)
        fused = ref.clone().to(device)
        if out_dtype == dtype:  # the protocol's dtype is optional: given where it differs
            codec.reference_decode_add_(ref, payload)
            impl.decode_add_(codec, fused, on_device)
        else:
            codec.reference_decode_add_(ref, payload, dtype=dtype)
            impl.decode_add_(codec, fused, on_device, dtype=dtype)
        if not _same_values(fused.cpu(), ref):
            into = "" if out_dtype == dtype else " into float32"
            return f"decode_add{into} differs from the reference"
    return None
