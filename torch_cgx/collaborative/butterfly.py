"""A round's sample-weighted average as a reduce-scatter and an all-gather of compressed parts
(each peer sends ``2 (W-1) / W`` of one payload, where an all-gather of whole payloads sends
``W - 1``), every exchange an all-to-all (each peer sends straight to every other: one latency
per exchange, where Gloo's ring all-gather takes W - 1 in a row).

The tensors, flattened end to end, are cut into C chunks (:func:`chunk_count`, from the shapes
alone) and each chunk into W contiguous parts; part j of every chunk belongs to peer j (rank
order). After the header table (every peer's samples, rate, batch size and the bytes of each of
its C * W encoded parts), chunk by chunk an all-to-all sends every contributor's part j to peer
j, which decodes them in rank order, forms ``sum_i (n_i * x_i) / sum_i n_i`` (each product and
sum a separate IEEE operation), encodes that average with the same compression and all-gathers
it, while the next chunk's reduce-scatter runs: every peer decodes the same bytes. The average
is compressed twice (the parts, then the averaged part): a quantizer's error is that of two
roundings; fp16's second rounding is exact for values that are already sums of fp16 values only
when no carry occurs, so at most one more half unit in the last place. An averaged part is sent
in the size of the largest part of its contributors (a fixed-size compressor's exact size), plus
a margin for a compressor whose size depends on the data; one that outgrows it makes that round
fail on every peer, and the Optimizer then averages by whole payloads.
"""

from __future__ import annotations

import logging
import struct
import time
from typing import List, Optional, Sequence, Tuple

import torch

from torch_cgx.collaborative.wire import Codec, _process_group, _rank, average, everyone

__all__ = ["TooLarge", "layout", "reduce"]

_log = logging.getLogger("torch_cgx.collaborative")
_LEN = struct.Struct("<I")
_TOO_LARGE = 0xFFFFFFFF
_FAILED = 0xFFFFFFFE  # the owner could not average its part (a corrupted contributor's part)


class TooLarge(ValueError):
    """An averaged part outgrew its bound (a compressor whose size depends on the data)."""


# a part of a chunk holds at least this many values: the parts of a round's chunks pipeline (a
# chunk's all-gather runs beside the next chunk's reduce-scatter), and the link carries several
# short exchanges faster than two long ones (measured: docs/collaborative.md)
PIECE_VALUES = 32768
MAX_CHUNKS = 16


