"""One peer of a collaboration (one process) for tests/test_collaborative_peers.py.

The first peer (``host=True``) hosts the Lighthouse (``initial_peers=None``) and writes its
address to ``<out>/address``; the others wait for that file and join. Every peer builds the
same seeded model only by chance of its own seed (``seed``): the first round makes them equal
(a heal from the first peer). Each micro-batch of ``BATCH`` samples sleeps ``delay`` seconds
(the emulated compute: a slow peer has a larger one). After every epoch it writes
``<out>/<name>/<epoch>.pt``: parameters, optimizer state, the round's table, whether it healed.
Controls: ``<out>/stop`` (an epoch: exit once reached); ``kill_round`` (SIGKILL this process in
the middle of its n-th round with payloads: after the headers went round, before the parts);
``leave_mesh`` (SIGKILL it once it published its Gloo address for a quorum of that many peers,
before it connected: see ``_leave_mesh``); ``timeout`` (``averaging_timeout``); ``background``
(``delay_grad_averaging``: rounds in the background).
"""

from __future__ import annotations

import os
import signal
import time

import torch

BATCH = 8
TARGET = 64


def _wait_for(path: str, limit: float = 60.0) -> str:
    deadline = time.monotonic() + limit
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {limit} s")
        time.sleep(0.02)
    with open(path) as f:
        return f.read().strip()


def _stop_epoch(out: str, name: str):
    """The epoch to stop at: <out>/stop-<name> where there is one, else <out>/stop."""
    for path in (os.path.join(out, f"stop-{name}"), os.path.join(out, "stop")):
        try:
            with open(path) as f:
                return int(f.read().strip() or "0")
        except (FileNotFoundError, ValueError):
            continue
    return None


def _die_in_round(n: int) -> None:
    """SIGKILL in this peer's n-th round that moves payloads: after the headers went round,
    before its parts (the reduce-scatter's all-to-all)."""
    from torch_cgx.collaborative import butterfly

    exchange, calls = butterfly._exchange, [0]

    def exchange_or_die(*args):
        calls[0] += 1
        if calls[0] == n:
            os.kill(os.getpid(), signal.SIGKILL)
        return exchange(*args)

    butterfly._exchange = exchange_or_die


def _leave_mesh(world: int) -> None:
    """SIGKILL once this peer published its Gloo address for a quorum of ``world`` peers, before
    it connected (its Gloo's first read of the others' addresses). Its Gloo device is at
    127.0.0.2, so the others (at 127.0.0.1, the lower address) are the side of each pair with it
    that waits for it to connect. Its replica id sorts last: it does not host the quorum's
    store (its death would fail the others' store at once)."""
    import uuid

    import torch.distributed as dist
    import torchft.process_group as tpg
    from torch.distributed import ProcessGroupGloo as Gloo

    class PublishThenDie(dist.Store):
        def __init__(self, store):
            super().__init__()
            self.store = store

        def set(self, key, value):
            self.store.set(key, value)

        def __getattribute__(self, name):
            if name in ("get", "wait", "multi_get", "check", "add", "compare_set"):
                os.kill(os.getpid(), signal.SIGKILL)
            return super().__getattribute__(name)

    def gloo(store, rank, size, timeout):
        opts = Gloo._Options()
        opts._timeout, opts._threads = timeout, 2
        opts._devices = [Gloo.create_device(hostname="127.0.0.2")]
        return Gloo(PublishThenDie(store) if size == world else store, rank, size, opts)

    tpg.BaseProcessGroupGloo = gloo
    uuid.uuid4 = lambda: uuid.UUID(int=2**128 - 1)


def _compression(kind: str):
    from torch_cgx import compression as C

    if kind == "fp16":
        return C.Float16Compression()
    if kind == "adaptive":  # the seed's policy, with a threshold that splits this model
        return C.SizeAdaptiveCompression(256, C.Float16Compression(), C.Uniform8BitQuantization())
    if kind == "maxmin4":
        return C.CGXCompression("maxmin", bits=4, bucket_size=64)
    return None


def _snapshot(opt, model, healed) -> dict:
    from torch_cgx.collaborative import wire

    return {
        "epoch": opt.local_epoch,
        "healed": healed,
        "params": {n: p.detach().clone() for n, p in model.named_parameters()},
        "optimizer": opt.optimizer.state_dict(),
        "table": opt.last_round.get("table"),
        "rank": wire.rank_of(opt.manager),
        "residuals": [None if r is None else r.clone() for r in opt.state.residuals],
        "time": time.time(),
    }


def write_whole(path: str, obj) -> None:
    """``obj`` (a str, else torch.save'd) at ``path``, whole or not at all: the test and the
    peers read these files while others write them."""
    if isinstance(obj, str):
        with open(path + ".tmp", "w") as f:
            f.write(obj)
    else:
        torch.save(obj, path + ".tmp")
    os.replace(path + ".tmp", path)


def run(
    out,
    name,
    first,
    delay,
    compression="fp16",
    kill_round=0,
    local=False,
    seed=0,
    stop=None,
    leave_mesh=0,
    timeout=5.0,
    background=False,
):
    from torch_cgx.collaborative import Optimizer, butterfly

    butterfly.PIECE_VALUES = 16  # this small model's rounds in 12 chunks: the pipeline runs
    if kill_round:
        _die_in_round(kill_round)
    if leave_mesh:
        _leave_mesh(leave_mesh)
    torch.manual_seed(1000 + seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    teacher = torch.nn.Linear(16, 1)
    torch.manual_seed(0)
    teacher.reset_parameters()
    address = None if first else _wait_for(os.path.join(out, "address"))
    opt = Optimizer(
        run_id="test", target_batch_size=TARGET, batch_size_per_step=BATCH,
        optimizer=lambda ps: torch.optim.Adam(ps, lr=0.01), params=model.parameters(),
        grad_compression=None if local else _compression(compression),
        state_averaging_compression=_compression(compression) if local else None,
        use_local_updates=local, initial_peers=address, host="127.0.0.1",
        matchmaking_time=3.0, averaging_timeout=timeout, heartbeat_timeout=1.0,
        delay_grad_averaging=background,
    )  # fmt: skip
    if first:
        write_whole(os.path.join(out, "address"), opt.address)
    folder = os.path.join(out, name)
    os.makedirs(folder, exist_ok=True)
    data = torch.Generator().manual_seed(7919 * (seed + 1))
    epoch = opt.local_epoch
    write_whole(os.path.join(folder, f"join{epoch}.pt"), _snapshot(opt, model, opt.healed))
    while True:
        last = stop if stop is not None else _stop_epoch(out, name)
        if last is not None and opt.local_epoch >= last:
            break
        x = torch.randn(BATCH, 16, generator=data)
        loss = torch.nn.functional.mse_loss(model(x), teacher(x).detach())
        loss.backward()
        time.sleep(delay)
        opt.step()
        opt.zero_grad()
        if opt.local_epoch != epoch:  # the round that changed it healed this peer or not
            epoch = opt.local_epoch
            write_whole(os.path.join(folder, f"{epoch}.pt"), _snapshot(opt, model, opt.healed))
    opt.shutdown()
