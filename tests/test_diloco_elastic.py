"""DiLoCo and Streaming DiLoCo on a cgx group (max-min 4-bit, error feedback) under torchrun:
rank 1 is SIGKILLed mid-run, ``torchrun --max-restarts`` restarts the job, every rank resumes
from the newest checkpoint they all have, and the run ends bitwise equal to an uninterrupted one
(the elastic resume DiLoCo promises; tests/diloco_elastic_train.py, docs/diloco.md#checkpoints)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch
from dist_helpers import free_port

SCRIPT = os.path.join(os.path.dirname(__file__), "diloco_elastic_train.py")

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch.distributed.run") is None,
    reason="torchrun (torch.distributed.run) is not available",
)


def torchrun(out, *script_args, restarts=0):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--max-restarts", str(restarts), "--rdzv-backend", "c10d",
           "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--monitor-interval", "0.5",
           SCRIPT, str(out), *script_args]  # fmt: skip
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    out.mkdir()
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    return [torch.load(out / f"final-{r}.pt", weights_only=True) for r in (0, 1)]


def resumes(out, rank):
    """(first inner step run, a finished reduction came back, residual norm) per resume."""
    got = []
    for start in sorted(int(p.name.split("-")[-1][:-4]) for p in out.glob(f"resumed-{rank}-*")):
        first, pending, residual = (out / f"resumed-{rank}-{start}.txt").read_text().split()
        got.append((int(first), bool(int(pending)), float(residual)))
    return got


def assert_bitwise(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), (k, float((a[k] - b[k]).abs().max()))


def assert_same_runs(straight, killed) -> None:
    for rank in (0, 1):
        s, k = straight[rank], killed[rank]
        assert_bitwise(s["local"], k["local"])  # every inner step of this rank
        assert_bitwise(s["final"], k["final"])
        for fs, fk in zip(s["diloco"]["fragments"], k["diloco"]["fragments"]):
            assert_bitwise(fs["globals"], fk["globals"])
            assert_bitwise(fs["residuals"], fk["residuals"])
            assert fs["syncs"] == fk["syncs"]
        assert s["diloco"]["step"] == k["diloco"]["step"]
    assert_bitwise(killed[0]["final"], killed[1]["final"])  # one model after sync_now
    # the replicas trained apart after their last scheduled sync
    assert any(not torch.equal(killed[0]["local"][n], killed[1]["local"][n]) for n in
               killed[0]["local"])  # fmt: skip


def test_diloco_resumes_bit_identical_after_a_kill_mid_period(tmp_path):
    """sync_every=3: syncs after inner steps 3, 6, 9 of 11; rank 1 dies after step 5."""
    straight = torchrun(tmp_path / "straight")
    killed = torchrun(tmp_path / "killed", "--kill-at", "5", restarts=1)
    assert (tmp_path / "killed" / "killed-5").exists()
    for rank in (0, 1):  # both resumed at step 5 from checkpoint 4, residuals of sync 1
        ((first, pending, residual),) = resumes(tmp_path / "killed", rank)
        assert first == 5 and not pending and residual > 0
    assert_same_runs(straight, killed)


def test_streaming_resumes_bit_identical_after_kills_around_a_reduction(tmp_path):
    """Two fragments, sync_every=4, delay 1: fragment 0's reduction starts after step 5 and is
    applied after 6; it starts again after 9. Rank 1 dies after step 5 (its reduction on the
    wire: the job resumes at 5 from checkpoint 4 and starts it again) and after step 10
    (checkpoint 9 holds that reduction's result, applied after the resumed step 10)."""
    straight = torchrun(tmp_path / "straight", "--streaming")
    killed = torchrun(
        tmp_path / "killed", "--streaming", "--kill-at", "5", "--kill-at", "10", restarts=2
    )
    for rank in (0, 1):
        (a, b) = resumes(tmp_path / "killed", rank)
        assert a[:2] == (5, False) and b[:2] == (10, True)
        assert a[2] > 0 and b[2] > 0
    assert_same_runs(straight, killed)