def chunk_count(total: int, world: int) -> int:
    """Chunks of a round over ``total`` values (the same on every peer: shapes only)."""
    return max(1, min(MAX_CHUNKS, total // (world * PIECE_VALUES)))


def layout(numels: Sequence[int], world: int, chunks: int = 1) -> List[List[Tuple[int, int, int]]]:
    """The segments ``(tensor, start, end)`` of each of the ``world * chunks`` parts, in flat
    order: part ``k * world + j`` is chunk ``k``'s part of peer ``j``."""
    total, count = sum(numels), world * chunks
    bounds = [total * j // count for j in range(count + 1)]
    parts, offset = [[] for _ in range(count)], 0
    for i, n in enumerate(numels):
        for j in range(count):
            lo, hi = max(bounds[j], offset), min(bounds[j + 1], offset + n)
            if lo < hi:
                parts[j].append((i, lo - offset, hi - offset))
        offset += n
    return parts


def _start(pg, send: List[torch.Tensor], into: List[int]):
    """An all-to-all begun: ``(work, output, into)``; :func:`_done` waits for it."""
    from torch.distributed.distributed_c10d import AllToAllOptions

    data = torch.cat(send) if send else torch.empty(0, dtype=torch.uint8)
    out = torch.empty(sum(into), dtype=torch.uint8)
    work = pg.alltoall_base(out, data, into, [c.numel() for c in send], AllToAllOptions())
    return work, out, into


def _done(started) -> List[torch.Tensor]:
    work, out, into = started
    work.wait()
    return list(torch.split(out, into))


def _bound(codec: Codec, table, part: int, segments) -> int:
    """The bytes an averaged part may take: what its largest contributor sent (a fixed-size
    compressor re-encodes to exactly that), with a margin for a data-dependent one."""
    largest = int(max(row[4 + part] for row in table))
    if codec.fixed_size:
        return largest
    return int(largest * 1.1) + 64 * len(segments) + 1024


def _framed(mine: Optional[torch.Tensor], bound: int) -> torch.Tensor:
    """``u32 length + the part``, padded to ``4 + bound``; the length says TooLarge past it,
    or that the owner failed (``mine`` None): the round fails on every peer, each having run
    the same exchanges (a peer that stopped early would leave the others waiting out the
    timeout, and the group's collectives out of step)."""
    wire = torch.zeros(4 + bound, dtype=torch.uint8)
    size = _FAILED if mine is None else _TOO_LARGE if mine.numel() > bound else mine.numel()
    wire[:4] = torch.frombuffer(bytearray(_LEN.pack(size)), dtype=torch.uint8)
    if mine is not None and size != _TOO_LARGE:
        wire[4 : 4 + size] = mine
    return wire


def _exchange(pg, codec: Codec, parts, encoded, table, times: dict, clock: float):
    """The reduce-scatter and all-gather of every chunk, pipelined (issued in the same order on
    every peer: RS 0, RS 1, AG 0, RS 2, AG 1, ...): ``(gathered wires per part, bytes sent)``."""
    world, rank = len(table), _rank(pg)
    chunks = len(parts) // world

    def scatter(k: int):
        ids = range(k * world, (k + 1) * world)
        return _start(pg, [encoded[p] for p in ids], [int(r[4 + k * world + rank]) for r in table])

    gathers, sent = [], 0
    pending = scatter(0)
    for k in range(chunks):
        following = scatter(k + 1) if k + 1 < chunks else None
        own = k * world + rank
        received = _done(pending)
        try:
            mine = _average_part(codec, parts[own], table, received)
        except ValueError as e:  # said in-band: every peer fails the round at its end
            _log.warning("collaborative round: a part this peer averages is bad: %s", e)
            mine = None
        bounds = [_bound(codec, table, p, parts[p]) for p in range(k * world, (k + 1) * world)]
        wire = _framed(mine, bounds[rank])
        gathers.append(_start(pg, [wire] * world, [4 + b for b in bounds]))
        sent += (world - 1) * wire.numel()
        pending = following
    times["reduce_scatter"] = time.perf_counter() - clock
    gathered = [w for g in gathers for w in _done(g)]
    times["all_gather"] = time.perf_counter() - clock - times["reduce_scatter"]
    sent += sum(c.numel() for p, c in enumerate(encoded) if p % world != rank)
    return gathered, sent


def reduce(manager, codec: Codec, values: Optional[List[torch.Tensor]], head: Sequence[float],
           times: Optional[dict] = None, decode_own: bool = False):  # fmt: skip
    """``(table, average, own_decoded, bytes_sent)`` of a round; ``values`` (flat fp32 per
    tensor) is None for a peer that contributes nothing; ``head`` is its ``(samples, rate,
    batch)``. ``average`` is None when nobody contributed; ``own_decoded`` (what this peer's
    parts carry, for error feedback) only with ``decode_own``. ``times`` receives the seconds
    of each phase (``header``; ``reduce_scatter``: until the last chunk's part is averaged;
    ``all_gather``: the rest)."""
    times = {} if times is None else times
    clock = time.perf_counter()
    pg = _process_group(manager)
    world = pg.size()
    numels = [int(torch.Size(s).numel()) for s in codec.shapes]
    parts = layout(numels, world, chunk_count(sum(numels), world))
    empty = [torch.empty(0, dtype=torch.uint8)] * len(parts)
    encoded = [codec.encode(values, p) for p in parts] if values is not None else empty
    header = torch.tensor([*head, 0.0, *[c.numel() for c in encoded]], dtype=torch.float64)
    rows = everyone(pg, header, world)
    times["header"], clock = time.perf_counter() - clock, time.perf_counter()
    table = [tuple(r.tolist()) for r in rows]
    total = sum(int(r[0]) for r in table)
    own = None
    if values is not None and decode_own:
        own = _place(codec, [(p, codec.decode(c, p)) for c, p in zip(encoded, parts)])
    if total == 0:
        return table, None, own, 0
    gathered, sent = _exchange(pg, codec, parts, encoded, table, times, clock)
    return table, _assemble(codec, parts, gathered), own, sent


def _average_part(codec, segments, table, received) -> torch.Tensor:
    """This peer's part averaged over the contributors, encoded again."""
    acc, _ = average(codec, table, received, segments)
    return codec.encode_pieces(acc, segments)


def _place(codec, decoded) -> List[torch.Tensor]:
    """Whole flat tensors from ``(segments, their values)`` pairs."""
    out = [torch.zeros(int(torch.Size(s).numel())) for s in codec.shapes]
    for segments, values in decoded:
        for (i, start, end), x in zip(segments, values):
            out[i][start:end] = x
    return out


def _assemble(codec, parts, gathered) -> List[torch.Tensor]:
    decoded = []
    for segments, buf in zip(parts, gathered):
        (size,) = _LEN.unpack(buf[:4].numpy().tobytes())
        if size == _TOO_LARGE:
            raise TooLarge("an averaged part outgrew its bound: averaging by whole payloads")
        if size == _FAILED:
            raise ValueError("collaborative round: a peer could not average its part (one "
                             "truncated or corrupted): the round is not committed")  # fmt: skip
        if size > buf.numel() - 4:
            raise ValueError(f"collaborative round: a part of {size} bytes in a "
                             f"{buf.numel() - 4}-byte buffer")  # fmt: skip
        decoded.append((segments, codec.decode(buf[4 : 4 + size], segments)))
    return _place(codec, decoded)
