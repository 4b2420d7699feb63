"""The wide-area DiLoCo benchmark (benchmarks.diloco): its argument checks, the GPT-2 fragments,
the derived columns, and a few steps of three methods on 2 real ranks (no namespaces)."""

from __future__ import annotations

import json
import os

import pytest
from dist_helpers import run_ranks

pytest.importorskip("transformers")
pytest.importorskip("matplotlib")

from benchmarks import diloco, diloco_run  # noqa: E402

TINY = ["--n-layer", "2", "--n-embd", "32", "--n-head", "2", "--seq-len", "16", "--batch", "2"]
TINY += ["--corpus-mb", "0.2", "--eval-batches", "1", "--calib", "1"]


def test_arguments_are_checked():
    args = diloco.parse_args([])
    assert args.methods == list(diloco_run.METHODS) and args.sync_every == 50
    with pytest.raises(SystemExit):
        diloco.parse_args(["--methods", "ddp-gloo,bogus"])
    with pytest.raises(SystemExit):  # the delay must fit in a fragment's share of the period
        diloco.parse_args(["--sync-every", "10", "--fragments", "2", "--delay", "5"])
    with pytest.raises(SystemExit):
        diloco.parse_args(["--steps", "1"])


def test_fragments_partition_the_gpt2_parameters():
    from benchmarks.train_workloads import GPT2Workload

    args = diloco.parse_args(TINY + ["--n-layer", "3"])
    model = GPT2Workload(args, 0).model()
    for k in (1, 2, 3):
        frags = diloco_run.fragments(model, k)
        ids = [id(p) for f in frags for p in f.parameters()]
        assert len(ids) == len(set(ids)) == len(list(model.parameters()))
    with pytest.raises(ValueError, match="fragments"):
        diloco_run.fragments(model, 4)
    kw = diloco_run.diloco_kwargs("sparseloco", args)
    assert kw["compressor"] == "sparseloco" and kw["error_feedback"] is True
    assert diloco_run.diloco_kwargs("diloco-fp32", args)["compressor"] is None


def test_time_to_target_and_comparisons():
    losses, wall = [5.0, 4.0, 3.0, 2.0], [1.0, 2.0, 3.0, 4.0]
    assert diloco.time_to(losses, wall, 3.5, 2) == 3.0  # mean(4, 3) first <= 3.5
    assert diloco.time_to(losses, wall, 1.0, 1) is None

    def rec(method, val, nbytes):
        r = {"method": method, "steps": 4, "losses": losses, "wall_s": wall, "val_loss": val}
        return dict(r, train_loss=2.5, bytes_per_rank_per_step=nbytes, utilisation=0.5)

    records = [rec("ddp-gloo", 2.0, 800.0), rec("ddp-cgx4", 2.0, 100.0)]
    records.append(rec("diloco-4bit", 2.2, 2.0))
    assert diloco.add_comparisons(records, None) == 2.5  # ddp-gloo's final training loss
    assert records[2]["fewer_bytes_than_ddp_cgx4"] == 50.0
    assert records[2]["val_vs_ddp_pct"] == pytest.approx(10.0)
    assert records[2]["time_to_target_s"] == 4.0
    assert "| diloco-4bit |" in diloco.table(records)


def _body(rank, world, json_path, png_path):
    argv = TINY + ["--steps", "4", "--sync-every", "2", "--delay", "0", "--log-every", "0"]
    argv += ["--methods", "ddp-cgx4,streaming-4bit,sparseloco"]
    assert diloco.main(argv + ["--json", json_path, "--plot", png_path]) == 0


def test_three_methods_on_two_ranks(tmp_path):
    json_path, png_path = str(tmp_path / "d.json"), str(tmp_path / "d.png")
    run_ranks(_body, 2, json_path, png_path, timeout=240)
    records = json.load(open(json_path))["records"]
    assert [r["method"] for r in records] == ["ddp-cgx4", "streaming-4bit", "sparseloco"]
    by = {r["method"]: r for r in records}
    for r in records:
        assert len(r["losses"]) == len(r["wall_s"]) == 4 and r["bytes_per_rank_per_step"] > 0
    # 4-bit DiLoCo every 2 steps sends far less than 4-bit DDP every step
    assert by["streaming-4bit"]["fewer_bytes_than_ddp_cgx4"] > 1.5
    with open(png_path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(png_path) > 1000
