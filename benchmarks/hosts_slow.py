"""A slow GPU on an emulated host: its compute stretched by a factor.

A host's processes get ``CGX_HOST_SLOWDOWN=<factor>`` (``rank_env(..., slowdown=)``, or set by
the benchmark that starts them); a training loop wraps its compute (forward, backward, the
local optimizer step) in :func:`slowed`, which sleeps ``(factor - 1)`` times the block's own
time after it: the host computes ``factor`` times slower while its network runs at full speed
(a slower accelerator, not a slower machine). Checked by tests/test_hosts.py (the wall time of
a CPU-bound block within 10 % of ``factor`` times its time alone).
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Iterator, Optional

__all__ = ["ENV", "slowdown", "slowed"]

ENV = "CGX_HOST_SLOWDOWN"


def slowdown() -> float:
    """This host's factor (1: full speed); ValueError for a bad ``CGX_HOST_SLOWDOWN``."""
    text = os.environ.get(ENV, "1")
    try:
        factor = float(text)
    except ValueError:
        factor = 0.0
    if not factor >= 1.0:
        raise ValueError(f"{ENV} must be a number >= 1, got {text!r}")
    return factor


@contextlib.contextmanager
def slowed(factor: Optional[float] = None) -> Iterator[None]:
    """Runs the block, then sleeps ``(factor - 1)`` times its duration."""
    factor = slowdown() if factor is None else factor
    start = time.perf_counter()
    yield
    if factor > 1.0:
        time.sleep((time.perf_counter() - start) * (factor - 1.0))
