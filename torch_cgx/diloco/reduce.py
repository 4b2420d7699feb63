"""The compressed average of one flat fp32 buffer over any group, issued asynchronously.

:func:`start_average` is the one seam: ``(group, flat, spec) -> Pending`` whose ``wait()``
returns the average, bitwise the same on every rank of the group.

- ``spec.name is None``: exact fp32 (the cgx backend's exact path, or ``dist.all_reduce``;
  both give every rank the same bytes).
- a cgx group: the backend's compressed allreduce with the compressor (the hooks' call path:
  ``hooks.core.issue`` with options built once per version of the group's settings); the
  backend writes this rank's compression error into the residual (error feedback).
- any other group (Gloo, NCCL): every rank encodes its buffer, the payloads are all-gathered
  (their sizes first when the compressor's payload size depends on the data), and every rank
  decodes and adds the W payloads in rank order into zeros, then divides by W.

Where the codecs run: CPU buffers use ``torch_cgx.compressors``; CUDA buffers use the device
plane's codec (``torch_cgx.device.codecs``) where a module for the compressor exists, and are
otherwise compressed through a host copy (a compressor without a device codec: none today).
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional

import torch
import torch.distributed as dist

from torch_cgx import compressors

__all__ = ["Pending", "Spec", "codec_for", "encode_payload", "start_average"]

_MAXMIN_FLAGS = ("skip_incomplete_buckets", "stochastic")


class Spec:
    """A validated compressor choice: ``name`` (None: exact fp32), ``params``, ``traits``."""

    __slots__ = ("name", "params", "traits", "host")

    def __init__(self, compressor: Optional[str], compressor_params: Optional[Dict]) -> None:
        if compressor is not None and not isinstance(compressor, str):
            raise ValueError(f"compressor must be a registered name or None, got {compressor!r}")
        if compressor_params is not None and not isinstance(compressor_params, dict):
            raise ValueError(f"compressor_params must be a dict, got {compressor_params!r}")
        params = dict(compressor_params or {})
        if compressor is None:
            if params:
                raise ValueError("compressor_params given with compressor=None (exact fp32)")
            self.name, self.params, self.host = None, {}, None
            self.traits = {"biased": False, "fixed_size": True}
            return
        try:
            made = compressors.get(compressor, **params)
        except ValueError as e:
            raise ValueError(f"compressor / compressor_params: {e}") from None
        self.name, self.params, self.traits, self.host = compressor, params, made.traits, made


class Pending:
    """One reduction in flight; :meth:`wait` returns the average (once). ``payload_bytes``:
    this rank's compressed bytes (0 when exact; the planned size on a cgx group)."""

    __slots__ = ("_works", "_finish", "_result", "payload_bytes")

    def __init__(self, works: List, finish: Callable[[], torch.Tensor], payload_bytes=0) -> None:
        self._works, self._finish, self._result = works, finish, None
        self.payload_bytes = payload_bytes

    @classmethod
    def done(cls, value: torch.Tensor) -> Pending:
        return cls([], lambda: value)

    def wait(self) -> torch.Tensor:
        if self._result is None:
            for work in self._works:
                work.wait()
            self._result = self._finish()
            self._works = []
        return self._result


def start_average(
    group: Optional[dist.ProcessGroup],
    flat: torch.Tensor,
    spec: Spec,
    *,
    residual: Optional[torch.Tensor] = None,
    call: int = 0,
) -> Pending:
    """Starts averaging the contiguous fp32 ``flat`` over ``group`` (None: the default group)
    with ``spec``. ``residual`` (fp32, ``flat``'s size, any device), when given, receives this
    rank's compression error once the result is ready. ``call`` numbers the random streams (the
    same on every rank for one reduction). ``flat`` belongs to the reduction until ``wait``."""
    from torch_cgx.backend import is_cgx_group

    group = group if group is not None else dist.distributed_c10d._get_default_group()
    if is_cgx_group(group):
        return _on_cgx(group, flat, spec, residual, call)
    if spec.name is None:
        work = dist.all_reduce(flat, group=group, async_op=True)
        return Pending([work], lambda: flat.div_(dist.get_world_size(group)))
    return _by_payloads(group, flat, spec, residual, call)


# --- a cgx group: the backend's allreduce ------------------------------------------------------


def _cgx_settings(spec: Spec):
    """The group settings of a compressed call with ``spec``, from the group's own."""

    def make(config):
        if spec.name != "maxmin":
            return config.replace(compressor=spec.name, compressor_params=spec.params)
        # bits: the compressor's default (4) unless given, whatever the group's (32: exact)
        bits = next(p["default"] for p in compressors.params("maxmin") if p["name"] == "bits")
        fields = {"compressor": "maxmin", "compressor_params": "", "bits": int(bits)}
        for key, value in spec.params.items():
            if key == "clip":
                fields["clip"] = "on" if value else "off"
            else:
                fields[key] = bool(value) if key in _MAXMIN_FLAGS else int(value)
        return config.replace(**fields)

    return make


