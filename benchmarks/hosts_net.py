"""Emulated hosts, the network side: namespaces, veths, a bridge, rate-limited links, clean-up.

Every emulated host is a network namespace with ``lo`` and one veth ``eth0``; the other ends of
the veths are ports of a Linux bridge living in its own namespace. Each host's link is limited in
both directions (a tbf qdisc on ``eth0``, the host's egress, and one on the bridge port, the
host's ingress); with a latency the hosts are built by hosts_wan.py instead (a userspace delay
line between TUN devices: this kernel has no netem). Nothing is created in, and
no address is used from, the caller's namespace. Running ranks on these hosts:
benchmarks/hosts_run.py; the command line: benchmarks/hosts.py; docs/hosts.md.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional

from torch_cgx.plan.rates import parse_rate_bits, parse_time

HZ = 250  # tbf needs burst >= rate / HZ; 250 is the common kernel setting (1000 also exists)
MIN_BURST = 64 * 1024  # bytes; also >= the largest GSO packet, so tbf never has to split one
# TCP payload per 1500-byte-MTU frame is 1448 B (IP 20 + TCP 20 + timestamps 12); tbf counts the
# 1514 B frame (Ethernet header included), so TCP goodput tops out at 95.6% of the link rate.
FRAME_OVER_PAYLOAD = 1514 / 1448

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


# --------------------------------------------------------------------------------- formatting


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
        if latency:  # the delay line (benchmarks/hosts_wan.py): TUN devices
            steps.append(("a TUN device", f"ip -n {ns} tuntap add mode tun name cgxtun"))
        for what, line in steps:
            p = _sh(line, check=False)
            if p.returncode != 0:
                why = p.stderr.strip()
                if what == "a TUN device":
                    raise HostsUnavailable(f"--latency needs TUN devices (/dev/net/tun): {why}")
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
    rate = parse_rate_bits(link)
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
