"""Where the peers meet: a torchft Lighthouse (hosted by the first peer, or standalone) and
one torchft Manager per peer (a replica group of one process).

Addresses: ``initial_peers`` is ``"host:port"``, ``"http://host:port"``, a hivemind-style
multiaddr ``"/ip4/HOST/tcp/PORT[/...]"``, or a list of them (the first is used); None reads
``INITIAL_PEERS`` then ``PL_INITIAL_PEERS`` (comma-separated), and when neither is set this peer
hosts the Lighthouse. The address other peers reach this one at (its store, its manager's
server, its Gloo sockets) is ``host``, else the first ``/ip4/`` of ``host_maddrs``, else
``CGX_HOST``, else the address this machine uses towards the Lighthouse.
"""

from __future__ import annotations

import os
import re
import socket
import uuid
from datetime import timedelta
from typing import Optional, Sequence, Tuple, Union

__all__ = ["Lighthouse", "join_address", "local_host", "make_manager", "parse_address"]

_MULTIADDR = re.compile(r"^/ip[46]/([^/]+)/tcp/(\d+)(/.*)?$")


def parse_address(value: str) -> Tuple[str, int]:
    """``(host, port)`` of one peer address; ValueError naming the forms accepted."""
    text = value.strip()
    m = _MULTIADDR.match(text)
    if m:
        return m.group(1), int(m.group(2))
    if text.startswith("http://"):
        text = text[len("http://") :]
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"initial_peers: {value!r} is not an address: pass 'host:port' (what the first peer "
            "printed), 'http://host:port' or '/ip4/HOST/tcp/PORT'"
        )
    return host.strip("[]"), int(port)


def join_address(initial_peers: Union[None, str, Sequence[str]]) -> Optional[Tuple[str, int]]:
    """The Lighthouse to join, or None: this peer hosts it."""
    if initial_peers is None:
        env = os.environ.get("INITIAL_PEERS") or os.environ.get("PL_INITIAL_PEERS")
        if not env:
            return None
        initial_peers = [p for p in env.split(",") if p.strip()]
    if isinstance(initial_peers, str):
        initial_peers = [initial_peers]
    peers = list(initial_peers)
    if not peers or not all(isinstance(p, str) for p in peers):
        raise ValueError(f"initial_peers must be an address or a list of them, got {peers!r}")
    return parse_address(peers[0])


def local_host(towards: Optional[str], host: Optional[str], host_maddrs=None) -> str:
    """The address other peers reach this one at (see the module's docstring)."""
    if host:
        return host
    for addr in host_maddrs or ():
        m = _MULTIADDR.match(str(addr))
        if m and m.group(1) not in ("0.0.0.0", "::"):
            return m.group(1)
    if os.environ.get("CGX_HOST"):
        return os.environ["CGX_HOST"]
    if towards is not None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:  # a UDP connect sends nothing: it picks the route's source address
                s.connect((towards, 9))
                return s.getsockname()[0]
            except OSError:
                pass
    return "127.0.0.1"


class Lighthouse:
    """A torchft Lighthouse in this process (the rendezvous); ``address`` is what other peers
    pass as ``initial_peers``. It must outlive the collaboration: without it no new round
    can form (every peer's next round waits, then fails after its quorum timeout)."""

    def __init__(self, host: str, port: int = 0, *, join_timeout: float = 5.0,
                 heartbeat_timeout: float = 2.0, min_peers: int = 1) -> None:  # fmt: skip
        from torchft._torchft import LighthouseServer

        self.server = LighthouseServer(
            bind=f"[::]:{port}",
            min_replicas=min_peers,
            join_timeout_ms=int(join_timeout * 1000),
            quorum_tick_ms=10,
            heartbeat_timeout_ms=int(heartbeat_timeout * 1000),
        )
        self.join_timeout = join_timeout
        self.port = int(self.server.address().rsplit(":", 1)[1])
        self.address = f"{host}:{self.port}"

    def shutdown(self) -> None:
        self.server.shutdown()


def _transport(host: str, timeout: timedelta):
    """torchft's HTTP checkpoint transport, advertising ``host`` (torchft's own advertises the
    machine's host name, which peers in other namespaces or behind NAT may not resolve)."""
    from torchft.checkpointing.http_transport import HTTPTransport

    class Transport(HTTPTransport):
        def address(self) -> str:
            return f"http://{host}:{self._server.socket.getsockname()[1]}/checkpoint/"

    return Transport(timeout=timeout, num_chunks=0)


def make_manager(lighthouse: Tuple[str, int], host: str, run_id: str, *, timeout: float,
                 quorum_timeout: float, heartbeat: float = 0.1):  # fmt: skip
    """A torchft Manager for this peer (one process, rank 0 of its replica group) and the
    TCPStore it owns."""
    import torch.distributed as dist
    from torchft.manager import Manager

    from torch_cgx.collaborative.group import BoundedGloo

    store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False)
    limit = timedelta(seconds=timeout)
    manager = Manager(
        pg=BoundedGloo(timeout=limit),
        load_state_dict=None,
        state_dict=None,
        min_replica_size=1,
        use_async_quorum=False,
        replica_id=f"{run_id}-{uuid.uuid4().hex[:8]}-{os.getpid()}",
        store_addr=host,
        store_port=store.port,
        rank=0,
        world_size=1,
        lighthouse_addr=f"http://{lighthouse[0]}:{lighthouse[1]}",
        hostname=host,
        timeout=limit,
        quorum_timeout=timedelta(seconds=quorum_timeout),
        connect_timeout=limit,
        heartbeat_interval=timedelta(seconds=heartbeat),
        checkpoint_transport=_transport(host, limit),
        init_sync=True,
    )
    return manager, store
