"""Compressors written in Python: :class:`CompressorBase`, its parameters and its payloads.

A subclass declares its parameters and traits and implements three methods in torch operations
(any device, no host round trip needed): ``body_size(numel)``, ``encode(x, ctx)`` and
``decode(body, numel)``. :func:`torch_cgx.compressors.register` makes it a compressor like the
native ones: by name in the cgx backend (CPU and CUDA tensors, through the group's device plane),
the hooks, FSDP2, DiLoCo, the collaborative optimizer and the planner.

The framework owns the payload's first 16 bytes (docs/FORMAT.md, "Compressors written in
Python"): ``CGXP``, the CRC-32 of the compressor's name and the element count; a decoder given a
payload of another compressor, element count or size raises ValueError before the body is read.
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Dict, Optional

import torch

from torch_cgx.device import constants
from torch_cgx.device.codecs.base import _M32, DeviceCodec, _fmix32, _mul32, constant_bytes, rng_key
from torch_cgx.warn import warn_once

__all__ = ["CompressorBase", "Context", "HEADER_BYTES", "Param"]

HEADER_BYTES = 16
_MAGIC = b"CGXP"


@dataclasses.dataclass(frozen=True)
class Param:
    """One parameter: its default, range and whether it is an integer (``help`` for the docs)."""

    default: float
    min: float = float("-inf")
    max: float = float("inf")
    integer: bool = False
    help: str = ""

    def check(self, owner: str, key: str, value) -> float:
        if isinstance(value, bool):
            value = int(value)
        if not isinstance(value, (int, float)):
            raise ValueError(f"{owner} parameter {key} must be a number, got {value!r}")
        if self.integer and value != int(value):
            raise ValueError(f"{owner} parameter {key} must be an integer, got {value!r}")
        if not self.min <= value <= self.max:
            raise ValueError(f"{owner} parameter {key} must be in [{self.min}, {self.max}], "
                             f"got {value!r}")  # fmt: skip
        return int(value) if self.integer else float(value)


class Context:
    """What an encode draws its random choices from: ``seed`` and ``stream`` (this rank's and
    call's), ``shared`` (the same on every rank for one message). Its draws take the keys as
    tensors, so a compiled encode is not specialised on them (read ``seed`` / ``stream`` in an
    encode compiled with ``torch.compile`` and it recompiles each call)."""

    __slots__ = ("seed", "stream", "shared", "_keys")

    def __init__(self, seed: int = 0, stream: int = 0, shared: int = 0, device=None) -> None:
        self.seed, self.stream, self.shared = seed, stream, shared
        own, common = rng_key(seed, stream), rng_key(seed, shared)
        keys = torch.tensor(own + common, dtype=torch.int64)
        # per-call values: host -> device without blocking the host (CUDA: pinned memory)
        self._keys = keys if device is None else constants.upload(keys, device)

    def uniform(self, index: torch.Tensor) -> torch.Tensor:
        """u in [0, 1) per element index (int64 tensor): the generator of FORMAT.md keyed by
        (seed, stream) -- stochastic rounding of this rank's values."""
        return _uniform(self._keys[0], self._keys[1], index)

    def uniform_first(self, n: int, device=None) -> torch.Tensor:
        """``uniform(arange(n))`` (n < 2^31), cheaper (see :meth:`uniform24_first`)."""
        if n >= 1 << 31:
            return self.uniform(torch.arange(n, device=device))
        return self.uniform24_first(n, device).to(torch.float32) * (2.0**-24)

    def uniform24_first(self, n: int, device=None) -> torch.Tensor:
        """The draws of :meth:`uniform_first` as the integers they are made of (int32 in [0,
        2^24): ``u * 2^24``; n < 2^31), in int32 arithmetic, which compilers vectorize (the
        same low 32 bits as FORMAT.md's hash in int64). A comparison with them needs no float."""
        if n >= 1 << 31:
            raise ValueError(f"uniform24_first takes n < 2^31, got {n}")
        keys = self._keys.view(torch.int32)  # little-endian words: [0] = k0, [2] = k1
        i = torch.arange(n, device=device, dtype=torch.int32)
        return (_mix32(_mix32(i ^ keys[0]) + keys[2]) >> 8) & 0xFFFFFF

    def shared_uniform(self, index: torch.Tensor) -> torch.Tensor:
        """The same draw keyed by (seed, shared): identical on every rank (random selections)."""
        return _uniform(self._keys[2], self._keys[3], index)


def _uniform(k0: torch.Tensor, k1: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    # FORMAT.md's element hash with the keys as tensors: base.uniform's values bit for bit
    i = index.to(torch.int64)
    lo, hi = i & _M32, (i >> 32) & _M32
    return _hashed(_fmix32((_fmix32(lo ^ k0) + (_mul32(hi, 0x9E3779B1) ^ k1)) & _M32))


def _signed32(c: int) -> int:
    return c - (1 << 32) if c >= 1 << 31 else c


def _mix32(h: torch.Tensor) -> torch.Tensor:
    """base._fmix32 on int32 tensors: products wrap modulo 2^32 (two's complement on every
    device torch runs on); a right shift is arithmetic, so its sign bits are masked off."""
    h = h ^ ((h >> 16) & 0xFFFF)
    h = h * _signed32(0x85EBCA6B)
    h = h ^ ((h >> 13) & 0x7FFFF)
    h = h * _signed32(0xC2B2AE35)
    return h ^ ((h >> 16) & 0xFFFF)


def _hashed(h: torch.Tensor) -> torch.Tensor:
    return (h >> 8).to(torch.float32) * (2.0**-24)


class CompressorBase:
    """A compressor in torch operations. Subclasses set ``params`` (name -> :class:`Param`), the
    traits (``biased``: needs error feedback; ``fixed_size``: the body's size depends on the
    element count only; ``sparse``) and implement :meth:`body_size`, :meth:`encode` and
    :meth:`decode`; :meth:`decode_add_` has a default. The configured parameters are
    ``self.p`` (validated, integers as int)."""

    name: str = ""
    params: Dict[str, Param] = {}
    biased: bool = False
    fixed_size: bool = True
    sparse: bool = False

    def __init__(self, **given) -> None:
        unknown = sorted(set(given) - set(self.params))
        if unknown:
            raise ValueError(f"{self.name} has no parameter(s) {unknown} (it takes "
                             f"{sorted(self.params) or 'none'})")  # fmt: skip
        self.p = {k: spec.check(self.name, k, given.get(k, spec.default))
                  for k, spec in self.params.items()}  # fmt: skip

    def body_size(self, numel: int) -> int:
        """Bytes of the body for ``numel`` values (the most when not ``fixed_size``)."""
        raise NotImplementedError

    def encode(self, x: torch.Tensor, ctx: Context) -> torch.Tensor:
        """The body (1-D uint8 on ``x``'s device, ``body_size`` bytes when ``fixed_size``, else at
        most) of the 1-D contiguous float32 tensor ``x``. Deterministic in (x, ctx)."""
        raise NotImplementedError

    def new_body(self, nbytes: int, device) -> torch.Tensor:
        """An empty body of ``nbytes`` for :meth:`encode` to fill and return: the payload's
        header goes in front of it in place (any other body is copied behind the header)."""
        whole = torch.empty(HEADER_BYTES + nbytes, dtype=torch.uint8, device=device)
        body = whole[HEADER_BYTES:]
        body._cgx_payload = whole
        return body

    def decode(self, body: torch.Tensor, numel: int) -> torch.Tensor:
        """The ``numel`` decoded values (float32, 1-D, on the body's device). Raise ValueError
        for a body that cannot be one (its size is checked before)."""
        raise NotImplementedError

    def decode_add_(self, acc: torch.Tensor, body: torch.Tensor) -> torch.Tensor:
        """``acc += decode(body)`` (acc: 1-D float32)."""
        return acc.add_(self.decode(body, acc.numel()))

    def bound(self, x: torch.Tensor) -> float:
        """The most ``|decode(encode(x)) - x|_2`` may be (None: none declared). The checks
        (``torch_cgx.testing.check_compressor``) hold the compressor to it."""
        return None


def header(name: str, numel: int, device) -> torch.Tensor:
    crc = zlib.crc32(name.encode())
    values = tuple(_MAGIC) + tuple(crc.to_bytes(4, "little")) + tuple(numel.to_bytes(8, "little"))
    return constant_bytes(values, torch.device(device))


def split(c: CompressorBase, payload: torch.Tensor, numel: int) -> torch.Tensor:
    """The body of ``payload`` after the host-side size checks (ValueError)."""
    if not isinstance(payload, torch.Tensor) or payload.dtype != torch.uint8 or payload.dim() != 1:
        raise ValueError(f"{c.name}: payload must be a 1-D uint8 tensor (what encode returned)")
    body = payload.numel() - HEADER_BYTES
    most = c.body_size(numel)
    if body < 0 or body > most or (c.fixed_size and body != most):
        raise ValueError(f"{c.name}: a payload of {payload.numel()} bytes cannot hold "
                         f"{numel} values ({HEADER_BYTES + most} bytes expected)")  # fmt: skip
    body = payload[HEADER_BYTES:]
    # aligned to 16 bytes: a decoder may view its bytes as wider types (payloads of one message
    # lie at any offset of its buffer)
    return body if body.storage_offset() % 16 == 0 else body.clone()


def encode(c: CompressorBase, x: torch.Tensor, ctx: Context) -> torch.Tensor:
    flat = x.detach().reshape(-1)
    flat = flat if flat.dtype == torch.float32 else flat.float()
    body = c.encode(flat.contiguous(), ctx)
    most = c.body_size(flat.numel())
    if not isinstance(body, torch.Tensor) or body.dtype != torch.uint8 or body.dim() != 1:
        raise TypeError(f"{c.name}.encode must return a 1-D uint8 tensor, got {body!r:.80}")
    if body.numel() > most or (c.fixed_size and body.numel() != most):
        raise RuntimeError(f"{c.name}.encode returned {body.numel()} bytes for {flat.numel()} "
                           f"values; body_size says {most}")  # fmt: skip
    head = header(c.name, flat.numel(), body.device)
    whole = getattr(body, "_cgx_payload", None)
    if (whole is not None and whole.numel() == HEADER_BYTES + body.numel()
            and whole.data_ptr() + HEADER_BYTES == body.data_ptr()):  # fmt: skip
        whole[:HEADER_BYTES].copy_(head)  # a body from new_body: its header in place
        return whole
    return torch.cat([head, body])


def check_header(c: CompressorBase, payload: torch.Tensor, numel: int) -> None:
    """ValueError when the header is not this compressor's for ``numel`` values (reads it)."""
    want = header(c.name, numel, payload.device)
    if payload.numel() < HEADER_BYTES or not torch.equal(payload[:HEADER_BYTES], want):
        raise ValueError(
            f"{c.name}: the payload's header is not one of {c.name} for {numel} "
            "values (another compressor, size or corrupted bytes)"
        )


class DeviceAdapter(DeviceCodec):
    """A registered Python compressor as the device plane's codec (any device)."""

    def __init__(self, compressor: CompressorBase, params: Dict) -> None:
        super().__init__(**params)
        self.c, self.name, self.fixed_size = compressor, compressor.name, compressor.fixed_size

    def encoded_size(self, numel: int, dtype: torch.dtype = torch.float32) -> int:
        return HEADER_BYTES + self.c.body_size(numel)

    def encode(self, x: torch.Tensor, *, seed: int = 0, stream: int = 0, shared: int = 0):
        return encode(self.c, x, Context(seed, stream, shared, x.device))

    def values(self, payload: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return self.c.decode(split(self.c, payload, numel), numel).float()

    def header_ok(self, payload: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        want = header(self.name, numel, payload.device)
        if payload.numel() < HEADER_BYTES:
            return torch.zeros((), dtype=torch.bool, device=payload.device)
        return (payload[:HEADER_BYTES] == want).all()


def make(cls, name: str, given: Optional[Dict], compile: bool) -> CompressorBase:
    c = cls.__new__(cls)
    c.name = name
    cls.__init__(c, **(given or {}))
    if compile:  # instance attributes over the methods: compiled per input size at first use
        c.encode = _compiled(c, c.encode)
        c.decode = _compiled(c, c.decode)
    return c


def _compiled(c: CompressorBase, eager):
    """``eager`` through torch.compile; where compiling fails, the eager method from then on,
    with a warning (a compressor's own errors, e.g. ValueError for a bad body, pass through)."""
    state = {"fn": torch.compile(eager, dynamic=True)}

    def call(*args):
        try:
            return state["fn"](*args)
        except Exception as e:
            if not type(e).__module__.startswith(("torch._dynamo", "torch._inductor")):
                raise
            if state["fn"] is not eager:
                warn_once(("compile", c.name, eager.__name__),
                          f"{c.name}: torch.compile of {eager.__name__} failed "
                          f"({type(e).__name__}: {str(e)[:200]}); running it eagerly",
                          category=RuntimeWarning)  # fmt: skip
                state["fn"] = eager
            return eager(*args)

    return call
