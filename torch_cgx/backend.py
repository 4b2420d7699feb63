"""Registers the ``cgx`` torch.distributed backend and gives typed access to its settings.

``import torch_cgx`` is all a script needs: ``dist.init_process_group("cgx", ...)`` then creates a
:class:`torch_cgx._C.ProcessGroupCGX` whose inner transport is Gloo, built from the same store
under its own prefixes (``cgx/inner/`` for forwarded collectives, ``cgx/wire/`` for compressed
traffic). ``new_group(..., backend="cgx")`` works the same way.
"""

from __future__ import annotations

import datetime
from typing import Optional

import torch
import torch.distributed as dist

from torch_cgx import _C
from torch_cgx.config import CGXConfig

__all__ = ["get_config", "set_config", "cgx_backend", "is_cgx_group"]


class _GroupState:
    """Python-side state of one cgx backend. Python wrappers of the C++ object are recreated on
    each access, so the state lives here, keyed by the object's address (re-keyed on creation)."""

    __slots__ = ("store", "config", "version")

    def __init__(self, store, config: CGXConfig) -> None:
        self.store, self.config, self.version = store, config, 0


_STATES: dict = {}


def _state(backend) -> _GroupState:
    return _STATES[backend.uid()]


def _agree(store, rank: int, size: int, key: str, config: CGXConfig) -> None:
    """Every rank publishes its settings and checks all others': a mismatch raises everywhere."""
    mine = config.describe()
    store.set(f"{key}/{rank}", mine)
    for other in range(size):
        theirs = store.get(f"{key}/{other}").decode()
        if theirs != mine:
            raise ValueError(
                f"cgx settings differ between ranks: rank {rank} has {mine}, rank {other} has "
                f"{theirs}; set the same CGX_* variables (or set_config arguments) on every rank"
            )


def _create(store, rank: int, size: int, timeout: datetime.timedelta):
    config = CGXConfig.from_env()
    inner = dist.ProcessGroupGloo(dist.PrefixStore("cgx/inner/", store), rank, size, timeout)
    wire = dist.ProcessGroupGloo(dist.PrefixStore("cgx/wire/", store), rank, size, timeout)
    _agree(store, rank, size, "cgx/config/0", config)
    pg = _C.ProcessGroupCGX(rank, size, inner, wire, config.to_native())
    _STATES[pg.uid()] = _GroupState(store, config)
    return pg


def _register() -> None:
    if "CGX" not in dist.Backend._plugins:
        dist.Backend.register_backend("cgx", _create, devices=["cpu", "cuda"])


def cgx_backend(group: Optional[dist.ProcessGroup] = None) -> _C.ProcessGroupCGX:
    """The cgx backend object behind ``group`` (default: the world); ValueError if it is not cgx."""
    if not dist.is_initialized():
        raise ValueError("torch.distributed is not initialized: call init_process_group('cgx')")
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    try:
        backend = pg._get_backend(torch.device("cpu"))
    except RuntimeError:
        backend = None
    if not isinstance(backend, _C.ProcessGroupCGX):
        raise ValueError(
            f"process group uses backend {dist.get_backend(pg)!r}, not 'cgx': create it with "
            "init_process_group('cgx') or new_group(..., backend='cgx')"
        )
    return backend


def is_cgx_group(group: Optional[dist.ProcessGroup] = None) -> bool:
    try:
        cgx_backend(group)
        return True
    except ValueError:
        return False


def get_config(group: Optional[dist.ProcessGroup] = None) -> CGXConfig:
    """The settings ``group``'s allreduce uses now."""
    return _state(cgx_backend(group)).config


def set_config(group: Optional[dist.ProcessGroup] = None, **changes) -> CGXConfig:
    """Changes ``group``'s settings, e.g. ``set_config(bits=4, bucket_size=1024)``.

    Collective: every rank of the group must call it with the same values (checked; a mismatch
    raises ValueError on every rank). Operations already issued keep the settings they were
    issued with. Returns the new settings.
    """
    backend = cgx_backend(group)
    state = _state(backend)
    new = state.config.replace(**changes)
    state.version += 1
    _agree(state.store, backend.rank(), backend.size(), f"cgx/config/{state.version}", new)
    backend.set_config(new.to_native())
    state.config = new
    return new
