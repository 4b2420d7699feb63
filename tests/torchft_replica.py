"""One torchft replica group (one process) training with torch_cgx's DiLoCo on a Manager.

Run by tests/test_diloco_torchft.py (a Lighthouse on 127.0.0.1 in the test process). Every
replica starts from the same seeded model (``init_sync=False``) and trains on its own batches;
after every committed sync it writes ``<out>/<replica>/<manager step>.pt`` (parameters, global
copies, outer optimizer, residuals, loss, inner step, whether it healed in that sync).

``streaming``: Streaming DiLoCo, the two Linear layers as fragments, delay 1 (``semi_async``:
each reduction in flight for a whole window instead). Controls, all
files in ``out``: ``go`` (start training: every replica is up), ``stop`` (a
manager step: exit once it is committed). ``kill_at`` (an argument): SIGKILL this process in
the middle of that sync (after the payload sizes went round, before the payloads).
"""

from __future__ import annotations

import os
import signal
import socket
import time
from datetime import timedelta

import torch

HOST = "127.0.0.1"


def _wait_for(path: str, limit: float) -> None:
    deadline = time.monotonic() + limit
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {limit} s")
        time.sleep(0.02)


def _stop_step(out: str):
    try:
        with open(os.path.join(out, "stop")) as f:
            return int(f.read().strip() or "0")
    except (FileNotFoundError, ValueError):
        return None


def _kill_in_the_middle_of(sync: int) -> None:
    """SIGKILL on the payload gather of this replica's ``sync``-th sync (1-based)."""
    from torch_cgx.diloco import managed

    gather, calls = managed._gather, [0]

    def gather_or_die(pg, tensor, world):
        calls[0] += 1
        if calls[0] == 2 * sync:  # the header gather is call 2 * sync - 1
            os.kill(os.getpid(), signal.SIGKILL)
        return gather(pg, tensor, world)

    managed._gather = gather_or_die


def _manager(lighthouse: str, replica: str, timeout: float):
    from torchft.manager import Manager
    from torchft.process_group import ProcessGroupGloo

    store = torch.distributed.TCPStore(HOST, 0, is_master=True, wait_for_workers=False)
    limit = timedelta(seconds=timeout)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=limit),
        load_state_dict=None,
        state_dict=None,
        min_replica_size=2,
        use_async_quorum=False,
        replica_id=replica,
        store_addr=HOST,
        store_port=store.port,
        rank=0,
        world_size=1,
        lighthouse_addr=lighthouse,
        hostname=HOST,
        timeout=limit,
        quorum_timeout=timedelta(seconds=60),
        connect_timeout=limit,
        init_sync=False,
    )
    return manager, store


def _held_out_loss(model, target) -> float:
    x = torch.randn(256, 16, generator=torch.Generator().manual_seed(12345))
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(model(x), target(x)))


def _snapshot(diloco, model, target) -> dict:
    return {
        "step": diloco.step,
        "loss": _held_out_loss(model, target),
        "healed": diloco._managed.healed,
        "contributors": diloco._managed.last.get("contributors"),
        "params": {n: p.detach().clone() for n, p in model.named_parameters()},
        # the parameters of the fragment(s) whose sync was just applied (alpha 0: the new
        # global values; the others' are each replica's own between their syncs)
        "applied": {
            f"{f}.{n}": p.detach().clone()
            for f in diloco.schedule.applies_at(diloco.step)
            for n, p in zip(diloco._fragments[f].names, diloco._fragments[f].params)
        },
        "globals": [diloco.global_parameters(f) for f in range(diloco.num_fragments)],
        "outer": [o.state_dict() for o in diloco.outer_optimizers],
        "residuals": {
            f"{f.index}.{n}": r.clone() for f in diloco._fragments for n, r in f.residuals.items()
        },
    }


