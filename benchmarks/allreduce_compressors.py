"""The verdict on a compressed allreduce with any registered compressor: the result against the
ranks' inputs, each compression judged by its compressor's definition.

The algorithms return, per rank, the error-feedback residual of what that rank compressed
(docs/algorithms.md, "Error feedback"): ``v - decode(encode(v))`` for every value ``v`` it
compressed. Given every rank's input and residual and the result, :func:`verdict` replays the
algorithm's data flow (docs/algorithms.md: pieces, segments, chunks) and checks each compression
``v -> v - residual`` with :func:`benchmarks.compressor_checks.check` (the decoded values of
one message against its input, by the compressor's definition in docs/FORMAT.md):

- allgather-reduce (sparse and data-dependent sizes, or ``allgather``): each rank compresses its
  values once; the result is the sum of the W decoded messages;
- sum-reduce (random-k): the same, every rank carrying the same indices;
- SRA: for chunk ``j`` every other rank compresses its values, the owner ``j`` compresses its
  own values plus their decodes (the final payload: the result);
- ring: chunk ``j`` travels ranks ``j, j + 1, ...``: each compresses its values plus the decode
  it received, the last one the final payload;
- tree: each rank compresses its values plus its children's decodes; the root's is the result.

A final compression's input is read back as ``result + residual`` and must match the sum the
replay computes. Decoded values come back as ``v - residual`` in fp32, within an ulp of ``v`` of
the true decode (the checks' tolerances cover it; sign, threshold and sparse decodes come back
exactly, and values within 2^-21 of the magnitudes behind ``v`` as 0). SUM only, fp32 inputs.
The count returned is the elements of every message whose check failed, plus those where the
result is off the replayed sum.
"""

from __future__ import annotations

from typing import List, NamedTuple, Sequence, Tuple

import torch

from benchmarks.compressor_checks import check
from torch_cgx import compressors

__all__ = ["Verdict", "alignment", "messages", "path", "replay", "verdict"]


class Verdict(NamedTuple):
    wrong: int  # elements in messages that break a definition, or off the replayed sum
    detail: str  # the first failure, "" when none


def alignment(name: str, params: dict) -> int:
    """Chunk boundaries are multiples of this (csrc/compressors: the bucket, or the chunk)."""
    if name == "maxmin":
        return int(params["bucket_size"])
    if name == "sparseloco":
        return int(params["chunk"])
    if "bucket_size" in params:
        return max(1, int(params["bucket_size"]))
    return 1


def _sparse_flow(name: str) -> Tuple[bool, bool]:
    """(sums in transit, gathered whatever the algorithm) for ``name`` (payload.h)."""
    if name == "maxmin":
        return False, False
    t = compressors.get(name).traits
    return t["summable"] and t["sparse"] and t["fixed_size"], t["sparse"] or not t["fixed_size"]


def path(name: str, algorithm: str) -> str:
    """The data flow of ``name`` under ``algorithm`` (csrc/algorithms/allreduce.cc):
    "sum", "gather", "sra", "ring" or "tree"."""
    sums, gathered = _sparse_flow(name)
    if sums and algorithm != "allgather":
        return "sum"
    return "gather" if gathered or algorithm == "allgather" else algorithm


