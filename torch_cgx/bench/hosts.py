"""Emulated multi-host runs on one machine: network namespaces, a bridge, rate-limited links.

    python -m torch_cgx.bench.hosts --hosts 2 --link 1gbit --check    # measure the links
    python -m torch_cgx.bench.allreduce --hosts 2 --link 1gbit -b 4M -e 16M --bits 4

Every emulated host is a network namespace with ``lo`` and one veth ``eth0``; the other ends of
the veths are ports of a Linux bridge living in its own namespace. Each host's link is limited to
``--link`` in both directions (a tbf qdisc on ``eth0``, the host's egress, and one on the bridge
port, the host's ingress); ``--latency`` adds a netem delay on each host's egress (one-way delay
between two hosts = latency). Nothing is created in, and no address is used from, the caller's
namespace. Needs root and iproute2; see docs/hosts.md.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

HZ = 250  # tbf needs burst >= rate / HZ; 250 is the common kernel setting (1000 also exists)
MIN_BURST = 64 * 1024  # bytes; also >= the largest GSO packet, so tbf never has to split one
DEFAULT_PORT = 29600
# TCP payload per 1500-byte-MTU frame is 1448 B (IP 20 + TCP 20 + timestamps 12); tbf counts the
# 1514 B frame (Ethernet header included), so TCP goodput tops out at 95.6% of the link rate.
FRAME_OVER_PAYLOAD = 1514 / 1448
HOST_ENV_MARK = "CGX_EMULATED_HOST"  # set in the ranks: no --hosts inside --hosts

_seq = itertools.count()


class HostsUnavailable(RuntimeError):
    """Emulated hosts cannot be created here (not root, no iproute2, no netns/tbf/netem)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Host:
    rank: int
    netns: str  # network namespace name (`ip netns exec <netns> ...`)
    ip: str  # address of eth0, only reachable from the other emulated hosts
    ifname: str = "eth0"


# ------------------------------------------------------------------------------------ parsing

_RATE_UNITS = {
    "bit": 1,
    "kbit": 10**3,
    "mbit": 10**6,
    "gbit": 10**9,
    "tbit": 10**12,
    "bps": 8,
    "kbps": 8 * 10**3,
    "mbps": 8 * 10**6,
    "gbps": 8 * 10**9,
}
_TIME_UNITS = {"us": 1e-6, "usec": 1e-6, "ms": 1e-3, "msec": 1e-3, "s": 1.0, "sec": 1.0}


def parse_rate(text: str) -> int:
    """tc-style rate -> bit/s: "100mbit", "1gbit", "10Gbit", "125mbps" (bytes/s, as in tc)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _RATE_UNITS:
        raise ValueError(f"not a rate: {text!r} (examples: 100mbit, 1gbit, 10gbit)")
    bits = int(float(m.group(1)) * _RATE_UNITS[unit])
    if bits < 8000:
        raise ValueError(f"rate too small: {text!r}")
    return bits


def parse_time(text: str) -> float:
    """tc-style time -> seconds: "1ms", "200us", "0.5s"."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _TIME_UNITS:
        raise ValueError(f"not a time: {text!r} (examples: 200us, 1ms, 10ms)")
    return float(m.group(1)) * _TIME_UNITS[unit]


def format_rate(bits: float) -> str:
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits >= scale:
            return f"{bits / scale:.3g} {unit}"
    return f"{bits:.0f} bit/s"


