"""Emulated hosts, the process side: one rank per host, with torchrun's variables.

``run_on_hosts`` builds the hosts (benchmarks/hosts_net.py), starts ``python -m module``
in each namespace, forwards rank 0's output, and kills every rank on the first failure, a
timeout or Ctrl-C. docs/hosts.md.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from benchmarks.hosts_net import Host, _signals_deferred, emulated_hosts
from benchmarks.hosts_wan import wan_hosts

DEFAULT_PORT = 29600
HOST_ENV_MARK = "CGX_EMULATED_HOST"  # set in the ranks: no --hosts inside --hosts


def _repo_root() -> str:
    """The folder that holds benchmarks/ (and, in a checkout, torch_cgx/)."""
    return str(Path(__file__).resolve().parents[1])


def repo_pythonpath(env: Dict[str, str]) -> str:
    """env's PYTHONPATH with the repository root first: a rank started as ``python -m
    benchmarks.x`` imports this folder wherever its working directory is."""
    path = [_repo_root()] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join(dict.fromkeys(path))


def rank_env(
    host: Host, world: int, master: Host, port: int, extra=None, local: int = 0, per_host: int = 1
) -> Dict[str, str]:
    """The environment torchrun would give local rank `local` of `per_host` on `host` (world:
    the number of hosts)."""
    env = dict(os.environ)
    env.update(
        RANK=str(host.rank * per_host + local),
        WORLD_SIZE=str(world * per_host),
        LOCAL_RANK=str(local),
        LOCAL_WORLD_SIZE=str(per_host),
        GROUP_RANK=str(host.rank),
        MASTER_ADDR=master.ip,
        MASTER_PORT=str(port),
        GLOO_SOCKET_IFNAME=host.ifname,
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=repo_pythonpath(env),
    )
    env[HOST_ENV_MARK] = host.netns
    if "CGX_CODEC_THREADS" not in os.environ:  # the "hosts" share this machine's cores
        env["CGX_CODEC_THREADS"] = str(max(1, (os.cpu_count() or 1) // (world * per_host)))
    env.update(extra or {})
    return env


def _pump(src, dst) -> None:
    """Copies a child's pipe to one of our streams as bytes arrive (progress stays live)."""
    try:
        while True:
            data = src.read1(65536)
            if not data:
                break
            buf = getattr(dst, "buffer", None)
            if buf is not None:
                dst.flush()
                buf.write(data)
                buf.flush()
            else:
                dst.write(data.decode(errors="replace"))
                dst.flush()
    except (OSError, ValueError):
        pass


def _stop(procs: Sequence[subprocess.Popen], grace: float = 3.0) -> None:
    """SIGTERM, then SIGKILL after `grace`, to each still running rank's process group."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        alive = [p for p in procs if p.poll() is None]
        for p in alive:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, sig)  # each rank leads its own session (start_new_session)
        deadline = time.monotonic() + wait
        for p in alive:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(0.0, deadline - time.monotonic()))


def _exit_code(rc: int) -> int:
    return 128 - rc if rc < 0 else rc


def any_hosts(world: int, link: str, latency: Optional[str], prefix: Optional[str] = None):
    """The emulated hosts of ``link`` (and ``latency``: the TUN delay line of hosts_wan.py,
    this kernel having no netem; without: the bridge and tbf of hosts_net.py)."""
    if latency:
        from torch_cgx.plan.rates import parse_rate_bits, parse_time

        return wan_hosts(world, parse_rate_bits(link), parse_time(latency), prefix)
    return emulated_hosts(world, link, None, prefix)


def run_on_hosts(
    world: int,
    link: str,
    latency: Optional[str],
    module: str,
    argv: Sequence[str] = (),
    timeout: float = 3600.0,
    env: Optional[Dict[str, str]] = None,
    port: int = DEFAULT_PORT,
    prefix: Optional[str] = None,
    ranks_per_host: int = 1,
) -> int:
    """Runs `python -m module *argv` `ranks_per_host` times per emulated host (ranks of one host
    share its namespace and link; between them traffic stays on the host), with torchrun's
    variables.

    Rank 0's output is forwarded live; the other ranks' output is shown only when the run fails.
    Returns the first nonzero exit code (signals as 128 + n; 124 on timeout), else 0. A failing
    rank gets the others killed; Ctrl-C kills every rank (KeyboardInterrupt is re-raised after
    the cleanup)."""
    with any_hosts(world, link, latency, prefix) as hosts:
        procs: List[subprocess.Popen] = []
        logs: List = []
        pumps: List[threading.Thread] = []
        first: Optional[tuple] = None  # (rank, code) of the first rank to fail on its own
        try:
            for h, local in ((h, k) for h in hosts for k in range(ranks_per_host)):
                cmd = ["ip", "netns", "exec", h.netns, sys.executable, "-m", module, *argv]
                first_rank = h.rank == 0 and local == 0
                if first_rank:
                    out = err = subprocess.PIPE
                else:
                    log = tempfile.TemporaryFile()
                    logs.append(log)
                    out, err = log, subprocess.STDOUT
                p = subprocess.Popen(
                    cmd,
                    env=rank_env(h, world, hosts[0], port, env, local, ranks_per_host),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                )
                procs.append(p)
                if first_rank:
                    for src, dst in ((p.stdout, sys.stdout), (p.stderr, sys.stderr)):
                        t = threading.Thread(target=_pump, args=(src, dst), daemon=True)
                        t.start()
                        pumps.append(t)
            deadline = time.monotonic() + timeout
            while first is None and any(p.poll() is None for p in procs):
                if time.monotonic() > deadline:
                    print(f"run_on_hosts: timeout after {timeout:.0f} s", file=sys.stderr)
                    first = (-1, 124)
                    break
                first = next(((r, p.returncode) for r, p in enumerate(procs) if p.poll()), None)
                time.sleep(0.05)
            if first is None:
                first = next(((r, p.returncode) for r, p in enumerate(procs) if p.returncode), None)
            codes = [p.returncode for p in procs]  # None: still running, killed below
        finally:
            with _signals_deferred():
                _stop(procs)
                for t in pumps:
                    t.join(timeout=5)
        try:
            if first is not None:
                _report_failure(first, codes, logs, hosts)
        finally:
            for f in logs + [s for p in procs[:1] for s in (p.stdout, p.stderr)]:
                f.close()
        return 0 if first is None else _exit_code(first[1])


def _report_failure(first: tuple, codes: List, logs: List, hosts: List[Host]) -> None:
    rank, code = first
    if rank >= 0:
        print(f"run_on_hosts: rank {rank} exited with {_exit_code(code)}", file=sys.stderr)
    for r, log in enumerate(logs, start=1):  # the other ranks' output, kept until now
        log.seek(0)
        text = log.read().decode(errors="replace")
        state = "killed" if codes[r] is None else f"exit {_exit_code(codes[r])}"
        host = hosts[r * len(hosts) // len(codes)]  # ranks_per_host ranks per host, in order
        print(f"----- rank {r} ({host.netns}, {state}) -----", file=sys.stderr)
        sys.stderr.write(text if text.endswith("\n") or not text else text + "\n")
    sys.stderr.flush()
