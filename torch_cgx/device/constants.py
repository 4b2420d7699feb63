"""Host values on the device without a host synchronisation: cached device constants
(:func:`get`) and non-blocking uploads of small per-call values (:func:`upload`).

On CUDA, ``torch.tensor(values, device="cuda")`` (and ``.to("cuda")`` of a pageable CPU tensor)
is a blocking copy: the host waits until the stream is idle, on every call of the data path.
Here the values go through pinned memory with ``non_blocking=True``, enqueued on the current
stream, and the host goes on at once.

:func:`get` keeps one device tensor per (key, device), built once from host values, in a bounded
LRU cache, and is safe across CUDA streams: the constant is written by a copy on the stream that
was current when it was made, so a reader on another stream first waits for that copy (an event
recorded at creation; ``stream.wait_event`` once per stream, no host wait), and the tensor is
marked used by that stream (``record_stream``), so that evicting it from the cache while the
stream still reads it cannot hand its memory to another tensor too early. **Constants are
shared: never write into one (clone it first).** On CPU tensors :func:`get` is a plain cache;
nothing here reads a device value on the host.

Everything in this module is the sanctioned way values made on the host reach the device
(tests/device_engine_reads.py's ``host_uploads`` allows what runs in here, nothing else).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Hashable

import torch

__all__ = ["CAPACITY", "bytes_of", "clear", "get", "size", "upload"]

CAPACITY = 4096  # entries over all devices (headers are per payload size: a model has a few)


class _Entry:
    __slots__ = ("tensor", "event", "streams")

    def __init__(self, tensor: torch.Tensor, event, streams: set) -> None:
        self.tensor, self.event, self.streams = tensor, event, streams


_lock = threading.Lock()
_cache: OrderedDict[tuple, _Entry] = OrderedDict()


def _stream_key(stream) -> int:
    # torch.cuda.Stream handles are pooled by torch (never destroyed): the handle names a stream
    return int(stream.cuda_stream)


def _host(values) -> torch.Tensor:
    t = values if isinstance(values, torch.Tensor) else torch.tensor(values)
    if t.device.type != "cpu":
        raise ValueError(f"constants: host values expected, got a tensor on {t.device}")
    return t.contiguous()


def upload(host: torch.Tensor, device) -> torch.Tensor:
    """``host`` (a small CPU tensor, e.g. this call's keys or sizes) on ``device``, enqueued on
    the device's current stream without blocking the host (CUDA: through pinned memory; the
    caching host allocator keeps the pinned block until the copy is done). For per-call values
    that cannot be cached; use them on the current stream. CPU: ``host`` itself."""
    device = torch.device(device)
    host = _host(host)
    if device.type == "cpu":
        return host
    if device.type == "cuda":
        with torch.cuda.device(device):
            return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


def _make(device: torch.device, make: Callable) -> _Entry:
    host = _host(make())
    if device.type != "cuda":
        return _Entry(host if device.type == "cpu" else host.to(device), None, set())
    with torch.cuda.device(device):
        stream = torch.cuda.current_stream(device)
        tensor = host.pin_memory().to(device, non_blocking=True)
        event = torch.cuda.Event()
        event.record(stream)
    return _Entry(tensor, event, {_stream_key(stream)})


def _for_stream(entry: _Entry, device: torch.device) -> None:
    """A reader on a stream other than those seen: wait for the copy (on the device), and tell
    the caching allocator that stream uses the tensor."""
    stream = torch.cuda.current_stream(device)
    key = _stream_key(stream)
    if key not in entry.streams:
        stream.wait_event(entry.event)
        entry.tensor.record_stream(stream)
        entry.streams.add(key)


def get(key: Hashable, device, make: Callable) -> torch.Tensor:
    """The constant ``key`` on ``device``: ``make()`` (host values: a CPU tensor or a sequence for
    ``torch.tensor``) copied there once, without blocking the host; ready to read on the current
    stream. Never write into the result (it is shared: clone it)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    k = (device, key)
    with _lock:
        entry = _cache.get(k)
        if entry is not None:
            _cache.move_to_end(k)
        else:
            entry = _cache[k] = _make(device, make)
            while len(_cache) > CAPACITY:
                _cache.popitem(last=False)
        if entry.event is not None:
            _for_stream(entry, device)
        return entry.tensor


def bytes_of(values: tuple, device) -> torch.Tensor:
    """The uint8 constant of the byte values ``values`` (headers, envelopes) on ``device``."""
    return get(("bytes", values), device, lambda: torch.tensor(values, dtype=torch.uint8))


def size() -> int:
    """Cached constants (all devices)."""
    with _lock:
        return len(_cache)


def clear() -> None:
    """Forgets every cached constant (tensors still in use stay valid: see :func:`get`)."""
    with _lock:
        _cache.clear()
