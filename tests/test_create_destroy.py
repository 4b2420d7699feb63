"""Creating, using and destroying a group again and again on one fixed port (env://) while the
CPU is loaded: cgx must not fail where Gloo would not.

Rank 0 hosts the TCPStore. When it destroys its group its store server goes, and in the next
cycle a new one takes the same port. A store operation that a rank issues after its peer may
have torn down its store fails with "Failed to recv, got 0 bytes"; so cgx's creation ends with a
store operation every rank waits on together (rank 0 deletes the group's keys last). And a rank
that starts the next cycle while rank 0's old server still listens connects to it and fails
once it goes (torch's race, which Gloo loses too); so the other ranks' destroy_process_group
returns only once rank 0's server has gone (tests/test_destroy_in_step.py, docs/reliability.md
section 7).

The tests run a few cycles under a bounded load; the full comparison with Gloo (and with another
build: a backend written cgx@DIR runs with PYTHONPATH=DIR) is a command:

    python tests/test_create_destroy.py --runs 8 --cycles 12 --busy 2 [--backends cgx,gloo,cgx@DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import re
import socket
import subprocess
import sys
import time
from typing import List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _ephemeral_low() -> int:
    """The first port of the range the kernel picks connections' own ports from."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _free_port(count: int = 1) -> int:
    """The first of ``count`` consecutive ports free now, below the ephemeral range: there, any
    connection made meanwhile (a store client's, Gloo's) could take one as its own port before
    the cycle that is to listen on it (EADDRINUSE: a failure of the harness, not of the group)."""
    low = _ephemeral_low()
    for _ in range(200):
        if low - count > 20000:
            first = random.randrange(20000, low - count)
        else:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                first = s.getsockname()[1]
        if first + count > 65535:
            continue
        try:
            for port in range(first, first + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
    raise RuntimeError(f"no {count} consecutive free ports")


def _slow_reader(inner, delay: float):
    """``inner`` with every read of this rank ``delay`` seconds late: a rank whose last reads
    come after its peer is done with the group (and, on rank 0, with its store) fails."""
    import torch.distributed as dist

    class SlowReader(dist.Store):
        def get(self, key):
            time.sleep(delay)
            return inner.get(key)

        def wait(self, keys, timeout=None):
            time.sleep(delay)
            return inner.wait(keys) if timeout is None else inner.wait(keys, timeout)

        def set(self, key, value):
            inner.set(key, value)

        def add(self, key, value):
            return inner.add(key, value)

        def compare_set(self, key, expected, desired):
            return inner.compare_set(key, expected, desired)

        def delete_key(self, key):
            return inner.delete_key(key)

        def check(self, keys):
            return inner.check(keys)

        def num_keys(self):
            return inner.num_keys()

    return SlowReader()


def _init(backend: str, cycle: int, ports: str, base: int):
    """init_process_group for one cycle: env:// on the fixed or the cycle's own port, or an
    explicit TCPStore on the cycle's port with rank 1's reads late ("slow-reader")."""
    import datetime

    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=20)
    if ports == "fixed":
        return dist.init_process_group(backend, timeout=timeout)
    os.environ["MASTER_PORT"] = str(base + cycle)
    if ports == "per-cycle":
        return dist.init_process_group(backend, timeout=timeout)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    tcp = dist.TCPStore("127.0.0.1", base + cycle, world, rank == 0, timeout=timeout)
    # c10d holds the only reference: rank 0's server goes when its group goes, as with env://.
    dist.init_process_group(backend, store=_slow_reader(tcp, 0.05 if rank == 1 else 0.0),
                            rank=rank, world_size=world, timeout=timeout)  # fmt: skip


def _worker(backend: str, cycles: int, op: str, ports: str) -> None:
    """One rank: ``cycles`` times init -> ``op`` (all_reduce or none) -> destroy. ``ports``:
    "fixed" (env://, one port: a rank may meet its peer's store of the previous cycle),
    "per-cycle" (env://, the next port each cycle: only a cycle's own store traffic remains) or
    "slow-reader" (per cycle, rank 1's store reads 50 ms late)."""
    import torch
    import torch.distributed as dist

    if backend == "cgx":
        import torch_cgx  # noqa: F401  (registers the backend)
    world, base = int(os.environ["WORLD_SIZE"]), int(os.environ["MASTER_PORT"])
    phase, cycle = "init", 0
    try:
        for cycle in range(cycles):
            phase = "init"
            _init(backend, cycle, ports, base)
            phase = op
            t = torch.full((4096,), float(dist.get_rank() + 1))
            expected = world * (world + 1) / 2 if op == "all_reduce" else dist.get_rank() + 1
            if op == "all_reduce":
                dist.all_reduce(t)
            if not torch.equal(t, torch.full_like(t, expected)):
                raise AssertionError(f"wrong sum {t[0].item()} != {expected}")
            phase = "destroy"
            dist.destroy_process_group()
    except Exception as e:
        import traceback

        frames = traceback.extract_tb(e.__traceback__)
        ours = [f for f in frames if "torch_cgx" in f.filename] or frames[-1:]
        where = f"{os.path.basename(ours[-1].filename)}:{ours[-1].lineno} {ours[-1].name}"
        print(f"FAILED cycle {cycle} in {phase} at {where}: {type(e).__name__}: "
              f"{str(e).splitlines()[0][:120]}", flush=True)  # fmt: skip
        sys.exit(1)


