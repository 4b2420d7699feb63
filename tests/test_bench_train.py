"""The training benchmark (benchmarks.train) on 2 real ranks, and the plotting helpers."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys

import pytest
from dist_helpers import run_ranks

from torch_cgx import compressors

PNG = b"\x89PNG\r\n\x1a\n"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORD_KEYS = {
    "workload",
    "method",
    "bits",
    "world",
    "params",
    "steps",
    "warmup",
    "batch_per_rank",
    "global_batch",
    "step_ms",
    "comm_overhead_ms",
    "overhead_ratio_vs_gloo",
    "samples_per_s",
    "wire_bytes_per_step",
    "final_loss",
    "loss_delta_vs_gloo_pct",
    "eval",
    "losses",
    "step_times_ms",
    "wall_s",
}


def is_png(path) -> bool:
    with open(path, "rb") as f:
        return f.read(8) == PNG


def body_train(rank, world, json_path, png_path):
    from benchmarks import train

    argv = ["--workloads", "digits", "--methods", "gloo,cgx4,noop", "--steps", "30"]
    argv += ["--log-every", "10", "--json", json_path, "--plot", png_path]
    assert train.main(argv) == 0


def body_train_lstm(rank, world, json_path):
    from benchmarks import train

    argv = ["--workloads", "lstm", "--methods", "gloo,cgx4", "--steps", "20", "--json", json_path]
    argv += ["--lstm-embed", "32", "--lstm-hidden", "64", "--seq-len", "32", "--corpus-mb", "0.5"]
    argv += ["--lstm-lr-warmup", "0", "--eval-batches", "1", "--log-every", "10"]
    assert train.main(argv) == 0


def test_train_lstm_two_ranks(tmp_path):
    """The third architecture: a byte LSTM on the gpt2 workload's corpus learns under Gloo and
    under 4-bit cgx alike."""
    json_path = str(tmp_path / "lstm.json")
    run_ranks(body_train_lstm, 2, json_path, timeout=300)
    with open(json_path) as f:
        out = json.load(f)
    info = out["meta"]["workloads"]["lstm"]
    assert info["config"] == {"embed": 32, "hidden": 64, "layers": 2} and info["params"] > 0
    records = {r["method"]: r for r in out["records"]}
    assert records["gloo"]["losses"][0] == records["cgx4"]["losses"][0]
    assert abs(records["gloo"]["losses"][0] - math.log(257)) < 0.1  # untrained: near uniform
    for r in records.values():
        assert r["final_loss"] < r["losses"][0] - 0.5, r["losses"]
        assert math.isfinite(r["eval"]["val_loss"])
    assert abs(records["cgx4"]["final_loss"] / records["gloo"]["final_loss"] - 1) < 0.05


def test_train_digits_two_ranks(tmp_path):
    json_path, png_path = str(tmp_path / "out" / "train.json"), str(tmp_path / "train.png")
    run_ranks(body_train, 2, json_path, png_path)
    with open(json_path) as f:
        out = json.load(f)
    assert out["meta"]["world"] == 2
    assert out["meta"]["workloads"]["digits"]["params"] > 0
    records = {r["method"]: r for r in out["records"]}
    assert list(records) == ["gloo", "cgx4", "noop"]
    for m, r in records.items():
        assert RECORD_KEYS <= set(r), f"{m}: missing {RECORD_KEYS - set(r)}"
        assert r["workload"] == "digits" and r["world"] == 2 and r["steps"] == 30
        assert r["global_batch"] == 2 * r["batch_per_rank"]
        assert len(r["losses"]) == len(r["step_times_ms"]) == len(r["wall_s"]) == 30
        numbers = [r["step_ms"], r["samples_per_s"], r["final_loss"], r["wire_bytes_per_step"]]
        numbers += r["losses"] + r["step_times_ms"] + r["wall_s"] + list(r["eval"].values())
        assert all(math.isfinite(v) for v in numbers), m
        assert r["step_ms"] > 0 and r["samples_per_s"] > 0
        assert all(b >= a for a, b in zip(r["wall_s"], r["wall_s"][1:])), "wall clock goes back"
        assert math.isfinite(r["comm_overhead_ms"])
        assert 0 <= r["eval"]["test_acc"] <= 1
    assert records["gloo"]["bits"] == 32 and records["cgx4"]["bits"] == 4
    # The same seed and batches: the first step's loss is the same for every method (same
    # initial weights, nothing reduced yet when it is computed).
    first = [r["losses"][0] for r in records.values()]
    assert max(first) - min(first) < 1e-6, first
    # noop communicates nothing and is the reference of the overhead.
    assert records["noop"]["wire_bytes_per_step"] == 0
    assert records["noop"]["comm_overhead_ms"] == 0
    # Gloo sends a ring's 2 (W - 1) / W = 1x the fp32 gradients; 4-bit cgx less than a quarter.
    grad_bytes = 4 * records["gloo"]["params"]
    assert records["gloo"]["wire_bytes_per_step"] == pytest.approx(grad_bytes)
    assert 0 < records["cgx4"]["wire_bytes_per_step"] < grad_bytes / 4
    # Comparisons against gloo.
    assert records["gloo"]["loss_delta_vs_gloo_pct"] == 0
    assert math.isfinite(records["cgx4"]["loss_delta_vs_gloo_pct"])
    # It learns: gloo's loss over the last 5 of 30 steps is well below the first 5.
    loss = records["gloo"]["losses"]
    assert sum(loss[-5:]) / 5 < sum(loss[:5]) / 5 - 0.2, loss
    assert is_png(png_path)


def test_train_module_runs_alone_as_one_process(tmp_path):
    """``python -m benchmarks.train`` with no launcher variables: one rank, env:// init."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
    env.update(PYTHONPATH=REPO, OMP_NUM_THREADS="1", CGX_CODEC_THREADS="1")
    json_path = tmp_path / "one.json"
    cmd = [sys.executable, "-m", "benchmarks.train", "--workloads", "digits"]
    cmd += ["--methods", "gloo,cgx2,noop", "--steps", "4", "--warmup", "1"]
    cmd += ["--json", str(json_path)]
    proc = subprocess.run(
        cmd, env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| digits | cgx2 |" in proc.stdout
    records = json.loads(json_path.read_text())["records"]
    assert [r["world"] for r in records] == [1, 1, 1]
    assert all(len(r["losses"]) == 4 for r in records)


def body_train_compressor(rank, world, json_path):
    from benchmarks import train

    argv = ["--workloads", "digits", "--methods", "gloo,c:topk,c:dgc", "--steps", "4"]
    argv += ["--warmup", "1", "--json", json_path]
    assert train.main(argv) == 0


def test_train_compressor_methods_two_ranks(tmp_path):
    """``--methods c:<name>``: any compressor through CompressionState / compression_hook."""
    json_path = str(tmp_path / "train.json")
    run_ranks(body_train_compressor, 2, json_path)
    with open(json_path) as f:
        records = {r["method"]: r for r in json.load(f)["records"]}
    assert list(records) == ["gloo", "c:topk", "c:dgc"]
    gloo, topk, dgc = records.values()
    for r in (topk, dgc):
        assert RECORD_KEYS <= set(r)
        assert len(r["losses"]) == 4 and all(math.isfinite(v) for v in r["losses"])
        assert r["bits"] is None and r["error_feedback"] is True  # biased: residuals kept
        assert r["losses"][0] == pytest.approx(gloo["losses"][0], abs=1e-6)
        # Sparse: far fewer bytes than Gloo's fp32 ring, but something is sent.
        assert 0 < r["wire_bytes_per_step"] < gloo["wire_bytes_per_step"] / 5
    assert topk["compressor"] == "topk" and topk["hook_momentum"] == 0
    assert dgc["compressor"] == "dgc" and dgc["hook_momentum"] == pytest.approx(0.9)
    assert topk["losses"] != gloo["losses"]  # compressed: another trajectory


def test_method_and_workload_flags():
    from benchmarks import train

    assert train.parse_methods("gloo,cgx3,noop") == ["gloo", "cgx3", "noop"]
    assert train.parse_methods("gloo,c:topk") == ["gloo", "c:topk"]
    every = [f"c:{name}" for name in compressors.names()]
    assert train.parse_methods("gloo,all-compressors") == ["gloo", *every]
    assert train.parse_methods("c:topk:ef,c:qsgd:noef") == ["c:topk:ef", "c:qsgd:noef"]
    assert train.error_feedback_of("c:topk:noef") is False
    assert train.error_feedback_of("c:topk") is None
    levers = "cgx4:legacy,cgx2:+rot:-ef,cgx1:legacy:+sr,cgx-adaptive2.5"
    assert train.parse_methods(levers) == levers.split(",")
    from benchmarks.train_methods import cgx_variant, nominal_bits

    assert cgx_variant("cgx2:+rot:-ef") == (2, {"rotation": True, "error_feedback": False})
    assert cgx_variant("cgx1:legacy:+sr") == (1, {"legacy": True, "stochastic": True})
    assert cgx_variant("cgx-adaptive2.5") == (2, {"adaptive_bits": 2.5})
    assert cgx_variant("cgx-adaptive3:-clip") == (3, {"adaptive_bits": 3.0, "clip": False})
    assert cgx_variant("cgx2:-clip:+rot") == (2, {"clip": False, "rotation": True})
    assert nominal_bits("cgx-adaptive2.5") == 2.5 and nominal_bits("cgx4:legacy") == 4
    from benchmarks.train_methods import backend_variant

    assert train.parse_methods("ddp-cgx4,ddp-cgx2:norot") == ["ddp-cgx4", "ddp-cgx2:norot"]
    assert backend_variant("ddp-cgx4") == (4, "auto") and nominal_bits("ddp-cgx2:norot") == 2
    assert backend_variant("ddp-cgx2:norot") == (2, "off") and backend_variant("cgx4") is None
    noef = train.parse_methods("all-noef")
    assert "c:onebit:noef" in noef and "c:qsgd:noef" not in noef  # unbiased: nothing to turn off
    assert "c:signsgd:noef" not in noef  # its default is already off
    for bad in (
        "gloo,cgx9",
        "nccl",
        "gloo,gloo",
        "",
        "c:nope",
        "c:",
        "c:topk,all-compressors",
        "c:topk:maybe",
        "c:topk:ef:ef",
        "cgx4:+nope",
        "cgx4:legacy:ef",
        "cgx-adaptive9",
        "cgx-adaptivex",
        "cgx-adaptive3:legacy",
        "ddp-cgx9",
        "ddp-cgx4:rot",
    ):
        with pytest.raises(argparse.ArgumentTypeError):
            train.parse_methods(bad)
    with pytest.raises(argparse.ArgumentTypeError):
        train.parse_workloads("gpt2,mnist")
    args = train.parse_args(["--steps", "7", "--digits-batch", "5"])
    assert args.gpt2_steps == args.digits_steps == 7 and args.digits_batch == 5
    assert args.methods == list(train.METHODS) and args.workloads == ["gpt2", "digits"]


def test_comparisons_and_table():
    from benchmarks import train

    def rec(method, step_ms, loss):
        return {
            "workload": "w",
            "method": method,
            "step_ms": step_ms,
            "samples_per_s": 1.0,
            "wire_bytes_per_step": 0.0,
            "final_loss": loss,
            "eval": {},
            "comm_overhead_ms": None,
            "overhead_ratio_vs_gloo": None,
            "loss_delta_vs_gloo_pct": None,
        }

    records = [rec("gloo", 30.0, 2.0), rec("cgx4", 15.0, 2.1), rec("noop", 10.0, 1.9)]
    train.add_comparisons(records)
    gloo, cgx4, noop = records
    assert gloo["comm_overhead_ms"] == 20 and cgx4["comm_overhead_ms"] == 5
    assert cgx4["overhead_ratio_vs_gloo"] == pytest.approx(0.25)
    assert cgx4["loss_delta_vs_gloo_pct"] == pytest.approx(5.0)
    assert noop["comm_overhead_ms"] == 0
    text = train.table(records)
    assert "| w | cgx4 | 15.0 | 5.0 | 0.25x |" in text
    assert text.count("\n") == 4


def test_convergence_table_averages_the_last_steps():
    from benchmarks.train_report import convergence_table

    def rec(workload, method, losses):
        return {"workload": workload, "method": method, "losses": losses,
                "wire_bytes_per_step": 2e6, "eval": {"acc": 0.5}}  # fmt: skip

    records = [rec("w", "gloo", [9.0, 2.0, 2.0]), rec("w", "c:x", [1.0, 2.0, 3.0])]
    text = convergence_table(records, last=2)
    assert "| c:x | 2.000 | 2.5000 | +25.00% | acc 0.5 |" in text
    assert "| gloo | 2.000 | 2.0000 | +0.00% | acc 0.5 |" in text


def test_plot_allreduce_writes_png(tmp_path):
    from benchmarks.plots import allreduce_label, plot_allreduce

    records = []
    for size in (2**20, 2**22, 2**24):
        for algo, bits, speed in (("gloo", 32, 1.0), ("sra", 4, 3.0), ("ring", 2, 2.5)):
            t_us = size / (speed * 1e9) * 1e6
            records.append({"size": size, "algo": algo, "bits": bits, "time_us": t_us, "world": 4})
    assert allreduce_label(records[0]) == "gloo" and allreduce_label(records[1]) == "cgx-sra-4bit"
    path = str(tmp_path / "allreduce.png")
    assert plot_allreduce(records, path) == path
    assert is_png(path) and os.path.getsize(path) > 1000
    with pytest.raises(ValueError):
        plot_allreduce([], str(tmp_path / "empty.png"))


def test_auto_method_runs_on_the_planned_cgx_group():
    from benchmarks import train_methods as tm

    assert tm.parse_methods("gloo,cgx-auto") == ["gloo", "cgx-auto"]
    assert tm.on_cgx_group("cgx-auto") and tm.nominal_bits("cgx-auto") is None
