"""The GPU check's steps (run.py runs them; docs/gpu-check.md lists what each checks).

A :class:`Step` gives its command, timeout and skip rule for the mode (GPU, or ``--cpu``: the same
code on CPU tensors at small sizes), a verdict on its output where passing needs more than exit
status 0, and what it adds to the report (figures, the fused kernels' fallbacks)."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

PY = sys.executable
HERE = pathlib.Path(__file__).resolve().parent


@dataclass
class Context:
    cpu: bool
    root: pathlib.Path
    work: pathlib.Path
    only: set = field(default_factory=set)
    environment: Dict = field(default_factory=dict)
    figures: Dict = field(default_factory=dict)
    fallbacks: List = field(default_factory=list)

    @property
    def device(self) -> str:
        return "cpu" if self.cpu else "cuda"

    def env(self, step: Step) -> Dict[str, str]:
        env = dict(os.environ)
        paths = [str(self.work / "site"), str(self.root), str(self.root / "tests")]
        env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env["PYTHONUNBUFFERED"] = "1"
        env["MAX_JOBS"] = str(os.cpu_count() or 2)
        env["CGX_GPU_CHECK_DECISIONS"] = str(self.work / "decisions")
        env.update(step.extra_env(self))
        return env


@dataclass
class Step:
    name: str
    checks: str  # what the step checks (the report's column)
    argv: Callable[[Context], List[str]]
    gpu_timeout: float
    cpu_timeout: float
    min_seconds: float = 5.0
    skip_rule: Optional[Callable[[Context], Optional[str]]] = None
    env_rule: Optional[Callable[[Context], Dict[str, str]]] = None
    # (ctx, output, status) -> None (keep the status) or (new status, why)
    verdict_rule: Optional[Callable[[Context, str, str], Optional[tuple]]] = None
    collect_rule: Optional[Callable[[Context], Dict]] = None

    def command(self, ctx: Context) -> List[str]:
        return self.argv(ctx)

    def timeout(self, ctx: Context) -> float:
        return self.cpu_timeout if ctx.cpu else self.gpu_timeout

    def skip(self, ctx: Context) -> Optional[str]:
        if ctx.only and self.name not in ctx.only:
            return "not selected (--only)"
        return self.skip_rule(ctx) if self.skip_rule else None

    def extra_env(self, ctx: Context) -> Dict[str, str]:
        return self.env_rule(ctx) if self.env_rule else {}

    def verdict(self, ctx: Context, out: str, status: str) -> Optional[tuple]:
        return self.verdict_rule(ctx, out, status) if self.verdict_rule else None

    def collect(self, ctx: Context) -> Dict:
        found = _fallbacks(ctx, self.name)
        extra = self.collect_rule(ctx) if self.collect_rule else {}
        return {**extra, "fallbacks": found} if found else extra


def _script(name: str, *args: str) -> Callable[[Context], List[str]]:
    return lambda ctx: [PY, str(HERE / name), "--device", ctx.device, *args]


def _fallbacks(ctx: Context, step: str) -> List[str]:
    """The fused kernels' self-check outcomes other than "fused" that the step's processes
    recorded (sitecustomize.py writes them at exit); moved into the report's list."""
    folder = ctx.work / "decisions"
    found = set()
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        for key, outcome in json.loads(path.read_text() or "{}").items():
            if outcome != "fused":
                found.add(f"{key}: {outcome}")
        path.unlink()
    for item in sorted(found):
        ctx.fallbacks.append({"step": step, "decision": item})
    return sorted(found)


# ---- env ----


def _probe_collect(ctx: Context) -> Dict:
    path = ctx.work / "probe.json"
    if path.is_file():
        ctx.environment.update(json.loads(path.read_text()))
    return {}


def _probe_verdict(ctx: Context, out: str, status: str) -> Optional[tuple]:
    _probe_collect(ctx)
    env = ctx.environment
    if not ctx.cpu and not env.get("cuda_available"):
        return "fail", "torch sees no CUDA device"
    return ("fail", env["problem"]) if env.get("problem") else None


# ---- build ----


