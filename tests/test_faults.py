"""A rank killed (SIGKILL) or stopped (SIGSTOP) inside a compressed allreduce of each algorithm,
or before a forwarded collective: every survivor raises within the group's timeout + 5 s, never
hangs, and shuts down cleanly (exit code 0). The whole matrix (every transport operation of each
algorithm): `python tests/fault_ranks.py` (docs/reliability.md)."""

from __future__ import annotations

import signal

import pytest
from fault_ranks import GROUP_TIMEOUT_S, run_case

KILL, STOP = signal.SIGKILL, signal.SIGSTOP
CASES = [
    ("all_reduce", "sra", 1, KILL),
    ("all_reduce", "ring", 2, KILL),
    ("all_reduce", "allgather", 0, KILL),
    ("all_reduce", "tree", 3, KILL),
    ("all_reduce", "sra", 2, STOP),
    ("all_reduce", "tree", 1, STOP),
    ("broadcast", "sra", 0, KILL),
    ("all_gather", "sra", 0, STOP),
]


@pytest.mark.parametrize("collective,algorithm,op,sig", CASES)
def test_survivors_raise_in_time_and_shut_down(tmp_path, collective, algorithm, op, sig):
    case = {"collective": collective, "algorithm": algorithm, "op": op, "signal": sig}
    reports = run_case({**case, "victim": 1}, 3, str(tmp_path))
    for r in reports:
        assert not r["hung"], r  # it came back and exited
        assert r.get("raised"), r
        assert r["seconds_to_error"] < GROUP_TIMEOUT_S + 5, r
        assert r["exitcode"] == 0, r  # destroy_process_group after the error, then a clean exit
        assert "Timed out" in r["error"] or "Connection" in r["error"] or "closed" in r["error"], r
    if sig == STOP:  # nothing tells them but the timeout: it must have been waited for
        assert max(r["seconds_to_error"] for r in reports) >= GROUP_TIMEOUT_S * 0.9
