"""The process group a quorum re-forms: torchft's reconfigurable Gloo group, its re-forming
bounded by the round's timeout (``averaging_timeout``).

Gloo's full mesh waits for each of its connections up to five times its timeout (the side of a
pair that accepts waits for the other side to connect, whether that peer is alive or not): a
peer that published its address and then died, stalled or gave up (its own connect failed) held
the others ``5 * averaging_timeout`` in the re-forming. And torch's store client retries a
refused connection past its timeout. So here:

- the quorum's store (hosted by one member) is probed first: a refused connection (its host
  died) fails the re-forming at once;
- the members meet on that store (each sets a key and waits for all of them, within the
  timeout): a member dead before the re-forming is dropped there;
- Gloo is then built with a fifth of the timeout for its connections, and its collectives get
  the whole timeout again.
"""

from __future__ import annotations

import socket

import torch
from torchft.process_group import ProcessGroupGloo

__all__ = ["BoundedGloo", "CONNECT_SHARE"]

CONNECT_SHARE = 5  # Gloo waits this many times its timeout for one connection of the mesh
_ARRIVED = "torch_cgx/arrived"


def _probe(store_addr: str, timeout: float) -> None:
    """ConnectionError unless the store at ``host:port/prefix`` accepts a connection."""
    host, _, port = store_addr.partition("/")[0].rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        raise ConnectionError(f"the quorum's store at {host}:{port} is gone: {e}") from e


class BoundedGloo(ProcessGroupGloo):
    """``ProcessGroupGloo(timeout)`` whose ``configure`` (the quorum's re-forming) fails within
    about ``timeout`` when a member is gone, and whose collectives wait ``timeout``."""

    def configure(self, store_addr: str, *args, **kwargs) -> None:
        self.abort(errored=False)  # no round runs on the last quorum's group meanwhile
        _probe(store_addr, self._timeout.total_seconds())
        super().configure(store_addr, *args, **kwargs)

    def _create_pg(self, store, rank: int, world_size: int):
        limit = self._timeout
        store.set(f"{_ARRIVED}/{rank}", b"1")
        store.wait([f"{_ARRIVED}/{r}" for r in range(world_size)], limit)
        self._timeout = limit / CONNECT_SHARE  # what Gloo's mesh waits for, times five
        try:
            pg = super()._create_pg(store, rank, world_size)
        finally:
            self._timeout = limit
        pg._get_backend(torch.device("cpu"))._set_default_timeout(limit)
        return pg
