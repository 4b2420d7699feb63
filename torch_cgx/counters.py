"""What compression saved on a cgx group: ``torch_cgx.stats(group)`` (this module: its counters).

    print(torch_cgx.stats())        # cgx stats: 7.75x fewer bytes (12.3 MB sent, 95.4 MB ...)
    torch_cgx.stats().as_dict()     # the counters, for a logger
    torch_cgx.reset_stats()         # from zero again (e.g. after warm-up)

The counters are this rank's, kept by the group's worker since the group was created or last
reset (csrc/torch/engine_stats.h):

- ``bytes_sent``: the bytes this rank handed to the transport in the group's allreduces and
  compressed reduce-scatters (exact ones included);
- ``bytes_exact``: what exact fp32 calls would have sent: ``2 (W - 1) / W * 4 n`` for an
  allreduce of n values (a ring), ``(W - 1) / W * 4 n`` for a reduce-scatter of n values;
- ``calls_compressed`` / ``calls_exact``: allreduces run compressed or exactly;
  ``reduce_scatter_compressed`` / ``reduce_scatter_exact`` the same for reduce-scatters;
- ``wire_seconds``: time inside transport calls; ``compute_seconds``: the rest of the compressed
  calls' time on the worker (encode, decode, sums, rotation, copies). With the pipeline the
  compute of one segment overlaps the wire of another: ``compute_seconds`` is the compute the
  pipeline did not hide, and the two add up to the calls' wall time.

Collectives forwarded to Gloo unchanged (broadcast, all_gather, ...) are not counted.
``plan`` says what the group's allreduce does now (its settings, or its planned rules).

``torch_cgx.stats(state)`` with a DDP hook state (registered through
``torch_cgx.hook_stats.counted``, as the Trainer callback and ``CGXStrategy`` do) gives the
hook's own counters: :class:`torch_cgx.hook_stats.HookStats`.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch.distributed as dist

from torch_cgx.backend import cgx_backend
from torch_cgx.byte_counts import ByteCounts

__all__ = ["Stats", "plan", "stats", "reset_stats"]


@dataclasses.dataclass(frozen=True)
class Stats(ByteCounts):
    """One rank's counters of one cgx group (see the module docstring)."""

    bytes_sent: int
    bytes_exact: int
    calls_compressed: int
    calls_exact: int
    reduce_scatter_compressed: int
    reduce_scatter_exact: int
    compute_seconds: float
    wire_seconds: float
    plan: str = ""

    def __str__(self) -> str:
        return (
            f"cgx stats: {self.ratio:.2f}x fewer bytes ({_mb(self.bytes_sent)} sent, "
            f"{_mb(self.bytes_exact)} exact), {self.calls_compressed} compressed / "
            f"{self.calls_exact} exact allreduces, {self.reduce_scatter_compressed} compressed / "
            f"{self.reduce_scatter_exact} exact reduce-scatters, compute "
            f"{self.compute_seconds:.3f} s, wire {self.wire_seconds:.3f} s"
            + (f", plan: {self.plan}" if self.plan else "")
        )


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def plan(group: Optional[dist.ProcessGroup] = None) -> str:
    """What the cgx ``group``'s allreduce does now, in a few words: its planned rules
    (``CGX_COMPRESSOR=auto``) or its settings."""
    backend = cgx_backend(group)
    if backend.plan():
        from torch_cgx.plan import auto

        return "planned: " + auto.describe(auto.rules_of(backend))
    from torch_cgx.backend import get_config

    c = get_config(group)
    if c.compressor == "maxmin":
        if c.bits >= 32:
            return "exact"
        return f"maxmin {c.bits} bits, bucket {c.bucket_size}, {c.algorithm}"
    return f"{c.compressor}({c.compressor_params}), {c.algorithm}"


def stats(group=None):
    """This rank's counters of the cgx ``group`` (default: the world); ValueError when the group
    is not a cgx group. Given a hook state instead of a group: that state's counters
    (:func:`torch_cgx.hook_stats.hook_stats`). Not collective."""
    if group is not None and not isinstance(group, dist.ProcessGroup):
        from torch_cgx.hook_stats import hook_stats

        return hook_stats(group)
    d = _with_device_plane(cgx_backend(group))
    return Stats(
        bytes_sent=d["bytes_sent"],
        bytes_exact=d["bytes_exact"],
        calls_compressed=d["calls_compressed"],
        calls_exact=d["calls_exact"],
        reduce_scatter_compressed=d["reduce_scatter_compressed"],
        reduce_scatter_exact=d["reduce_scatter_exact"],
        compute_seconds=d["compute_seconds"],
        wire_seconds=d["wire_seconds"],
        plan=plan(group),
    )


def reset_stats(group=None) -> None:
    """Sets this rank's counters of the cgx ``group`` (or of a hook state) to zero. Not
    collective."""
    if group is not None and not isinstance(group, dist.ProcessGroup):
        from torch_cgx import hook_stats

        return hook_stats.reset(group)
    backend = cgx_backend(group)
    backend.reset_stats()
    if backend.device_plane_token():
        from torch_cgx.device.plane import plane_of

        plane_of(backend).reset_stats()


def _with_device_plane(backend) -> dict:
    """The native engine's counters plus the device plane's (docs/gpu.md), if the group has one:
    the two serve different tensors of one group."""
    d = dict(backend.stats())
    if backend.device_plane_token():
        from torch_cgx.device.plane import plane_of

        for k, v in plane_of(backend).stats().items():
            d[k] = d.get(k, 0) + v
    return d
