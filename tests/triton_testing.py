"""Helpers the Triton kernel tests share (test_triton_maxmin*.py, test_triton_levels*.py,
test_triton_sparse*.py): the interpreter's preamble and the PTX tests' compile subprocess."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
from typing import Callable, Tuple

import pytest
import torch

import torch_cgx.device.triton as cgx_triton


def interpreted_kernels(*names: str) -> Tuple:
    """A Triton test module's preamble: imports the kernel modules ``names`` of
    torch_cgx.device.triton under Triton's interpreter where ``TRITON_INTERPRET`` is unset
    (triton decorates its helpers and kernels when first imported: nothing in the process may
    import it before), so that they run on CPU tensors, and on CUDA tensors compiled where
    ``TRITON_INTERPRET=0``. Returns (the modules..., the device, the module's autouse fixture
    that sets ``TRITON_INTERPRET=1`` during its tests only: other modules keep their
    environment, where CPU tensors take the reference). Skips the calling module where triton
    is missing, the kernels cannot run, or triton was imported without the interpreter first."""
    set_here = "TRITON_INTERPRET" not in os.environ
    os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        found = [importlib.import_module(f"torch_cgx.device.triton.{n}") for n in names]
    except ImportError:
        found = None
    device = torch.device("cpu" if cgx_triton.interpreted() else "cuda")
    runs = cgx_triton.available(device) and (device.type == "cpu" or torch.cuda.is_available())
    late = found is not None and device.type == "cpu" and not _interpreter_decorated()
    if set_here:
        del os.environ["TRITON_INTERPRET"]
    if found is None:
        pytest.skip("triton is not installed (pip install triton==3.6.0)", allow_module_level=True)
    if not runs:
        pytest.skip(f"Triton kernels cannot run on {device} here (TRITON_INTERPRET=1 runs them on "
                    "CPU tensors)", allow_module_level=True)  # fmt: skip
    if late:
        pytest.skip("triton was imported without TRITON_INTERPRET=1 before this module (run this "
                    "module first, or alone)", allow_module_level=True)  # fmt: skip
    if device.type == "cpu":
        skip_overflow_shadow()
    return (*found, device, _interpreter_fixture(set_here))


def _interpreter_decorated() -> bool:
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(tl.sum, InterpretedFunction)


def _interpreter_fixture(set_here: bool) -> Callable:
    @pytest.fixture(autouse=True, scope="module")
    def _interpreter():
        """TRITON_INTERPRET=1 for this module's tests only, where this module set it."""
        if set_here:
            os.environ["TRITON_INTERPRET"] = "1"
        yield
        if set_here:
            os.environ.pop("TRITON_INTERPRET", None)

    return _interpreter


def skip_overflow_shadow() -> None:
    """Triton's interpreter (3.6) computes every 8- to 32-bit integer add, sub and mul a second
    time in int64 to check it for overflow (``sanitize_overflow``), but reports an overflow only
    with its ``debug`` option, which is off (and must stay off: the generator's uint32 products
    wrap by design). The shadow changes nothing and costs the int32 kernel variants about a
    quarter of their interpreted time: turned off for the process."""
    from triton.runtime import interpreter

    opts = interpreter.interpreter_builder.options
    if getattr(opts, "sanitize_overflow", False) and not opts.debug:
        interpreter.interpreter_builder.options = dataclasses.replace(opts, sanitize_overflow=False)


def wide_indices(monkeypatch) -> None:
    """The kernels' int64 index variant from now on in the test (otherwise only where an index
    may reach 2^31: the int32 one runs on the tests' sizes)."""
    monkeypatch.setattr(cgx_triton, "INDEX32_LIMIT", 0)


def poison_empty(monkeypatch) -> None:
    """torch.empty's uint8 tensors (the payloads) filled with 0xA5 from now on in the test: a
    byte a kernel leaves unwritten shows."""
    empty = torch.empty

    def poisoned(*args, **kwargs):
        t = empty(*args, **kwargs)
        return t.fill_(0xA5) if t.dtype == torch.uint8 else t

    monkeypatch.setattr(torch, "empty", poisoned)


def require_triton_backend(backend: str = "nvidia") -> None:
    """A compile test module's preamble: skips it where triton or its ``backend`` ("nvidia":
    the bundled ptxas; "amd": the bundled AMDGPU linker) is missing, without importing triton
    (a process decorates triton's helpers for the interpreter or the compiler at its first
    import)."""
    spec = importlib.util.find_spec("triton")
    if spec is None:
        pytest.skip("triton is not installed (pip install triton==3.6.0)", allow_module_level=True)
    if not (pathlib.Path(spec.origin).parent / "backends" / backend / "compiler.py").is_file():
        pytest.skip(f"triton has no {backend} backend here", allow_module_level=True)


def compiled(cache_dir, script: str, *args: str) -> dict:
    """The JSON a compile script prints, run in a subprocess without TRITON_INTERPRET, compiling
    into ``cache_dir`` (whatever ~/.triton holds)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    env["TRITON_CACHE_DIR"] = str(cache_dir)
    run = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


def contractions(code: str) -> list:
    """The fused multiply-adds of PTX ``code`` other than the generator's ``fma.rn.f32 d, r,
    0f33800000, t`` (rng.py: r a 24-bit integer, times 2^-24 exactly, so the fma rounds once,
    as the native t + u): any other is a contraction that rounds differently from the native
    codec (``enable_fp_fusion=False`` must reach the code)."""
    exact = re.compile(r"fma\.rn\.f32\s+%\w+, %\w+, 0f33800000, %\w+;")
    return [f for f in re.findall(r"\bfma\.[^;]*;", code) if not exact.fullmatch(f)]
