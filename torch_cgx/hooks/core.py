"""The core every compressing DDP hook runs on; ``cgx_hook``, ``compression_hook`` and
``policy_hook`` are presets over it (docs/hooks.md has their table of defaults).

One hook call on a gradient bucket (DDP's ``GradBucket``: ``grad_bucket``) goes:

1. **spans**: the bucket's buffer cut into (offset, numel, param) per gradient, split into the
   ones the state compresses and the ones it reduces exactly (:func:`grad_spans`);
2. **parts**: each group of spans becomes a :class:`Part`, one reduction: its native options
   (built once per version of the group's settings, :class:`NativeCalls`, never per bucket),
   its residuals (error feedback), how to pad and rotate it;
3. **the reduction**: :func:`reduce_bucket`, the one place a hook reduces a bucket: for a CPU
   buffer one native call (the backend's ``reduce_bucket``) that stages each part (each layer
   plus its residual, padded and rotated where the preset asks; the buffer itself when a part
   covers all of it with nothing to add), reduces the parts and writes them back (rotated back)
   on the group's worker, so the hook's own thread only lays the parts out; other buffers are
   staged here (:func:`stage`, ``levers.stage``) with one native call (:func:`issue`) per part;
4. **residuals**: once the bucket is done, each layer's new residual (what its compression left
   out) is handed to its state (``Part.keep``).

The quantizer's own bucket is ``bucket_size`` everywhere here.
"""

from __future__ import annotations

import weakref
import zlib
from typing import Callable, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from torch_cgx import _C
from torch_cgx.backend import cgx_backend, get_config
from torch_cgx.config import CGXConfig
from torch_cgx.hooks import levers

__all__ = [
    "NativeCalls",
    "cached_layout",
    "call_stream",
    "check_min_size",
    "clip_rule",
    "Part",
    "feedback",
    "grad_spans",
    "issue",
    "native_calls",
    "native_part",
    "reduce_bucket",
    "rotation_rule",
    "settled",
    "stage",
    "stage_part",
]

Span = Tuple[int, int, torch.Tensor]  # (offset in the bucket buffer, numel, param)


def settled(fut: torch.futures.Future) -> None:
    """Raises the error of ``fut``, or of any future in a ``collect_all`` future's list. Every
    ``then`` callback of the hooks calls it first: a callback that never reads its future's value
    hides a failed collective, and DDP would apply this rank's unreduced gradients."""
    value = fut.value()
    if isinstance(value, list):
        for f in value:
            if isinstance(f, torch.futures.Future):
                f.value()


def grad_spans(compresses: Callable, grad_bucket) -> Tuple[List[Span], List[Span]]:
    """(offset, numel, param) of the gradients ``compresses(param)`` accepts, and of the
    others, in the order of the gradient bucket's buffer (``grad_bucket``: or its parameters)."""
    params = grad_bucket if isinstance(grad_bucket, list) else grad_bucket.parameters()
    spans, offset = ([], []), 0
    for p in params:
        spans[0 if compresses(p) else 1].append((offset, p.numel(), p))
        offset += p.numel()
    return spans


def cached_layout(cache: dict, grad_bucket, make: Callable[[list], object]):
    """``make(params)`` of the gradient bucket's parameters, computed once per set of them (the
    same every step until DDP rebuilds its buckets): keyed by their identities, the entry keeps
    them alive so the identities stay theirs. The caller never changes what it gets."""
    params = grad_bucket.parameters()
    key = tuple(map(id, params))
    got = cache.get(key)
    if got is None:
        if len(cache) >= 256:  # buckets rebuilt again and again: start afresh
            cache.clear()
        got = cache[key] = (params, make(params))
    return got[1]


def call_stream(state, grad_bucket, first) -> int:
    """The random streams of this step's call for ``grad_bucket``: ``state.steps`` and the
    bucket's first compressed parameter (``state.key``: its name when known), the same on every
    rank and after a checkpoint, whatever index DDP gives the gradient bucket."""
    key = state.key(first)
    tag = zlib.crc32(key.encode()) if isinstance(key, str) else grad_bucket.index()
    return (state.steps << 20) ^ (tag & 0xFFFFF)


