"""Per hook state stats: ``torch_cgx.stats(state)`` for a state registered through
:func:`counted` (the Trainer callback and ``CGXStrategy`` do it).

    ddp.register_comm_hook(state, torch_cgx.hook_stats.counted(torch_cgx.cgx_hook))
    print(torch_cgx.stats(state))   # cgx hook stats (CGXState): 7.50x fewer bytes ...

The counters live beside the state, in a map keyed by the state object (weakly where the state
allows weak references; the hook states of torch_cgx.hooks have ``__slots__`` without
``__weakref__``, so for them by ``id`` and type: the state objects are untouched). Per DDP step the
hook's window runs from its first gradient bucket to the completion of the last one's future;
the byte, call and time counters are the deltas of the group's own counters
(``torch_cgx.stats(group)``) over that window. During backward nothing else runs on the group,
so they are the hook's; on a group that is not cgx (PowerSGD on Gloo) only the steps and
buckets are counted.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import weakref
from typing import Callable, Dict, Optional, Tuple

import torch

from torch_cgx.byte_counts import ByteCounts

__all__ = ["HookStats", "counted", "hook_stats", "describe_state"]

_COUNTERS = ("bytes_sent", "bytes_exact", "calls_compressed", "calls_exact")
_SECONDS = ("compute_seconds", "wire_seconds")


@dataclasses.dataclass(frozen=True)
class HookStats(ByteCounts):
    """One rank's counters of one hook state (see the module docstring)."""

    hook: str
    plan: str
    steps: int
    buckets: int
    bytes_sent: int
    bytes_exact: int
    calls_compressed: int
    calls_exact: int
    compute_seconds: float
    wire_seconds: float

    def __str__(self) -> str:
        return (
            f"cgx hook stats ({self.hook}: {self.plan}): {self.ratio:.2f}x fewer bytes "
            f"({self.bytes_sent / 1e6:.1f} MB sent, {self.bytes_exact / 1e6:.1f} MB exact), "
            f"{self.steps} steps, {self.buckets} gradient buckets, {self.calls_compressed} "
            f"compressed / {self.calls_exact} exact allreduces, compute "
            f"{self.compute_seconds:.3f} s, wire {self.wire_seconds:.3f} s"
        )


class _Record:
    __slots__ = ("hook", "lock", "pending", "last_seen", "start", "steps", "buckets", "totals")

    def __init__(self, hook: str) -> None:
        self.hook, self.lock = hook, threading.Lock()
        self.pending, self.last_seen, self.start = 0, False, None
        self.steps = self.buckets = 0
        self.totals = dict.fromkeys(_COUNTERS, 0)
        self.totals.update(dict.fromkeys(_SECONDS, 0.0))


_WEAK: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_BY_ID: Dict[int, Tuple[type, _Record]] = {}


def _find(state) -> Optional[_Record]:
    try:
        return _WEAK.get(state)
    except TypeError:  # no weak references (__slots__ without __weakref__)
        kind, rec = _BY_ID.get(id(state), (None, None))
        return rec if kind is type(state) else None


def _record(state, hook_name: str) -> _Record:
    """The state's record, made at its first counted call (or when counted() binds it)."""
    rec = _find(state)
    if rec is None:
        rec = _Record(hook_name)
        try:
            _WEAK[state] = rec
        except TypeError:
            _BY_ID[id(state)] = (type(state), rec)
    return rec


def _group_backend(state):
    """The cgx backend the state's calls go to, or None (not cgx, or no group)."""
    from torch_cgx.backend import cgx_backend

    try:
        return cgx_backend(getattr(state, "process_group", None))
    except ValueError:
        return None


def _open(rec: _Record, state) -> None:
    """At a gradient bucket: the first of a step snapshots the group's counters."""
    with rec.lock:
        if rec.pending == 0 and not rec.last_seen and rec.start is None:
            backend = _group_backend(state)
            rec.start = (backend, backend.stats() if backend is not None else None)
        rec.pending += 1
        rec.buckets += 1


def _close(rec: _Record, last: bool) -> None:
    """At a bucket's completion: after the step's last one, the deltas are added."""
    with rec.lock:
        rec.pending -= 1
        rec.last_seen = rec.last_seen or last
        if rec.pending or not rec.last_seen:
            return
        backend, before = rec.start if rec.start is not None else (None, None)
        rec.start, rec.last_seen = None, False
        rec.steps += 1
        if backend is None or before is None:
            return
        after = backend.stats()
        for k in rec.totals:
            rec.totals[k] += after[k] - before[k]


def counted(hook: Callable, state=None) -> Callable:
    """``hook`` with its state's stats counted (``torch_cgx.stats(state)``); the same signature,
    name and results. Given ``state``, its (zero) counters exist from now on, before any step."""
    if state is not None:
        _record(state, getattr(hook, "__name__", "hook")).hook = getattr(hook, "__name__", "hook")

    @functools.wraps(hook)
    def counted_hook(state, bucket: torch.distributed.GradBucket):
        rec = _record(state, getattr(hook, "__name__", "hook"))
        _open(rec, state)
        last = bucket.is_last()
        try:
            fut = hook(state, bucket)
        except BaseException:
            _close(rec, last)
            raise

        def done(f):
            _close(rec, last)
            return f.value()

        return fut.then(done)

    counted_hook.__cgx_counted__ = True
    return counted_hook


def describe_state(state) -> str:
    """What a hook state compresses with, in a few words."""
    name = type(state).__name__
    if name == "CGXState":
        bits = state.compression_params.get("bits", "group's")
        return f"max-min {bits} bits per layer, min_size {state.min_size}"
    if name == "CompressionState":
        params = ", ".join(f"{k}={v}" for k, v in sorted(state.params.items()))
        plan = ", group's plan" if getattr(state, "plan", None) == "auto" else ""
        return f"{state.compressor}({params}){plan}, min_size {state.min_size}"
    if name == "PowerSGDState":
        return f"PowerSGD rank {state.matrix_approximation_rank}"
    return name


def hook_stats(state) -> HookStats:
    """This rank's counters of ``state``; ValueError for a state never registered through
    :func:`counted`."""
    rec = _find(state)
    if rec is None:
        raise ValueError(
            f"no stats for this {type(state).__name__}: register its hook through "
            "torch_cgx.hook_stats.counted(hook, state) (the Trainer callback and CGXStrategy do)"
        )
    with rec.lock:
        t = dict(rec.totals)
        return HookStats(hook=rec.hook, plan=describe_state(state), steps=rec.steps,
                         buckets=rec.buckets, **t)  # fmt: skip


def any_ran() -> bool:
    """Whether any counted hook of this process has run."""
    records = list(_WEAK.values()) + [rec for _, rec in _BY_ID.values()]
    return any(rec.buckets for rec in records)


def reset(state) -> None:
    """Sets ``state``'s counters to zero (its hook name kept)."""
    rec = _find(state)
    if rec is not None:
        with rec.lock:
            rec.steps = rec.buckets = 0
            rec.totals = dict.fromkeys(_COUNTERS, 0)
            rec.totals.update(dict.fromkeys(_SECONDS, 0.0))
