"""CGX's per-call settings: CGX_COMPRESSION_{QUANTIZATION_BITS,BUCKET_SIZE,SKIP_INCOMPLETE_BUCKETS}
changed with os.environ between allreduces apply to the next one (real ranks over Gloo)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from dist_helpers import run_ranks

BITS = "CGX_COMPRESSION_QUANTIZATION_BITS"
BUCKET = "CGX_COMPRESSION_BUCKET_SIZE"


def _data(rank: int, n: int = 1 << 16) -> torch.Tensor:
    g = torch.Generator().manual_seed(rank)
    return torch.randn(n, generator=g)


def _reduce(rank: int, world: int):
    """(result, bytes this rank sent) of one SUM allreduce of the ranks' data."""
    import torch_cgx

    t = _data(rank)
    before = torch_cgx.cgx_backend().total_bytes_sent()
    dist.all_reduce(t)
    return t, torch_cgx.cgx_backend().total_bytes_sent() - before


def body_changes_apply(rank, world):
    import torch_cgx

    os.environ.pop(BITS, None)
    dist.init_process_group("cgx")
    exact = sum(_data(r) for r in range(world))
    full = 2 * (world - 1) * exact.numel() * 4 // world  # a ring's bytes for fp32
    t, sent = _reduce(rank, world)
    assert sent == full and torch.allclose(t, exact, atol=1e-5)  # unset: 32 bits, exact
    os.environ[BITS] = "4"
    t, sent4 = _reduce(rank, world)
    assert sent4 < full / 6  # compressed at 4 bits (+ per-bucket min/step)
    err4 = (t - exact).abs().max().item()
    assert 0 < err4 < 2.0
    assert torch_cgx.get_config().bits == 4  # the group's settings follow the variable
    os.environ[BITS] = "8"
    os.environ[BUCKET] = "128"
    t, sent8 = _reduce(rank, world)
    assert sent4 < sent8 < full / 3 and (t - exact).abs().max().item() < err4 / 4
    assert torch_cgx.get_config().bucket_size == 128
    # set_config's value stays while the variables do not change; then the variable wins.
    torch_cgx.set_config(bits=2)
    _, sent2 = _reduce(rank, world)
    assert sent2 < sent4
    os.environ[BITS] = "8"  # unchanged since the group read it: set_config's 2 stays
    _, again = _reduce(rank, world)
    assert again == sent2
    del os.environ[BITS]  # unset: the default, no compression
    t, sent = _reduce(rank, world)
    assert sent == full and torch.allclose(t, exact, atol=1e-5)
    # The replicas are identical through all of it.
    out = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(out, t)
    assert all(torch.equal(o, out[0]) for o in out)
    dist.destroy_process_group()


def test_variables_changed_between_calls_apply():
    run_ranks(body_changes_apply, 2, timeout=120)


def body_one_rank_changes(rank, world):
    import torch_cgx

    os.environ[BITS] = "4"
    dist.init_process_group("cgx")
    _reduce(rank, world)
    if rank == 1:
        os.environ[BITS] = "8"
    t = _data(rank)
    keep = t.clone()
    with pytest.raises(ValueError, match=f"differ.*{BITS}: rank 0 4 rank 1 8"):
        dist.all_reduce(t)
    assert torch.equal(t, keep)  # nothing was reduced, nothing lost
    os.environ[BITS] = "8"  # alike again: the group works
    t, sent = _reduce(rank, world)
    assert 0 < sent and torch_cgx.get_config().bits == 8
    # A malformed value is named on the rank that has it (here: every rank).
    os.environ[BITS] = "eight"
    with pytest.raises(ValueError, match=f"{BITS} must be an integer, got 'eight'"):
        dist.all_reduce(_data(rank))
    os.environ[BITS] = "9"
    with pytest.raises(ValueError, match=f"{BITS} must be 1..8, or 32"):
        dist.all_reduce(_data(rank))
    os.environ[BITS] = "8"
    assert torch_cgx.get_config().bits == 8  # the bad values changed nothing
    _reduce(rank, world)
    dist.destroy_process_group()


def test_one_rank_changing_raises_on_every_rank():
    run_ranks(body_one_rank_changes, 2, timeout=120)


def body_one_rank_changes_on_the_device_plane(rank, world):
    import torch_cgx
    from torch_cgx.device import plane

    os.environ[BITS] = "4"
    os.environ["CGX_DATA_PLANE"] = "device"  # every tensor on the device plane
    dist.init_process_group("cgx")
    assert plane.plane_of(torch_cgx.cgx_backend()) is not None
    dist.all_reduce(_data(rank))
    exact = sum(_data(r) for r in range(world))
    for call in ("all_reduce", "reduce_scatter_tensor"):
        if rank == 1:
            os.environ[BITS] = "8"
        t, out = _data(rank), torch.zeros((1 << 16) // world)
        keep = t.clone()
        with pytest.raises(ValueError, match=f"differ.*{BITS}: rank 0 4 rank 1 8"):
            if call == "all_reduce":
                dist.all_reduce(t)
            else:
                dist.reduce_scatter_tensor(out, t)
        assert torch.equal(t, keep) and not out.any()  # nothing reduced, nothing lost
        os.environ[BITS] = "4"
    dist.all_reduce(t)  # alike again: the plane works, within 4 bits' rounding
    assert (t - exact).abs().max().item() < 2.0
    dist.destroy_process_group()


def test_one_rank_changing_raises_on_the_device_plane_too():
    """The device plane agrees on the per-call settings before it exchanges payloads, as the
    native path does (else the ranks' payloads would differ in size on the carrier)."""
    run_ranks(body_one_rank_changes_on_the_device_plane, 2, timeout=120)


def body_read_once(rank, world):
    import torch_cgx

    os.environ[BITS] = "4"
    os.environ["CGX_SETTINGS_PER_CALL"] = "0"
    dist.init_process_group("cgx")
    _, sent4 = _reduce(rank, world)
    os.environ[BITS] = "8" if rank == 0 else "2"  # ignored: read once
    _, sent = _reduce(rank, world)
    assert sent == sent4 and torch_cgx.get_config().bits == 4
    dist.destroy_process_group()


def test_settings_per_call_off_reads_once():
    run_ranks(body_read_once, 2, timeout=120)


def test_env_parser_is_shared():
    from torch_cgx import _C
    from torch_cgx.config import CGXConfig

    assert _C.parse_env_int("X", " -12 ") == -12
    for bad in ("0x10", "1e3", "", "12a", "9" * 25):
        with pytest.raises(ValueError, match="X must be an integer|X is out of range"):
            _C.parse_env_int("X", bad)
    assert _C.parse_env_bool("Y", "On") is True and _C.parse_env_bool("Y", "no") is False
    with pytest.raises(ValueError, match="Y must be 0 or 1, got 'maybe'"):
        _C.parse_env_bool("Y", "maybe")
    with pytest.raises(ValueError, match="CGX_SETTINGS_PER_CALL must be 0 or 1"):
        CGXConfig.from_env({"CGX_SETTINGS_PER_CALL": "sometimes"})
