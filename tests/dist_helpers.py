"""Runs a function on W real ranks (separate processes, TCP store on 127.0.0.1, Gloo sockets)."""

from __future__ import annotations

import os
import signal
import socket
import sys
import tempfile
import time
from typing import Callable, Dict, Optional

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


RANK_LOG = "_CGX_TEST_RANK_LOG"  # in ``env``: where a rank writes its stdout and stderr


def _entry(rank, fn, world, port, env, args):
    import faulthandler

    # ``env``: the caller's environment as it was at the call (a fork server's children inherit
    # the server's, from when it started) with the call's own variables
    env = dict(env)
    log = env.pop(RANK_LOG, None)
    if log:  # the fork server's stdout / stderr are whatever they were when it started
        fd = os.open(log, os.O_WRONLY | os.O_APPEND)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    faulthandler.enable()  # a crash in a rank prints its Python stack
    os.environ.update(env)
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank),
            "GLOO_SOCKET_IFNAME": "lo",
            "OMP_NUM_THREADS": "1",
            "CGX_CODEC_THREADS": "1",
        }
    )
    import torch

    torch.set_num_threads(1)
    fn(rank, world, *args)


# Ranks start from a fork server that has imported torch and torch_cgx once (about a second of
# CPU saved per rank against "spawn", which imports them again in every rank: most of the
# suite's time on a 2-core machine). CGX_TEST_START_METHOD=spawn restores the old behaviour.
START_METHOD = os.environ.get("CGX_TEST_START_METHOD", "forkserver")
PRELOAD = ["torch", "torch.distributed", "torch_cgx", "dist_helpers"]


def context_start_method() -> str:
    """The start method of the tests' ranks (the fork server's preload set on first use)."""
    if START_METHOD == "forkserver":
        import multiprocessing

        multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
    return START_METHOD


def run_ranks(
    fn: Callable,
    world: int,
    *args,
    env: Optional[Dict[str, str]] = None,
    timeout: float = 120,
    port: Optional[int] = None,
) -> None:
    """Starts `world` processes running fn(rank, world, *args); re-raises the first failure.

    A hang fails: after `timeout` seconds in all, every rank still running is killed and
    TimeoutError raised. What the ranks print is printed here afterwards (on stderr: pytest
    shows it with the test's failure)."""
    fd, log = tempfile.mkstemp(prefix="cgx-ranks-", suffix=".log")
    os.close(fd)
    ctx = mp.start_processes(
        _entry,
        args=(fn, world, port or free_port(), {**os.environ, **(env or {}), RANK_LOG: log}, args),
        nprocs=world,
        join=False,
        start_method=context_start_method(),
    )
    deadline = time.monotonic() + timeout
    try:
        while not ctx.join(timeout=max(0.1, min(5.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                alive = [r for r, p in enumerate(ctx.processes) if p.is_alive()]
                raise TimeoutError(f"ranks {alive} still running after {timeout:g} s (a hang?)")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
                p.join(5)
        with open(log, errors="replace") as f:
            sys.stderr.write(f.read())
        os.unlink(log)