def _chunk(count: int, world: int, align: int, j: int) -> Tuple[int, int]:
    per = -(-count // world)
    size = -(-per // align) * align
    return min(count, size * j), min(count, size * (j + 1))


def messages(n: int, flow: str, align: int, fusion: int, segment: int,
             lanes: bool) -> List[Tuple[int, int]]:  # fmt: skip
    """(begin, end) of each message reduced on its own: pieces of ``fusion`` elements, cut in
    segments of ``segment`` elements (whole alignment units) by SRA's pipeline, and where
    ``lanes`` by the other algorithms' lanes when a piece is longer than a segment."""
    out = []
    for begin in range(0, n, fusion):
        count, seg = min(fusion, n - begin), min(fusion, n - begin)
        if segment > 0 and (flow == "sra" or (lanes and count > segment)):
            seg = max(1, segment // align) * align
        out += [(begin + s, begin + min(count, s + seg)) for s in range(0, count, seg)]
    return out


def _layout(name, params, algorithm, n, fusion, segment, pipeline_sparse=False):
    """(flow, alignment, messages) of the allreduce of n values (allreduce.cc, lanes.cc)."""
    flow, align = path(name, algorithm), alignment(name, params)
    lanes = pipeline_sparse if any(_sparse_flow(name)) else algorithm != "sra"
    return flow, align, messages(n, flow, align, fusion, segment, lanes)


class _Replay:
    def __init__(self, name, params, inputs, result, residuals):
        self.name, self.params = name, params
        self.x, self.z, self.res = inputs, result, residuals
        self.wrong, self.detail = 0, ""

    def fail(self, count: int, what: str) -> None:
        self.wrong += count
        self.detail = self.detail or what

    def judge(self, v: torch.Tensor, d: torch.Tensor, what: str) -> None:
        c = check(self.name, v, d, self.params)
        if not c.ok:
            self.fail(v.numel(), f"{what}: {c.detail}")

    def sent(self, r, v, lo, hi, what, scale=None) -> Tuple[torch.Tensor, torch.Tensor]:
        """The decode of rank r's compression of v (elements lo..hi; v replayed from terms
        whose magnitudes add up to scale), judged; and the magnitudes behind the decode."""
        res = self.res[r][lo:hi]
        d = v - res
        behind = (v.abs() if scale is None else scale) + res.abs()
        # A replayed sum is off the rank's by ulps of its terms: a decoded 0 comes back as such
        # an ulp, which no decode produces; read it as 0.
        d[d.abs() <= 2.0**-21 * behind] = 0
        self.judge(v, d, f"rank {r} {what} [{lo}, {hi})")
        return d, behind + d.abs()

    def final(self, r: int, s: torch.Tensor, scale: torch.Tensor, lo: int, hi: int) -> None:
        """Rank r's final compression: its input read back, against the replayed sum s."""
        z = self.z[lo:hi]
        v = z + self.res[r][lo:hi]
        off = (v - s).abs() > 2.0**-20 * (scale + z.abs() + self.res[r][lo:hi].abs()) + 1e-30
        if bool(off.any()):
            self.fail(int(off.sum()), f"rank {r} final [{lo}, {hi}): input off the replayed sum")
        self.judge(v, z, f"rank {r} final [{lo}, {hi})")

    def summed(self, decoded: Sequence[torch.Tensor], lo: int, hi: int) -> None:
        want, scale = torch.zeros(hi - lo), torch.zeros(hi - lo)
        for d in decoded:
            want += d
            scale += d.abs()
        off = (self.z[lo:hi] - want).abs() > 2.0**-20 * scale + 1e-30
        if bool(off.any()):
            self.fail(int(off.sum()), f"[{lo}, {hi}): result off the sum of the decodes")


def _sra(rp: _Replay, world: int, align: int, lo: int, hi: int) -> None:
    for j in range(world):
        a, b = _chunk(hi - lo, world, align, j)
        a, b = lo + a, lo + b
        if a == b:
            continue
        s, scale = rp.x[j][a:b].clone(), rp.x[j][a:b].abs()
        for q in range(world):
            if q != j:
                d, behind = rp.sent(q, rp.x[q][a:b], a, b, f"chunk {j}")
                s, scale = s + d, scale + behind
        rp.final(j, s, scale, a, b)


def _ring(rp: _Replay, world: int, align: int, lo: int, hi: int) -> None:
    for j in range(world):
        a, b = _chunk(hi - lo, world, align, j)
        a, b = lo + a, lo + b
        if a == b:
            continue
        p, scale = rp.x[j][a:b], rp.x[j][a:b].abs()
        for t in range(world - 1):
            d, behind = rp.sent((j + t) % world, p, a, b, f"chunk {j} hop {t}", scale)
            nxt = rp.x[(j + t + 1) % world][a:b]
            p, scale = nxt + d, nxt.abs() + behind
        rp.final((j + world - 1) % world, p, scale, a, b)


def _tree(rp: _Replay, world: int, lo: int, hi: int) -> None:
    decoded = {}
    for r in reversed(range(world)):  # children (higher ranks) first
        p, scale = rp.x[r][lo:hi].clone(), rp.x[r][lo:hi].abs()
        span, mask = world if r == 0 else r & -r, 1
        while mask < span and r + mask < world:
            d, behind = decoded.pop(r + mask)
            p, scale, mask = p + d, scale + behind, mask * 2
        if r:
            decoded[r] = rp.sent(r, p, lo, hi, "partial sum", scale)
        else:
            rp.final(0, p, scale, lo, hi)


def verdict(name: str, params: dict, inputs: Sequence[torch.Tensor], result: torch.Tensor,
            residuals: Sequence[torch.Tensor], algorithm: str = "sra", *, fusion: int = 1 << 24,
            segment: int = 1 << 20, pipeline_sparse: bool = False) -> Verdict:  # fmt: skip
    """Judges the allreduce (SUM) of ``inputs`` (one fp32 tensor per rank) that gave ``result``
    and the per-rank ``residuals`` with compressor ``name`` (all its ``params``) under
    ``algorithm``; ``fusion`` and ``segment`` in elements (the backend's fusion buffer and
    pipeline segment: 64 MiB and 4 MiB of fp32 by default)."""
    world = len(inputs)
    flat = [t.reshape(-1).float() for t in inputs]
    rp = _Replay(name, params, flat, result.reshape(-1).float(), [r.reshape(-1) for r in residuals])
    flow, align, msgs = _layout(name, params, algorithm, flat[0].numel(), fusion, segment,
                                pipeline_sparse)  # fmt: skip
    for lo, hi in msgs:
        if flow in ("sum", "gather"):
            decoded = [rp.sent(r, flat[r][lo:hi], lo, hi, "message")[0] for r in range(world)]
            if flow == "sum" and not all(torch.equal(d != 0, decoded[0] != 0) for d in decoded):
                rp.fail(hi - lo, f"[{lo}, {hi}): the ranks carried different indices")
            rp.summed(decoded, lo, hi)
        elif flow == "sra":
            _sra(rp, world, align, lo, hi)
        elif flow == "ring":
            _ring(rp, world, align, lo, hi)
        else:
            _tree(rp, world, lo, hi)
    return Verdict(rp.wrong, rp.detail)


def replay(name: str, params: dict, inputs: Sequence[torch.Tensor], algorithm: str = "sra", *,
           fusion: int = 1 << 24, segment: int = 1 << 20) -> torch.Tensor:  # fmt: skip
    """The result of the allreduce (SUM) of ``inputs`` with a compressor whose payload does not
    depend on the random streams (not terngrad, qsgd, randomk, dgc, graddrop; max-min with
    nearest rounding): each compression replayed with ``compressors.get(name, **params)``,
    summed in fp32 in the algorithm's order (docs/algorithms.md)."""
    c = compressors.get(name, **params)
    rt = lambda v: c.decode(c.encode(v.contiguous()))  # noqa: E731
    x = [t.reshape(-1).float() for t in inputs]
    world, out = len(x), torch.zeros(x[0].numel())
    flow, align, msgs = _layout(name, params, algorithm, x[0].numel(), fusion, segment)
    for lo, hi in msgs:
        if flow in ("sum", "gather"):
            for r in range(world):
                out[lo:hi] += rt(x[r][lo:hi])
        elif flow == "tree":
            acc = [t[lo:hi].clone() for t in x]
            for r in reversed(range(world)):
                mask = 1
                while mask < (world if r == 0 else r & -r) and r + mask < world:
                    acc[r] += rt(acc[r + mask])
                    mask *= 2
            out[lo:hi] = rt(acc[0])
        else:
            for j in range(world):
                a, b = (lo + e for e in _chunk(hi - lo, world, align, j))
                if a == b:
                    continue
                acc = x[j][a:b].clone()
                if flow == "ring":
                    for t in range(1, world):
                        acc = x[(j + t) % world][a:b] + rt(acc)
                else:
                    for q in range(world):
                        if q != j:
                            acc += rt(x[q][a:b])
                out[a:b] = rt(acc)
    return out
