"""torch_cgx: communication-efficient distributed training for PyTorch.

``import torch_cgx`` registers the ``cgx`` torch.distributed backend (compressed allreduce) and
maps MPI / PMI launcher variables to torch's, so CGX scripts run unchanged under torchrun or
mpirun. See README.md.
"""

from torch_cgx import codec  # noqa: F401  (loads the native core)
from torch_cgx.backend import cgx_backend, get_config, is_cgx_group, set_config
from torch_cgx.config import CGXConfig
from torch_cgx.hooks import CGXState, cgx_hook
from torch_cgx.launch import apply_launcher_env

__version__ = "0.1.0"

__all__ = [
    "CGXConfig",
    "CGXState",
    "cgx_backend",
    "cgx_hook",
    "get_config",
    "is_cgx_group",
    "set_config",
]

apply_launcher_env()
backend._register()  # noqa: F821  (the submodule, bound by the import above)
