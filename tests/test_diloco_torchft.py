"""DiLoCo on torchft: three replica groups (real processes, a Lighthouse on 127.0.0.1) keep
training when one is SIGKILLed in the middle of a sync; the killed one is started again, heals
from a live peer, and from its first sync on all three hold bitwise the same parameters, global
copies and outer-optimizer state; a replica that stops answering (SIGSTOP) is dropped within the
process group's timeout. DiLoCo with 4-bit max-min; semi-asynchronous Streaming DiLoCo (two
fragments, each reduction in flight for a whole window) with top-k and error feedback; exact
DiLoCo and Streaming DiLoCo (delay 1) bitwise torchft's own (tests/torchft_replica.py is the
replica)."""

from __future__ import annotations

import importlib.util
import os
import signal
import time

import pytest
import torch
import torch.multiprocessing as mp
from dist_helpers import context_start_method

# Not imported here: torchft imports triton, which must first be imported by the Triton tests'
# modules under TRITON_INTERPRET=1 (collection imports every module before any test runs).
if importlib.util.find_spec("torchft") is None:  # installed by install-deps; a pinned skip
    pytest.skip("torchft is not installed (requirements-dev.txt)", allow_module_level=True)

import torchft_replica  # noqa: E402
from torchft_testing import LIMIT, TIMEOUT, Replicas, _equal  # noqa: E402


def _check_same_sync(replicas, names, step, semi=False):
    snaps = {n: replicas.load(n, step) for n in names}
    first = snaps[names[0]]
    for n in names[1:]:
        assert first["applied"], f"sync {step}: no fragment applied at inner step {first['step']}"
        for key in ("applied", "globals", "outer", "step"):
            _equal(snaps[n][key], first[key], f"{n} vs {names[0]} at sync {step}: {key}")
    # the divisor of the average this sync applied: the same everywhere (a replica that healed
    # in this very quorum applied none); synchronous: the replicas that did not heal in it
    counts = {n: s["contributors"] for n, s in snaps.items() if not s["healed"]}
    assert len(set(counts.values())) == 1 and None not in counts.values(), (step, counts)
    if not semi:
        want = sum(not s["healed"] for s in snaps.values())
        assert set(counts.values()) == {want}, (step, counts, want)
    return snaps


