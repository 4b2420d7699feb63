"""``python -m benchmarks.allreduce --compressors ...``: every registered compressor in the
allreduce table (2 real ranks, tiny sizes, a few seconds): every row's verdict 0 (max-min's bound,
the others' definitions), the published errors within the bound where one is derived, and every
derived column equal to its parts."""

from __future__ import annotations

import json

import pytest
import torch
from dist_helpers import run_ranks

from benchmarks import allreduce
from benchmarks.allreduce_compressors import replay
from torch_cgx import compressors
from torch_cgx.bounds import bucket_bound, bucket_stats


def body_allreduce(rank, world, json_path):
    import contextlib

    from benchmarks import allreduce

    argv = ["-b", "16K", "-e", "64K", "-f", "4", "-n", "2", "-w", "0", "--bits", "none"]
    argv += ["--algorithms", "sra,ring", "--compressors", "all", "--json", json_path]
    with open(f"{json_path}.{rank}.out", "w") as out, contextlib.redirect_stdout(out):
        assert allreduce.main(argv) == 0  # the table, printed (rank 0), in a file of the rank's


# Compressors whose payload depends on the call's random streams: no replay.
from test_backend import RANDOMIZED  # noqa: E402  payloads that depend on the streams


def _inputs(count: int, world: int):
    """The benchmark's inputs (rank r: randn seeded 1234 + r) and their exact sum."""
    xs = [
        torch.randn(count, generator=torch.Generator().manual_seed(1234 + r)) for r in range(world)
    ]
    return xs, torch.stack([x.double() for x in xs]).sum(0)


def _error_bound(name: str, algo: str, xs, exact) -> torch.Tensor | None:
    """A per-element bound on |result - exact| from the compressor's definition, where one is
    tight enough to matter: max-min's (docs/algorithms.md), two fp16 / bf16 roundings of the
    partial sums, and for the gathered sparse ones |x'_r - x_r| <= |x_r| per rank (a value is
    sent exactly, dropped, or set to a level between the kept |x|). None: no such bound (the
    verdict, #wrong, judges those)."""
    magnitudes = torch.stack([x.double().abs() for x in xs]).sum(0)
    if name == "maxmin":
        ranges, mags = bucket_stats(xs[0], 512)
        for x in xs[1:]:
            r, m = bucket_stats(x, 512)
            ranges, mags = ranges + r, mags + m
        return bucket_bound(ranges, mags, 4, len(xs), algo).repeat_interleave(512)[: exact.numel()]
    if name in ("fp16", "bf16"):
        return (2**-10 if name == "fp16" else 2**-7) * magnitudes * 1.01
    return magnitudes if allreduce.gather_only(name) else None


def _check_errors(r: dict, xs, exact) -> None:
    """maxerr and relerr (|err|_2 / |exact|_2): for a compressor whose payload does not depend on
    the random streams, those of the replayed result (the compressions the algorithm makes,
    benchmarks.allreduce_compressors.replay); for the others, consistent with each other and
    within the bound where one is derived."""
    name = r["compressor"]
    if name not in RANDOMIZED:
        params = {p["name"]: p["default"] for p in compressors.params(name)}
        err = (replay(name, params, xs, r["algo"]).double() - exact).abs()
        assert r["maxerr"] == pytest.approx(float(err.max()), rel=1e-9), r
        assert r["relerr"] == pytest.approx(float(err.norm() / exact.norm()), rel=1e-9), r
    norm, n = float(exact.norm()), exact.numel()
    assert r["maxerr"] <= r["relerr"] * norm * (1 + 1e-6) <= r["maxerr"] * n**0.5 * (1 + 1e-6), r
    bound = _error_bound(name, r["algo"], xs, exact)
    if bound is not None:
        assert r["maxerr"] <= float(bound.max()), r
        assert r["relerr"] <= float(bound.norm()) / norm, r


def _printed(out: str) -> dict:
    """The printed table's rows by (size, algo cell)."""
    rows = [line.split() for line in out.splitlines() if line[:1] == " " and "float" in line]
    return {(int(c[0]), c[3]): c for c in rows if len(c) == len(allreduce.COLUMNS)}


def _check_printed(cells, r, gloo_cells, world) -> None:
    """Every derived column equals its parts as printed (within the printed digits)."""
    t, algbw, busbw = float(cells[5]), float(cells[6]), float(cells[7])
    assert algbw == pytest.approx(r["size"] / t / 1e3, rel=1e-3, abs=1e-3)
    assert busbw == pytest.approx(algbw * 2 * (world - 1) / world, abs=1e-3)
    assert float(cells[12]) == pytest.approx(float(gloo_cells[5]) / t, rel=2e-3, abs=0.006)
    assert float(cells[13]) == pytest.approx(int(gloo_cells[8]) / int(cells[8]), abs=0.006)
    assert int(cells[8]) == r["wire"] and cells[11] == str(r["wrong"])


def test_every_compressor_in_the_table(tmp_path):
    json_path = str(tmp_path / "allreduce.json")
    run_ranks(body_allreduce, 2, json_path)
    records = json.loads(open(json_path).read())
    out = open(f"{json_path}.0.out").read()
    printed = _printed(out)
    names = compressors.names()
    for size in (16384, 65536):
        rows = [r for r in records if r["size"] == size]
        gloo = rows[0]
        assert gloo["algo"] == "gloo" and gloo["speedup"] == 1 and gloo["wrong"] == 0
        assert gloo["wire"] == size  # a ring: 2 (W - 1) / W of the bytes
        xs, exact = _inputs(size // 4, 2)
        by_name = {}
        for r in rows[1:]:
            by_name.setdefault(r["compressor"], []).append(r)
        assert list(by_name) == names  # registry order, every one
        for name, group in by_name.items():
            c = compressors.get(name)
            gathered = c.traits["sparse"] or not c.traits["fixed_size"]
            assert [r["algo"] for r in group] == (["allgather"] if gathered else ["sra", "ring"])
            for r in group:
                assert r["wire"] > 0, r
                assert r["same"] is True, r  # bit-identical on both ranks
                assert r["wrong"] == 0, r  # every compressor judged by its definition
                if c.traits["fixed_size"]:
                    assert r["bits"] == round(8 * c.encoded_size(size // 4) / (size // 4), 3)
                else:
                    assert r["bits"] is None
                assert r["speedup"] == gloo["time_us"] / r["time_us"]
                assert r["ideal"] == gloo["wire"] / r["wire"]
                _check_errors(r, xs, exact)
                algo = f"{name}:{'ag' if r['algo'] == 'allgather' else r['algo']}"
                _check_printed(printed[(size, algo)], r, printed[(size, "gloo")], 2)
        assert by_name["topk"][0]["wire"] < gloo["wire"] / 10  # 1% of the values
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