def tbf_params(rate_bits: int) -> Dict[str, int]:
    """burst >= rate / HZ (else tbf cannot reach the rate), at least 64 KiB; the queue holds
    the burst plus 20 ms at the rate."""
    rate_bytes = rate_bits // 8
    burst = max(rate_bytes // HZ, MIN_BURST)
    return {"burst": burst, "limit": burst + max(rate_bytes // 50, 2 * MIN_BURST)}


# ------------------------------------------------------------------------------------ commands


def _cmd(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(list(args), capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if check and p.returncode != 0:
        raise RuntimeError(f"`{' '.join(args)}` failed: {(p.stderr or p.stdout).strip()}")
    return p


def _sh(line: str, check: bool = True) -> subprocess.CompletedProcess:
    """_cmd of a command line; every word we pass is a plain token (names are checked)."""
    return _cmd(*line.split(), check=check)


def _netns_list() -> List[str]:
    out = _cmd("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _root_links() -> List[str]:
    out = _cmd("ip", "-o", "link", "show", check=False).stdout
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]


def _tbf(ns: str, dev: str, rate_bits: int, delay: Optional[float]) -> None:
    p = tbf_params(rate_bits)
    _sh(
        f"tc -n {ns} qdisc add dev {dev} root handle 1: tbf rate {rate_bits}bit "
        f"burst {p['burst']} limit {p['limit']}"
    )
    if delay:
        # netem as tbf's child: packets are shaped by tbf, then held for `delay`.
        limit = max(1000, int(rate_bits / 8 / 1500 * (delay + 0.05)))  # packets in flight
        p = _sh(
            f"tc -n {ns} qdisc add dev {dev} parent 1:1 handle 10: netem "
            f"delay {round(delay * 1e6)}us limit {limit}",
            check=False,
        )
        if p.returncode != 0:
            raise HostsUnavailable(
                "--latency needs the netem qdisc, which this kernel lacks "
                f"(CONFIG_NET_SCH_NETEM / sch_netem): {p.stderr.strip()}"
            )


# ---------------------------------------------------------------------------- prerequisites


def check_prerequisites(latency: bool = False) -> None:
    """Raises HostsUnavailable(reason) unless namespaces, veths, a bridge and tbf (and netem,
    with `latency`) can be used: checked by building and deleting a probe namespace."""
    if os.geteuid() != 0:
        raise HostsUnavailable("emulated hosts need root (network namespaces, tc); run as root")
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    if missing:
        raise HostsUnavailable(
            f"emulated hosts need iproute2: {' and '.join(missing)} not found "
            "(apt-get install iproute2)"
        )
    ns = f"cgxprobe{os.getpid()}"
    p = _cmd("ip", "netns", "add", ns, check=False)
    if p.returncode != 0:
        raise HostsUnavailable(f"cannot create a network namespace: {p.stderr.strip()}")
    try:
        steps = [
            ("a veth pair", f"ip -n {ns} link add cgxa type veth peer name cgxb"),
            ("a bridge", f"ip -n {ns} link add cgxbr type bridge"),
            (
                "tbf",
                f"tc -n {ns} qdisc add dev cgxa root tbf rate 1gbit burst {MIN_BURST} "
                f"limit {2 * MIN_BURST}",
            ),
        ]
        if latency:
            steps.append(("netem", f"tc -n {ns} qdisc add dev cgxb root netem delay 1ms"))
        for what, line in steps:
            p = _sh(line, check=False)
            if p.returncode != 0:
                why = p.stderr.strip()
                if what == "netem":
                    raise HostsUnavailable(
                        "--latency needs the netem qdisc, which this kernel lacks "
                        f"(CONFIG_NET_SCH_NETEM / module sch_netem): {why}"
                    )
                raise HostsUnavailable(f"cannot create {what} in a namespace: {why}")
    finally:
        _cmd("ip", "netns", "del", ns, check=False)


# --------------------------------------------------------------------------------- the hosts


class _Terminated(SystemExit):
    pass


def _raise_terminated(signum, frame):
    raise _Terminated(128 + signum)


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """While inside: SIGTERM / SIGHUP raise SystemExit(128 + sig), so `finally` blocks run
    (SIGINT already raises KeyboardInterrupt). Only the main thread can install handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, _raise_terminated) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Blocks SIGINT / SIGTERM / SIGHUP (delivered afterwards) so a cleanup runs to its end."""
    sigs = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _subnet(pid: int, seq: int) -> int:
    return 1 + (pid + 37 * seq) % 254


@contextlib.contextmanager
def emulated_hosts(
    world: int, link: str, latency: Optional[str] = None, prefix: Optional[str] = None
) -> Iterator[List[Host]]:
    """Creates `world` emulated hosts linked at `link` (both directions) through one bridge;
    yields their Host records; deletes everything it created on exit, exception, Ctrl-C or
    SIGTERM. Namespaces: `<prefix>-br` (bridge) and `<prefix>-h<i>`; the default prefix is
    `cgx<pid>-<n>`. Addresses: 10.213.<k>.<i+1>/24, k from the pid (each run has its own
    bridge, so concurrent runs cannot collide anyway)."""
    rate = parse_rate(link)
    delay = parse_time(latency) if latency else None
    if not 1 <= world <= 250:
        raise ValueError(f"world must be in 1..250, got {world}")
    seq = next(_seq)
    prefix = prefix or f"cgx{os.getpid()}-{seq}"
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,40}", prefix):
        raise ValueError(f"bad prefix {prefix!r}")
    k = _subnet(os.getpid(), seq)
    bridge_ns = f"{prefix}-br"
    hosts = [Host(i, f"{prefix}-h{i}", f"10.213.{k}.{i + 1}") for i in range(world)]
    taken = set(_netns_list()) & {bridge_ns, *(h.netns for h in hosts)}
    if taken:
        raise RuntimeError(f"namespaces already exist (not ours, left alone): {sorted(taken)}")
    created: List[str] = []  # namespaces this call made, deleted in reverse order
    ok = False
    with _signals_raise():
        try:
            with _signals_deferred():  # no signal between creating and recording it
                _cmd("ip", "netns", "add", bridge_ns)
                created.append(bridge_ns)
            _cmd("ip", "-n", bridge_ns, "link", "add", "br0", "type", "bridge")
            _cmd("ip", "-n", bridge_ns, "link", "set", "dev", "br0", "up")
            for h in hosts:
                port = f"p{h.rank}"
                with _signals_deferred():
                    _cmd("ip", "netns", "add", h.netns)
                    created.append(h.netns)
                _cmd("ip", "-n", h.netns, "link", "set", "dev", "lo", "up")
                # Both ends are created inside our namespaces, never in the caller's.
                _sh(
                    f"ip -n {h.netns} link add {h.ifname} type veth peer name {port} "
                    f"netns {bridge_ns}"
                )
                _cmd("ip", "-n", bridge_ns, "link", "set", "dev", port, "master", "br0")
                _cmd("ip", "-n", bridge_ns, "link", "set", "dev", port, "up")
                _cmd("ip", "-n", h.netns, "addr", "add", f"{h.ip}/24", "dev", h.ifname)
                _cmd("ip", "-n", h.netns, "link", "set", "dev", h.ifname, "up")
                _tbf(h.netns, h.ifname, rate, delay)  # host egress
                _tbf(bridge_ns, port, rate, None)  # host ingress
            yield hosts
            ok = True
        finally:
            with _signals_deferred():
                left = _teardown(bridge_ns, hosts, created, prefix)
            if left:
                msg = f"emulated hosts: could not remove {left}"
                if ok:
                    raise RuntimeError(msg)
                print(msg, file=sys.stderr)


def _teardown(bridge_ns: str, hosts: List[Host], created: List[str], prefix: str) -> List[str]:
    """Deletes the veths (both ends, synchronously), the bridge, then the namespaces; returns
    what is still there."""
    if bridge_ns in created:
        for h in hosts:
            _cmd("ip", "-n", bridge_ns, "link", "del", "dev", f"p{h.rank}", check=False)
        _cmd("ip", "-n", bridge_ns, "link", "del", "dev", "br0", check=False)
    left = []
    for ns in reversed(created):
        if ns != bridge_ns:
            out = _cmd("ip", "-n", ns, "-o", "link", "show", check=False).stdout
            if "eth0" in out:  # the bridge side was gone already: delete from this side
                _cmd("ip", "-n", ns, "link", "del", "dev", "eth0", check=False)
        _cmd("ip", "netns", "del", ns, check=False)
    names = set(_netns_list())
    left += [ns for ns in created if ns in names]
    left += [f"link {name}" for name in _root_links() if name.startswith(prefix)]
    return left


def cleanup_stale(verbose: bool = True) -> List[str]:
    """Deletes namespaces with this module's default names whose process is gone (after a
    SIGKILL, which no handler can catch); returns their names."""
    removed = []
    for ns in _netns_list():
        m = re.fullmatch(r"cgx(?:probe)?(\d+)(?:-\d+-(?:br|h\d+))?", ns)
        if m and not Path(f"/proc/{m.group(1)}").exists():
            _cmd("ip", "netns", "del", ns, check=False)
            removed.append(ns)
            if verbose:
                print(f"removed stale namespace {ns}")
    return removed


# ----------------------------------------------------------------------------- running ranks


def _package_root() -> str:
    return str(Path(__file__).resolve().parents[2])


def rank_env(host: Host, world: int, master: Host, port: int, extra=None) -> Dict[str, str]:
    """The environment torchrun would give the rank of `host` (one process per host)."""
    env = dict(os.environ)
    path = [_package_root()] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env.update(
        RANK=str(host.rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK="0",
        LOCAL_WORLD_SIZE="1",
        GROUP_RANK=str(host.rank),
        MASTER_ADDR=master.ip,
        MASTER_PORT=str(port),
        GLOO_SOCKET_IFNAME=host.ifname,
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(dict.fromkeys(path)),
    )
    env[HOST_ENV_MARK] = host.netns
    if "CGX_CODEC_THREADS" not in os.environ:  # the "hosts" share this machine's cores
        env["CGX_CODEC_THREADS"] = str(max(1, (os.cpu_count() or 1) // world))
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
) -> int:
    """Runs `python -m module *argv` once per emulated host, with torchrun's variables.

    Rank 0's output is forwarded live; the other ranks' output is shown only when the run fails.
    Returns the first nonzero exit code (signals as 128 + n; 124 on timeout), else 0. A failing
    rank gets the others killed; Ctrl-C kills every rank (KeyboardInterrupt is re-raised after
    the cleanup)."""
    with emulated_hosts(world, link, latency, prefix) as hosts:
        procs: List[subprocess.Popen] = []
        logs: List = []
        pumps: List[threading.Thread] = []
        first: Optional[tuple] = None  # (rank, code) of the first rank to fail on its own
        try:
            for h in hosts:
                cmd = ["ip", "netns", "exec", h.netns, sys.executable, "-m", module, *argv]
                if h.rank == 0:
                    out = err = subprocess.PIPE
                else:
                    log = tempfile.TemporaryFile()
                    logs.append(log)
                    out, err = log, subprocess.STDOUT
                p = subprocess.Popen(
                    cmd,
                    env=rank_env(h, world, hosts[0], port, env),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                )
                procs.append(p)
                if h.rank == 0:
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
        print(f"----- rank {r} ({hosts[r].netns}, {state}) -----", file=sys.stderr)
        sys.stderr.write(text if text.endswith("\n") or not text else text + "\n")
    sys.stderr.flush()


def maybe_run_on_hosts(argv: Sequence[str], module: str) -> Optional[int]:
    """For a benchmark's main(): with `--hosts W --link RATE [--latency T]` in argv, runs
    `python -m module <argv without them>` on W emulated hosts and returns its exit code;
    without --hosts returns None (run normally). Missing prerequisites: the reason on stderr,
    2."""
    rest, opts = [], {}
    it = iter(argv)
    for a in it:
        name, eq, value = a.partition("=")
        if name in ("--hosts", "--link", "--latency"):
            if not eq:
                value = next(it, None)
                if value is None or value.startswith("--"):
                    raise SystemExit(f"{name} needs a value")
            opts[name] = value
        else:
            rest.append(a)
    if "--hosts" not in opts:
        if opts:
            raise SystemExit(f"{' and '.join(opts)} need --hosts W (emulated hosts)")
        return None
    if "--link" not in opts:
        raise SystemExit("--hosts needs --link RATE (e.g. --link 1gbit): the emulated link speed")
    if os.environ.get(HOST_ENV_MARK):
        raise SystemExit("--hosts given inside an emulated host")
    try:
        world = int(opts["--hosts"])
        parse_rate(opts["--link"])
        if "--latency" in opts:
            parse_time(opts["--latency"])
    except ValueError as e:
        raise SystemExit(f"--hosts/--link/--latency: {e}") from None
    if world < 1:
        raise SystemExit("--hosts needs W >= 1")
    try:
        check_prerequisites(latency="--latency" in opts)
    except HostsUnavailable as e:
        print(f"emulated hosts unavailable: {e.reason}", file=sys.stderr)
        return 2
    try:
        return run_on_hosts(world, opts["--link"], opts.get("--latency"), module, rest)
    except HostsUnavailable as e:
        print(f"emulated hosts unavailable: {e.reason}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: ranks killed, emulated hosts removed", file=sys.stderr)
        return 130


# ------------------------------------------------------------------------- link measurement

# Run with `python -c` inside the namespaces (no torch import: starts in ~50 ms).
_PROBE = r"""
import json, socket, statistics, sys, time
role, ip, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
if role == "recv":
    srv = socket.create_server((ip, port))
    print("listening", flush=True)
    c, _ = srv.accept()
    n = int.from_bytes(c.recv(8, socket.MSG_WAITALL), "little")
    buf, got, mark, t0 = bytearray(1 << 20), 0, n // 8, None
    while got < n:
        k = c.recv_into(buf, min(len(buf), n - got))
        if not k:
            break
        got += k
        if t0 is None and got >= mark:
            t0, g0 = time.perf_counter(), got
    t1 = time.perf_counter()
    c.sendall(b"k")
    for _ in range(int(sys.argv[4])):
        c.sendall(c.recv(1))
    print(json.dumps({"bytes": got - g0, "seconds": t1 - t0, "total": got}), flush=True)
else:
    n, rounds = int(sys.argv[4]), int(sys.argv[5])
    for _ in range(200):
        try:
            c = socket.create_connection((ip, port), timeout=30)
            break
        except OSError:
            time.sleep(0.05)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    c.sendall(n.to_bytes(8, "little"))
    chunk, left = b"\0" * (1 << 20), n
    while left:
        left -= c.send(chunk[: min(left, len(chunk))])
    c.recv(1)
    rtt = []
    for _ in range(rounds):
        t = time.perf_counter()
        c.sendall(b"p")
        c.recv(1)
        rtt.append(time.perf_counter() - t)
    print(json.dumps({"rtt_us": statistics.median(rtt) * 1e6 if rtt else None}), flush=True)
"""


def measure_link(src: Host, dst: Host, nbytes: int, port: int = 5201, rounds: int = 20) -> dict:
    """Sends nbytes over TCP from src to dst (both inside their namespaces); returns the
    steady-state rate seen by the receiver (after the first 1/8, which includes tbf's burst)
    in bit/s, and the median TCP round-trip time in us."""

    def probe(host: Host, *args) -> List[str]:
        return ["ip", "netns", "exec", host.netns, sys.executable, "-c", _PROBE, *map(str, args)]

    recv = subprocess.Popen(
        probe(dst, "recv", dst.ip, port, rounds),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        if recv.stdout.readline().strip() != "listening":
            raise RuntimeError(f"receiver failed: {recv.stderr.read()}")
        send = subprocess.run(
            probe(src, "send", dst.ip, port, nbytes, rounds),
            capture_output=True,
            text=True,
            timeout=300,
        )
        if send.returncode != 0:
            raise RuntimeError(f"sender failed: {send.stderr}")
        out, err = recv.communicate(timeout=60)
        if recv.returncode != 0:
            raise RuntimeError(f"receiver failed: {err}")
        r = json.loads(out.strip().splitlines()[-1])
        s = json.loads(send.stdout.strip().splitlines()[-1])
        return {"bits_per_s": 8 * r["bytes"] / r["seconds"], "bytes": r["total"], **s}
    finally:
        _stop([recv], grace=1.0)


# ------------------------------------------------------------------------------------- CLI


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m torch_cgx.bench.hosts",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--hosts", type=int, default=2, help="emulated hosts (default 2)")
    p.add_argument("--link", default="1gbit", help="per-host link rate, tc syntax (1gbit)")
    p.add_argument("--latency", default=None, help="one-way delay added per host (netem)")
    p.add_argument("--check", action="store_true", help="measure host 0 <-> host 1 over TCP")
    p.add_argument("--bytes", default=None, help="bytes per direction (default: 64M, at most 2 s)")
    p.add_argument("--tolerance", type=float, default=0.15, help="allowed relative deviation")
    p.add_argument("--cleanup", action="store_true", help="remove namespaces of dead runs, exit")
    args = p.parse_args(argv)
    if args.cleanup:
        cleanup_stale()
        return 0
    try:
        rate = parse_rate(args.link)
        if args.latency:
            parse_time(args.latency)
        check_prerequisites(latency=args.latency is not None)
    except ValueError as e:
        p.error(str(e))
    except HostsUnavailable as e:
        print(f"emulated hosts unavailable: {e.reason}", file=sys.stderr)
        return 2
    if args.check and args.hosts < 2:
        p.error("--check needs --hosts >= 2")
    if args.bytes:
        from torch_cgx.bench.sizes import parse_size

        nbytes = parse_size(args.bytes)
    else:
        nbytes = min(64 << 20, rate // 8 * 2)
    rc = 0
    try:
        with emulated_hosts(args.hosts, args.link, args.latency) as hosts:
            bp = tbf_params(rate)
            print(
                f"# {args.hosts} emulated hosts, link {format_rate(rate)} each way "
                f"(tbf burst {bp['burst']} B, limit {bp['limit']} B)"
                + (f", latency {args.latency} one-way" if args.latency else "")
            )
            for h in hosts:
                print(f"#   rank {h.rank}: netns {h.netns}, {h.ifname} {h.ip}")
            if args.check:
                for a, b in ((hosts[0], hosts[1]), (hosts[1], hosts[0])):
                    m = measure_link(a, b, nbytes)
                    dev = m["bits_per_s"] / rate - 1
                    good = abs(dev) <= args.tolerance
                    rc = rc or (0 if good else 1)
                    frames = m["bits_per_s"] * FRAME_OVER_PAYLOAD
                    print(
                        f"{a.ip} -> {b.ip}: {m['bits_per_s'] / 1e9:.3f} Gbit/s "
                        f"({dev:+.1%} vs {format_rate(rate)}; with headers "
                        f"{frames / 1e9:.3f} Gbit/s; {m['bytes'] >> 20} MiB), "
                        f"TCP rtt {m['rtt_us']:.0f} us" + ("" if good else "  <-- OFF"),
                        flush=True,
                    )
    except KeyboardInterrupt:
        print("interrupted: emulated hosts removed", file=sys.stderr)
        return 130
    return rc


if __name__ == "__main__":
    sys.exit(main())
