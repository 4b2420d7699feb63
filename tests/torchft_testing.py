"""What the torchft tests share (their Lighthouse is the ``lighthouse`` fixture of conftest.py):
replica processes started from the fork server with their snapshots in a folder, bitwise
comparison."""

from __future__ import annotations

import os
import signal
import time

import torch
import torch.multiprocessing as mp
import torchft_replica
from dist_helpers import context_start_method

TIMEOUT = 5.0  # the replicas' process-group and manager timeout (s)
LIMIT = 120.0  # any wait here


class Replicas:
    def __init__(self, out, lighthouse, compressor, params, streaming):
        self.out, self.args = str(out), (lighthouse, compressor, params)
        self.streaming = streaming  # False, "delay" or "semi_async"
        self.ctx = mp.get_context(context_start_method())
        self.procs = {}

    def start(self, name: str, kill_at: int = 0):
        target = torchft_replica.run
        lighthouse, compressor, params = self.args
        streaming, semi = bool(self.streaming), self.streaming == "semi_async"
        args = (self.out, lighthouse, name, compressor, params, kill_at, TIMEOUT, streaming, semi)
        self.procs[name] = self.ctx.Process(target=target, args=args, daemon=True)
        self.procs[name].start()

    def steps(self, name: str):
        folder = os.path.join(self.out, name)
        if not os.path.isdir(folder):
            return []
        return sorted(int(f[:-3]) for f in os.listdir(folder) if f.endswith(".pt"))

    def load(self, name: str, step: int) -> dict:
        return torch.load(os.path.join(self.out, name, f"{step}.pt"), weights_only=False)

    def wait(self, what, condition):
        deadline = time.monotonic() + LIMIT
        while not condition():
            for name, p in self.procs.items():
                if p.exitcode not in (None, -signal.SIGKILL):
                    raise AssertionError(f"replica {name} exited with {p.exitcode} waiting {what}")
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.05)

    def stop_at(self, step: int, names) -> None:
        with open(os.path.join(self.out, "stop.tmp"), "w") as f:
            f.write(str(step))
        os.replace(os.path.join(self.out, "stop.tmp"), os.path.join(self.out, "stop"))
        for name in names:
            self.procs[name].join(LIMIT)
            assert self.procs[name].exitcode == 0, (name, self.procs[name].exitcode)

    def kill_all(self):
        for p in self.procs.values():
            if p.is_alive():
                p.kill()
                p.join(10)


def _equal(a, b, what):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), what
        for key in a:
            _equal(a[key], b[key], f"{what}.{key}")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), what
    elif isinstance(a, (list, tuple)):
        for i, (x, y) in enumerate(zip(a, b)):
            _equal(x, y, f"{what}[{i}]")
    else:
        assert a == b, what
