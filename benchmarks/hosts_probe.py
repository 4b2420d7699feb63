"""Emulated hosts: measuring a link (TCP rate and round trip between two hosts, plain sockets).

Used by ``python -m benchmarks.hosts --check``; docs/hosts.md, "Measured link rates".
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import List

from benchmarks.hosts_net import Host
from benchmarks.hosts_run import _stop

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
