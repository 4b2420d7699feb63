"""Each DDP hook's own time per gradient-bucket call, apart from the collective and the codec.

    python benchmarks/hook_overhead.py                 # 2 ranks on 127.0.0.1, every hook
    python benchmarks/hook_overhead.py --steps 50 --layers 10 --width 512 --bucket-cap-mb 4

Two real ranks (spawned processes, a cgx group over loopback) call each hook on the gradient
buckets of a model of ``--layers`` blocks (Linear(width, width) + LayerNorm(width)), cut as DDP
cuts them (parameters in reverse order, a new gradient bucket when ``--bucket-cap-mb`` is
reached). The hooks are called directly with bucket objects that answer DDP's ``GradBucket``
methods, so the timer sees the hook and nothing of DDP.

How the hook's own time is separated from the collective's: every module that imported
``cgx_backend`` gets a proxy for the group's backend. The proxy takes note of each native call
(``allreduce_with`` / ``allreduce_call`` / ``reduce_bucket``) and hands the hook a future of its
own; the timer issues the noted calls itself once the hook has returned, one after the other, so
the worker never runs while the hook does (on a machine with few cores it would otherwise slow
the hook down by running the collective beside it). Per bucket call:

- issue: the hook's call until it returns its future (settings, spans, staging where the hook
  stages) plus the native calls' own issuing (validation, enqueueing), timed one by one;
- collective + codec: from then until the real collectives are done (the worker's time: with
  ``reduce_bucket`` it includes the staging, rotation and unstaging the worker does);
- callback: the proxy's futures are completed on this thread, which runs the hook's callbacks
  (unstaging, residuals) then and there.

own = issue + callback, on the wall clock; "own cpu": the same in this thread's CPU time
(``time.thread_time``), which a machine shared with other work inflates less (time waiting for
a core is not counted). The proxy's Python layer adds about 1 us a call. Printed: medians over
``--steps`` steps (after ``--warmup``) per bucket call, the maximum over the two ranks.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from typing import Callable, Dict, List

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


class _Bucket:
    """What the hooks read of DDP's ``GradBucket``."""

    def __init__(self, params: List[torch.Tensor], index: int, last: bool) -> None:
        self._params, self._index, self._last = params, index, last
        self._buffer = torch.randn(sum(p.numel() for p in params))

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def set_buffer(self, buf: torch.Tensor) -> None:
        self._buffer = buf

    def parameters(self) -> List[torch.Tensor]:
        return self._params

    def gradients(self) -> List[torch.Tensor]:
        out, pos = [], 0
        for p in self._params:
            out.append(self._buffer[pos : pos + p.numel()].view_as(p))
            pos += p.numel()
        return out

    def index(self) -> int:
        return self._index

    def is_last(self) -> bool:
        return self._last


def make_model(layers: int, width: int) -> torch.nn.Module:
    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width), torch.nn.LayerNorm(width)]
    return torch.nn.Sequential(*blocks)


def grad_buckets(model: torch.nn.Module, cap_mb: float) -> List[_Bucket]:
    """DDP's cut: parameters in reverse order, a new gradient bucket at ``cap_mb`` MiB."""
    cap, groups, size = cap_mb * (1 << 20), [[]], 0
    for p in reversed(list(model.parameters())):
        if groups[-1] and size + p.numel() * 4 > cap:
            groups.append([])
            size = 0
        groups[-1].append(p)
        size += p.numel() * 4
    return [_Bucket(ps, i, i == len(groups) - 1) for i, ps in enumerate(groups)]


class _Timed:
    """A stand-in for the native backend: notes the hooks' native calls for the timer to issue,
    and hands out futures the timer completes."""

    def __init__(self, real) -> None:
        self._real = real
        self.noted = []  # (issue the real call, our future, the tensor it returns)

    def __getattr__(self, name):
        return getattr(self._real, name)

    def _note(self, call, tensor):
        fut = torch.futures.Future()
        self.noted.append((call, fut, tensor))
        return _Work(fut)

    def allreduce_with(self, tensor, config, average, residual=None):
        call = lambda: self._real.allreduce_with(tensor, config, average, residual)  # noqa: E731
        return self._note(call, tensor)

    def allreduce_call(self, tensor, options, average, residual=None):
        call = lambda: self._real.allreduce_call(tensor, options, average, residual)  # noqa: E731
        return self._note(call, tensor)

    def reduce_bucket(self, buffer, parts, average=True):
        call = lambda: self._real.reduce_bucket(buffer, parts, average)  # noqa: E731
        return self._note(call, buffer)


class _Work:
    def __init__(self, fut) -> None:
        self._fut = fut

    def get_future(self):
        return self._fut

    def wait(self):
        return self._fut.wait()


