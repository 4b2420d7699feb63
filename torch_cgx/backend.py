"""Registers the ``cgx`` torch.distributed backend and gives typed access to its settings.

``import torch_cgx`` is all a script needs: ``dist.init_process_group("cgx", ...)`` then creates a
:class:`torch_cgx._C.ProcessGroupCGX` whose inner transport is Gloo, built from the same store.
``new_group(..., backend="cgx")`` works the same way.

Store keys. Every instance of a group gets its own key space ``cgx/<generation>/`` (``inner/`` and
``wire/`` for the two Gloo rendezvous, ``config/<version>/`` for settings agreements), the
generation counted in the store itself. So a group destroyed and created again under the same
name and store (test suites with setUp / tearDown) never reads the previous instance's
addresses or settings. The C++ object holds all per-group state, the store included: nothing
outlives the group.

Store traffic ends together. Under env:// and tcp:// rank 0 hosts the TCPStore, and its server
goes when rank 0 destroys the group; a rank still reading the store then fails ("Failed to recv,
got 0 bytes"). So every exchange ends with :func:`_release`, which every rank passes and rank 0
leaves last (it waits for the others' reports, then deletes the keys), creation ends with one,
and destruction touches no store (docs/reliability.md) - but for one announcement.

Leaving in step. When the default group is destroyed, the other ranks return from
``destroy_process_group`` only once rank 0 has left and its store server has gone (bounded:
:func:`_watch_store_host`), so that a group created next on the same port cannot meet the old
server (torch's race across re-creations, which Gloo loses too: docs/reliability.md, section 7).
"""

from __future__ import annotations

import atexit
import datetime
import os
import socket
from typing import Optional

import torch
import torch.distributed as dist

from torch_cgx import _C
from torch_cgx.config import CREATION_ONLY, CGXConfig, Options
from torch_cgx.topology import attach_hierarchy

__all__ = ["get_config", "set_config", "cgx_backend", "is_cgx_group"]


def _release(store, rank: int, size: int, key: str, keys=()) -> None:
    """Ends an exchange through the store so that no rank touches the store after the rank that
    hosts it may have gone: every rank reports that it is done; rank 0 (the TCPStore's host under
    env:// and tcp://) waits for all reports, then deletes ``keys`` and the report keys. The
    other ranks' last store operation thus comes before rank 0 can leave."""
    if store.add(f"{key}/done", 1) == size:
        store.set(f"{key}/all", "1")
    if rank != 0:
        return
    store.wait([f"{key}/all"])
    for k in [*keys, f"{key}/done", f"{key}/all"]:
        try:
            store.delete_key(k)
        except (RuntimeError, NotImplementedError):
            break  # a store without deletion (FileStore on some versions): keys are unique


def _agree(store, rank: int, size: int, key: str, config: CGXConfig) -> None:
    """Every rank publishes its settings and checks all others': a mismatch raises everywhere.
    Agreed, the exchange ends with :func:`_release` (rank 0 deletes the keys last); on a
    mismatch, which every rank sees alike, the keys stay (a rank that refused its own settings
    in ``set_config`` never reports) and every rank raises."""
    mine = config.describe()
    store.set(f"{key}/{rank}", mine)
    theirs = [store.get(f"{key}/{other}").decode() for other in range(size)]
    if all(text == theirs[0] for text in theirs):
        _release(store, rank, size, key, [f"{key}/{r}" for r in range(size)])
    for other, text in enumerate(theirs):
        if text != mine:
            raise ValueError(
                f"cgx settings differ between ranks: rank {rank} has {mine}, rank {other} has "
                f"{text}; set the same CGX_* variables (or set_config arguments) on every rank"
            )


def _generation(store, size: int) -> int:
    """0, 1, 2, ... for successive instances of a group under this store. Every rank adds 1; an
    instance's adds all happen before any rank gets past its Gloo rendezvous, which waits for
    every rank, so the next instance's adds come after them (and no rank can be done with the
    group before this add)."""
    return (store.add("cgx/instances", 1) - 1) // size


# A rank 0 that does not destroy the default group holds the others' destroy_process_group this
# long at most (never longer than the group's timeout); a store server that outlives the group (a
# TCPStore the script keeps) holds them this long at most after rank 0 has left.
HOST_WAIT = datetime.timedelta(seconds=5)
HOST_GRACE = datetime.timedelta(seconds=1)


def _ms(t: datetime.timedelta) -> int:
    return int(t.total_seconds() * 1000)


