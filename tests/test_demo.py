"""The demo's one-line takeaway (the runs themselves: `make demo`, documented in the README)."""

from __future__ import annotations


def test_takeaway_line(monkeypatch):
    from benchmarks import demo

    runs = {"gloo": ([1.0, 0.5], 0.048, 4000.0), "cgx-4": ([1.0, 0.505], 0.024, 500.0)}
    monkeypatch.setenv("CGX_DEMO_HOSTS", "1")
    line = demo._takeaway(runs)
    assert line == (
        "Takeaway on this link: 4-bit cgx sends 8.0x fewer bytes per step than Gloo, steps "
        "2.00x faster, and ends at a loss +1.0% from Gloo's."
    )
    monkeypatch.delenv("CGX_DEMO_HOSTS")
    runs["cgx-4"] = ([1.0, 0.5], 0.096, 500.0)
    assert "on loopback" in demo._takeaway(runs) and "steps 0.50x as fast" in demo._takeaway(runs)
    assert abs(demo._params() - 1.116) < 0.01
