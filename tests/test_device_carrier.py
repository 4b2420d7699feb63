"""The device plane's CUDA carrier (torch_cgx/device/plane.py): NCCL only when every rank of the
group uses a GPU of its own, decided by comparing the ranks' device UUIDs through the group's
store (NCCL refuses two ranks of one communicator on one GPU, "Duplicate GPU detected"), else
Gloo. Driven on the CPU with real stores, fake identifiers and, for ``install`` itself, a
faked CUDA / NCCL availability and a fake NCCL class."""

from __future__ import annotations

import datetime
import inspect
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.distributed as dist
from dist_helpers import free_port

from torch_cgx.config import CGXConfig
from torch_cgx.device import plane


def _on_ranks(fn, size):
    """fn(rank) on ``size`` threads (store gets block until every rank has published)."""
    with ThreadPoolExecutor(size) as pool:
        return list(pool.map(fn, range(size)))


def _decide(kind, identifiers, available=True):
    """Every rank publishes its identifier and decides, on one HashStore or on a TCPStore
    server with a client per rank (a blocked get holds its client's socket)."""
    size = len(identifiers)
    if kind == "hash":
        shared = dist.HashStore()
        stores = [shared] * size
    else:
        port = free_port()
        wait = datetime.timedelta(seconds=30)
        server = dist.TCPStore("127.0.0.1", port, None, True, timeout=wait)
        stores = [dist.TCPStore("127.0.0.1", port, None, False, timeout=wait) for _ in range(size)]

    def rank_fn(rank):
        plane.publish_device(stores[rank], rank, identifiers[rank])
        return plane.nccl_carries(plane.read_devices(stores[rank], size), available)

    result = _on_ranks(rank_fn, size)
    if kind == "tcp":
        del server
    return result


@pytest.mark.parametrize("kind", ["hash", "tcp"])
def test_ranks_sharing_a_gpu_get_gloo_and_distinct_gpus_nccl(kind):
    same = ["GPU-1111", "GPU-1111"]
    distinct = ["GPU-1111", "GPU-2222", "GPU-3333"]
    assert _decide(kind, same) == [False, False]
    assert _decide(kind, distinct) == [True] * 3
    assert _decide(kind, distinct, available=False) == [False] * 3
    assert _decide(kind, ["GPU-1111"]) == [True]  # one rank, its own GPU
    assert _decide(kind, ["GPU-1111", "GPU-2222", "GPU-1111"]) == [False] * 3
    assert _decide(kind, ["GPU-1111", ""]) == [False, False]  # unnamed: maybe shared


def test_the_uuid_keys_cannot_clash_with_the_planes_other_keys():
    assert plane.UUID_PREFIX.startswith("device/") and plane.UUID_PREFIX.endswith("/")
    name = plane.UUID_PREFIX.split("/")[1]
    assert name not in ("nccl", "gloo")
    with pytest.raises(RuntimeError):  # device/<device type>/ holds the hierarchies' groups
        torch.device(name)
    for other in ("device/nccl/", "device/gloo/", "device/cuda/intra/0/", "device/cpu/cross/"):
        assert not other.startswith(plane.UUID_PREFIX)
        assert not plane.UUID_PREFIX.startswith(other)


def test_the_bound_device_comes_from_the_creating_calls_device_id():
    """torch passes init_process_group's / new_group's device_id to its helper, not to a custom
    backend's creator: the plane reads it from the helper's frame."""
    helper = dist.distributed_c10d._new_process_group_helper
    assert "device_id" in inspect.signature(helper).parameters
    ns = {"__name__": "torch.distributed.distributed_c10d", "read": plane._creating_device_id}
    source = "def _new_process_group_helper(device_id):\n    return (lambda: read())()\n"
    exec(source, ns)  # the plane's lookup, called from a frame below torch's helper
    assert ns["_new_process_group_helper"](torch.device("cuda", 3)) == torch.device("cuda", 3)
    assert plane._creating_device_id() is None
    assert plane.bound_index([None, torch.device("cuda", 2)]) == 2
    assert plane.bound_index([torch.device("cuda", 1), torch.device("cuda", 2)]) == 1
    assert plane.bound_index([torch.device("cpu"), torch.device("cuda")]) is None


class _FakeNCCL:
    """Stands for ProcessGroupNCCL (absent from a CPU build of torch)."""

    made = []

    def __init__(self, store, rank, size):
        _FakeNCCL.made.append(rank)

    def name(self):
        return "nccl"

    _allgather_base = alltoall_base = send = recv = allreduce = None


class _FakeBackend:
    def hierarchical(self):
        return False

    def set_device_plane(self, plane_, carrier, every, token):
        self.carrier = carrier


@pytest.mark.parametrize("same_gpu", [True, False])
def test_install_on_two_ranks_sharing_one_gpu_takes_gloo(monkeypatch, same_gpu):
    """Two ranks on one GPU (mp.spawn on a one-GPU machine, LOCAL_WORLD_SIZE unset): Gloo
    carries the CUDA tensors; two GPUs: NCCL. Before the store comparison, the first got NCCL."""
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1 if same_gpu else 2)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    monkeypatch.setattr(dist, "ProcessGroupNCCL", _FakeNCCL, raising=False)
    local = threading.local()
    uuid = (lambda: "GPU-same") if same_gpu else (lambda: f"GPU-{local.rank}")
    monkeypatch.setattr(plane, "_device_uuid", uuid, raising=False)
    _FakeNCCL.made = []
    store = dist.HashStore()
    config = CGXConfig(data_plane="auto")

    def rank_fn(rank):
        local.rank = rank
        backend = _FakeBackend()
        plane.install(backend, config, store, rank, 2, datetime.timedelta(seconds=30))
        return backend.carrier

    carriers = _on_ranks(rank_fn, 2)
    if same_gpu:
        assert _FakeNCCL.made == [] and all(isinstance(c, dist.ProcessGroupGloo) for c in carriers)
    else:
        assert sorted(_FakeNCCL.made) == [0, 1]
        assert all(isinstance(c, _FakeNCCL) for c in carriers)
