"""benchmarks/device_ncu.py without a GPU: ncu's details page (the CSV it prints, preamble,
thousands separators and markers included) assigned to the profiled calls with the derived
figures, and the driver end to end against a stand-in ``ncu`` that runs the real workload on
CPU tensors, refuses the metrics (as an ncu lacking one would) and is then asked for its
standard sections."""

from __future__ import annotations

import json
import os
import stat
import sys

import pytest

from benchmarks import device_ncu as ncu

HEAD = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
        '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
        '"Metric Value"')  # fmt: skip
STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"


def csv_rows(kernels):
    """ncu's details page for (name, {metric: value}) kernels, IDs in order."""
    out = ["==PROF== Connected to process 1", HEAD]
    for i, (name, metrics) in enumerate(kernels):
        for metric, value in metrics.items():
            out.append(f'"{i}","1","python3","h","{name}","1","7","(128, 1, 1)","(8, 1, 1)",'
                       f'"0","9.0","Command line profiler metrics","{metric}","",'
                       f'"{value}"')  # fmt: skip
    return "\n".join(out) + "\n"


PIPE = "sm__inst_executed_pipe_{}.avg.pct_of_peak_sustained_active"


def kernel(ns, read, write, inst=None, stalls=(), pipes=()):
    m = {"gpu__time_duration.sum": f"{ns:,}", "dram__bytes_read.sum": f"{read:,}",
         "dram__bytes_write.sum": f"{write:,}", "launch__registers_per_thread": "40",
         "dram__throughput.avg.pct_of_peak_sustained_elapsed": "91.5"}  # fmt: skip
    if inst is not None:
        m["smsp__thread_inst_executed.sum"] = f"{inst:,}"
    m.update({STALL.format(k): v for k, v in stalls})
    m.update({PIPE.format(k): v for k, v in pipes})
    return m


MARK = (
    "void at::cuda::(anonymous namespace)::spin_kernel(long)",
    {"gpu__time_duration.sum": "900"},
)
CALLS = [dict(case="copy", phase="copy", numel=1000, least_bytes=8000),
         dict(case="maxmin", phase="encode", numel=1000, least_bytes=4600),
         dict(case="maxmin", phase="decode_add", numel=1000, least_bytes=8600)]  # fmt: skip


def test_details_are_assigned_to_the_calls_behind_their_markers():
    text = csv_rows([MARK, ("copy_kernel", kernel(2000, 4000, 4000)),
                     MARK, ("scalars_kernel", kernel(1000, 4000, 100, inst=30000)),
                     ("codes_kernel", kernel(1500, 4000, 500, inst=25000, stalls=[
                         ("long_scoreboard", "3.5"), ("barrier", "9.25"), ("wait", "1.0")],
                         pipes=[("alu", "61.2"), ("fma", "38.4"), ("xu", "70.1"),
                                ("lsu", "12.0")])),
                     MARK, ("decode_kernel", kernel(2150, 8600, 4000))])  # fmt: skip
    kernels = ncu.parse_details(text)
    assert [k["id"] for k in kernels] == list(range(7))
    calls = ncu.assign(kernels, CALLS)
    copy, enc, dec = calls
    assert [r["name"] for r in enc["kernels"]] == ["scalars_kernel", "codes_kernel"]
    assert enc["ns"] == 2500 and copy["ns"] == 2000 and dec["ns"] == 2150
    # the copy moves 8000 bytes in 2000 ns; the encode its 4600 in 2500: 1.84 / 4 = 0.46
    assert enc["vs_copy"] == pytest.approx((4600 / 2500) / (8000 / 2000))
    assert dec["vs_copy"] == pytest.approx(1.0)
    assert enc["moved_over_least"] == pytest.approx((4100 + 4500) / 4600)  # the input read twice
    codes = enc["kernels"][1]
    assert codes["inst_per_value"] == 25.0 and codes["regs"] == 40 and codes["dram_pct"] == 91.5
    assert codes["stalls"] == [("barrier", 9.25), ("long_scoreboard", 3.5)]
    assert codes["pipes"] == [("xu", 70.1), ("alu", 61.2), ("fma", 38.4)]  # the three busiest
    assert dec["kernels"][0]["inst_per_value"] is None  # not collected: no figure, no guess
    lines = ncu.table(calls).splitlines()
    assert lines[2].split() == ["copy", "copy", "2", "1", "1"]
    assert lines[6].split()[:4] == ["codes_kernel", "1.5", "92", "-"]
    assert lines[6].endswith("25  barrier 9.2, long_scoreboard 3.5; xu 70, alu 61, fma 38")
    assert lines[5].endswith("30")  # the scalars kernel: no stall or pipe collected


