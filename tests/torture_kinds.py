"""The collectives of tests/torture_ops.py, one function per kind: (torture, op index, label,
size, dtype, op). Each issues the call on every rank, then checks this rank's result."""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from torture_ops import CODEC, REDUCE_OPS, make_input


def all_reduce(t, i, what, n, dtype, op, group=None, xs=None):
    ranks = [0, 1] if group is not None and t.rank < 2 else [2, 3] if group is not None else None
    xs = xs or t.inputs(i, n, dtype, ranks, small_ints=op == "product")
    mine = xs[ranks.index(t.rank)] if ranks else xs[t.rank]
    got = mine.clone()
    dist.all_reduce(got, op=REDUCE_OPS[op], group=group)
    compressed = t.compressed(group, n, dtype, op)
    t.check_sum(i, what, got, xs, op, group, compressed)
    if compressed:
        t.same_everywhere(i, what, got, group)


def sub_all_reduce(t, i, what, n, dtype, op):
    all_reduce(t, i, what, n, dtype, op, group=t.pair)


def codec_all_reduce(t, i, what, n, dtype, op):
    all_reduce(t, i, what, n, dtype, op)  # the codec's dtypes with SUM / AVG (KINDS twice)


def all_reduce_async(t, i, what, n, dtype, op):
    """Three at once; a forwarded broadcast and, sometimes, new settings while they are in flight
    (each call keeps the settings it was issued with)."""
    issued, compressed = t.settings[None], t.compressed(None, n, dtype, op)
    batches = [t.inputs(i * 7 + k, n, dtype, small_ints=op == "product") for k in range(3)]
    gots = [xs[t.rank].clone() for xs in batches]
    works = [dist.all_reduce(g, op=REDUCE_OPS[op], async_op=True) for g in gots]
    broadcast(t, i, what + " (between async calls and their wait)", n, dtype, op)
    t.maybe_reconfigure(None)
    later, t.settings[None] = t.settings[None], issued
    for w in works:
        w.wait()
    for xs, got in zip(batches, gots):
        t.check_sum(i, what, got, xs, op, None, compressed)
        if compressed:
            t.same_everywhere(i, what, got)
    t.settings[None] = later


def _fused_check(t, i, what, op, got, parts):
    """got: the concatenated results of a fused call over `parts` (per tensor: every rank's
    input), reduced as one piece: compressed, identical everywhere."""
    fused = [torch.cat(xs) for xs in zip(*parts)]
    compressed = t.compressed(None, got.numel(), got.dtype, op)
    t.check_sum(i, what, got, fused, op, None, compressed)
    if compressed:
        t.same_everywhere(i, what, got)


def coalesced(t, i, what, n, dtype, op):
    if op not in ("sum", "avg") or not dtype.is_floating_point:
        op = "sum"
    a, b = t.inputs(i, n, dtype), t.inputs(i + 500_000, n + 3, dtype)
    ga, gb = a[t.rank].clone(), b[t.rank].clone()
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(ga, op=REDUCE_OPS[op])
        dist.all_reduce(gb, op=REDUCE_OPS[op])
    cm.wait()
    _fused_check(t, i, what, op, torch.cat([ga, gb]), [a, b])