def _busy(count: int) -> List[subprocess.Popen]:
    """``count`` processes spinning on a core each (the load)."""
    code = "while True: pass"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(count)]


def _stop(procs: List[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def run_cycles(backend: str, cycles: int, op: str = "all_reduce", ports: str = "fixed",
               world: int = 2, timeout: float = 300) -> Tuple[bool, str]:  # fmt: skip
    """One run of :func:`_worker` on ``world`` ranks: (ok, what failed). ``backend``: cgx, gloo,
    or cgx@DIR (the torch_cgx in DIR: another build, to compare)."""
    backend, _, root = backend.partition("@")
    port = _free_port(1 if ports == "fixed" else cycles)
    ranks = []
    for rank in range(world):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   WORLD_SIZE=str(world), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
                   CGX_CODEC_THREADS="1", PYTHONPATH=root or ROOT)  # fmt: skip
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", backend, str(cycles), op,
               ports]  # fmt: skip
        ranks.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))  # fmt: skip
    deadline = time.monotonic() + timeout
    failures = []
    for rank, p in enumerate(ranks):
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _stop(ranks)
            return False, f"rank {rank}: still running after {timeout:g} s"
        if p.returncode != 0:
            lines = [ln for ln in out.splitlines() if ln.strip()]
            why = [ln for ln in lines if ln.startswith("FAILED")] or lines[-1:] or [""]
            failures.append(f"rank {rank}: {why[-1]}")
    return not failures, "; ".join(failures)


def test_creation_waits_for_a_slow_reader():
    """init -> destroy with no collective in between while rank 1 reads the store 50 ms late:
    rank 0 must not leave creation (and take its store server with it) before rank 1's last
    store operation. Before creation ended with _release, rank 1 failed in the first cycle with
    "Failed to recv, got 0 bytes" (Gloo alone fails the same way, in Gloo's rendezvous)."""
    ok, why = run_cycles("cgx", 4, op="none", ports="slow-reader", timeout=120)
    assert ok, why


def test_cycles_under_load_succeed():
    """4 cycles of init -> destroy, each on its own port, with 2 busy processes: creation and
    destruction under load leave no store traffic behind. (On one fixed port a rank can also
    meet its peer's store of the previous cycle, torch's own race, which Gloo loses too: the
    comparison is the command in the module docstring, docs/reliability.md.)"""
    busy = _busy(2)
    try:
        ok, why = run_cycles("cgx", 4, op="none", ports="per-cycle", timeout=240)
    finally:
        _stop(busy)
    assert ok, why


def test_fixed_port_cycles_under_load_succeed():
    """12 cycles of init -> all_reduce -> destroy on one fixed port with 2 busy processes, the
    command's case: rank 1 must never reach rank 0's server of the previous cycle. Alternated
    on 2026-11-27 (docs/reliability.md section 7), the build from before the other ranks waited
    for that server to go failed 24 of 24 such runs (2 and 4 busy), Gloo 20 of 24, this none."""
    busy = _busy(2)
    try:
        ok, why = run_cycles("cgx", 12, timeout=240)
    finally:
        _stop(busy)
    assert ok, why


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=8)
    p.add_argument("--cycles", type=int, default=12)
    p.add_argument("--busy", type=int, default=4, help="spinning processes (the load)")
    p.add_argument("--backends", default="cgx,gloo", help="cgx, gloo, cgx@DIR (another build)")
    p.add_argument("--op", choices=("all_reduce", "none"), default="all_reduce")
    p.add_argument("--ports", choices=("fixed", "per-cycle", "slow-reader"), default="fixed")
    args = p.parse_args()
    busy = _busy(args.busy)
    failed = {b: 0 for b in args.backends.split(",")}
    cycles = {b: 0 for b in failed}  # cycles begun: a run stops at its first failed one
    loads = []
    try:
        for run in range(args.runs):
            for backend in failed:  # alternated, so both see the same load over time
                start = time.monotonic()
                ok, why = run_cycles(backend, args.cycles, args.op, args.ports)
                failed[backend] += not ok
                at = [int(c) for c in re.findall(r"FAILED cycle (\d+)", why)]
                cycles[backend] += min(at) + 1 if at else args.cycles
                took, load = time.monotonic() - start, os.getloadavg()[0]
                loads.append(load)
                print(f"run {run} {backend}: {'ok' if ok else 'FAILED ' + why} ({took:.1f} s, "
                      f"load average {load:.1f})", flush=True)  # fmt: skip
    finally:
        _stop(busy)
    for backend, n in failed.items():
        print(f"{backend}: {n} of {args.runs} runs failed, {n} of {cycles[backend]} cycles "
              f"({args.cycles} cycles a run, op {args.op}, {args.ports} port, {args.busy} busy "
              f"processes)")  # fmt: skip
    print(f"load average (1 min) after each run: min {min(loads):.1f}, mean "
          f"{sum(loads) / len(loads):.1f}, max {max(loads):.1f}")  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--worker":
        _worker(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5])
    else:
        main()
