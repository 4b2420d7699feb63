"""The README's `mpirun -np 4 python train.py    # no shim needed` under the real Open MPI: 2 ranks
of tests/mpirun_rank.py started by mpirun (loopback only), each `import torch_cgx` and
`init_process_group("cgx")` with nothing but Open MPI's variables, a 4-bit allreduce checked
against the codec's error bound. tests/test_backend_setup.py fakes the same variables.

Open MPI (openmpi-bin) is installed by scripts/install-deps.sh; without mpirun this test skips,
and `make test` fails on that skip (it is not in tests/expected_skips.txt)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from dist_helpers import free_port

RANK_SCRIPT = Path(__file__).with_name("mpirun_rank.py")
ROOT = RANK_SCRIPT.parent.parent


def mpirun_command(mpirun: str, np: int) -> list:
    cmd = [mpirun, "--oversubscribe", "-np", str(np)]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    # Open MPI's own runtime on loopback only; ranks never call MPI, so no byte transport is needed.
    cmd += ["--mca", "oob_tcp_if_include", "lo", "--mca", "btl", "self"]
    for var in ("MASTER_ADDR", "MASTER_PORT", "CGX_COMPRESSION_QUANTIZATION_BITS", "PYTHONPATH"):
        cmd += ["-x", var]
    return cmd + [sys.executable, str(RANK_SCRIPT)]


def test_mpirun_two_ranks_init_cgx_with_no_shim():
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("Open MPI's mpirun is not installed (scripts/install-deps.sh: openmpi-bin)")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
        and not k.startswith(("CGX_", "OMPI_", "PMIX_", "PMI_"))
    }
    env.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        CGX_COMPRESSION_QUANTIZATION_BITS="4",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
        OMP_NUM_THREADS="1",
    )
    proc = subprocess.Popen(
        mpirun_command(mpirun, 2),
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: a hang is killed with its ranks
    )
    try:
        stdout, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"mpirun ran past 60 s:\n{stdout}\n{stderr}")
    out = stdout + stderr
    assert proc.returncode == 0, out
    for rank in range(2):
        assert f"mpirun rank {rank} of 2: ok" in stdout, out
