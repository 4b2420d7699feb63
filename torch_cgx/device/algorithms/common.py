"""What every device algorithm shares: streams, chunk ranges, the resolved compressor and one
call's state. Vocabulary as in csrc/algorithms/allreduce.h: a *piece* is at most the fusion
buffer, SRA cuts it into *segments*, a segment (other algorithms: a piece) into one *chunk* per
rank, on multiples of the compressor's alignment. Every received payload is decoded through the
codec's ``decode_add_`` (its fused kernel where one passed its self-check; :class:`Run`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

_M64 = (1 << 64) - 1
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def streams_for(call_index: int, piece: int, rank: int, chunk: int, phase: int) -> Tuple[int, int]:
    """(stream, shared) of one payload, as payload.cc: distinct per call, piece, rank, chunk and
    phase (0: first send, 1: a re-compressed partial sum, 2: the final payload); ``shared`` is
    the same on every rank (random-k's indices)."""
    s = splitmix64(splitmix64(call_index & _M64) ^ (piece & _M64))
    rest = ((chunk & 0xFFFFFFFF) << 2) | phase

    def mix(r: int) -> int:
        return splitmix64(s ^ (((r << 32) | rest) & _M64))

    return mix(rank & 0xFFFFFFFF), mix(0xFFFFFFFF)


def segment_id(piece: int, k: int) -> int:
    """The stream index of segment ``k`` of ``piece`` (SRA's segments and the lanes')."""
    return (piece * 1000003 + k) & _M64


def chunk_range(count: int, ranks: int, bucket: int, j: int) -> Tuple[int, int]:
    """[begin, end) of chunk ``j`` of ``count`` elements over ``ranks`` (allreduce.cc)."""
    per = (count + ranks - 1) // ranks
    chunk = (per + bucket - 1) // bucket * bucket
    return min(count, chunk * j), min(count, chunk * (j + 1))


def divide_(t: torch.Tensor, w: int) -> torch.Tensor:
    """``t /= w`` as an IEEE division by a device tensor (a CPU scalar divisor lets CUDA multiply
    by its reciprocal, which is not the native engine's ``acc[i] /= float(w)``)."""
    return t.div_(torch.full((), float(w), dtype=t.dtype, device=t.device))


@dataclass
class Plan:
    """One call's compressor, resolved once: the device codec and what the algorithms ask of it
    (payload.h: chunk alignment, payload sizes, which path its traits take)."""

    codec: object
    alignment: int
    fixed_size: bool
    sparse: bool
    summable: bool

    @property
    def gather_only(self) -> bool:
        return not self.fixed_size or self.sparse

    @property
    def sum_in_transit(self) -> bool:
        return self.summable and self.sparse and self.fixed_size

    def size(self, n: int, dtype: torch.dtype) -> int:
        """Exact payload bytes (fixed-size compressors), the most encode writes otherwise."""
        return int(self.codec.encoded_size(n, dtype))


class Run:
    """One compressed call's state: the transport, the plan, the call's streams, the residual
    and the counters. The algorithms call :meth:`encode`, :meth:`values` / :meth:`decode_to_`,
    :meth:`decode_add_` and :meth:`residual_` only, so they do not know which compressor they
    run; every decode goes through the codec's ``decode_add_`` dispatch."""

    def __init__(
        self,
        transport,
        plan: Plan,
        *,
        seed: int,
        call_index: int,
        average: bool,
        residual: Optional[torch.Tensor],
        header_flag: Optional[torch.Tensor],
    ):
        self.t = transport
        self.plan = plan
        self.codec = plan.codec
        self.seed = seed
        self.call_index = call_index
        self.average = average
        self.residual = residual  # flat fp32 view of the current piece's residual, or None
        self.bytes_sent = 0
        # 0-d bool on the device: some payload's header was not what this rank expected
        self.bad = header_flag

    def streams(self, piece: int, rank: int, chunk: int, phase: int) -> Tuple[int, int]:
        return streams_for(self.call_index, piece, rank, chunk, phase)

    def encode(self, x: torch.Tensor, piece: int, rank: int, chunk: int, phase: int):
        stream, shared = self.streams(piece, rank, chunk, phase)
        return self.codec.encode(x, seed=self.seed, stream=stream, shared=shared)

    def flag(self, bad: torch.Tensor) -> None:
        """Records a 0-d bool device tensor (True: a bad header) into :attr:`bad`, unread."""
        self.bad = bad if self.bad is None else self.bad | bad

    def _check(self, payload: torch.Tensor, n: int, dtype: torch.dtype) -> None:
        self.flag(~self.codec.header_ok(payload, n, dtype))  # a device tensor: nothing moves

    def values_into(self, out: torch.Tensor, payload: torch.Tensor, dtype: torch.dtype):
        """``out`` (fp32, contiguous) = the values the payload (encoded from ``dtype``) decodes
        to, through the codec's ``decode_add_`` (a fused kernel where one passed its
        self-check): ``-0.0 + v == v`` bitwise for every v under round-to-nearest, NaN stays
        NaN, so decode-adding into ``-0.0`` gives exactly ``codec.values``. Sparse codecs add
        at their indices only (no fill gives +0.0 there and a value's own -0.0 elsewhere) and
        have no fused kernel: their ``values``."""
        if self.plan.sparse:
            return out.copy_(self.codec.values(payload, out.numel(), dtype))
        out.fill_(-0.0)
        self.codec.decode_add_(out, payload, dtype=dtype)
        return out

    def values(self, payload: torch.Tensor, n: int, dtype: torch.dtype) -> torch.Tensor:
        """The fp32 values a received payload of ``n`` values of ``dtype`` decodes to (its
        header checked lazily, into :attr:`bad`)."""
        self._check(payload, n, dtype)
        out = torch.empty(n, dtype=torch.float32, device=payload.device)
        return self.values_into(out, payload, dtype)

    def decode_to_(self, dest: torch.Tensor, payload: torch.Tensor, dtype: torch.dtype) -> None:
        """``dest`` = the values of a received payload (header checked lazily), decoded in
        place where ``dest`` is contiguous fp32 (no extra pass), else through an fp32 buffer
        and one rounding to ``dest``'s dtype (the final gathers)."""
        if dest.dtype == torch.float32 and dest.is_contiguous():
            self._check(payload, dest.numel(), dtype)
            self.values_into(dest, payload, dtype)
        else:
            dest.copy_(self.values(payload, dest.numel(), dtype))

    def decode_add_(self, acc: torch.Tensor, payload: torch.Tensor, dtype: torch.dtype) -> None:
        """``acc += decode(payload)`` in fp32 (``acc`` fp32; the payload encoded from ``dtype``),
        through the codec's ``decode_add_`` (its fused kernel where one applies)."""
        self._check(payload, acc.numel(), dtype)
        self.codec.decode_add_(acc, payload, dtype=dtype)

    def residual_(self, begin: int, x: torch.Tensor, payload: torch.Tensor, scale: int = 0):
        """residual[begin, begin + n) = x - decode(payload) (store_residual), times ``scale``
        when given (the owner's residual of an averaged sum). The decoded values land in the
        residual first (:meth:`values_into`), then ``x - v`` in one subtraction: the same bits
        as before, zeros' signs included (never ``-((-x) + v)``)."""
        if self.residual is None:
            return
        out = self.residual[begin : begin + x.numel()]  # contiguous: a slice of a flat view
        self.values_into(out, payload, x.dtype)
        torch.sub(x.float(), out, out=out)
        if scale:
            out.mul_(float(scale))


def padded(payload: torch.Tensor, slot: int) -> torch.Tensor:
    """``payload`` zero-padded to ``slot`` bytes (an allgather's equal slots)."""
    extra = slot - payload.numel()
    if extra <= 0:
        return payload
    return torch.cat([payload, payload.new_zeros(extra)])
