"""benchmarks.collaborative's bookkeeping (the run itself needs emulated hosts and minutes:
``python -m benchmarks.collaborative``, docs/collaborative.md): its figures from peers' logs,
and its argument errors."""

from __future__ import annotations

import json

import pytest

from benchmarks import collaborative as B


def _write(tmp_path, name, rows):
    with open(tmp_path / f"cgx-{name}.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def test_figures_from_the_peers_logs(tmp_path):
    t = 1000.0  # the collaboration runs from t to t + 10
    _write(
        tmp_path,
        "p0",
        [
            {"event": "start", "solo": 300.0},
            {"event": "loss", "time": t, "loss": 2.0},
            {"event": "epoch", "time": t + 1, "epoch": 1, "samples": 100},
            {"event": "epoch", "time": t + 3, "epoch": 2, "samples": 200},
            {"event": "end", "time": t + 10, "epoch": 2, "samples": 250, "loss": 1.5},
        ],
    )
    _write(
        tmp_path,
        "p1",
        [
            {"event": "start", "solo": 100.0},
            {"event": "end", "time": t + 10, "epoch": 2, "samples": 150},
        ],
    )
    _write(
        tmp_path,
        "p1r",
        [
            {"event": "start", "solo": None},
            {"event": "epoch", "time": t + 7, "epoch": 2, "samples": 32},
        ],
    )
    procs = {"p0": None, "p1": None, "p1r": None}
    r = B._figures("cgx", str(tmp_path), procs, 40_000, t, t + 10, t + 3, t + 5)
    assert r["samples_per_s"] == pytest.approx((250 + 150 + 32) / 10)
    assert r["solo_sum"] == 400.0 and r["of_solo"] == pytest.approx(43.2 / 400)
    assert r["epochs"] == 2 and r["epoch_s"] == pytest.approx(2.0)
    assert r["late_epoch_s"] is None  # no two epochs in the last third
    assert r["bytes_per_sample"] == pytest.approx(40_000 / 432)
    assert r["loss"] == 1.5 and r["rejoin_s"] == pytest.approx(2.0) and r["down_s"] == 2.0
    assert r["curves"]["loss"] == [(0.0, 2.0)] and r["curves"]["epochs"] == [(1.0, 1), (3.0, 2)]


def test_bad_systems():
    with pytest.raises(SystemExit, match="--systems"):
        B.main(["--systems", "cgx,nope"])