def _native(config: CGXConfig) -> _C.CallOptions:
    """The native options of a call with ``config``: validated and resolved once, the
    compressor built once (copies share it)."""
    return _C.CallOptions(config.to_native())


class NativeCalls:
    """The native options of one hook state's calls, built once per version of its group's
    settings and reused for every gradient bucket. Each hook call starts with
    :meth:`refresh` (which drops everything built when the group's settings changed, e.g. by
    ``set_config``); :meth:`options` then builds ``make(group_settings)`` the first time a key
    is asked for, and returns the same native object until the settings change."""

    __slots__ = ("builds", "_pg", "_version", "_cache")

    def __init__(self) -> None:
        self.builds = 0
        self._pg, self._version, self._cache = None, None, {}

    def refresh(self, group: Optional[dist.ProcessGroup]):
        """The backend of ``group`` (None: the default group, which may have been created
        again); the cache is dropped when the group or its settings changed. Holds neither the
        group nor its backend (a weak reference to the group): a cache never keeps a destroyed
        group's threads alive."""
        pg = group if group is not None else dist.distributed_c10d._get_default_group()
        backend = cgx_backend(pg)  # ValueError for a group that is not cgx
        version = backend.settings_version()  # moves with set_config and set_plan
        if self._pg is None or self._pg() is not pg or version != self._version:
            self._pg, self._version, self._cache = weakref.ref(pg), version, {}
        return backend

    def cached(self, key, build: Callable[[CGXConfig], object]):
        """``build(group_settings)``, computed once per version of the group's settings."""
        try:
            return self._cache[key]
        except KeyError:
            pass
        config = self._cache.get(_SETTINGS)
        if config is None:
            config = self._cache[_SETTINGS] = get_config(self._pg())
        value = self._cache[key] = build(config)
        return value

    def options(self, key, make: Callable[[CGXConfig], CGXConfig]):
        """The native options of ``make(group_settings)`` for ``key``."""

        def build(config: CGXConfig):
            self.builds += 1
            return _native(make(config))

        return self.cached(("options", key), build)

    def exact(self):
        """An exact call's options on this group (its settings, uncompressed)."""
        return self.options("exact", _exact)


_SETTINGS = object()  # the cache's key of the group's own settings


def _exact(config: CGXConfig) -> CGXConfig:
    return config.replace(bits=32, compressor="maxmin", compressor_params="")


def issue(backend, tensor: torch.Tensor, options: _C.CallOptions, stream: int = -1,
          residual=None, average: bool = True):  # fmt: skip
    """The one native call of the hooks: averages (or, ``average=False``, sums) ``tensor`` in
    place over the group with ``options`` (from :class:`NativeCalls`), numbering its random
    streams ``stream`` (-1: the group's call counter); ``residual``, an fp32 tensor of
    ``tensor``'s size, receives what its compression left out. Returns the Work."""
    if stream != options.stream:
        options = options.with_stream(stream)  # a cheap copy: the compressor is shared
    # A tensor the group's device plane serves (CUDA; any with data_plane=device) goes there.
    return backend.allreduce_call(tensor, options, average, residual)


def device_plane(backend, tensor: torch.Tensor, compressors: Sequence[str] = ()):
    """The group's device plane when it serves ``tensor`` in calls with one of ``compressors``
    (torch_cgx/device/plane.py), else None: such a bucket is staged here, on its device, and
    each staged tensor reduced by the plane (the adapter routes ``allreduce_call`` to it;
    docs/gpu.md)."""
    if not backend.device_plane_token():
        return None
    from torch_cgx.device.plane import plane_of

    plane = plane_of(backend)
    if plane is None:
        return None
    return plane if any(plane.serves(tensor, c) for c in (*compressors, "")) else None


Keep = Optional[Callable[[torch.Tensor, torch.Tensor], None]]


