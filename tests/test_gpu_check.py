"""scripts/gpucheck's rules that decide a step's status (docs/gpu-check.md): a skipped device
test fails the step on a GPU, a sanitizer that refuses the machine is a skip, the allreduce table
is read back; and the offline harness refuses installers. The whole check runs in `make test`
(make gpu-check-cpu)."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _load(name: str):
    """scripts/gpucheck/<name>.py as a module of its own name, without putting its folder on
    sys.path: the check's scripts are plain files, and a folder on the path of the one pytest
    process (and of every rank it spawns) would shadow installed packages of the same names."""
    path = ROOT / "scripts" / "gpucheck" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"gpucheck_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


steps = _load("steps")


def _ctx(tmp_path, cpu):
    return steps.Context(cpu=cpu, root=ROOT, work=tmp_path)


def test_a_skipped_device_test_fails_the_step_on_a_gpu_only(tmp_path):
    (tmp_path / "device-tests.xml").write_text(
        '<testsuites><testsuite><testcase classname="tests.test_device_maxmin" name="test_cuda">'
        '<skipped message="no CUDA device"/></testcase><testcase classname="t" name="ok"/>'
        '<testcase classname="t" name="bad"><failure message="assert 1 == 2"/></testcase>'
        "</testsuite></testsuites>"
    )
    assert steps.skipped_tests(tmp_path / "device-tests.xml") == [
        "tests.test_device_maxmin::test_cuda: no CUDA device"
    ]
    assert steps._pytest_collect(_ctx(tmp_path, False))["failed_tests"] == ["t::bad: assert 1 == 2"]
    status, why = steps._pytest_verdict(_ctx(tmp_path, False), "", "pass")
    assert status == "fail" and "test_cuda" in why
    assert steps._pytest_verdict(_ctx(tmp_path, True), "", "pass") is None


def test_the_steps_are_the_documented_ones():
    """docs/gpu-check.md's table names every step and no other (nothing builds native GPU code:
    the fused kernels are Triton's, compiled at first use)."""
    names = [s.name for s in steps.STEPS]
    assert names == ["env", "build-ext", "two-ranks", "sync-debug", "bench-codecs",
                     "bench-allreduce", "memcheck", "device-tests"]  # fmt: skip
    table = re.findall(r"^\| `([a-z-]+)` \|", (ROOT / "docs" / "gpu-check.md").read_text(), re.M)
    assert sorted(table) == sorted(names)


def test_a_refusing_sanitizer_is_a_skip_and_a_finding_a_failure(tmp_path):
    refused = "========= Error: Device not supported\nerror 999"
    assert steps._memcheck_verdict(_ctx(tmp_path, False), refused, "fail")[0] == "skip"
    found = "========= Invalid __global__ write of size 4\n========= ERROR SUMMARY: 1 error"
    assert steps._memcheck_verdict(_ctx(tmp_path, False), found, "fail") is None


def test_the_allreduce_table_is_read_back():
    out = (
        "# device allreduce: 2 ranks on cpu\n"
        "   size(B)      count         algo bits   time(us)    algbw    maxerr    relerr #wrong"
        "  same speedup\n"
        "     65536      16384         gloo   32     3298.6    0.020  2.38e-07  2.73e-08      -"
        "   yes    1.00\n"
        "     65536      16384      cgx:sra    4    14846.0    0.004  5.61e-01  1.44e-01      0"
        "   yes    0.22\n"
    )
    rows = steps.parse_table(out)
    assert [r["algo"] for r in rows] == ["gloo", "cgx:sra"]
    assert rows[1]["#wrong"] == "0" and rows[1]["speedup"] == "0.22"
    assert steps.parse_table("no table") == []


@pytest.mark.skipif(os.name != "posix", reason="bash")
def test_offline_refuses_installers_and_downloads():
    run = subprocess.run(
        [str(ROOT / "scripts" / "offline.sh"), "sh", "-c", "pip install nothing; exit 0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 1, run.stderr
    assert "pip install nothing" in run.stderr
