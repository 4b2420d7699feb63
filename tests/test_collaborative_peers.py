"""Collaborative training with real peers (processes on 127.0.0.1, torchft's Gloo): the first
peer hosts the Lighthouse; one peer is 3x slower; one is SIGKILLed in the middle of a round and a
new one joins later (tests/collaborative_peer.py). Checked from every peer's snapshots:
parameters and optimizer state bitwise equal after every epoch, the slow peer's share, the
epochs' pace, the others going on after the kill, the newcomer equal and contributing; a peer
that dies while a newcomer's quorum re-forms the process group dropped within the timeout; with
local updates, parameters bitwise after every average and a SIGSTOPped peer dropped."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import collaborative_peer
import pytest
import torch
import torch.multiprocessing as mp
from dist_helpers import context_start_method

pytest.importorskip("torchft")

LIMIT = 120.0
FAST, SLOW = 0.01, 0.03  # seconds of emulated compute per micro-batch
STOP = 36


def _start(ctx, out, name, first, delay, **kw):
    kw.setdefault("stop", STOP)
    p = ctx.Process(target=collaborative_peer.run, args=(str(out), name, first, delay),
                    kwargs=kw, daemon=True)  # fmt: skip
    p.start()
    return p


def _snapshots(out, name):
    folder = os.path.join(out, name)
    return {e: torch.load(os.path.join(folder, f"{e}.pt"), weights_only=False)
            for e in _epochs(out, name)}  # fmt: skip


def _epochs(out, name):
    """The epochs of ``name``'s snapshots so far (a listing: cheaper than loading them)."""
    folder = os.path.join(out, name)
    names = os.listdir(folder) if os.path.isdir(folder) else []
    return sorted(int(f[:-3]) for f in names if f.endswith(".pt") and f[0].isdigit())