class Part:
    """One reduction of a gradient bucket: the spans it covers (:func:`grad_spans`), its native
    options (:class:`NativeCalls`) and random stream, and how its spans are staged: each plus
    its residual (``residuals``, one per span or None), padded to whole buckets of
    ``bucket_size`` when ``split``, rotated with ``seeds`` (one per span, or none), in fp32 or
    the buffer's dtype; ``whole``: it is the bucket's only part and covers all of the buffer;
    ``keep(param, residual)``: told each span's new residual (None: no error feedback)."""

    __slots__ = ("options", "spans", "stream", "residuals", "seeds", "bucket_size", "split",
                 "fp32", "whole", "keep")  # fmt: skip

    def __init__(self, options: _C.CallOptions, spans: List[Span], *, stream: int = -1,
                 residuals: Optional[Sequence] = None, seeds: Sequence[int] = (),
                 bucket_size: int = 1, split: bool = False, fp32: bool = False,
                 whole: bool = False, keep: Keep = None) -> None:  # fmt: skip
        self.options, self.spans, self.stream = options, spans, stream
        self.residuals, self.seeds, self.bucket_size = residuals, seeds, bucket_size
        self.split, self.fp32, self.whole, self.keep = split, fp32, whole, keep

    def dtype(self, buf: torch.Tensor) -> torch.dtype:
        return torch.float32 if self.fp32 else buf.dtype


# False: every bucket is staged in Python and reduced one native call per part (the path of
# buffers off the CPU); tests compare the two.
NATIVE_BUCKETS = True


def reduce_bucket(
    backend,
    buf: torch.Tensor,
    parts: Sequence[Part],
    extra: Sequence[Callable[[], torch.futures.Future]] = (),
    after: Optional[Callable[[], None]] = None,
) -> torch.futures.Future:
    """The hooks' one place that reduces a gradient bucket: averages ``parts`` of ``buf`` in
    place, in order, then issues each call of ``extra`` (a function returning a future). The
    hook's future: once all are done, each part's ``keep`` is told its spans' new residuals,
    then ``after()``; its value is ``buf``.

    A CPU buffer goes to the backend in one native call (``reduce_bucket``,
    csrc/torch/bucket_call.h), which stages, reduces and writes back on the group's worker: the
    caller only lays the parts out. Other buffers are staged here, one native call per part."""
    names = [part.options.config.compressor for part in parts]
    if not NATIVE_BUCKETS or buf.device.type != "cpu" or device_plane(backend, buf, names):
        return _reduce_staged(backend, buf, parts, extra, after)
    native, kept = [], []
    for part in parts:
        spans, out = part.spans, []
        if part.keep is not None:
            out = [torch.empty(n, dtype=torch.float32) for _, n, _ in spans]
            kept.append((part.keep, spans, out))
        native.append(native_part(
            part.options, stream=part.stream, offsets=[o for o, _, _ in spans],
            numels=[n for _, n, _ in spans], residuals=part.residuals or [], residuals_out=out,
            seeds=part.seeds, bucket_size=part.bucket_size, split=part.split, fp32=part.fp32,
            whole=part.whole))  # fmt: skip
    fut = backend.reduce_bucket(buf, native, True).get_future()
    if extra:
        fut = torch.futures.collect_all([fut] + [issue_more() for issue_more in extra])

    def done(fut):
        settled(fut)
        for keep, spans, out in kept:
            for (_, _, p), res in zip(spans, out):
                keep(p, res)
        if after is not None:
            after()
        return buf

    return fut.then(done)


def native_part(options: _C.CallOptions, **fields) -> _C.BucketPart:
    """A part of the backend's ``reduce_bucket``: ``fields`` set by name (an unknown one raises
    AttributeError), the others their defaults (csrc/torch/bucket_call.h)."""
    native = _C.BucketPart(options)
    for name, value in fields.items():
        setattr(native, name, value)
    return native


