"""torch_cgx: communication-efficient distributed training for PyTorch.

``import torch_cgx`` registers the ``cgx`` torch.distributed backend (compressed allreduce) and
maps MPI / PMI launcher variables to torch's, so CGX scripts run unchanged under torchrun or
mpirun. See README.md.
"""

from torch_cgx import (
    _native,  # noqa: F401  (first: checks the extension against torch)
    codec,  # noqa: F401
    compressors,  # noqa: F401
)
from torch_cgx import backend as _backend
from torch_cgx import settings as _settings
from torch_cgx import warn as _warn
from torch_cgx.backend import cgx_backend, get_config, is_cgx_group, set_config
from torch_cgx.config import CGXConfig, Options
from torch_cgx.counters import Stats, reset_stats, stats
from torch_cgx.hooks import CGXState, CompressionState, cgx_hook, compression_hook
from torch_cgx.launch import apply_launcher_env
from torch_cgx.version import __version__

__all__ = [
    "CGXConfig",
    "CGXState",
    "CompressionState",
    "Options",
    "Stats",
    "__version__",
    "cgx_backend",
    "cgx_hook",
    "compression_hook",
    "get_config",
    "is_cgx_group",
    "reset_stats",
    "set_config",
    "stats",
]

apply_launcher_env()
_process = _settings.process_settings()
codec.set_num_threads(_process.codec_threads)
if not _process.avx2:
    _native._C.set_isa(False)
_backend._register()
_warn.watch_env()  # an exit check, only when CGX_* variables ask for compression