def _wait(what, procs, condition):
    deadline = time.monotonic() + LIMIT
    while not condition():
        for name, p in procs.items():
            if p.exitcode not in (None, 0, -signal.SIGKILL):
                raise AssertionError(f"peer {name} exited with {p.exitcode} waiting for {what}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@contextlib.contextmanager
def _peers(procs):
    """Yields ``procs`` (name -> process, more may be added); on exit the peers named by
    ``finish(names)`` must have exited 0, and any still alive are killed."""
    done = []
    try:
        yield procs, done.extend
        for name in done:
            procs[name].join(LIMIT)
            assert procs[name].exitcode == 0, (name, procs[name].exitcode)
    finally:
        for p in procs.values():
            if p.is_alive():
                p.kill()


def _equal(a, b, what):
    for key in a["params"]:
        assert torch.equal(a["params"][key], b["params"][key]), f"{what}: parameter {key}"
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    assert sa.keys() == sb.keys(), what
    for i in sa:
        for k in sa[i]:
            assert torch.equal(sa[i][k], sb[i][k]), f"{what}: optimizer state {i}.{k}"


@pytest.mark.timeout(240)
def test_slow_peer_kill_and_join(tmp_path):
    out = str(tmp_path)
    ctx = mp.get_context(context_start_method())
    _stop_at(out, 10**6)  # until the newcomer is in (the peers read <out>/stop)
    _stop_at(out, 10**6, "a")
    with _peers({}) as (procs, finish):
        # a hosts the Lighthouse and runs its rounds in the background; the others do not
        procs["a"] = _start(ctx, out, "a", True, FAST, seed=0, compression="adaptive",
                            stop=None, background=True)  # fmt: skip
        procs["b"] = _start(ctx, out, "b", False, FAST, seed=1, compression="adaptive",
                            kill_round=8, stop=None)  # fmt: skip
        procs["c"] = _start(ctx, out, "c", False, SLOW, seed=2, compression="adaptive",
                            stop=None)  # fmt: skip
        _wait("b's death", procs, lambda: procs["b"].exitcode == -signal.SIGKILL)
        killed_at = max(_epochs(out, "a"), default=0)
        procs["d"] = _start(ctx, out, "d", False, FAST, seed=3, compression="adaptive",
                            stop=None, background=True)  # fmt: skip
        _wait("4 epochs with d", procs, lambda: len(_epochs(out, "d")) >= 4)
        # d stalls past averaging_timeout (5 s) and the heartbeat timeout (1 s): the others go
        # on without it; back, d is behind and heals during a background round
        os.kill(procs["d"].pid, signal.SIGSTOP)
        time.sleep(6.5)
        stalled_at = max(_epochs(out, "d"))
        os.kill(procs["d"].pid, signal.SIGCONT)
        _wait("d's heal", procs, lambda: _healed_after(_snapshots(out, "d"), stalled_at))
        healed_at = _healed_after(_snapshots(out, "d"), stalled_at)
        _wait("2 epochs after d's heal", procs, lambda: max(_epochs(out, "d")) >= healed_at + 2)
        stop = max(_epochs(out, "a")) + 10  # the peers are ahead of the listing by a few
        _stop_at(out, stop)
        for n in "cd":  # the host leaves last: a round the others left in flight can end
            procs[n].join(LIMIT)
        _stop_at(out, max(_epochs(out, "a")) + 2, "a")
        finish("acd")
    snaps = {n: _snapshots(out, n) for n in "abcd"}
    # the others went on after the kill, without a restart, to the last epoch
    assert max(snaps["c"]) == max(snaps["d"]) == stop <= max(snaps["a"]), (
        stop, {n: max(snaps[n]) for n in "acd"})  # fmt: skip
    assert killed_at < stop - 5
    # bitwise equal after every epoch, on every peer that saw it
    for e, a in snaps["a"].items():
        for n in "bcd":
            if e in snaps[n]:
                _equal(a, snaps[n][e], f"epoch {e}, peers a and {n}")
    # the newcomer: healed at its first round, equal from then, contributing within 2 epochs
    first = min(snaps["d"])
    join = torch.load(os.path.join(out, "d", f"join{first - 1}.pt"), weights_only=False)
    assert join["healed"]
    _equal(snaps["a"][first - 1], join, "the newcomer after its heal")
    gave = [e for e, s in snaps["d"].items() if s["table"][s["rank"]][0] > 0]
    assert gave and min(gave) <= first + 1, (first, gave)
    # after its stall d skipped epochs, healed, and is bitwise the others' (checked above)
    assert healed_at > stalled_at + 1 and healed_at in snaps["a"], (stalled_at, healed_at)
    # the slow peer: fewer samples per epoch than the fast ones, and the epochs at their pace
    three = [s for e, s in snaps["c"].items() if e > 3 and len(s["table"]) == 3]
    assert three, "no epoch with three peers"
    slow = sum(s["table"][s["rank"]][0] for s in three)
    fast = sum(sum(r[0] for r in s["table"]) for s in three) - slow
    assert slow * 1.5 < fast / 2, (slow, fast)  # a fast peer contributes > 1.5x the slow one
    times = [snaps["c"][e]["time"] for e in sorted(snaps["c"])]
    per_epoch = (times[-1] - times[0]) / (len(times) - 1)
    # with an equal share the slow peer alone needs TARGET / 3 samples at its pace per epoch
    equal_share = collaborative_peer.TARGET / 3 / collaborative_peer.BATCH * SLOW
    assert per_epoch < equal_share * 1.5 + 0.3, (per_epoch, equal_share)


@pytest.mark.timeout(120)
def test_local_updates_average_parameters_bitwise_and_a_stalled_peer_is_dropped(tmp_path):
    out = str(tmp_path)
    ctx = mp.get_context(context_start_method())
    with _peers({}) as (procs, finish):
        for name, first, delay in (("a", True, FAST), ("b", False, SLOW), ("c", False, FAST)):
            procs[name] = _start(ctx, out, name, first, delay, seed=ord(name) - ord("a"),
                                 compression="maxmin4", local=True)  # fmt: skip
        _wait("8 epochs with c", procs, lambda: len(_epochs(out, "c")) >= 8)
        os.kill(procs["c"].pid, signal.SIGSTOP)  # c stalls, wherever it is (a round or not)
        stalled = time.time()
        finish("ab")
    a, b = _snapshots(out, "a"), _snapshots(out, "b")
    # the others go on: their next epoch within averaging_timeout (5 s) and the Lighthouse's
    # heartbeat timeout (1 s) of the stall, plus slack for this machine
    after = [s["time"] for s in a.values() if s["time"] > stalled]
    assert after and min(after) - stalled < 5 + 1 + 4, min(after) - stalled
    assert max(a) == max(b) == STOP
    common = sorted(set(a) & set(b))
    assert len(common) > 10
    for e in common:
        for key in a[e]["params"]:
            assert torch.equal(a[e]["params"][key], b[e]["params"][key]), (e, key)
    # the optimizer steps locally: its statistics are each peer's own
    last = common[-1]
    assert not torch.equal(a[last]["optimizer"]["state"][0]["exp_avg"],
                           b[last]["optimizer"]["state"][0]["exp_avg"])  # fmt: skip
    assert any(r is not None for r in a[last]["residuals"])  # 4-bit max-min: error feedback


def _healed_after(snaps, epoch):
    """The first epoch after ``epoch`` that a heal brought (None before one)."""
    return min((e for e, s in snaps.items() if e > epoch and s["healed"]), default=None)


def _stop_at(out, epoch, name=None):
    """Every peer (or ``name``) stops at ``epoch`` (collaborative_peer reads the file)."""
    collaborative_peer.write_whole(os.path.join(out, "stop" if name is None else f"stop-{name}"),
                                   str(epoch))  # fmt: skip


@pytest.mark.timeout(120)
def test_a_peer_dead_in_the_re_forming_of_the_group_is_dropped_within_the_timeout(tmp_path):
    """b publishes its Gloo address for the quorum that takes newcomer c in, and dies before it
    connects: a and c, the side of their pairs with b that waits, fail that round within
    averaging_timeout (Gloo alone waits five times its timeout), and c joins in the next."""
    out, timeout = str(tmp_path), 3.0
    ctx = mp.get_context(context_start_method())
    _stop_at(out, 10**6)  # until c is in (the peers read <out>/stop)
    with _peers({}) as (procs, finish):
        procs["a"] = _start(ctx, out, "a", True, FAST, stop=None, timeout=timeout)
        procs["b"] = _start(ctx, out, "b", False, FAST, seed=1, stop=None, timeout=timeout,
                            leave_mesh=3)  # fmt: skip
        _wait("3 epochs with b", procs, lambda: len(_epochs(out, "b")) >= 3)
        procs["c"] = _start(ctx, out, "c", False, FAST, seed=2, stop=None, timeout=timeout)
        _wait("b's death", procs, lambda: procs["b"].exitcode == -signal.SIGKILL)
        _wait("3 epochs with c", procs, lambda: len(_epochs(out, "c")) >= 3)
        stop = max(_epochs(out, "c")) + 3
        _stop_at(out, stop)
        finish("ac")
    a, c = _snapshots(out, "a"), _snapshots(out, "c")
    assert max(a) == max(c) == stop
    # a's longest wait for an epoch: the timeout, the Lighthouse's heartbeat timeout (1 s) and
    # a round, plus slack for this machine (before: 5 x the timeout)
    times = [a[e]["time"] for e in sorted(a)]
    gap = max(t - s for s, t in zip(times, times[1:]))
    assert gap < timeout + 1 + 3, gap
    # the newcomer ran its joining round again without b: healed from a, equal from then
    first = min(c)
    join = torch.load(os.path.join(out, "c", f"join{first - 1}.pt"), weights_only=False)
    assert join["healed"]
    _equal(a[first - 1], join, "the newcomer after its heal")
    for e in c:
        _equal(a[e], c[e], f"epoch {e}, peers a and c")