def stage(
    buf: torch.Tensor,
    spans: List[Span],
    whole: bool,
    *,
    bucket_size: int = 1,
    split: bool = False,
    dtype: Optional[torch.dtype] = None,
    residuals: Optional[Sequence] = None,
    seeds: Sequence[int] = (),
) -> levers.Staged:
    """The tensor one call reduces, staged in Python (what the backend's ``reduce_bucket`` does
    on its worker): ``buf`` itself (residuals added in place) when the call covers all of it
    (``whole``) in its own dtype, unpadded and unrotated; else a copy of the spans
    (``levers.stage``: each layer plus its residual, padded to whole buckets when ``split``,
    rotated with its seed when ``seeds`` are given)."""
    dtype = buf.dtype if dtype is None else dtype
    residuals = [None] * len(spans) if residuals is None else residuals
    alone = not split or len(spans) == 1  # a lone layer cannot straddle two
    if whole and alone and not seeds and dtype == buf.dtype:
        for (o, n, _), res in zip(spans, residuals):
            if res is not None:
                buf[o : o + n] += res.to(dtype)
        return levers.Staged(buf, spans, [o for o, _, _ in spans], [n for _, n, _ in spans], [])
    return levers.stage(buf, spans, bucket_size, split, dtype, residuals, seeds)


def stage_part(buf: torch.Tensor, part: Part) -> levers.Staged:
    """:func:`stage` of ``part``."""
    return stage(buf, part.spans, part.whole, bucket_size=part.bucket_size, split=part.split,
                 dtype=part.dtype(buf), residuals=part.residuals, seeds=part.seeds)  # fmt: skip


def _reduce_staged(backend, buf, parts, extra, after) -> torch.futures.Future:
    """reduce_bucket with the staging in Python: each part staged, then one native call each;
    once all are done, each staged tensor is rotated back into ``buf``."""
    calls = []
    for part in parts:
        staged = stage_part(buf, part)
        if part.keep is not None:
            feedback(staged)
        work = issue(backend, staged.tensor, part.options, part.stream, staged.residual)
        calls.append((work, staged, part))
    futures = [work.get_future() for work, _, _ in calls] + [more() for more in extra]

    def done(fut):
        settled(fut)
        for _, staged, part in calls:
            layers = levers.unstage(staged, buf, part.bucket_size)
            if part.keep is not None:
                for (_, _, p), res in zip(staged.spans, layers):
                    part.keep(p, res)
        if after is not None:
            after()
        return buf

    if len(futures) == 1:
        return futures[0].then(done)
    return torch.futures.collect_all(futures).then(done)


def feedback(staged: levers.Staged) -> levers.Staged:
    """Gives ``staged`` an fp32 residual of its size for the backend to fill."""
    staged.residual = torch.empty(
        staged.tensor.numel(), dtype=torch.float32, device=staged.tensor.device
    )
    return staged


# Native options of the helpers that take a group, not a state (exact_allreduce and the
# quantized allreduce of _reduce.py): one NativeCalls per process group, dropped with it.
_BY_GROUP: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def native_calls(group: Optional[dist.ProcessGroup]) -> NativeCalls:
    """The shared :class:`NativeCalls` of ``group`` (None: the default group)."""
    if group is None:
        group = dist.distributed_c10d._get_default_group()
    calls = _BY_GROUP.get(group)
    if calls is None:
        calls = _BY_GROUP[group] = NativeCalls()
    return calls


def rotation_rule(rotation: Optional[bool], bits: int, bucket_size: int) -> bool:
    """Whether max-min at ``bits`` rotates: ``rotation`` when given (True with a bucket size
    that cannot rotate is refused by the caller, as the backend refuses ``rotation="on"``), else
    the backend's rule for ``rotation="auto"`` (one place: csrc/torch/call_options.cc)."""
    if rotation is not None:
        return rotation
    return _C.rotation_rule("auto", bits, bucket_size, "maxmin")


def clip_rule(clip: Optional[bool], rotates: bool) -> bool:
    """Whether max-min clips: ``clip`` when given, else the backend's rule (with the rotation)."""
    return _C.clip_rule("auto" if clip is None else ("on" if clip else "off"), rotates)


def check_min_size(min_size, alias, alias_name: str, default: int) -> int:
    """The minimum size a state was given, under its name or an alias (``alias_name``: CGX's
    ``layer_min_size`` for ``CGXState``, or a deprecated one; docs/guide.md, "Compatibility
    names")."""
    if alias is not None:
        if min_size is not None:
            raise ValueError(f"give min_size or {alias_name}, not both")
        min_size, name = alias, alias_name
    else:
        min_size, name = (default if min_size is None else min_size), "min_size"
    if isinstance(min_size, bool) or not isinstance(min_size, int) or min_size < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {min_size!r}")
    return min_size
