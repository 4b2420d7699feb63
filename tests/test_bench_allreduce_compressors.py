"""``python -m benchmarks.allreduce --compressors ...``: every registered compressor in the
allreduce table (2 real ranks, tiny sizes, a few seconds)."""

from __future__ import annotations

import json

import pytest
from dist_helpers import run_ranks

from torch_cgx import compressors


def body_allreduce(rank, world, json_path):
    from benchmarks import allreduce

    argv = ["-b", "16K", "-e", "64K", "-f", "4", "-n", "2", "-w", "0", "--bits", "none"]
    argv += ["--algorithms", "sra,ring", "--compressors", "all", "--json", json_path]
    assert allreduce.main(argv) == 0


def test_every_compressor_in_the_table(tmp_path, capfd):
    json_path = str(tmp_path / "allreduce.json")
    run_ranks(body_allreduce, 2, json_path)
    records = json.loads(open(json_path).read())
    out = capfd.readouterr().out
    names = compressors.names()
    for size in (16384, 65536):
        rows = [r for r in records if r["size"] == size]
        assert rows[0]["algo"] == "gloo" and rows[0]["speedup"] == 1
        by_name = {}
        for r in rows[1:]:
            by_name.setdefault(r["compressor"], []).append(r)
        assert list(by_name) == names  # registry order, every one
        for name, group in by_name.items():
            traits = compressors.get(name).traits
            gathered = traits["sparse"] or not traits["fixed_size"]
            assert [r["algo"] for r in group] == (["allgather"] if gathered else ["sra", "ring"])
            for r in group:
                assert r["wire"] > 0, r
                assert r["same"] is True, r  # bit-identical on both ranks
                assert r["time_us"] > 0 and r["relerr"] >= 0
                # Only max-min has a bound: checked, and met; the others get no verdict.
                assert r["wrong"] == (0 if name == "maxmin" else -1), r
                assert (r["bits"] is None) == (not traits["fixed_size"])
        assert by_name["fp16"][0]["relerr"] < 1e-3  # close to the exact sum
        assert by_name["topk"][0]["wire"] < rows[0]["wire"] / 10  # 1% of the values
    assert "topk:ag" in out and "qsgd:sra" in out and "qsgd:ring" in out
    assert "# out of bound: 0 elements" in out and "differ" not in out


def test_option_parsing():
    from benchmarks import allreduce

    assert allreduce._compressors("all") == compressors.names()
    assert allreduce._compressors("topk,qsgd,topk") == ["topk", "qsgd"]
    assert allreduce._compressors("") == []
    with pytest.raises(SystemExit, match="nope"):
        allreduce._compressors("topk,nope")
    assert allreduce._bits("none") == [] and allreduce._bits("8,4") == [8, 4]
    assert allreduce.gather_only("dgc") and allreduce.gather_only("topk")
    assert not allreduce.gather_only("qsgd")
    row = {"size": 4096, "count": 1024, "type": "float", "algo": "allgather", "bits": None,
           "compressor": "topk", "time_us": 10.0, "world": 2, "wire": 80, "maxerr": 1.0,
           "relerr": 0.5, "wrong": -1, "speedup": 2.0, "ideal": 51.2}  # fmt: skip
    cells = allreduce.format_row(row).split()
    assert cells[3:5] == ["topk:ag", "-"] and cells[11] == "-"
