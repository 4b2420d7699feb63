"""torch_cgx: communication-efficient distributed training for PyTorch.

``import torch_cgx`` loads the native core. See README.md for the backend, hooks and benchmarks.
"""

from torch_cgx import codec  # noqa: F401

__version__ = "0.1.0"