def libstdcxx_linkage(root: pathlib.Path) -> str:
    """How torch_cgx._C links libstdc++: "dynamic" (a NEEDED entry), "static" (none: the
    compiler put its own copy in, whose locale the process never initialised: iostreams in the
    library crash, as the GPU machine's CXX=/opt/gcc/bin/g++ did), or "unknown"."""
    found = sorted((root / "torch_cgx").glob("_C*.so"))
    if not found or shutil.which("readelf") is None:
        return "unknown"
    out = subprocess.run(["readelf", "-d", str(found[0])], capture_output=True, text=True).stdout
    return "dynamic" if "libstdc++" in out else "static"


def _build_ext_collect(ctx: Context) -> Dict:
    return {"cxx": os.environ.get("CXX", "c++"), "libstdcxx": libstdcxx_linkage(ctx.root)}


# ---- device tests ----


def _pytest_argv(ctx: Context) -> List[str]:
    files = ["tests/test_device_kernels.py"]
    if not ctx.cpu:
        tests = ctx.root / "tests"
        found = [*tests.glob("test_device_*.py"), *tests.glob("test_triton_*.py")]
        files = sorted(str(p.relative_to(ctx.root)) for p in found)
        files.append("tests/test_gpu_two_ranks.py")
    xml = str(ctx.work / "device-tests.xml")
    argv = [PY, "-m", "pytest", *files, "-q", "-rfEs", "--tb=short", "-p", "no:cacheprovider",
            "--timeout=300", "--durations=15", f"--junitxml={xml}"]  # fmt: skip
    if not ctx.cpu and importlib.util.find_spec("xdist") is not None:
        # workers: a crash (a segfault in one test) fails that test, not the whole step; and
        # the Triton tests compile their kernel variants in parallel
        argv += ["-n", str(min(8, os.cpu_count() or 2))]
    return argv


def _pytest_env(ctx: Context) -> Dict[str, str]:
    if ctx.cpu:
        return {}
    # TRITON_INTERPRET=0: the Triton tests run the compiled kernels on CUDA tensors
    return {"CGX_TEST_REQUIRE_CUDA": "1", "CGX_DEVICE_KERNELS": "fused", "TRITON_INTERPRET": "0"}


def skipped_tests(xml_path: pathlib.Path, kinds=("skipped",)) -> List[str]:
    """The tests a JUnit XML file reports as skipped (or another of ``kinds``: "failure",
    "error"), with the message."""
    if not xml_path.is_file():
        return []
    out = []
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        for kind in kinds:
            for skip in case.findall(kind):
                out.append(f"{case.get('classname')}::{case.get('name')}: {skip.get('message')}")
    return out


def _pytest_verdict(ctx: Context, out: str, status: str) -> Optional[tuple]:
    skipped = skipped_tests(ctx.work / "device-tests.xml")
    if skipped and not ctx.cpu and status == "pass":
        return "fail", f"{len(skipped)} tests skipped, a failure on a GPU: " + "; ".join(skipped)
    return None


def _pytest_collect(ctx: Context) -> Dict:
    xml = ctx.work / "device-tests.xml"
    found = {"skipped_tests": skipped_tests(xml),
             "failed_tests": skipped_tests(xml, ("failure", "error"))}  # fmt: skip
    return {k: v for k, v in found.items() if v}


# ---- memcheck ----


