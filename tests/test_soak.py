"""The short soak (benchmarks.soak): 4 ranks, 600 mixed compressed allreduces after a
warm-up over every setting, then 10 init/destroy cycles of groups and subgroups. Threads and
file descriptors must stay flat, resident memory within 1 % over the second half of the calls
and within 1 % + 8 MiB over the cycles (the long run: python -m benchmarks.soak)."""

from __future__ import annotations

from benchmarks import soak


def test_short_soak_leaks_nothing(capsys):
    assert soak.main(["--calls", "300", "--cycles", "6", "--timeout", "300"]) == 0
    out = capsys.readouterr().out
    assert "no leak" in out and "phase 2: 6 init/destroy cycles" in out


def test_verdict_names_each_leak():
    s = {"rss_kb": 1000, "threads": 10, "fds": 20}
    grown = {"rss_kb": 1100, "threads": 11, "fds": 21}
    res = {"warm": s, "trend": [s] * 7 + [grown] * 3, "end": grown,
           "cycles": [{"cycle": 1, **s}, {"cycle": 10, **grown, "rss_kb": 9999}]}  # fmt: skip
    bad = soak.verdict([res], 0.01)
    assert any("grew 10.00%" in b for b in bad)
    assert any("threads 10 -> 11 during" in b for b in bad)
    assert any("fds 20 -> 21 over the cycles" in b for b in bad)
    assert any("over 10 cycles" in b for b in bad)
    flat = {**res, "trend": [s] * 10, "end": s, "cycles": [{"cycle": 1, **s}]}
    assert soak.verdict([flat], 0.01) == []
