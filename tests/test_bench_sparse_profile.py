"""CPU smoke tests of benchmarks/device_sparse_profile.py: a small run of every sparse codec
(timings, ratios, the profile's op classes, the dispatcher's op counts, the JSON), and the CUDA
path's attribution of device kernels to op classes on a synthetic profile (no GPU here)."""

from __future__ import annotations

import json
import types

import torch
from torch.autograd.profiler_util import FunctionEvent

from benchmarks import device_sparse_profile as prof


def test_cpu_run_writes_rows(tmp_path, capsys):
    out = tmp_path / "p.json"
    args = ["--device", "cpu", "--size", "64K", "--rounds", "1", "--budget", "0.001"]
    assert prof.main(args + ["--json", str(out)]) == 0
    rows = {r["compressor"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == set(prof.NAMES)
    for r in rows.values():
        assert r["path"] == "reference" and r["encode_ratio"] > 0 and r["decode_add_ratio"] > 0
        p = r["profile"]["encode"]
        assert abs(sum(p[c]["share"] for c in prof.CLASSES) - 1) < 1e-6
    # the structure benchmarks/results/ quotes: random_k's draws and rounds are hundreds of int ops
    assert rows["randomk"]["profile"]["encode"]["elementwise"]["n"] > 200
    assert rows["topk"]["profile"]["encode"]["select"]["n"] == 2  # topk and sort
    assert rows["randomk"]["ops"]["encode"]["elementwise"] > 150  # at the dispatcher
    assert rows["topk"]["ops"]["encode"] == {"select": 2, "elementwise": 6, "gather": 2, "pack": 4}
    assert "profile of one encode" in capsys.readouterr().out


def _event(i, name, device, us, kernels=()):
    e = FunctionEvent(i, name, 0, 0, us, device_type=device)
    for k in kernels:
        e.append_kernel(k, 0, 1.0)
    return e


def test_cuda_kernels_take_their_launching_op_class():
    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA
    events = [
        _event(1, "aten::topk", cpu, 50, ["gatherTopK"]),
        _event(2, "aten::bitwise_and", cpu, 5, ["elementwise_and"]),
        _event(3, "gatherTopK", cuda, 30),
        _event(4, "elementwise_and", cuda, 10),
        _event(5, "keys_kernel", cuda, 6),
        _event(6, "Memcpy DtoD (Device -> Device)", cuda, 4),
        _event(7, "unknown", cuda, 2),
    ]
    rows = prof._cuda_rows(types.SimpleNamespace(events=lambda: events))
    by = {name: (cls, us) for cls, _, us, name in rows}
    assert by["gatherTopK"] == ("select", 30)
    assert by["elementwise_and"][0] == "elementwise"
    assert by["keys_kernel"][0] == "triton"
    assert by["Memcpy DtoD (Device -> Device)"][0] == "pack"
    assert by["unknown"][0] == "other" and len(rows) == 5
