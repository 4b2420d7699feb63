"""One round's traffic over a torchft Manager's process group: the header table and the
sample-weighted average of per-tensor compressed tensors.

A round is two all-gathers over the quorum (Gloo on CPU), each an all-to-all of the same
tensor (:func:`everyone`: one latency, not the ring's W - 1): a header of float64
``(samples, rate, batch size, payload bytes)`` per peer, then (when averaging by whole payloads)
every peer's payload padded to the largest.
A payload is the peer's tensors, each compressed by the object its policy chooses for it
(``resolve(policy, CompressionInfo(key=index, role=...))``, hivemind's per-tensor policies
included), each as ``u32 length + Payload.to_bytes()``. Every peer decodes the contributors'
payloads in rank order and forms ``sum_i (n_i * x_i) / sum_i n_i`` on the host, each product
and sum a separate IEEE operation (no fused multiply-add): the same bytes on every peer,
whatever its CPU.
"""

from __future__ import annotations

import struct
from typing import List, Optional, Sequence, Tuple

import torch

from torch_cgx.compression import (
    CompressionBase,
    CompressionInfo,
    NoCompression,
    Payload,
    TensorRole,
    extract,
    resolve,
)
from torch_cgx.compression.base import TensorDescriptor
from torch_cgx.diloco.managed import _process_group, _rank

__all__ = ["Codec", "average", "everyone", "gather_round", "is_biased", "is_fixed_size"]

_LEN = struct.Struct("<I")


def is_biased(leaf: CompressionBase) -> bool:
    """Whether ``leaf`` leaves a systematic error that error feedback should carry: every
    compressor but the exact one, fp16 (one rounding to nearest) and the unbiased stochastic
    compressors of the registry."""
    from torch_cgx.compression import Float16Compression, ScaledFloat16Compression
    from torch_cgx.compression.registered import CGXCompression

    if isinstance(leaf, (NoCompression, Float16Compression, ScaledFloat16Compression)):
        return False
    if isinstance(leaf, CGXCompression):
        return bool(leaf.codec_for(0).traits.get("biased", True))
    return True


def is_fixed_size(leaf: CompressionBase) -> bool:
    """Whether ``leaf``'s payload size depends on the values' count alone (so an averaged part
    re-encodes to the size its contributors sent): exact, fp16 and the registry's fixed-size
    compressors; any other is assumed to depend on the data."""
    from torch_cgx.compression import Float16Compression, ScaledFloat16Compression
    from torch_cgx.compression.registered import CGXCompression

    if type(leaf) in (NoCompression, Float16Compression, ScaledFloat16Compression):
        return True  # the classes themselves: a subclass may compress otherwise
    if type(leaf) is CGXCompression:
        return bool(leaf.codec_for(0).traits.get("fixed_size", False))
    return False


