"""Node layout of a cgx group and its hierarchical allreduce (``CGX_HIERARCHICAL``).

Ranks are grouped by node: under torchrun / mpirun (``LOCAL_WORLD_SIZE`` and ``RANK`` set, the
launcher giving each node a contiguous block of ranks) by ``RANK // LOCAL_WORLD_SIZE``, else by
hostname; each rank publishes its node id in the group's store, so every rank sees the same
layout. Nodes are numbered by their lowest rank; a rank's local rank is its place among its
node's ranks. With several nodes holding several ranks (``auto``) or with ``on``, the group gets
a shared-memory segment per node (``CGX_INNER_COMMUNICATOR_TYPE=SHM``, the default; MPI / NCCL /
GLOO: the node's Gloo group instead) for the exact node sums, and cross-node Gloo groups for
the compressed part:
the node leaders (``CGX_INTRA_BROADCAST=1``) or, per local rank, the ranks of that local rank on
every node (``CGX_INTRA_BROADCAST=0``; every node must then hold as many ranks).
"""

from __future__ import annotations

import datetime
import os
import socket
import uuid
from typing import List, Tuple

import torch.distributed as dist

from torch_cgx import _C, settings
from torch_cgx.config import CGXConfig


def node_id() -> str:
    launcher = settings.launcher_env()
    local, rank = launcher["LOCAL_WORLD_SIZE"], launcher["RANK"]
    if local and rank and local.isdigit() and rank.isdigit() and int(local) > 0:
        return f"launcher-node-{int(rank) // int(local)}"
    return f"host-{socket.gethostname()}"


def layout(ids: List[str]) -> List[List[int]]:
    """The ranks of each node (group ranks, ascending), nodes ordered by their lowest rank."""
    nodes: dict = {}
    for r, nid in enumerate(ids):
        nodes.setdefault(nid, []).append(r)
    return list(nodes.values())


def _place(nodes: List[List[int]], rank: int) -> Tuple[int, int]:
    for i, members in enumerate(nodes):
        if rank in members:
            return i, members.index(rank)
    raise AssertionError("rank not in the layout")


def attach_hierarchy(backend, config: CGXConfig, store, rank: int, size: int,
                     timeout: datetime.timedelta) -> None:  # fmt: skip
    """Builds the node and cross-node Gloo groups and hands them to ``backend`` when the
    hierarchical allreduce applies (see the module docstring); otherwise does nothing."""
    if config.hierarchical == "off" or size == 1:
        return
    store.set(f"node/{rank}", node_id())
    nodes = layout([store.get(f"node/{r}").decode() for r in range(size)])
    if len(nodes) == 1 or max(len(m) for m in nodes) == 1:
        return  # one node, or one rank per node: the flat algorithms already are the best
    sizes = {len(m) for m in nodes}
    if not config.intra_broadcast and len(sizes) != 1:
        raise ValueError(
            "CGX_INTRA_BROADCAST=0 needs as many ranks on every node, got "
            f"{[len(m) for m in nodes]} (use CGX_INTRA_BROADCAST=1 or CGX_HIERARCHICAL=off)"
        )
    node, local = _place(nodes, rank)
    h = _C.Hierarchy()
    h.local_rank, h.local_size, h.nodes = local, len(nodes[node]), len(nodes)
    h.intra_broadcast = config.intra_broadcast
    h.intra_compress = config.intra_compress
    h.intra = dist.ProcessGroupGloo(
        dist.PrefixStore(f"intra/{node}/", store), local, len(nodes[node]), timeout
    )
    if config.intra_broadcast:
        if local == 0:
            h.cross = dist.ProcessGroupGloo(
                dist.PrefixStore("cross/", store), node, len(nodes), timeout
            )
    else:
        h.cross = dist.ProcessGroupGloo(
            dist.PrefixStore(f"cross/{local}/", store), node, len(nodes), timeout
        )
    shm = config.inner_communicator in ("", "shm")  # the node's ranks share a memory segment
    _set_hierarchy_everywhere(backend, h, store, rank, size, node, local, shm)
    if h.shm_name:  # once every local rank has mapped it, the name can go (no leak on a crash)
        h.intra.barrier().wait()
        backend.unlink_node_segment()


def _set_hierarchy_everywhere(backend, h, store, rank: int, size: int, node: int, local: int,
                              shm: bool) -> None:  # fmt: skip
    """Hands ``h`` to the backend on every rank. With shared memory, local rank 0 creates the
    node's segment first and publishes its name (or its error) for the others to open. Every
    rank then reports through the store, so that a failure anywhere (a /dev/shm too small, say)
    raises on every rank instead of leaving some waiting."""
    status = "ok"
    try:
        if shm and local == 0:
            h.shm_name = f"/cgx-{os.getpid()}-{uuid.uuid4().hex[:12]}"
            try:
                backend.set_hierarchy(h)
            except Exception as e:
                store.set(f"shm/{node}", "!" + str(e))
                raise
            store.set(f"shm/{node}", h.shm_name)
        else:
            if shm:
                name = store.get(f"shm/{node}").decode()
                if name.startswith("!"):
                    raise RuntimeError(f"local rank 0 of this node failed: {name[1:]}")
                h.shm_name = name
            backend.set_hierarchy(h)
    except Exception as e:
        status = f"rank {rank}: {e}"
    store.set(f"hierarchy/{rank}", status)
    failed = [s for s in (store.get(f"hierarchy/{r}").decode() for r in range(size)) if s != "ok"]
    if failed:
        raise RuntimeError("cgx: the hierarchical allreduce could not be set up: "
                           + "; ".join(failed))  # fmt: skip
