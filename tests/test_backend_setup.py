"""The cgx backend's life cycle on real ranks: init methods and launchers, settings that differ
between ranks (at creation and at set_config), and a dead or stalled peer."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from dist_helpers import run_ranks


def body_init(rank, world, init_method):
    import torch_cgx  # noqa: F401

    if init_method == "env":
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            del os.environ[k]  # only the Open MPI variables remain
        os.environ.update({"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(world)})
        torch_cgx.apply_launcher_env()
        dist.init_process_group("cgx")
    else:
        dist.init_process_group("cgx", init_method=init_method, rank=rank, world_size=world)
    assert dist.get_rank() == rank and dist.get_backend() == "cgx"
    t = torch.ones(100)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((100,), float(world)))
    dist.destroy_process_group()


@pytest.mark.parametrize("kind", ["tcp", "file", "mpirun-env"])
def test_init_methods(kind, tmp_path):
    from dist_helpers import free_port

    method = {
        "tcp": f"tcp://127.0.0.1:{free_port()}",
        "file": f"file://{tmp_path}/store",
        "mpirun-env": "env",
    }[kind]
    run_ranks(body_init, 2, method)


def body_mismatch(rank, world):
    import torch_cgx  # noqa: F401  (registers the backend)

    os.environ["CGX_COMPRESSION_QUANTIZATION_BITS"] = "4" if rank == 0 else "8"
    with pytest.raises(ValueError, match="cgx settings differ between ranks"):
        dist.init_process_group("cgx")
    os.environ["CGX_COMPRESSION_QUANTIZATION_BITS"] = "4"


def test_mismatched_settings_raise_on_every_rank():
    run_ranks(body_mismatch, 2)


def body_set_config_mismatch(rank, world):
    import torch_cgx

    dist.init_process_group("cgx")
    with pytest.raises(ValueError, match="cgx settings differ between ranks"):
        torch_cgx.set_config(bits=4 if rank == 0 else 8)
    assert torch_cgx.get_config().bits == 32  # unchanged on every rank
    # A value only one rank rejects: that rank names it, the others learn it differs.
    with pytest.raises(ValueError, match="bits must be" if rank == 1 else "invalid settings"):
        torch_cgx.set_config(bits=9 if rank == 1 else 4)
    assert torch_cgx.get_config().bits == 32
    torch_cgx.set_config(bits=4)  # the group still works and agrees
    t = torch.ones(1000)
    dist.all_reduce(t)
    assert torch.allclose(t, torch.full((1000,), float(world)), rtol=0, atol=1e-5)
    dist.destroy_process_group()


def test_set_config_mismatch_raises_on_every_rank_and_keeps_settings():
    run_ranks(body_set_config_mismatch, 2)


def body_peer_fails(rank, world, marker, how):
    """Rank 1 dies (`dead`) or goes silent (`stalled`) after one good allreduce; rank 0 writes how
    long its next compressed allreduce took to raise (timeout 5 s)."""
    import datetime
    import time

    import torch_cgx

    dist.init_process_group("cgx", timeout=datetime.timedelta(seconds=5))
    torch_cgx.set_config(bits=4)
    x = torch.ones(100_000)
    dist.all_reduce(x)
    if rank == 1:
        deadline = time.monotonic() + 30
        while how == "stalled" and time.monotonic() < deadline and not os.path.exists(marker):
            time.sleep(0.1)  # alive but silent until rank 0 has its verdict (at most 30 s)
        os._exit(0)  # dies without a word
    start = time.monotonic()
    with pytest.raises(RuntimeError):
        dist.all_reduce(x, async_op=True).wait()
    with open(marker, "w") as f:
        f.write(str(time.monotonic() - start))
    os._exit(0)


@pytest.mark.parametrize("how", ["dead", "stalled"])
def test_failed_peer_gives_an_error_within_the_timeout(tmp_path, how):
    marker = str(tmp_path / "elapsed")
    try:
        run_ranks(body_peer_fails, 2, marker, how, timeout=90)
    except Exception:
        pass  # rank 1's abrupt exit is reported by the launcher; rank 0's verdict is the marker
    assert os.path.exists(marker), "rank 0 did not get an error"
    assert float(open(marker).read()) < 20  # timeout 5 s, plus slack for a loaded machine


def test_launcher_env_mapping():
    from torch_cgx.launch import apply_launcher_env

    env = {
        "OMPI_COMM_WORLD_RANK": "3",
        "OMPI_COMM_WORLD_SIZE": "8",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    }
    assert apply_launcher_env(env)
    assert env["RANK"] == "3" and env["WORLD_SIZE"] == "8" and env["LOCAL_RANK"] == "1"
    assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == "29500"
    env = {"PMI_RANK": "1", "PMI_SIZE": "2", "MASTER_ADDR": "10.0.0.1"}
    assert apply_launcher_env(env) and env["MASTER_ADDR"] == "10.0.0.1" and env["RANK"] == "1"
    env = {"RANK": "0", "WORLD_SIZE": "1", "OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "9"}
    assert not apply_launcher_env(env) and env["RANK"] == "0"
    assert not apply_launcher_env({})
