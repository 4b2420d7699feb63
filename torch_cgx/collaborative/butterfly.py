"""A round's sample-weighted average as a reduce-scatter and an all-gather of compressed parts
(each peer sends ``2 (W-1) / W`` of one payload, where an all-gather of whole payloads sends
``W - 1``), every exchange an all-to-all (each peer sends straight to every other: one latency
per exchange, where Gloo's ring all-gather takes W - 1 in a row).

The tensors, flattened end to end, are cut into W contiguous parts; part j belongs to peer j
(rank order). After the header table (every peer's samples, rate, batch size and the bytes of
each of its W encoded parts), an all-to-all sends every contributor's part j to peer j, which
decodes them in rank order, forms ``sum_i (n_i * x_i) / sum_i n_i`` (each product and sum a
separate IEEE operation), encodes that average with the same compression and all-gathers it:
every peer decodes the same bytes. The average is compressed twice (the parts, then the
averaged part): a quantizer's error is that of two roundings; fp16's second rounding is exact
for values that are already sums of fp16 values only when no carry occurs, so at most one more
half unit in the last place. A part's re-encoded size is bounded by the largest part any peer
sent plus a margin; a compressor whose averaged part exceeds it (its size depends on the data)
makes that round fail on every peer, and the Optimizer then averages by whole payloads.
"""

from __future__ import annotations

import struct
import time
from typing import List, Optional, Sequence, Tuple

import torch

from torch_cgx.collaborative.wire import Codec, _process_group, _rank, average, everyone

__all__ = ["TooLarge", "layout", "reduce"]

_LEN = struct.Struct("<I")
_TOO_LARGE = 0xFFFFFFFF


class TooLarge(ValueError):
    """An averaged part outgrew its bound (a compressor whose size depends on the data)."""


def layout(numels: Sequence[int], world: int) -> List[List[Tuple[int, int, int]]]:
    """The segments ``(tensor, start, end)`` of each of the ``world`` parts."""
    total = sum(numels)
    bounds = [total * j // world for j in range(world + 1)]
    parts, offset = [[] for _ in range(world)], 0
    for i, n in enumerate(numels):
        for j in range(world):
            lo, hi = max(bounds[j], offset), min(bounds[j + 1], offset + n)
            if lo < hi:
                parts[j].append((i, lo - offset, hi - offset))
        offset += n
    return parts


def _alltoall(pg, chunks: List[torch.Tensor], table, rank: int) -> List[torch.Tensor]:
    from torch.distributed.distributed_c10d import AllToAllOptions

    world = len(table)
    send = torch.cat(chunks) if chunks else torch.empty(0, dtype=torch.uint8)
    into = [int(table[r][4 + rank]) for r in range(world)]
    out = torch.empty(sum(into), dtype=torch.uint8)
    pg.alltoall_base(out, send, into, [c.numel() for c in chunks], AllToAllOptions()).wait()
    return list(torch.split(out, into))


def reduce(manager, codec: Codec, values: Optional[List[torch.Tensor]], head: Sequence[float],
           times: Optional[dict] = None, decode_own: bool = False):  # fmt: skip
    """``(table, average, own_decoded, bytes_sent)`` of a round; ``values`` (flat fp32 per
    tensor) is None for a peer that contributes nothing; ``head`` is its ``(samples, rate,
    batch)``. ``average`` is None when nobody contributed; ``own_decoded`` (what this peer's
    parts carry, for error feedback) only with ``decode_own``. ``times`` receives the seconds
    of each phase (``header``, ``reduce_scatter``, ``all_gather``)."""
    times = {} if times is None else times
    clock = time.perf_counter()
    pg = _process_group(manager)
    world, rank = pg.size(), _rank(pg)
    parts = layout([int(torch.Size(s).numel()) for s in codec.shapes], world)
    empty = torch.empty(0, dtype=torch.uint8)
    chunks = [codec.encode(values, p) for p in parts] if values is not None else [empty] * world
    header = torch.tensor([*head, 0.0, *[c.numel() for c in chunks]], dtype=torch.float64)
    rows = everyone(pg, header, world)
    times["header"], clock = time.perf_counter() - clock, time.perf_counter()
    table = [tuple(r.tolist()) for r in rows]
    total = sum(int(r[0]) for r in table)
    own = None
    if values is not None and decode_own:
        own = _place(codec, [(p, codec.decode(c, p)) for c, p in zip(chunks, parts)])
    if total == 0:
        return table, None, own, 0
    received = _alltoall(pg, chunks, table, rank)
    mine = _average_part(codec, parts[rank], table, received)
    times["reduce_scatter"], clock = time.perf_counter() - clock, time.perf_counter()
    largest = max(r[4 + j] for r in table for j in range(world))
    bound = int(largest * 1.1) + 64 * max(len(p) for p in parts) + 1024
    wire = torch.zeros(4 + bound, dtype=torch.uint8)
    if mine.numel() > bound:
        wire[:4] = torch.frombuffer(bytearray(_LEN.pack(_TOO_LARGE)), dtype=torch.uint8)
    else:
        wire[:4] = torch.frombuffer(bytearray(_LEN.pack(mine.numel())), dtype=torch.uint8)
        wire[4 : 4 + mine.numel()] = mine
    gathered = everyone(pg, wire, world)
    times["all_gather"] = time.perf_counter() - clock
    sent = sum(c.numel() for j, c in enumerate(chunks) if j != rank) + (world - 1) * wire.numel()
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
        if size > buf.numel() - 4:
            raise ValueError(f"collaborative round: a part of {size} bytes in a "
                             f"{buf.numel() - 4}-byte buffer")  # fmt: skip
        decoded.append((segments, codec.decode(buf[4 : 4 + size], segments)))
    return _place(codec, decoded)
