"""Smoke test of ``python -m benchmarks.codec --compressors`` (64K values, a few seconds)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from benchmarks import codec as bench_codec
from benchmarks import compressor_checks, torch_ops_compressors
from benchmarks import compressors as bench_compressors
from torch_cgx import codec, compressors

NUMEL = 1 << 16
RATE_KEYS = [f"{op}_gbps" for op in bench_compressors.OPS] + [
    "encode_vs_memcpy",
    "encode_vs_torch",
    "decode_add_vs_memcpy",
    "decode_add_vs_torch",
]


def test_every_compressor_has_a_row(tmp_path, capsys):
    path = tmp_path / "compressors.json"
    args = ["--compressors", "all", "--size", "256K", "--iters", "1", "--warmup", "0"]
    assert bench_codec.main([*args, "--retries", "0", "--json", str(path)]) == 0
    records = json.loads(path.read_text())
    assert [r["name"] for r in records] == compressors.native.names()
    out = capsys.readouterr().out
    lines = out.splitlines()
    for r in records:
        c = compressors.get(r["name"])
        assert r["numel"] == NUMEL and r["threads"] == 1
        assert r["verify"] == "ok", (r["name"], r["verify_detail"])
        assert math.isfinite(r["ratio"]) and r["ratio"] > 0
        assert r["payload_bytes"] <= c.encoded_size(NUMEL)
        if c.traits["fixed_size"]:
            assert r["ratio"] == pytest.approx(4 * NUMEL / c.encoded_size(NUMEL), rel=1e-12)
        for key in RATE_KEYS:
            assert math.isfinite(r[key]) and r[key] > 0, (r["name"], key)
        row = [line.split() for line in lines if line.split()[:1] == [r["name"]]]
        assert len(row) == 1, r["name"]
        assert row[0][2] == f"{r['ratio']:.1f}" and row[0][-2] == "ok"
    assert bench_compressors.format_table(records) in out


def test_names_sizes_and_threads_restored():
    before = (torch.get_num_threads(), codec.num_threads())
    records = bench_compressors.compressor_table(["tbq", "topk"], 3000, [1], iters=1, warmup=0)
    assert [(r["name"], r["verify"]) for r in records] == [("tbq", "ok"), ("topk", "ok")]
    assert (torch.get_num_threads(), codec.num_threads()) == before
    assert bench_compressors.parse_names("all") == compressors.native.names()
    assert bench_compressors.parse_names("qsgd, fp16,qsgd") == ["qsgd", "fp16"]
    assert bench_compressors.parse_size("64M") == 64 << 20
    assert bench_compressors.parse_size("256K") == 256 << 10
    with pytest.raises(SystemExit):
        bench_codec.main(["--compressors", "no-such-compressor", "--size", "4K"])


@pytest.mark.parametrize("name", compressors.native.names())
@pytest.mark.parametrize("numel", [1, 1000, 4096])
def test_torch_ops_peer_passes_the_check_and_a_corrupt_decode_fails(name, numel):
    x = torch.randn(numel, generator=torch.Generator().manual_seed(numel)) + 0.01
    x[x == 0] = 1.0  # the checks read carried values as the nonzero ones
    params = bench_compressors.default_params(name)
    peer = torch_ops_compressors.OPS[name]
    enc = peer.encode(x, params, torch.Generator().manual_seed(1))
    decoded = peer.decode_add_(torch.zeros(numel), enc, params)
    assert compressor_checks.check(name, x, decoded, params).ok
    ours = compressors.get(name).decode(compressors.get(name).encode(x))
    assert compressor_checks.check(name, x, ours, params).ok
    bad = ours.clone()
    i = int(ours.nonzero()[-1]) if bool((ours != 0).any()) else 0
    bad[i] = bad[i] * 3 + 100  # far outside every compressor's worst case
    assert not compressor_checks.check(name, x, bad, params).ok
