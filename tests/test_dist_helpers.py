"""The multi-process helper itself: a hanging rank fails the test in bounded time."""

from __future__ import annotations

import os
import time

import pytest
from dist_helpers import run_ranks


def body_hangs(rank, world, pid_dir):
    open(os.path.join(pid_dir, str(os.getpid())), "w").close()
    if rank == 1:
        time.sleep(3600)


def test_a_hanging_rank_fails_within_the_timeout(tmp_path):
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"ranks \[1\] still running"):
        run_ranks(body_hangs, 2, str(tmp_path), timeout=8)
    assert time.monotonic() - start < 30
    for pid in map(int, os.listdir(tmp_path)):  # and the hung rank was killed
        for _ in range(50):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"rank process {pid} still alive")
