"""Helpers the Triton kernel tests share (test_triton_maxmin.py, test_triton_levels.py)."""

from __future__ import annotations

import dataclasses

import torch

import torch_cgx.device.triton as cgx_triton


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
