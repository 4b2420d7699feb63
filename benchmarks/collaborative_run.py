"""One peer of ``python -m benchmarks.collaborative`` (run inside an emulated host): the same
model, data and arguments through ``torch_cgx.collaborative.Optimizer`` ("cgx") or
``hivemind.Optimizer`` ("hivemind"); "-delay" adds hivemind's ``delay_grad_averaging``,
"-wait" torch_cgx's ``wait_for_round``.

A peer first trains alone (plain Adam, no collaboration) until ``--join-at``: its solo rate,
measured while every other peer does the same (they share this machine's cores). Then it joins
the collaboration and trains until ``--end`` (absolute times, ``time.time()``), logging every
epoch to ``<out>/<name>.jsonl``; peer 0 then writes the held-out loss. A host's compute is
stretched by ``CGX_HOST_SLOWDOWN`` (benchmarks/hosts_slow.py).
"""

from __future__ import annotations

import json
import os
import time
from functools import partial

import torch

from benchmarks.hosts_slow import slowed

IN, HIDDEN, CLASSES = 512, 1024, 10  # 1.06M parameters


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(),
                               torch.nn.Linear(HIDDEN, IN), torch.nn.ReLU(),
                               torch.nn.Linear(IN, CLASSES))  # fmt: skip


class Data:
    """Inputs N(0, 1), labels from a fixed random teacher; a stream per peer."""

    def __init__(self, seed: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.w1 = torch.randn(IN, 64, generator=g) / IN**0.5
        self.w2 = torch.randn(64, CLASSES, generator=g) / 8
        self.gen = torch.Generator().manual_seed(1000 + seed)

    def batch(self, n: int, gen=None):
        x = torch.randn(n, IN, generator=gen or self.gen)
        return x, (torch.tanh(x @ self.w1) @ self.w2).argmax(1)

    def held_out(self):
        return self.batch(2048, torch.Generator().manual_seed(99))


def _compression(name: str, hivemind: bool):
    if hivemind:
        import hivemind.compression as lib
    else:
        from torch_cgx import compression as lib
    if name == "fp16":
        return lib.Float16Compression()
    if name == "none":
        return lib.NoCompression()
    if name == "maxmin4" and not hivemind:
        return lib.CGXCompression("maxmin", bits=4)
    raise ValueError(f"compression {name!r} is not available for this system")


def _optimizer(args, model, address):
    hivemind_system = args.system.startswith("hivemind")
    opts = dict(run_id="bench", target_batch_size=args.target, batch_size_per_step=args.batch,
                optimizer=partial(torch.optim.Adam, lr=1e-3), params=model.parameters(),
                matchmaking_time=args.matchmaking_time, averaging_timeout=args.averaging_timeout,
                grad_compression=_compression(args.compression, hivemind_system),
                state_averaging_compression=_compression(args.compression,
                                                         hivemind_system))  # fmt: skip
    if "-delay" in args.system:
        opts.update(delay_grad_averaging=True, delay_optimizer_step=True)
        if args.system.endswith("-wait"):
            opts["wait_for_round"] = True
        if hivemind_system:  # hivemind's delayed step needs its offloaded optimizer
            opts["offload_optimizer"] = True
    if hivemind_system:
        import hivemind

        peers = [address] if address else []
        dht = hivemind.DHT(host_maddrs=[f"/ip4/{args.ip}/tcp/0"], initial_peers=peers, start=True)
        opt = hivemind.Optimizer(dht=dht, **opts)
        mine = [str(a) for a in dht.get_visible_maddrs() if f"/ip4/{args.ip}/" in str(a)]
        return opt, mine[0] if mine else None
    from torch_cgx.collaborative import Optimizer

    opt = Optimizer(initial_peers=address, host=args.ip, **opts)
    return opt, opt.address


def _solo(model, data, batch: int, until: float) -> float:
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    state = [p.detach().clone() for p in model.parameters()]
    samples, start = 0, time.perf_counter()
    while time.time() < until:
        x, y = data.batch(batch)
        with slowed():
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        samples += batch
    with torch.no_grad():  # the collaboration starts from the seeded model
        for p, s in zip(model.parameters(), state):
            p.copy_(s)
    return samples / (time.perf_counter() - start)


def _log(f, **row) -> None:
    f.write(json.dumps(row) + "\n")
    f.flush()


def run_peer(args) -> None:
    torch.set_num_threads(1)
    started = time.time()
    model, data = make_model(args.seed), Data(args.index)
    solo = _solo(model, data, args.batch, args.join_at) if args.join_at > time.time() else None
    address = None
    if args.index > 0:
        path = os.path.join(args.out, f"{args.system}.address")
        while not os.path.exists(path):
            time.sleep(0.05)
        address = open(path).read().strip()
    with open(os.path.join(args.out, f"{args.system}-{args.name}.jsonl"), "a") as f:
        _log(f, event="start", time=started, solo=solo)
        opt, mine = _optimizer(args, model, address)
        if args.index == 0:
            with open(os.path.join(args.out, f"{args.system}.address.tmp"), "w") as a:
                a.write(mine)
            os.replace(os.path.join(args.out, f"{args.system}.address.tmp"),
                       os.path.join(args.out, f"{args.system}.address"))  # fmt: skip
        _log(f, event="joined", time=time.time(), epoch=opt.local_epoch)
        _train(args, opt, model, data, f)


def _held_out(model, data) -> float:
    x, y = data.held_out()
    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(model(x), y))


def _train(args, opt, model, data, f) -> None:
    epoch, samples, check = opt.local_epoch, 0, time.time()
    while time.time() < args.end:
        if args.index == 0 and time.time() >= check:  # the held-out loss every 2 s
            _log(f, event="loss", time=time.time(), loss=_held_out(model, data))
            check += 2.0
        x, y = data.batch(args.batch)
        with slowed():
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
        opt.step()
        opt.zero_grad()
        samples += args.batch
        if opt.local_epoch != epoch:
            epoch = opt.local_epoch
            last = getattr(opt, "last_round", {})  # torch_cgx's: the round's times
            _log(f, event="epoch", time=time.time(), epoch=epoch, samples=samples,
                 round=last.get("seconds"), phases=last.get("phases"))  # fmt: skip
    if args.index == 0:
        held = _held_out(model, data)
        _log(f, event="end", time=time.time(), epoch=epoch, samples=samples, loss=held)
    else:
        _log(f, event="end", time=time.time(), epoch=epoch, samples=samples)
    os._exit(0)  # leave at once: the others may be in a round (the driver ends them)
