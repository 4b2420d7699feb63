"""Never compress silently nothing: when torch_cgx settings ask for compression but nothing of
torch_cgx does the work, the user is told once, in a warning naming the setting and the backend.

Three situations, each warned about once per process (:class:`NothingCompressedWarning`):

- **the settings ask, the group is not cgx**: ``CGX_COMPRESSION_QUANTIZATION_BITS`` < 32 or
  ``CGX_COMPRESSOR`` set to a compressor (or ``auto``), but the groups doing the work are Gloo
  or NCCL (accelerate or Trainer created them: ``TrainingArguments(ddp_backend=...)`` cannot
  name cgx). Checked by :func:`check_group` (``init_cgx``, the Trainer callback at
  ``on_train_begin``) and at exit (:func:`watch_env`, armed by ``import torch_cgx`` only when
  such a variable is set): at exit, when the process still has a default group, no group of
  it is cgx and no counted hook ran (torch_cgx.hook_stats).
- **a hook state whose hook never ran**: a state made and handed to the callback, but after N
  optimizer steps its hook saw no gradient bucket (registered on another model, or swallowed:
  accelerate's ``DistributedDataParallelKwargs(comm_hook=...)`` takes only torch's own hooks).
- **a compressing cgx group that compressed nothing**: the group's settings compress, no hook
  is registered, and after N steps not one allreduce was compressed (every tensor under
  ``min_size``, or not a float type).

Nothing here runs a collective, and nothing warns on the normal paths (a cgx group whose
settings compress, a hook that runs): tests/test_integrations.py checks both ways.

:class:`SlowPathWarning` is the other kind, through the same :func:`warn_once`: a configuration
that works but is known to be slow where it runs (a lane-summed bucket of over 2^20 values on a
GPU: torch_cgx/device/codecs/fused.py), once per configuration, naming the setting to change.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import warnings
from typing import List, Mapping, Optional

__all__ = ["NothingCompressedWarning", "SlowPathWarning", "check_group", "requested", "warn_once",
           "watch_env"]  # fmt: skip

_BITS_VAR, _COMPRESSOR_VAR = "CGX_COMPRESSION_QUANTIZATION_BITS", "CGX_COMPRESSOR"
_HOW = (
    "create the group with torch_cgx.integrations.init_cgx() (or "
    "dist.init_process_group('cgx')) before TrainingArguments / Accelerator, and leave "
    "ddp_backend unset"
)


class NothingCompressedWarning(UserWarning):
    """torch_cgx settings ask for compression, but nothing is compressed (see the module)."""


class SlowPathWarning(UserWarning):
    """A configuration that works but takes a path known to be slow on this device (once per
    process and configuration; the message says what to change)."""


_lock = threading.Lock()
_warned: set = set()
_armed = False


def warn_once(key, message: str, stacklevel: int = 3,
              category: type = NothingCompressedWarning) -> bool:  # fmt: skip
    """Warns ``message`` (a ``category``) unless ``key`` was warned about before in this process;
    True if it warned."""
    with _lock:
        if key in _warned:
            return False
        _warned.add(key)
    warnings.warn(f"torch_cgx: {message}", category, stacklevel=stacklevel)
    return True


def requested(env: Optional[Mapping[str, str]] = None) -> List[str]:
    """The ``CGX_*`` variables of ``env`` (default: the process's) that ask for compression, as
    ``NAME=value``: bits below 32, or a compressor other than max-min (max-min compresses only
    with bits below 32). A malformed value is not reported here (the group's creation refuses
    it, naming the variable)."""
    env = os.environ if env is None else env
    out = []
    bits = (env.get(_BITS_VAR) or "").strip()
    try:
        if bits and int(bits) < 32:
            out.append(f"{_BITS_VAR}={bits}")
    except ValueError:
        pass
    compressor = (env.get(_COMPRESSOR_VAR) or "").strip()
    if compressor and compressor.lower() != "maxmin":
        out.append(f"{_COMPRESSOR_VAR}={compressor}")
    return out


def _backend_name(group) -> str:
    import torch.distributed as dist

    try:
        return str(dist.get_backend(group))
    except (RuntimeError, ValueError):
        return "unknown"


def check_group(group=None, where: str = "", env: Optional[Mapping[str, str]] = None) -> bool:
    """Warns once when the ``CGX_*`` variables ask for compression and ``group`` (None: the
    default group) is not a cgx group; ``where`` names the caller in the message. True if the
    settings ask and the group will not compress them. Not collective; silent when
    torch.distributed is not initialized."""
    import torch.distributed as dist

    from torch_cgx.backend import is_cgx_group

    asked = requested(env)
    if not asked or not dist.is_available() or not dist.is_initialized():
        return False
    if is_cgx_group(group):
        return False
    backend = _backend_name(group)
    where = f" ({where})" if where else ""
    warn_once(
        ("group", backend, tuple(asked)),
        f"{', '.join(asked)} asks for compression, but the process group doing the work uses "
        f"backend {backend!r}{where}: nothing is compressed; {_HOW}.",
        stacklevel=4,
    )
    return True


def _any_cgx_group() -> bool:
    import torch.distributed as dist

    from torch_cgx.backend import is_cgx_group

    groups = list(getattr(dist.distributed_c10d._world, "pg_map", {}) or [])
    return any(is_cgx_group(pg) for pg in groups)


def _at_exit() -> None:
    """The exit check (see :func:`watch_env`); never raises."""
    try:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized() or _any_cgx_group():
            return
        counted = sys.modules.get("torch_cgx.hook_stats")
        if counted is not None and counted.any_ran():  # a hook compressed (PowerSGD on Gloo)
            return
        check_group(None, "seen at exit: the process had no cgx group")
    except Exception:  # noqa: BLE001 - a check at exit must not turn a run into a failure
        pass


def watch_env() -> None:
    """Arms the exit check when the ``CGX_*`` variables ask for compression (nothing
    otherwise): at exit, a process whose default group is still alive and none of whose groups
    is cgx gets the warning. Called by ``import torch_cgx``; idempotent."""
    global _armed
    if _armed or not requested():
        return
    _armed = True
    atexit.register(_at_exit)