def _memcheck_argv(ctx: Context) -> List[str]:
    run = [PY, str(HERE / "kernel_check.py"), "--device", ctx.device]
    if ctx.cpu:
        return run
    return ["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "1", *run, "--quick"]


def _memcheck_skip(ctx: Context) -> Optional[str]:
    if not ctx.cpu and shutil.which("compute-sanitizer") is None:
        return "compute-sanitizer not found"
    return None


REFUSALS = ("Device not supported", "device not supported", "Target application terminated before")


def _memcheck_verdict(ctx: Context, out: str, status: str) -> Optional[tuple]:
    """compute-sanitizer that refuses the machine (gVisor: "Device not supported", then error
    999 at the first allocation) is a skip, noted, not a failure of the code."""
    if status != "pass" and not ctx.cpu and "ERROR SUMMARY" not in out:
        if any(r in out for r in REFUSALS):
            return "skip", "compute-sanitizer refused this machine (see the output)"
    return None


# ---- benchmarks ----


def _bench_codecs_argv(ctx: Context) -> List[str]:
    size = ["--size", "256K", "--rounds", "1", "--budget", "0.005"]
    size = size if ctx.cpu else ["--size", "64M"]
    return [PY, "-m", "benchmarks.device", "--device", ctx.device, *size,
            "--json", str(ctx.work / "bench-device.json")]  # fmt: skip


def _bench_codecs_collect(ctx: Context) -> Dict:
    path = ctx.work / "bench-device.json"
    if path.is_file():
        ctx.figures["codecs"] = json.loads(path.read_text())
    return {}


def _bench_allreduce_argv(ctx: Context) -> List[str]:
    sizes = ["-b", "64K", "-e", "256K", "-n", "3", "--max-seconds", "0.2", "--bits", "4"]
    if not ctx.cpu:
        sizes = ["-b", "1M", "-e", "64M", "-f", "4", "--bits", "4,8"]
    return [PY, "-m", "benchmarks.device_allreduce", "--device", ctx.device, "--ranks", "2",
            *sizes, "--timeout", "150"]  # fmt: skip


def parse_table(out: str) -> List[Dict]:
    """The rows of benchmarks.device_allreduce's table (after its '#' title line)."""
    lines = [ln.split() for ln in out.splitlines() if ln.strip() and not ln.startswith("#")]
    head = next((ln for ln in lines if ln and ln[0] == "size(B)"), None)
    if head is None:
        return []
    return [dict(zip(head, row)) for row in lines if row[0].isdigit() and len(row) == len(head)]


def _bench_allreduce_verdict(ctx: Context, out: str, status: str) -> Optional[tuple]:
    ctx.figures["allreduce"] = parse_table(out)
    return None if ctx.figures["allreduce"] else ("fail", "no table in the output")


def _only_gpu_sanitizer(ctx: Context) -> Dict[str, str]:
    return {"CGX_DEVICE_KERNELS": "fused"} if not ctx.cpu else {}


STEPS = [
    Step("env", "device, driver, torch / triton / CUDA versions, tools present (torch >= 2.11)",
         lambda ctx: [PY, str(HERE / "probe.py"), "--json", str(ctx.work / "probe.json")], 60, 30,
         verdict_rule=_probe_verdict, collect_rule=_probe_collect),
    Step("build-ext", "torch_cgx._C built in place against the torch found, every core",
         lambda ctx: [PY, "setup.py", "-q", "build_ext", "--inplace"], 300, 40, min_seconds=20,
         collect_rule=_build_ext_collect),
    Step("two-ranks", "2 ranks sharing the device through init_process_group('cgx', device_id):"
         " every compressor x algorithm, reduce_scatter, DDP: bitwise the CPU engine",
         _script("ranks.py"), 150, 60),
    Step("sync-debug", "a DDP step and an engine allreduce under set_sync_debug_mode('error') "
         "(CPU: the host-read / upload recorder)", _script("sync.py"), 120, 60),
    Step("bench-codecs", "each codec's encode / decode_add GB/s beside device-to-device copy and "
         "the torch-ops peer (64 MB fp32)", _bench_codecs_argv, 150, 60,
         collect_rule=_bench_codecs_collect),
    Step("bench-allreduce", "allreduce of 2 ranks on the device, 1-64 MB, cgx vs the carrier",
         _bench_allreduce_argv, 150, 60, verdict_rule=_bench_allreduce_verdict),
    Step("memcheck", "compute-sanitizer memcheck over every fused kernel on small buffers "
         "(CPU: the same script, no sanitizer)", _memcheck_argv, 150, 40,
         skip_rule=_memcheck_skip, env_rule=_only_gpu_sanitizer, verdict_rule=_memcheck_verdict),
    Step("device-tests", "every device test, CUDA required (a skip fails), kernels in fused mode",
         _pytest_argv, 300, 60, min_seconds=20, env_rule=_pytest_env,
         verdict_rule=_pytest_verdict, collect_rule=_pytest_collect),
]  # fmt: skip
