"""Torture: every rank issues the same random sequence of collectives on a cgx group (every
collective the backend serves, sync and async, random dtypes, sizes 0, 1 and odd primes, ops,
subgroups; compressed and forwarded interleaved by changing the settings between calls). Each
rank's inputs are a pure function of (seed, op index, rank), so every rank computes the exact
reference locally; exact results must match it (bit for bit for data movement and integers,
within fp reordering for float sums), compressed ones must lie within their bound, and
compressed allreduces must be bit-identical on every rank. A failure names the seed and the op.

Long run:   python tests/torture_ops.py --ops 5000 --seed 7     (4 ranks, spawned here)
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import sys
import time

import torch
import torch.distributed as dist

PRIMES = [2, 3, 5, 7, 13, 31, 97, 101, 509, 997, 4099, 10007, 65537, 99991]
SIZES = [0, 1, *PRIMES]
FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
CODEC = (torch.float32, torch.float16, torch.bfloat16)
INTS = [torch.int32, torch.int64]
KINDS = [
    "all_reduce", "all_reduce_async", "coalesced", "reduce_scatter_tensor", "reduce_scatter",
    "all_gather_into_tensor", "all_gather", "broadcast", "reduce", "gather", "scatter",
    "all_to_all_single", "barrier", "send_recv", "sub_all_reduce",
    # the codec's dtypes with SUM / AVG (compressed whenever the settings are), the deprecated
    # all_reduce_coalesced, the coalescing manager's reduce-scatters and all-gathers, all_to_all
    "codec_all_reduce", "codec_all_reduce", "codec_all_reduce", "all_reduce_coalesced",
    "reduce_scatter_coalesced", "all_gather_coalesced", "all_to_all",
]  # fmt: skip
EPS = {torch.float32: 2.0**-23, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7,
       torch.float64: 2.0**-52}  # fmt: skip


def make_input(seed: int, i: int, rank: int, n: int, dtype, small_ints: bool = False):
    """Normal values at a random scale; `small_ints` (for PRODUCT): integers in [-3, 3], floats
    of magnitude in [0.5, 2] with random signs (a product of W of them cannot overflow fp16)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + i * 1009 + rank)
    if dtype.is_floating_point and small_ints:
        mag = 0.5 + 1.5 * torch.rand(n, generator=g, dtype=torch.float64)
        return (mag * (torch.randint(0, 2, (n,), generator=g) * 2 - 1)).to(dtype)
    if dtype.is_floating_point:
        scale = 1 + torch.rand(1, generator=g).item() * 10
        return (torch.randn(n, generator=g, dtype=torch.float64) * scale).to(dtype)
    lo, hi = (-3, 4) if small_ints else (-1000, 1000)
    return torch.randint(lo, hi, (n,), generator=g, dtype=dtype)


def reference(exact: torch.Tensor, op: str) -> torch.Tensor:
    """The reduction over dim 0 (ranks) of fp64 inputs, in fp64 (integers: exact)."""
    if op in ("sum", "avg"):
        return exact.sum(0) / (exact.shape[0] if op == "avg" else 1)
    if op == "max":
        return exact.max(0).values
    if op == "min":
        return exact.min(0).values
    return exact.prod(0)


def pair_reference(xs, op: str) -> torch.Tensor:
    """Two ranks' exact float result as the backend computes it: one operation in the dtype
    (fp16 / bf16 in fp32, then rounded), AVG dividing the sum by 2 afterwards."""
    dtype = xs[0].dtype
    wide = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    a, b = xs[0].to(wide), xs[1].to(wide)
    r = a * b if op == "product" else a + b
    return (r / 2 if op == "avg" else r).to(dtype)