def test_markers_that_miss_the_calls_leave_the_kernels_unassigned():
    text = csv_rows([MARK, ("copy_kernel", kernel(2000, 4000, 4000)), ("x", kernel(1, 1, 1))])
    calls = ncu.assign(ncu.parse_details(text), CALLS)
    assert len(calls) == 1 and calls[0]["case"] == "?"
    assert [r["name"] for r in calls[0]["kernels"]] == ["copy_kernel", "x"]
    assert ncu.parse_details("==PROF== no kernels profiled\n") == []


FAKE = """\
#!{python}
# a stand-in ncu: runs the profiled command, refuses --metrics naming {refuse!r}, prints
# sections on --import
import json, subprocess, sys
argv = sys.argv[1:]
if "--import" in argv:
    manifest = json.load(open(argv[argv.index("--import") + 1]))
    print("==PROF== importing")
    print({head!r})
    i = 0
    for call in manifest:
        for name, ns in (("spin_kernel(long)", 900), (call["phase"] + "_kernel", 1000)):
            for metric, unit, value in (("Duration", "nsecond", ns),
                                        ("Registers Per Thread", "", 32)):
                print(f'"{{i}}","1","p","h","{{name}}","1","7","(1, 1, 1)","(1, 1, 1)","0","9.0",'
                      f'"SpeedOfLight","{{metric}}","{{unit}}","{{value}}"')
            i += 1
    sys.exit(0)
if "--metrics" in argv and {refuse!r} in argv[argv.index("--metrics") + 1]:
    print("==ERROR== Failed to find metric")
    sys.exit(1)
report = argv[argv.index("-o") + 1]
inner = argv[argv.index(sys.executable):]
rc = subprocess.run(inner).returncode
manifest = inner[inner.index("--manifest") + 1]
open(report + ".ncu-rep", "w").write(open(manifest).read())
sys.exit(rc)
"""


def fake_ncu(tmp_path, monkeypatch, refuse: str) -> None:
    fake = tmp_path / "ncu"
    fake.write_text(FAKE.format(python=sys.executable, head=HEAD, refuse=refuse))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("NCU", str(fake))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def test_driver_falls_back_to_sections_and_reports_every_call(tmp_path, monkeypatch, capsys):
    fake_ncu(tmp_path, monkeypatch, refuse="gpu__time")  # refuses every --metrics run
    out = tmp_path / "o"
    args = ["--device", "cpu", "--size", "64K", "--compressors", "maxmin,signsgd", "--out",
            str(out), "--timeout", "120"]  # fmt: skip
    assert ncu.main(args) == 0
    printed = capsys.readouterr().out
    assert "standard sections" in printed and "maxmin encode" in printed
    log = (out / "ncu_profile.log").read_text()
    assert log.count("$ ") == 3 and log.count("--metrics") == 2 and "--section SpeedOfLight" in log
    assert log.count("inst_executed_pipe") == 1  # the second run: the metrics without the pipes
    assert "--clock-control none" in log and "--profile-from-start off" in log
    calls = json.loads((out / "ncu.json").read_text())
    assert [(c["case"], c["phase"]) for c in calls] == [
        ("copy", "copy"), ("maxmin", "encode"), ("maxmin", "decode_add"),
        ("signsgd", "encode"), ("signsgd", "decode_add")]  # fmt: skip
    for c in calls:  # the sections' display names read; equal times: the bytes' ratio
        assert c["ns"] == 1000 and c["kernels"][0]["regs"] == 32
        assert c["vs_copy"] == pytest.approx(c["least_bytes"] / (8 * 16384))
    # encode reads the input and writes the payload that decode_add reads beside out
    assert calls[1]["least_bytes"] - 4 * 16384 == calls[2]["least_bytes"] - 8 * 16384 > 0


def test_an_ncu_without_the_pipe_metrics_still_gives_the_others(tmp_path, monkeypatch, capsys):
    fake_ncu(tmp_path, monkeypatch, refuse="inst_executed_pipe")
    out = tmp_path / "o"
    args = ["--device", "cpu", "--size", "64K", "--compressors", "signsgd", "--out", str(out),
            "--timeout", "120"]  # fmt: skip
    assert ncu.main(args) == 0
    assert capsys.readouterr().out.startswith("metrics of ")
    log = (out / "ncu_profile.log").read_text()
    assert log.count("$ ") == 2 and "--section" not in log and "again for the metrics" in log


def test_no_ncu_is_a_clear_error(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("NCU", str(tmp_path / "missing"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(ncu.os, "access", lambda p, m: False)
    assert ncu.main(["--out", str(tmp_path)]) == 2
    assert "no ncu" in capsys.readouterr().err
    assert not os.listdir(tmp_path)


def test_an_ncu_that_hangs_is_stopped_at_the_timeout(tmp_path, monkeypatch, capsys):
    fake = tmp_path / "ncu"
    fake.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(60)\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("NCU", str(fake))
    assert ncu.main(["--out", str(tmp_path / "o"), "--timeout", "1"]) == 1
    assert "ran past --timeout 1 s" in capsys.readouterr().err
