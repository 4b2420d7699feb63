"""Destroying the default group in step with rank 0, the store's host (env://): another rank's
destroy_process_group returns only once rank 0's store server has gone, so that its next
init_process_group on the same port cannot meet the old server (torch_cgx.backend,
csrc/torch/host_departure.h, docs/reliability.md section 7). The waits are bounded: a rank 0
that keeps the group, or a store the script keeps, holds the others only so long.

The fixed-port comparison under load is tests/test_create_destroy.py."""

from __future__ import annotations

import datetime
import json
import os
import socket
import time

from dist_helpers import run_ranks


def _save(out: str, rank: int, **record) -> None:
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)


def _load(out: str, world: int = 2):
    return [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(world)]


def body_late_host(rank, world, out):
    """Rank 0 destroys 1 s after rank 1 has started to; rank 1 then probes the port."""
    import torch
    import torch.distributed as dist

    import torch_cgx  # noqa: F401

    dist.init_process_group("cgx")
    sub = dist.new_group([0, 1], backend="cgx")
    dist.all_reduce(torch.ones(64))
    dist.all_reduce(torch.ones(64), group=sub)
    if rank == 0:
        time.sleep(1.0)
    start = time.monotonic()
    dist.destroy_process_group(sub)  # a subgroup: nothing to wait for
    sub_done = time.monotonic()
    del sub  # (a group object kept alive keeps the store, and so rank 0's server, alive)
    dist.destroy_process_group()
    done = time.monotonic()
    refused = None
    if rank == 1:
        try:
            socket.create_connection(("127.0.0.1", int(os.environ["MASTER_PORT"])), 2).close()
            refused = False
        except ConnectionRefusedError:
            refused = True
    _save(out, rank, start=start, sub_s=sub_done - start, done=done, refused=refused)
    if rank == 0:
        time.sleep(1.0)  # alive: the server went with the group, not with the process


def test_another_rank_returns_once_the_host_has_left(tmp_path):
    run_ranks(body_late_host, 2, str(tmp_path), timeout=120)
    host, other = _load(str(tmp_path))
    assert other["sub_s"] < 0.5, other  # the subgroup's destruction did not wait for rank 0
    assert other["done"] - other["start"] > 0.5, other  # rank 0 came 1 s later: waited for it
    assert other["done"] >= host["start"], (host, other)
    assert other["refused"], other  # and rank 0's store server had gone when it returned


def body_host_keeps(rank, world, out):
    """Rank 0 never destroys its group (it sleeps, then exits): rank 1's destroy returns after
    the bound, the group's timeout (2 s) here."""
    import torch
    import torch.distributed as dist

    import torch_cgx  # noqa: F401

    dist.init_process_group("cgx", timeout=datetime.timedelta(seconds=2))
    dist.all_reduce(torch.ones(64))
    if rank == 0:
        time.sleep(4.0)
        return
    start = time.monotonic()
    dist.destroy_process_group()
    _save(out, rank, took=time.monotonic() - start)


def test_a_host_that_keeps_the_group_holds_the_others_at_most_the_bound(tmp_path):
    run_ranks(body_host_keeps, 2, str(tmp_path), timeout=120)
    took = json.load(open(tmp_path / "rank1.json"))["took"]
    assert 1.5 < took < 10, took  # min(timeout, HOST_WAIT) = 2 s, plus slack for a loaded machine


def body_kept_store(rank, world, out):
    """The script's own TCPStore, kept across two groups: its server stays, so rank 1 waits
    for rank 0's announcement and at most HOST_GRACE more; the second group works."""
    import torch
    import torch.distributed as dist

    import torch_cgx  # noqa: F401
    from torch_cgx.backend import HOST_GRACE

    port = int(os.environ["MASTER_PORT"])
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0)
    took = []
    for _ in range(2):
        dist.init_process_group("cgx", store=store, rank=rank, world_size=world)
        t = torch.ones(64)
        dist.all_reduce(t)
        assert t[0].item() == world
        start = time.monotonic()
        dist.destroy_process_group()
        took.append(time.monotonic() - start)
    _save(out, rank, took=took, grace=HOST_GRACE.total_seconds())
    if rank == 0:
        store.wait(["finished"])  # the server (rank 0's) stays until rank 1 is done with it
    else:
        store.set("finished", "1")


def test_a_kept_store_holds_the_others_at_most_the_grace(tmp_path):
    run_ranks(body_kept_store, 2, str(tmp_path), timeout=120)
    other = _load(str(tmp_path))[1]
    assert max(other["took"]) < other["grace"] + 3, other  # plus slack for a loaded machine