def _on_cgx(group, flat, spec, residual, call) -> Pending:
    from torch_cgx.hooks import core

    calls = core.native_calls(group)
    backend = calls.refresh(group)
    if spec.name is None:
        work = core.issue(backend, flat, calls.exact(), average=True)
        return Pending([work], lambda: flat)
    key = ("diloco", spec.name, tuple(sorted(spec.params.items())))
    options = calls.options(key, _cgx_settings(spec))
    out_res = None
    if residual is not None:
        # the residual goes where the call runs: the device plane (CUDA tensors; any with
        # data_plane="device") writes it on the tensor's device, the host engine on the CPU
        where = flat.device if core.device_plane(backend, flat) is not None else torch.device("cpu")
        usable = residual.device == where and residual.is_contiguous()
        out_res = residual if usable else torch.empty(flat.numel(), device=where)
    work = core.issue(backend, flat, options, call & (2**62 - 1), out_res)

    def finish() -> torch.Tensor:
        if out_res is not None and out_res is not residual:
            residual.copy_(out_res.view(residual.shape))
        return flat

    return Pending([work], finish, spec.host.encoded_size(flat.numel()))


# --- any other group: payloads --------------------------------------------------------------


class _Codec:
    """The compressor of ``spec`` where ``device``'s values are encoded: the device plane's
    codec for CUDA tensors where one exists, else the host compressor (CUDA values then
    travel through a host copy)."""

    __slots__ = ("host", "codec")

    def __init__(self, spec: Spec, device: torch.device) -> None:
        self.host, self.codec = True, None
        if device.type == "cuda":
            try:
                from torch_cgx.device import codecs

                self.codec, self.host = codecs.get(spec.name, **spec.params), False
            except (ImportError, ValueError):
                pass  # no device codec for it yet: a host copy below
        if self.codec is None:
            self.codec = spec.host

    def encode(self, x: torch.Tensor, stream: int, shared: int) -> torch.Tensor:
        return self.codec.encode(x, seed=0, stream=stream, shared=shared)

    def decode_add_(self, out: torch.Tensor, payload: torch.Tensor) -> None:
        self.codec.decode_add_(out, payload)


def codec_for(spec: Spec, device: torch.device) -> _Codec:
    return _Codec(spec, device)


def encode_payload(codec: _Codec, values: torch.Tensor, rank: int, call: int, residual):
    """``values`` encoded with this rank's random stream for reduction ``call``; ``residual``,
    when given, receives ``values - decode(payload)``."""
    call = call & (2**40 - 1)
    payload = codec.encode(values, stream=(rank << 40) | call, shared=call)
    if residual is not None:  # e = x - decode(encode(x)): what this rank's payload left out
        lost = values.clone()
        codec.decode_add_(lost.neg_(), payload)
        residual.copy_(lost.neg_())
    return payload


def _by_payloads(group, flat, spec, residual, call) -> Pending:
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    codec = _Codec(spec, flat.device)
    values = flat.cpu() if codec.host else flat
    payload = encode_payload(codec, values, rank, call, residual)
    wire = payload.to(flat.device)
    if spec.traits["fixed_size"]:
        sizes = [wire.numel()] * world
    else:  # sizes first (blocking, one int64 per rank), then the payloads padded to the largest
        from torch_cgx.device import constants  # the upload does not block: only the read does

        mine = constants.upload(torch.tensor([wire.numel()], dtype=torch.int64), flat.device)
        every = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(every, mine, group=group)
        sizes = [int(s) for s in torch.cat(every).tolist()]  # the size read: one, not W
        padded = torch.zeros(max(sizes), dtype=torch.uint8, device=flat.device)
        padded[: wire.numel()] = wire
        wire = padded
    gathered = [torch.empty_like(wire) for _ in range(world)]
    work = dist.all_gather(gathered, wire, group=group, async_op=True)

    def finish() -> torch.Tensor:
        total = torch.zeros(values.numel(), dtype=torch.float32, device=values.device)
        for payload_r, size in zip(gathered, sizes):  # rank order: the same sum everywhere
            part = payload_r[:size]
            codec.decode_add_(total, part.cpu() if codec.host else part)
        total.div_(world)
        if total.device != flat.device:
            flat.copy_(total)
            return flat
        return total

    return Pending([work], finish, payload.numel())