class Codec:
    """The compression of each tensor of a list (shapes fixed at construction)."""

    def __init__(self, policy: Optional[CompressionBase], shapes, role: TensorRole) -> None:
        policy = NoCompression() if policy is None else policy
        if not isinstance(policy, CompressionBase):
            raise ValueError(
                f"compression must be a torch_cgx.compression object (Float16Compression(), "
                f"SizeAdaptiveCompression(...), CGXCompression('maxmin', bits=4), ...) or None, "
                f"got {policy!r}"
            )
        self.shapes = [tuple(s) for s in shapes]
        self.leaves = [
            resolve(policy, CompressionInfo(i, TensorDescriptor(s, torch.float32), role))
            for i, s in enumerate(self.shapes)
        ]
        self.biased = [is_biased(leaf) for leaf in self.leaves]
        self.fixed_size = all(is_fixed_size(leaf) for leaf in self.leaves)

    def whole(self) -> List[Tuple[int, int, int]]:
        """Every tensor as one segment ``(tensor, start, end)``."""
        return [(i, 0, int(torch.Size(s).numel())) for i, s in enumerate(self.shapes)]

    def encode(self, tensors: Sequence[torch.Tensor], segments=None) -> torch.Tensor:
        """``segments`` (default: every tensor whole) of the flat ``tensors``, each compressed
        by its tensor's object (a whole tensor in its shape, a part of one flat)."""
        segments = self.whole() if segments is None else segments
        return self.encode_pieces([tensors[i].reshape(-1)[a:b] for i, a, b in segments], segments)

    def encode_pieces(self, pieces: Sequence[torch.Tensor], segments) -> torch.Tensor:
        """The payload of ``pieces``, the values of ``segments`` one by one."""
        parts = []
        for (i, start, end), x in zip(segments, pieces):
            info = CompressionInfo(i, TensorDescriptor(self.shapes[i], torch.float32))
            if end - start == int(torch.Size(self.shapes[i]).numel()):
                x = x.reshape(self.shapes[i])
            blob = self.leaves[i].compress(x, info).to_bytes()
            parts += [_LEN.pack(len(blob)), blob]
        data = b"".join(parts)
        return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else _empty()

    def decode(self, payload: torch.Tensor, segments=None) -> List[torch.Tensor]:
        """The flat fp32 values of each segment of ``payload``; ValueError when it is
        truncated, corrupted or of other sizes."""
        raw = payload.numpy().tobytes()
        out, pos = [], 0
        for i, start, end in self.whole() if segments is None else segments:
            if pos + 4 > len(raw):
                raise ValueError(f"collaborative payload truncated at tensor {i}")
            (size,) = _LEN.unpack_from(raw, pos)
            if pos + 4 + size > len(raw):
                raise ValueError(f"collaborative payload truncated in tensor {i}")
            x = extract(Payload.from_bytes(raw[pos + 4 : pos + 4 + size]))
            if x.numel() != end - start:
                raise ValueError(f"collaborative payload: tensor {i} has {x.numel()} values "
                                 f"where {end - start} were expected")  # fmt: skip
            out.append(x.detach().to(torch.float32).reshape(-1))
            pos += 4 + size
        if pos != len(raw):
            raise ValueError(f"collaborative payload: {len(raw) - pos} bytes past its tensors")
        return out


def _empty() -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8)


def everyone(pg, tensor: torch.Tensor, world: int) -> List[torch.Tensor]:
    """Every peer's ``tensor`` (the same size everywhere), each sent straight to every peer
    (an all-to-all: one latency, where Gloo's ring all-gather takes W - 1 in a row)."""
    from torch.distributed.distributed_c10d import AllToAllOptions

    flat = tensor.reshape(-1)
    out = torch.empty(world * flat.numel(), dtype=flat.dtype)
    splits = [flat.numel()] * world
    pg.alltoall_base(out, flat.repeat(world), splits, splits, AllToAllOptions()).wait()
    return list(torch.split(out, flat.numel()))


def gather_round(manager, header: Sequence[float], payload: Optional[torch.Tensor]):
    """Header rows of every peer of the quorum (rank order) and their payloads (None where a
    peer sent none). Raises what the process group raises (a peer gone, a timeout)."""
    pg = _process_group(manager)
    world = pg.size()
    rows = everyone(pg, torch.tensor(list(header), dtype=torch.float64), world)
    table = [tuple(r.tolist()) for r in rows]
    longest = int(max(row[3] for row in table))
    if longest == 0:
        return table, [None] * world, 0
    wire = torch.zeros(longest, dtype=torch.uint8)
    if payload is not None:
        wire[: payload.numel()] = payload
    parts = everyone(pg, wire, world)
    payloads = [p[: int(row[3])] if row[3] > 0 else None for p, row in zip(parts, table)]
    return table, payloads, longest * (world - 1)


def rank_of(manager) -> int:
    return _rank(_process_group(manager))


def average(codec: Codec, table, payloads, segments=None):
    """``(the sample-weighted average of the contributors' values of each segment (default:
    every tensor whole), the total samples)``; None for the average when nobody contributed.
    Rank order, each product and sum a separate IEEE operation: the same bytes everywhere."""
    segments = codec.whole() if segments is None else segments
    total = sum(int(row[0]) for row in table)
    if total == 0:
        return None, 0
    acc = [torch.zeros(end - start, dtype=torch.float32) for _, start, end in segments]
    for row, payload in zip(table, payloads):
        samples = int(row[0])
        if samples == 0:
            continue
        if payload is None or (payload.numel() == 0 and segments):
            raise ValueError("collaborative round: a peer reported samples without a payload")
        for a, x in zip(acc, codec.decode(payload, segments)):
            a.add_(x.mul_(float(samples)))  # two roundings, each IEEE: no fused multiply-add
    for a in acc:
        a.div_(float(total))
    return acc, total