class Torture:
    def __init__(self, seed: int, rank: int, world: int):
        import torch_cgx

        self.cgx = torch_cgx
        self.seed, self.rank, self.world = seed, rank, world
        self.rng = random.Random(seed)  # the same choices on every rank
        self.gloo = dist.new_group(backend="gloo")
        pairs = [dist.new_group([0, 1], backend="cgx"), dist.new_group([2, 3], backend="cgx")]
        gloos = [dist.new_group([0, 1], backend="gloo"), dist.new_group([2, 3], backend="gloo")]
        self.pair, self.pair_gloo = pairs[rank // 2], gloos[rank // 2]
        # (bits, bucket size, algorithm, stochastic rounding, raw incomplete buckets) per group
        self.settings = {g: (32, 512, "sra", False, False) for g in (None, self.pair)}
        self.checked = {"compressed": 0, "exact": 0}

    # ---- helpers ----
    def fail(self, i, what, msg):
        raise AssertionError(f"torture seed {self.seed}, op {i} ({what}): {msg}")

    def inputs(self, i, n, dtype, ranks=None, small_ints=False):
        ranks = range(self.world) if ranks is None else ranks
        return [make_input(self.seed, i, r, n, dtype, small_ints) for r in ranks]

    def maybe_reconfigure(self, group):
        """Before 30 % of the calls: new settings (the same on every rank: one shared rng)."""
        if self.rng.random() < 0.3:
            bits = self.rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 32, 32, 32])
            bucket = self.rng.choice([64, 128, 512, 1000])
            alg = self.rng.choice(["sra", "ring", "tree", "allgather"])
            stochastic, skip = self.rng.random() < 0.2, self.rng.random() < 0.2
            self.cgx.set_config(group, bits=bits, bucket_size=bucket, algorithm=alg,
                                stochastic=stochastic, skip_incomplete_buckets=skip)  # fmt: skip
            self.settings[group] = (bits, bucket, alg, stochastic, skip)

    def compressed(self, group, n, dtype, op):
        bits = self.settings[group][0]
        return bits <= 8 and dtype in CODEC and op in ("sum", "avg") and n >= 16

    def same_everywhere(self, i, what, t, group=None):
        copies = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
        dist.all_gather(copies, t, group=self.gloo if group is None else self.pair_gloo)
        if not all(torch.equal(c, copies[0]) for c in copies):
            self.fail(i, what, "results differ between ranks")

    def check_sum(self, i, what, got, xs, op, group=None, compressed=False):
        """got: this rank's result of reducing xs (the group's inputs) with op. Integers, MAX and
        MIN, and two ranks' exact float results (one addition or product, whose order cannot
        vary) bit for bit; more ranks' float results within the rounding of any order."""
        w = len(xs)
        exact = torch.stack([x.double() for x in xs])
        ref = reference(exact, op)
        if not got.dtype.is_floating_point or op in ("max", "min"):
            if not torch.equal(got.double(), ref):
                self.fail(i, what, f"exact {op} differs from the reference")
            self.checked["exact"] += 1
            return
        if w == 2 and not compressed:
            if not torch.equal(got, pair_reference(xs, op)):
                self.fail(i, what, f"two ranks' exact {op} is not bit-exact")
            self.checked["exact"] += 1
            return
        eps = EPS[got.dtype]
        if op == "product":  # w - 1 roundings of the running product, one of the result
            tol = (w + 1) * eps * ref.abs() + 1e-300
        else:
            tol = w * eps * exact.abs().sum(0) + eps * ref.abs() + 1e-300
        if compressed:
            from torch_cgx.bounds import allreduce_error_bound

            bits, bucket, alg, stochastic, _ = self.settings[group]
            tol = tol + allreduce_error_bound(xs, bits, bucket, alg, op == "avg", dtype=got.dtype,
                                              stochastic=stochastic)  # fmt: skip
        err = (got.double() - ref).abs()
        if not (err <= tol * 1.0001).all():
            worst = int((err - tol).argmax())
            self.fail(i, what, f"error {float(err[worst]):.3g} > bound {float(tol[worst]):.3g} "
                               f"at {worst} (compressed={compressed})")  # fmt: skip
        self.checked["compressed" if compressed else "exact"] += 1

    def pick(self, kinds=KINDS):
        kind, n = self.rng.choice(kinds), self.rng.choice(SIZES)
        dtype = self.rng.choice(FLOATS + INTS)
        if kind == "codec_all_reduce":  # compressible, unless the settings say bits 32
            dtype, n = self.rng.choice(CODEC), self.rng.choice([p for p in PRIMES if p > 16])
        ops = ["sum", "max", "min", "product"]
        if dtype.is_floating_point:
            ops += ["sum", "avg", "avg"]  # SUM and AVG (the compressible ops) half of the time
        if kind == "codec_all_reduce":
            ops = ["sum", "avg"]
        return kind, n, dtype, self.rng.choice(ops)

    # ---- one op ----
    def run(self, i: int) -> str:
        kind, n, dtype, op = self.pick()
        if kind == "sub_all_reduce":
            self.maybe_reconfigure(self.pair)
        else:
            self.maybe_reconfigure(None)
        group = self.pair if kind == "sub_all_reduce" else None
        what = f"{kind} n={n} {dtype} {op} settings={self.settings[group]}"
        try:
            getattr(self, "op_" + kind)(i, what, n, dtype, op)
        except AssertionError:
            raise
        except Exception as e:  # the backend raised: name the call
            raise RuntimeError(f"torture seed {self.seed}, op {i} ({what}): {e}") from e
        return what


REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "max": dist.ReduceOp.MAX,
              "min": dist.ReduceOp.MIN, "product": dist.ReduceOp.PRODUCT}  # fmt: skip


def _install_ops():
    from torture_kinds import KIND_FUNCTIONS

    for name, fn in KIND_FUNCTIONS.items():
        setattr(Torture, "op_" + name, fn)


def body(rank: int, world: int, seed: int, ops: int) -> None:
    import torch_cgx  # noqa: F401  (registers the backend)

    _install_ops()
    dist.init_process_group("cgx")
    t = Torture(seed, rank, world)
    start = time.monotonic()
    for i in range(ops):
        try:
            t.run(i)
        except Exception as e:
            # This rank's own failure, printed at once: the peers then fail too (a closed
            # connection), and run_ranks may re-raise one of theirs.
            label = e if "torture seed" in str(e) else f"torture seed {seed}, op {i}: {e!r}"
            print(f"rank {rank}: {label}", file=sys.stderr, flush=True)
            raise
    dist.barrier(group=t.gloo)
    if rank == 0:
        print(f"torture seed {seed}: {ops} ops in {time.monotonic() - start:.1f} s, checked "
              f"{t.checked['compressed']} compressed and {t.checked['exact']} exact results "
              f"(4 ranks)", flush=True)  # fmt: skip
    del t
    gc.collect()
    dist.destroy_process_group()


def main(argv=None) -> int:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from dist_helpers import run_ranks

    p = argparse.ArgumentParser(description="random collectives on 4 ranks, checked")
    p.add_argument("--ops", type=int, default=5000)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--timeout", type=float, default=3600)
    a = p.parse_args(argv)
    run_ranks(body, 4, a.seed, a.ops, timeout=a.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