def all_reduce_coalesced(t, i, what, n, dtype, op):
    """The deprecated list call (any op): one fused piece of a vector and a 3 x 2 matrix."""
    a = t.inputs(i, n, dtype, small_ints=op == "product")
    b = t.inputs(i + 500_000, 6, dtype, small_ints=op == "product")
    ts = [a[t.rank].clone(), b[t.rank].clone().view(3, 2)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        dist.all_reduce_coalesced(ts, op=REDUCE_OPS[op])
    _fused_check(t, i, what, op, torch.cat([ts[0], ts[1].reshape(-1)]), [a, b])


def _scatter_check(t, i, what, n, dtype, op, got, xs):
    """got: this rank's chunk of the reduce-scatter of xs (each W * n values). Compressed: the
    one-shot bound (docs/algorithms.md), each other rank's chunk quantized once (half a step,
    plus the fp32 rounding of encoding and decoding, a few ulps of the bucket's magnitude), then
    W fp32 additions (of up to sum |x|) and the rounding to the dtype."""
    from torture_ops import EPS

    chunks = [x.view(t.world, n)[t.rank] for x in xs]
    compressed = t.compressed(None, n, dtype, op)
    if not compressed:
        t.check_sum(i, what, got, chunks, op)
        return
    bits, bucket, _, stochastic, _ = t.settings[None]  # stochastic rounding: a whole step
    div, eps32 = (t.world if op == "avg" else 1), EPS[torch.float32]
    exact = sum(c.double() for c in chunks) / div
    bound = t.world * eps32 * sum(c.double().abs() for c in chunks)
    for j, c in enumerate(chunks):
        if j == t.rank:
            continue
        pad = -(-n // bucket) * bucket - n
        b = torch.cat([c.double(), c.double()[-1:].expand(pad)]).view(-1, bucket)
        hi, lo = b.max(1).values, b.min(1).values
        mag = torch.maximum(hi.abs(), lo.abs())
        per = (hi - lo) / (2**bits - 1) / (1 if stochastic else 2) + 4 * eps32 * mag
        bound += per.repeat_interleave(bucket)[:n]
    tol = bound / div + EPS[dtype] * exact.abs() + 1e-30
    err = (got.double() - exact).abs()
    if not (err <= tol * 1.0001).all():
        at = int((err - tol).argmax())
        t.fail(i, what, f"compressed reduce-scatter error {float(err[at]):.3g} over the bound "
                        f"{float(tol[at]):.3g} at {at}")  # fmt: skip
    t.checked["compressed"] += 1


def reduce_scatter_tensor(t, i, what, n, dtype, op):
    xs = t.inputs(i, t.world * n, dtype, small_ints=op == "product")
    got = torch.empty(n, dtype=dtype)
    dist.reduce_scatter_tensor(got, xs[t.rank].clone(), op=REDUCE_OPS[op])
    _scatter_check(t, i, what, n, dtype, op, got, xs)


def reduce_scatter(t, i, what, n, dtype, op):
    xs = t.inputs(i, t.world * n, dtype, small_ints=op == "product")
    got = torch.empty(n, dtype=dtype)
    dist.reduce_scatter(got, list(xs[t.rank].clone().view(t.world, n).unbind(0)),
                        op=REDUCE_OPS[op])  # fmt: skip
    _scatter_check(t, i, what, n, dtype, op, got, xs)


def reduce_scatter_coalesced(t, i, what, n, dtype, op):
    """Two reduce_scatter_tensor calls under the coalescing manager: one fused reduce-scatter
    whose chunk of rank r is the concatenation of r's chunks of both inputs."""
    sizes = (n, n + 2)
    parts = [t.inputs(i + 500_000 * k, t.world * m, dtype, small_ints=op == "product")
             for k, m in enumerate(sizes)]  # fmt: skip
    outs = [torch.empty(m, dtype=dtype) for m in sizes]
    with dist._coalescing_manager(async_ops=True) as cm:
        for out, xs in zip(outs, parts):
            dist.reduce_scatter_tensor(out, xs[t.rank].clone(), op=REDUCE_OPS[op])
    cm.wait()
    fused = [torch.cat([xs[r].view(t.world, m) for xs, m in zip(parts, sizes)], 1).reshape(-1)
             for r in range(t.world)]  # fmt: skip
    _scatter_check(t, i, what, sum(sizes), dtype, op, torch.cat(outs), fused)


def _moved(t, i, what, got, want):
    if not torch.equal(got, want):
        t.fail(i, what, "data movement is not exact")
    t.checked["exact"] += 1


def all_gather_into_tensor(t, i, what, n, dtype, op):
    xs = t.inputs(i, n, dtype)
    got = torch.empty(t.world * n, dtype=dtype)
    dist.all_gather_into_tensor(got, xs[t.rank].clone())
    _moved(t, i, what, got, torch.cat(xs))


def all_gather(t, i, what, n, dtype, op):
    xs = t.inputs(i, n, dtype)
    got = [torch.empty(n, dtype=dtype) for _ in range(t.world)]
    dist.all_gather(got, xs[t.rank].clone())
    _moved(t, i, what, torch.cat(got), torch.cat(xs))


def all_gather_coalesced(t, i, what, n, dtype, op):
    a, b = t.inputs(i, n, dtype), t.inputs(i + 500_000, n + 2, dtype)
    ga, gb = torch.empty(t.world * n, dtype=dtype), torch.empty(t.world * (n + 2), dtype=dtype)
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_gather_into_tensor(ga, a[t.rank].clone())
        dist.all_gather_into_tensor(gb, b[t.rank].clone())
    cm.wait()
    _moved(t, i, what, torch.cat([ga, gb]), torch.cat(a + b))


def broadcast(t, i, what, n, dtype, op):
    src = t.rng.randrange(t.world)
    xs = t.inputs(i, n, dtype)
    got = xs[t.rank].clone()
    dist.broadcast(got, src=src)
    _moved(t, i, what, got, xs[src])


def reduce(t, i, what, n, dtype, op):
    if op == "avg":
        op = "sum"  # torch has no AVG reduce on Gloo
    dst = t.rng.randrange(t.world)
    xs = t.inputs(i, n, dtype, small_ints=op == "product")
    got = xs[t.rank].clone()
    dist.reduce(got, dst=dst, op=REDUCE_OPS[op])
    if t.rank == dst:
        t.check_sum(i, what, got, xs, op)


def gather(t, i, what, n, dtype, op):
    dst = t.rng.randrange(t.world)
    xs = t.inputs(i, n, dtype)
    got = [torch.empty(n, dtype=dtype) for _ in range(t.world)] if t.rank == dst else None
    dist.gather(xs[t.rank].clone(), gather_list=got, dst=dst)
    if t.rank == dst:
        _moved(t, i, what, torch.cat(got), torch.cat(xs))


def scatter(t, i, what, n, dtype, op):
    src = t.rng.randrange(t.world)
    parts = [make_input(t.seed, i, 100 + j, n, dtype) for j in range(t.world)]
    got = torch.empty(n, dtype=dtype)
    dist.scatter(got, scatter_list=[p.clone() for p in parts] if t.rank == src else None, src=src)
    _moved(t, i, what, got, parts[t.rank])


def all_to_all_single(t, i, what, n, dtype, op):
    """Even splits, or (half of the time) uneven ones: rank a sends sizes[a][b] values to b."""
    w = t.world
    if t.rng.random() < 0.5:
        sizes = [[n] * w for _ in range(w)]
    else:
        sizes = [[t.rng.randrange(min(n, 40) + 1) for _ in range(w)] for _ in range(w)]
    xs = [make_input(t.seed, i, r, sum(sizes[r]), dtype) for r in range(w)]
    sent = [list(x.split(row)) for x, row in zip(xs, sizes)]  # sent[a][b]: from a to b
    got = torch.empty(sum(sizes[a][t.rank] for a in range(w)), dtype=dtype)
    dist.all_to_all_single(got, xs[t.rank].clone(), [sizes[a][t.rank] for a in range(w)],
                           sizes[t.rank])  # fmt: skip
    _moved(t, i, what, got, torch.cat([sent[a][t.rank] for a in range(w)]))


def all_to_all(t, i, what, n, dtype, op):
    """The list form (Gloo's needs every tensor of one size)."""
    xs = t.inputs(i, t.world * n, dtype)
    got = [torch.empty(n, dtype=dtype) for _ in range(t.world)]
    dist.all_to_all(got, [c.clone() for c in xs[t.rank].view(t.world, n).unbind(0)])
    _moved(t, i, what, torch.cat(got), torch.cat([x.view(t.world, n)[t.rank] for x in xs]))


def barrier(t, i, what, n, dtype, op):
    dist.barrier()


def send_recv(t, i, what, n, dtype, op):
    xs = t.inputs(i, n, dtype)
    to, frm = (t.rank + 1) % t.world, (t.rank - 1) % t.world
    got = torch.empty(n, dtype=dtype)
    reqs = [dist.isend(xs[t.rank].clone(), to), dist.irecv(got, frm)]
    for r in reqs:
        r.wait()
    _moved(t, i, what, got, xs[frm])


KIND_FUNCTIONS = {name: fn for name, fn in globals().items() if callable(fn) and not
                  name.startswith("_") and name not in ("make_input",)}  # fmt: skip
assert set(CODEC) and set(KIND_FUNCTIONS) >= {"all_reduce", "send_recv"}
