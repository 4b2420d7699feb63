"""Emulated hosts across an emulated internet: a one-way latency per link without netem.

This machine's kernel has no netem (docs/hosts.md), so the delay is a userspace delay line:
every host namespace holds a TUN device ``eth0`` (its address 10.214.<k>.<i+1>/24), and one
forwarder process (``python -m benchmarks.hosts_wan --serve``, started by :func:`wan_hosts`)
holds the other end of every TUN. It reads each IP packet a host sends, and delivers it to the
destination host's TUN after

- the sender's uplink serialises it at the link rate (a FIFO per host: packets wait behind the
  ones before them),
- the one-way latency,
- the receiver's downlink serialises it at the link rate,

dropping a packet whose wait for the uplink would exceed the buffer (the larger of 50 ms and
twice the latency at the link rate): TCP sees a bottleneck link with a bounded queue. Packets
are counted at their IP length (TCP payload peaks at 1448 / 1500 = 96.5 % of the rate).

The forwarder runs at real-time priority (SCHED_FIFO; else the lowest nice value it may take):
it sleeps in epoll between packets, and the hosts' compute, which shares this machine's cores,
cannot delay the emulated wire (a wire does not slow down when its hosts are busy).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import heapq
import itertools
import os
import select
import struct
import subprocess
import sys
import time
from typing import Iterator, List, Optional

from benchmarks.hosts_net import Host, _cmd, _netns_list, _signals_deferred, _subnet

__all__ = ["wan_hosts"]

_TUNSETIFF, _IFF_TUN, _IFF_NO_PI = 0x400454CA, 0x0001, 0x1000
_CLONE_NEWNET = 0x40000000
_seq = itertools.count()


def _open_tun(netns: str, name: str) -> int:
    """The fd of the persistent TUN ``name`` of ``netns`` (attached from inside it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    here = os.open("/proc/self/ns/net", os.O_RDONLY)
    there = os.open(f"/var/run/netns/{netns}", os.O_RDONLY)
    try:
        if libc.setns(there, _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {netns}")
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
        fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TUN | _IFF_NO_PI))
    finally:
        libc.setns(here, _CLONE_NEWNET)
        os.close(here)
        os.close(there)
    return fd


def _take_priority() -> None:
    """SCHED_FIFO at a low real-time priority, else nice -10, else as it is (not root)."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        return
    except (OSError, AttributeError):
        pass
    try:
        os.nice(-10)
    except OSError:
        pass


def serve(namespaces: List[str], ips: List[str], rate_bits: float, delay: float) -> None:
    """The delay line (runs until killed); prints "ready" once every TUN is attached."""
    _take_priority()
    fds = [_open_tun(ns, "eth0") for ns in namespaces]
    where = {bytes(map(int, ip.split("."))): i for i, ip in enumerate(ips)}
    per_byte = 8.0 / rate_bits
    buffer = max(0.05, 2 * delay)
    up = [0.0] * len(fds)  # when each host's uplink / downlink is next free
    down = [0.0] * len(fds)
    queue: list = []  # (delivery time, seq, destination fd, packet)
    count = itertools.count()
    print("ready", flush=True)
    poll = select.epoll()
    for fd in fds:
        poll.register(fd, select.EPOLLIN)
    index = {fd: i for i, fd in enumerate(fds)}
    while True:
        now = time.monotonic()
        wait = max(0.0, queue[0][0] - now) if queue else 1.0
        for fd, _ in poll.poll(wait):
            src = index[fd]
            while True:
                try:
                    packet = os.read(fd, 65536)
                except BlockingIOError:
                    break
                now = time.monotonic()
                dst = where.get(packet[16:20]) if len(packet) >= 20 else None
                start = max(now, up[src])
                if dst is None or start - now > buffer:
                    continue  # not for a host of ours, or the uplink's queue is full: dropped
                up[src] = start + len(packet) * per_byte
                arrive = max(up[src] + delay, down[dst])
                down[dst] = arrive + len(packet) * per_byte
                heapq.heappush(queue, (down[dst], next(count), fds[dst], packet))
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, _, fd, packet = heapq.heappop(queue)
            try:
                os.write(fd, packet)
            except OSError:
                pass  # the receiving TUN is full or gone: dropped, as a wire would


@contextlib.contextmanager
def wan_hosts(world: int, rate_bits: float, delay: float,
              prefix: Optional[str] = None) -> Iterator[List[Host]]:  # fmt: skip
    """``world`` hosts, every pair ``delay`` seconds apart one way, each host's link limited
    to ``rate_bits`` in both directions; everything is deleted on exit."""
    if not 1 <= world <= 250:
        raise ValueError(f"world must be in 1..250, got {world}")
    seq = next(_seq)
    prefix = prefix or f"cgx{os.getpid()}-{seq}"
    k = _subnet(os.getpid(), seq)
    hosts = [Host(i, f"{prefix}-h{i}", f"10.214.{k}.{i + 1}") for i in range(world)]
    taken = set(_netns_list()) & {h.netns for h in hosts}
    if taken:
        raise RuntimeError(f"namespaces already exist (not ours, left alone): {sorted(taken)}")
    created, line = [], None
    try:
        for h in hosts:
            with _signals_deferred():
                _cmd("ip", "netns", "add", h.netns)
                created.append(h.netns)
            _cmd("ip", "-n", h.netns, "link", "set", "dev", "lo", "up")
            _cmd("ip", "-n", h.netns, "tuntap", "add", "mode", "tun", "name", "eth0")
            _cmd("ip", "-n", h.netns, "addr", "add", f"{h.ip}/24", "dev", "eth0")
            _cmd("ip", "-n", h.netns, "link", "set", "dev", "eth0", "up")
        argv = [sys.executable, "-m", "benchmarks.hosts_wan", "--serve", str(rate_bits),
                str(delay), *(h.netns for h in hosts), "--", *(h.ip for h in hosts)]  # fmt: skip
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        line = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=root)
        if line.stdout.readline().strip() != "ready":
            raise RuntimeError("the delay line did not start")
        yield hosts
    finally:
        if line is not None:
            line.kill()
            line.wait()
        for ns in reversed(created):
            _cmd("ip", "netns", "del", ns, check=False)


if __name__ == "__main__" and sys.argv[1:2] == ["--serve"]:
    rate, latency = float(sys.argv[2]), float(sys.argv[3])
    cut = sys.argv.index("--")
    serve(sys.argv[4:cut], sys.argv[cut + 1 :], rate, latency)