def _install_proxy() -> _Timed:
    """Every loaded torch_cgx module's ``cgx_backend`` returns the proxy from now on."""
    from torch_cgx import backend as backend_module

    real = backend_module.cgx_backend
    proxy = _Timed(real(None))

    def patched(group=None):
        return proxy

    for name, module in list(sys.modules.items()):
        if name.startswith("torch_cgx") and getattr(module, "cgx_backend", None) is real:
            module.cgx_backend = patched
    return proxy


def _hooks(model: torch.nn.Module) -> Dict[str, Callable[[], tuple]]:
    """name -> a function making (state, hook) afresh."""
    from torch_cgx import CGXState, cgx_hook
    from torch_cgx.compression import (
        NoCompression,
        SizeAdaptiveCompression,
        Uniform8BitQuantization,
    )
    from torch_cgx.compression.ddp import PolicyState, policy_hook
    from torch_cgx.hooks import CompressionState, compression_hook

    params = {"bits": 4, "bucket_size": 512}
    policy = SizeAdaptiveCompression(4096, NoCompression(), Uniform8BitQuantization())
    return {
        "cgx_hook (default levers)": lambda: (CGXState(None, 1024, params, module=model), cgx_hook),
        "cgx_hook (legacy)": lambda: (CGXState(None, 1024, params, legacy=True), cgx_hook),
        "compression_hook maxmin": lambda: (
            CompressionState(None, "maxmin", params, module=model),
            compression_hook,
        ),
        "compression_hook topk": lambda: (
            CompressionState(None, "topk", {"ratio": 0.01}, module=model),
            compression_hook,
        ),
        "policy_hook": lambda: (PolicyState(model, policy), policy_hook),
    }


def _step(proxy: _Timed, state, hook, buckets) -> List[tuple]:
    """One step over every bucket; per bucket call, seconds of (issue, collective, callback)
    on the wall clock, then (issue, callback) in this thread's CPU time."""
    out = []
    wall, cpu = time.perf_counter, time.thread_time
    for bucket in buckets:
        w0, c0 = wall(), cpu()
        fut = hook(state, bucket)
        works = []
        for call, _, _ in proxy.noted:
            works.append(call())
        w1, c1 = wall(), cpu()
        for work in works:
            work.wait()
        w2, c2 = wall(), cpu()
        for _, ours, tensor in proxy.noted:
            ours.set_result([tensor])
        fut.wait()
        w3, c3 = wall(), cpu()
        proxy.noted.clear()
        out.append((w1 - w0, w2 - w1, w3 - w2, c1 - c0, c3 - c2))
    return out


def _rank(rank: int, world: int, port: int, args, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), GLOO_SOCKET_IFNAME="lo")  # fmt: skip
    torch.set_num_threads(1)
    import torch_cgx  # noqa: F401  (registers the backend)

    dist.init_process_group("cgx")
    torch.manual_seed(0)
    model = make_model(args.layers, args.width)
    buckets = grad_buckets(model, args.bucket_cap_mb)
    proxy = _install_proxy()
    rows = {}
    for name, make in _hooks(model).items():
        if args.only and args.only not in name:
            continue
        state, hook = make()
        samples = []
        for step in range(args.warmup + args.steps):
            times = _step(proxy, state, hook, buckets)
            if step >= args.warmup:
                samples += times
        rows[name] = [statistics.median(s[i] for s in samples) * 1e3 for i in range(5)]
    dist.barrier()
    queue.put((rank, rows, [b.buffer().numel() for b in buckets]))
    dist.destroy_process_group()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--bucket-cap-mb", type=float, default=4.0)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--only", default="", help="run the hooks whose name contains this")
    args = parser.parse_args(argv)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, 2, port, args, queue)) for r in range(2)]
    for p in procs:
        p.start()
    got = [queue.get(timeout=1800) for _ in procs]
    for p in procs:
        p.join()
    results = {rank: rows for rank, rows, _ in got}
    sizes = got[0][2]
    print(f"2 ranks, loopback; {args.layers} x (Linear({args.width}, {args.width}) + LayerNorm); "
          f"bucket cap {args.bucket_cap_mb:g} MiB; median of {args.steps} steps per bucket call; "
          f"gradient buckets of {sizes} values; ms (max over ranks)")  # fmt: skip
    print(f"{'hook':28s} {'own':>7s} {'issue':>7s} {'callback':>8s} {'own cpu':>8s} "
          f"{'coll+codec':>10s}")  # fmt: skip
    for name in results[0]:
        issue, coll, back, issue_cpu, back_cpu = (
            max(results[r][name][i] for r in results) for i in range(5)
        )
        print(f"{name:28s} {issue + back:7.3f} {issue:7.3f} {back:8.3f} "
              f"{issue_cpu + back_cpu:8.3f} {coll:10.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
