"""Loads the native extension, checking that it was built against the running torch.

c10d has no stable C++ ABI: an extension built against another torch version fails with
undefined symbols, or worse, loads and misbehaves. Both cases raise ImportError here, naming the
two versions and the command that rebuilds.
"""

from __future__ import annotations

import torch

_REBUILD = (
    "rebuild it against the installed torch: `make build` in a checkout, or "
    "`pip install --no-build-isolation --force-reinstall --no-deps <torch_cgx source>`"
)


def check_torch_version(built: str, running: str) -> None:
    """Raises ImportError when the extension's torch (``built``) is not ``running``'s version
    (local labels such as ``+cpu`` ignored)."""
    base = running.split("+")[0]
    if built != base:
        raise ImportError(
            f"torch_cgx's native extension was built against torch {built}, but torch {running} "
            f"is installed; {_REBUILD}"
        )


try:
    from torch_cgx import _C
except ImportError as e:
    raise ImportError(
        f"torch_cgx's native extension does not load with torch {torch.__version__} ({e}); "
        f"it may be missing or built against another torch: {_REBUILD}"
    ) from e

check_torch_version(_C.built_with_torch, torch.__version__)