def _watch_store_host(backend, store, rank: int, timeout: datetime.timedelta) -> None:
    """Arms the default group's departure in step with rank 0 (csrc/torch/host_departure.h) when
    rank 0 may host ``store``'s server and take it down with the group: a TCPStore (env://,
    tcp://, or one the script passed) that is not torchrun's agent store (which outlives every
    group). The other ranks open the watch now, while the server is certainly this group's (rank 0
    is still in creation, waiting for their reports)."""
    root = store
    while isinstance(root, dist.PrefixStore):
        root = root.underlying_store
    if not isinstance(root, dist.TCPStore):
        return
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
        return
    fd = -1
    if rank != 0:
        try:
            wait = min(timeout, HOST_WAIT).total_seconds()
            fd = socket.create_connection((root.host, root.port), timeout=wait).detach()
        except OSError:
            fd = -1  # no watch: only rank 0's announcement is waited for
    backend.watch_store_host(fd, _ms(min(timeout, HOST_WAIT)), _ms(min(timeout, HOST_GRACE)))


def _create(opts, pg_options=None):
    """c10d's creator (``extended_api``): ``opts`` holds the store, rank, size and timeout;
    ``pg_options`` is what the script passed to ``init_process_group`` / ``new_group``: None
    (the ``CGX_*`` variables alone) or :class:`torch_cgx.Options`."""
    store, rank, size, timeout = opts.store, opts.group_rank, opts.group_size, opts.timeout
    if pg_options is None:
        config = CGXConfig.from_env()
    elif isinstance(pg_options, Options):
        config = pg_options.config()
    else:
        raise TypeError(
            f"pg_options of a cgx group must be torch_cgx.Options, got {type(pg_options).__name__}"
        )
    group_store = dist.PrefixStore(f"cgx/{_generation(store, size)}/", store)
    inner = dist.ProcessGroupGloo(dist.PrefixStore("inner/", group_store), rank, size, timeout)
    wire = dist.ProcessGroupGloo(dist.PrefixStore("wire/", group_store), rank, size, timeout)
    _agree(group_store, rank, size, "config/0", config)
    native = config.to_native()
    backend = _C.ProcessGroupCGX(rank, size, inner, wire, native, group_store, timeout)
    attach_hierarchy(backend, config, group_store, rank, size, timeout)
    if config.data_plane != "host":  # CUDA tensors; CPU ones too, or for Python compressors
        from torch_cgx.device import plane

        plane.install(backend, config, group_store, rank, size, timeout)
    if config.compressor == "auto":
        from torch_cgx.plan import auto

        auto.install(backend, config, "plan/0")
    if not dist.is_initialized() and size > 1:  # the default group, being created
        _watch_store_host(backend, store, rank, timeout)
    # The node layout and the plan end with reads that rank 0 does not wait for: creation's
    # last store operation is one every rank passes, rank 0 last.
    _release(group_store, rank, size, "created")
    return backend


def _register() -> None:
    if "CGX" not in dist.Backend._plugins:
        dist.Backend.register_backend("cgx", _create, extended_api=True, devices=["cpu", "cuda"])
        # Groups still alive at exit (DDP models keep them) stop their threads while Python can
        # still serve them, not during finalization.
        atexit.register(_C.ProcessGroupCGX.shutdown_all)


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
    return CGXConfig.from_native(cgx_backend(group).config())


def set_config(group: Optional[dist.ProcessGroup] = None, **changes) -> CGXConfig:
    """Changes ``group``'s settings, e.g. ``set_config(bits=4, bucket_size=1024)``.

    Collective: every rank of the group must call it with the same values (checked; a mismatch
    raises ValueError on every rank and leaves the settings unchanged). Operations already issued
    keep the settings they were issued with. Returns the new settings.
    """
    backend = cgx_backend(group)
    key = f"config/{backend.next_config_version()}"
    try:
        fixed = sorted(set(changes) & set(CREATION_ONLY))
        if fixed:
            raise ValueError(f"{fixed} are fixed when the group is created (CGX_* variables)")
        new = get_config(group).replace(**changes)
        new.check_effective()
    except (TypeError, ValueError) as e:
        # Tell the other ranks, which would otherwise wait for this rank's settings.
        backend.store().set(f"{key}/{backend.rank()}", f"invalid settings ({e})")
        raise
    _agree(backend.store(), backend.rank(), backend.size(), key, new)
    backend.set_config(new.to_native())
    if new.compressor == "auto":  # planned again: the budget may have changed
        from torch_cgx.plan import auto

        auto.install(backend, new, f"plan/{key}")
        _release(backend.store(), backend.rank(), backend.size(), f"plan/{key}/installed")
    else:
        backend.set_plan([])
    return new
