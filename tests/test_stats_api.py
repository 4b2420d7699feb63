"""torch_cgx.stats(): the documented Python face of a group's counters (torch_cgx/counters.py)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from dist_helpers import run_ranks


def body_stats_api(rank, world):
    import torch_cgx

    dist.init_process_group("cgx", pg_options=torch_cgx.Options(bits=4, bucket_size=512))
    torch_cgx.reset_stats()
    assert torch_cgx.stats().ratio == 1.0 and torch_cgx.stats().bytes_sent == 0
    n = 1 << 16
    for step in range(3):
        x = torch.randn(n, generator=torch.Generator().manual_seed(10 * step + rank))
        dist.all_reduce(x)
    dist.all_reduce(torch.ones(8))  # under min_size: exact
    s = torch_cgx.stats()
    native = torch_cgx.cgx_backend().stats()
    assert (s.bytes_sent, s.bytes_exact) == (native["bytes_sent"], native["bytes_exact"])
    assert (s.calls_compressed, s.calls_exact) == (3, 1)
    # 4 bits + 8 bytes per 512 values: about 7.5x fewer bytes than fp32 on the compressed calls.
    assert 6.5 < s.ratio < 8.0, s
    assert s.bytes_saved == s.bytes_exact - s.bytes_sent
    assert s.compute_seconds == native["compute_seconds"] and s.wire_seconds > 0
    d = s.as_dict()
    assert d["ratio"] == s.ratio and d["calls_compressed"] == 3
    line = str(s)
    assert line.startswith(f"cgx stats: {s.ratio:.2f}x fewer bytes") and "\n" not in line
    torch_cgx.reset_stats()
    assert torch_cgx.stats().calls_compressed == 0
    gloo = dist.new_group([0, 1], backend="gloo")
    try:
        torch_cgx.stats(gloo)
        raise AssertionError("stats of a Gloo group did not raise")
    except ValueError as e:
        assert "not 'cgx'" in str(e)
    dist.destroy_process_group()


def test_stats_api_on_two_ranks():
    run_ranks(body_stats_api, 2, timeout=120)


def test_stats_without_a_group_is_a_clear_error():
    import torch_cgx

    with pytest.raises(ValueError, match="not initialized"):
        torch_cgx.stats()