def _start_and_kill(replicas):
    """Three replicas; r2 SIGKILLs itself in its third committing sync. Returns the survivors' last
    committed step before r2 is started again."""
    # (semi-asynchronous: the first window of each of the two fragments commits nothing)
    third = 5 if replicas.streaming == "semi_async" else 3
    for name, kill_at in (("r0", 0), ("r1", 0), ("r2", third)):
        replicas.start(name, kill_at)
    ups = lambda: all(  # noqa: E731
        os.path.isdir(os.path.join(replicas.out, n))
        and any(f.startswith("up") for f in os.listdir(os.path.join(replicas.out, n)))
        for n in ("r0", "r1", "r2")
    )
    replicas.wait("three replicas up", ups)
    open(os.path.join(replicas.out, "go"), "w").close()
    replicas.procs["r2"].join(LIMIT)
    assert replicas.procs["r2"].exitcode == -signal.SIGKILL
    killed = max(replicas.steps("r2"))
    # The survivors keep committing without r2 (no restart of anything).
    without = lambda: min(max(replicas.steps(n), default=0) for n in ("r0", "r1"))  # noqa: E731
    replicas.wait("two syncs without r2", lambda: without() >= killed + 2)
    os.rename(os.path.join(replicas.out, "r2"), os.path.join(replicas.out, "r2.killed"))
    return killed


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "compressor, params, stop_one, streaming",
    [("maxmin", {"bits": 4}, True, False), ("topk", {"ratio": 0.1}, False, "semi_async")],
    ids=["maxmin4", "topk-ef-streaming-semi-async"],
)
def test_replicas_leave_heal_and_agree(
    tmp_path, lighthouse, compressor, params, stop_one, streaming
):
    replicas = Replicas(tmp_path, lighthouse, compressor, params, streaming)
    try:
        killed = _start_and_kill(replicas)
        replicas.start("r2")  # the same replica id again: it heals at its first sync
        replicas.wait("r2's first sync after the restart", lambda: replicas.steps("r2"))
        first = min(replicas.steps("r2"))
        snap = replicas.load("r2", first)
        assert snap["healed"] and first > killed + 1
        assert all(float(r.abs().max()) == 0 for r in snap["residuals"].values())
        common = lambda: sorted(  # noqa: E731
            set(replicas.steps("r0")) & set(replicas.steps("r1")) & set(replicas.steps("r2"))
        )
        replicas.wait("two syncs of all three", lambda: len(common()) >= 2)
        for step in common():
            semi = streaming == "semi_async"
            snaps = _check_same_sync(replicas, ["r0", "r1", "r2"], step, semi)
        # residuals are each replica's own: the survivors' are not the healed one's zeros
        assert any(float(r.abs().max()) > 0 for r in snaps["r0"]["residuals"].values())
        for n in ("r0", "r1"):
            steps = replicas.steps(n)
            early, late = replicas.load(n, steps[0]), replicas.load(n, steps[-1])
            losses = [replicas.load(n, k)["loss"] for k in steps]
            assert late["loss"] < 0.5 * early["loss"], (n, losses)
        alive = ["r0", "r1", "r2"]
        if stop_one:
            alive = _stop_one(replicas)
        replicas.stop_at(max(max(replicas.steps(n)) for n in alive) + 2, alive)
    finally:
        replicas.kill_all()


def _stop_one(replicas):
    """SIGSTOP r1: r0 and r2 commit again within the timeout and agree."""
    before = max(replicas.steps("r0"))
    os.kill(replicas.procs["r1"].pid, signal.SIGSTOP)
    stopped = time.monotonic()
    replicas.wait("a sync without r1", lambda: max(replicas.steps("r0")) >= before + 2)
    took = time.monotonic() - stopped
    assert took < 4 * TIMEOUT, f"the stopped replica held the others {took:.1f} s"
    step = max(replicas.steps("r0"))
    replicas.wait("r2 at the same sync", lambda: max(replicas.steps("r2")) >= step)
    _check_same_sync(replicas, ["r0", "r2"], step)
    replicas.procs["r1"].kill()
    return ["r0", "r2"]


@pytest.mark.timeout(300)
def test_exact_average_is_torchfts_diloco_bitwise(tmp_path, lighthouse):
    """compressor=None on a manager gives bitwise torchft's own DiLoCo: 2 replicas, 6 syncs,
    DiLoCo, then Streaming DiLoCo (two fragments, delay 1): the same parameters at every sync."""
    ctx = mp.get_context(context_start_method())
    for streaming in (False, True):
        runs = {}
        for impl, prefix in (("torch_cgx", "a"), ("torchft", "b")):
            out = tmp_path / f"{impl}-{int(streaming)}"
            out.mkdir()
            procs = [
                ctx.Process(
                    target=torchft_replica.run_parity,
                    args=(str(out), lighthouse, f"{prefix}{r}", impl, streaming, 6),
                    daemon=True,
                )
                for r in range(2)
            ]
            for p in procs:
                p.start()
            for p in procs:
                p.join(LIMIT)
                assert p.exitcode == 0, (impl, streaming, p.exitcode)
            runs[impl] = [torch.load(out / f"{prefix}{r}.pt") for r in range(2)]
        for r in range(2):
            ours, theirs = runs["torch_cgx"][r], runs["torchft"][r]
            assert sorted(ours) == sorted(theirs) == list(range(1, 7)), (
                sorted(ours),
                sorted(theirs),
            )
            for step in ours:
                _equal(ours[step], theirs[step], f"replica {r}, streaming={streaming}, sync {step}")