def _replica(replica: str, seed: int):
    """The same seeded model and teacher everywhere; batches of this replica's own."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    target = torch.nn.Linear(16, 1)
    data = torch.Generator().manual_seed(int(replica[1:]) * 7919 + seed)
    return model, target, data, torch.optim.SGD(model.parameters(), lr=0.05)


def _inner_step(model, target, data, inner) -> None:
    x = torch.randn(32, 16, generator=data)
    with torch.no_grad():
        y = target(x)
    torch.nn.functional.mse_loss(model(x), y).backward()
    inner.step()
    inner.zero_grad()
    time.sleep(0.01)


def run_parity(out: str, lighthouse: str, replica: str, impl: str, streaming: bool, syncs: int):
    """Exact DiLoCo (``impl`` "torch_cgx" with compressor=None, or "torchft": torchft's own) for
    ``syncs`` committed syncs; saves the model's parameters after each to ``<out>/<replica>.pt``."""
    socket.gethostname = lambda: HOST
    from torch_cgx.diloco import DiLoCo, outer_sgd

    model, target, data, inner = _replica(replica, 0)
    manager, _store = _manager(lighthouse, replica, 5.0)
    fragments = [model[0], model[2]] if streaming else [model]
    outer = [outer_sgd(m.parameters()) for m in fragments]
    args = (manager, fragments, inner, outer, 4)
    if impl == "torchft":
        from torchft.local_sgd import DiLoCo as TorchftDiLoCo

        diloco = TorchftDiLoCo(*args, fragment_sync_delay=int(streaming))
    else:
        diloco = DiLoCo(*args, compressor=None, fragment_sync_delay=int(streaming))
    seen, committed = {}, 0
    with diloco:
        while committed < syncs:
            _inner_step(model, target, data, inner)
            if manager.current_step() != committed:
                committed = manager.current_step()
                seen[committed] = {n: p.detach().clone() for n, p in model.named_parameters()}
    torch.save(seen, os.path.join(out, f"{replica}.pt"))
    manager.shutdown(wait=False)


def run(
    out: str,
    lighthouse: str,
    replica: str,
    compressor: str,
    params: dict,
    kill_at: int,
    timeout: float = 5.0,
    streaming: bool = False,
    semi_async: bool = False,
) -> None:
    socket.gethostname = lambda: HOST  # torchft's checkpoint server advertises the hostname
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    from torch_cgx.diloco import DiLoCo, outer_sgd

    if kill_at:
        _kill_in_the_middle_of(kill_at)
    model, target, data, inner = _replica(replica, kill_at)
    manager, _store = _manager(lighthouse, replica, timeout)
    # streaming: the two Linear layers as fragments, each reduction overlapping one inner step
    fragments = [model[0], model[2]] if streaming else model
    # one window late, DiLoCo's outer momentum 0.9 oscillates on this model; 0.5 converges
    outer = (lambda p: outer_sgd(p, momentum=0.5)) if semi_async else None
    diloco = DiLoCo(
        manager,
        fragments,
        inner,
        outer,
        4,
        compressor=compressor,
        compressor_params=params,
        fragment_sync_delay=int(streaming and not semi_async),
        semi_async=semi_async,
    )
    mine = os.path.join(out, replica)
    os.makedirs(mine, exist_ok=True)
    open(os.path.join(mine, f"up.{os.getpid()}"), "w").close()
    _wait_for(os.path.join(out, "go"), 120)
    committed = manager.current_step()
    with diloco:
        while True:
            _inner_step(model, target, data, inner)
            applied = diloco.schedule.applies_at(diloco.step)  # (a heal moves the step too)
            if manager.current_step() != committed and applied:
                committed = manager.current_step()
                snap = _snapshot(diloco, model, target)
                torch.save(snap, os.path.join(mine, f"{committed}.pt.tmp"))
                os.replace(
                    os.path.join(mine, f"{committed}.pt.tmp"), os.path.join(mine, f"{committed}.pt")
                )
                stop = _stop_step(out)
                if stop is not None and committed >= stop:
                    break
    manager.shutdown(wait=False)
