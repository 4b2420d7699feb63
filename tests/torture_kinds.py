"""The collectives of tests/torture_ops.py, one function per kind: (torture, op index, label,
size, dtype, op). Each issues the call on every rank, then checks this rank's result."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torture_ops import CODEC, REDUCE_OPS, make_input


def _reducible(dtype, op):
    # Gloo has no AVG (the cgx backend sums and divides); products of fp16 overflow: ints only.
    return not (op == "product" and dtype.is_floating_point)


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


def all_reduce_async(t, i, what, n, dtype, op):
    batches = [t.inputs(i * 7 + k, n, dtype, small_ints=op == "product") for k in range(3)]
    gots = [xs[t.rank].clone() for xs in batches]
    works = [dist.all_reduce(g, op=REDUCE_OPS[op], async_op=True) for g in gots]
    for w in works:
        w.wait()
    for xs, got in zip(batches, gots):
        t.check_sum(i, what, got, xs, op, None, t.compressed(None, n, dtype, op))


def coalesced(t, i, what, n, dtype, op):
    if op not in ("sum", "avg") or not dtype.is_floating_point:
        op = "sum"
    a, b = t.inputs(i, n, dtype), t.inputs(i + 500_000, n + 3, dtype)
    ga, gb = a[t.rank].clone(), b[t.rank].clone()
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(ga, op=REDUCE_OPS[op])
        dist.all_reduce(gb, op=REDUCE_OPS[op])
    cm.wait()
    fused = [torch.cat([x, y]) for x, y in zip(a, b)]  # reduced as one piece
    got = torch.cat([ga, gb])
    t.check_sum(i, what, got, fused, op, None, t.compressed(None, 2 * n + 3, dtype, op))


def _scatter_check(t, i, what, n, dtype, op, got, xs):
    """got: this rank's chunk of the reduce-scatter of xs (each W * n values)."""
    from torture_ops import EPS

    chunks = [x.view(t.world, n)[t.rank] for x in xs]
    compressed = t.compressed(None, n, dtype, op)
    if not compressed:
        t.check_sum(i, what, got, chunks, op)
        return
    bits, bucket, _ = t.settings[None]
    exact = sum(c.double() for c in chunks) / (t.world if op == "avg" else 1)
    bound = torch.zeros(n, dtype=torch.float64)
    for j, c in enumerate(chunks):
        if j == t.rank:
            continue
        pad = -(-n // bucket) * bucket - n
        b = torch.cat([c.double(), c.double()[-1:].expand(pad)]).view(-1, bucket)
        step = (b.max(1).values - b.min(1).values) / (2**bits - 1)
        bound += (step / 2).repeat_interleave(bucket)[:n]
    eps = EPS[dtype]
    tol = bound / (t.world if op == "avg" else 1) + eps * exact.abs() * 4 + 1e-30
    err = (got.double() - exact).abs()
    if not (err <= tol * 1.0001).all():
        t.fail(i, what, f"compressed reduce-scatter error {float(err.max()):.3g} over bound")
    t.checked["compressed"] += 1


def reduce_scatter_tensor(t, i, what, n, dtype, op):
    if not _reducible(dtype, op):
        op = "sum"
    xs = t.inputs(i, t.world * n, dtype, small_ints=op == "product")
    got = torch.empty(n, dtype=dtype)
    dist.reduce_scatter_tensor(got, xs[t.rank].clone(), op=REDUCE_OPS[op])
    _scatter_check(t, i, what, n, dtype, op, got, xs)


def reduce_scatter(t, i, what, n, dtype, op):
    if not _reducible(dtype, op):
        op = "sum"
    xs = t.inputs(i, t.world * n, dtype, small_ints=op == "product")
    got = torch.empty(n, dtype=dtype)
    dist.reduce_scatter(got, list(xs[t.rank].clone().view(t.world, n).unbind(0)),
                        op=REDUCE_OPS[op])  # fmt: skip
    _scatter_check(t, i, what, n, dtype, op, got, xs)


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


def broadcast(t, i, what, n, dtype, op):
    src = t.rng.randrange(t.world)
    xs = t.inputs(i, n, dtype)
    got = xs[t.rank].clone()
    dist.broadcast(got, src=src)
    _moved(t, i, what, got, xs[src])


def reduce(t, i, what, n, dtype, op):
    if op == "avg" or not _reducible(dtype, op):
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
    xs = t.inputs(i, t.world * n, dtype)
    got = torch.empty(t.world * n, dtype=dtype)
    dist.all_to_all_single(got, xs[t.rank].clone())
    want = torch.cat([x.view(t.world, n)[t.rank] for x in xs]) if n else got
    _moved(t, i, what, got, want)


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
