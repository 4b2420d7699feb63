"""CGX-compatible import path: ``from cgx_utils import cgx_hook, CGXState``."""

import torch_cgx  # noqa: F401  (registers the backend)
from torch_cgx.hooks import CGXState, cgx_hook

__all__ = ["CGXState", "cgx_hook"]
