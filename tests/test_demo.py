"""The demo (`make demo`): its one-line takeaway, and a short run of it on loopback
(``--loopback --quick``: 2 ranks, small sizes, 20 steps, some 6 s) whose every printed figure
is checked against its parts: the codec's ratios, the allreduce's bytes and verdicts, the bytes
per training step, and the takeaway's quotients of the printed columns."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from dist_helpers import free_port

from torch_cgx import codec
from torch_cgx.bounds import chunk_ranges


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


def sra_bytes(n: int, bits: int, world: int = 2) -> int:
    """One rank's bytes for SRA of n fp32 values (W = 2, bucket 512, chunks of equal size): the
    other chunk's payload, then its own (the final slot)."""
    sizes = [codec.encoded_size(e - b, bits, 512) for b, e in chunk_ranges(n, world, 512)]
    assert len(set(sizes)) == 1
    return sizes[0] * 2 * (world - 1)


def check_codec(lines, mb) -> None:
    rows = [line.split() for line in lines if line.split()[:1] == [f"{mb:g}"]]
    assert [int(r[1]) for r in rows] == [8, 4, 2]
    for r in rows:
        assert float(r[12]) == round(mb * 2**20 / codec.encoded_size(int(mb * 2**18), int(r[1])), 1)


def check_allreduce(lines, sizes) -> None:
    rows = [line.split() for line in lines if line.split()[2:3] == ["float"]]
    assert [(int(r[0]), r[3], r[4]) for r in rows] == [
        (s, algo, bits)
        for s in sizes
        for algo, bits in (("gloo", "32"), ("sra", "8"), ("sra", "4"))
    ]
    for r in rows:
        size, wire = int(r[0]), int(r[8])
        assert r[11] == "0"  # every element within max-min's bound
        assert wire == (size if r[3] == "gloo" else sra_bytes(size // 4, int(r[4])))
        assert float(r[13]) == pytest.approx(size / wire, abs=0.006)


def step_bytes(demo, hidden: int, bits: int) -> float:
    """The CGX hook's bytes per step (W = 2): the layers of at least 1024 values in one SRA call,
    the rest (biases, the last layer) in one exact ring; plus the loss's max, 4 bytes every 10."""
    sizes = [64 * hidden, hidden * hidden]
    exact = 4 * (demo._params(hidden) * 1e6 - sum(sizes))
    return sra_bytes(sum(sizes), bits) + exact + 4 / 10


def test_quick_run_on_loopback():
    from benchmarks import demo

    env = dict(os.environ, CGX_DEMO_PORT=str(free_port()))
    env.pop("CGX_DEMO_HOSTS", None)
    cmd = [sys.executable, "-m", "benchmarks.demo", "--loopback", "--quick"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    check_codec(lines, demo.QUICK["codec_mb"])
    check_allreduce(lines, [64 << 10, 256 << 10])
    hidden = demo.QUICK["hidden"]
    head = lines.index(
        f"== DDP training, 2 ranks on this machine (loopback), MLP {demo._params(hidden):.2f}M "
        "parameters: loss (max over ranks) =="
    )
    assert lines[head + 1].split() == ["step", "gloo", "cgx-8", "cgx-4"]
    losses = [[float(v) for v in line.split()[1:]] for line in lines[head + 2 : head + 4]]
    assert [line.split()[0] for line in lines[head + 2 : head + 4]] == ["10", "20"]
    ms = [float(v) for v in lines[head + 4].split()[1:]]
    kb = [float(v) for v in lines[head + 5].split()[1:]]
    assert lines[head + 4].startswith("ms/step") and lines[head + 5].startswith("KB/step")
    want = [4 * demo._params(hidden) * 1e6] + [step_bytes(demo, hidden, b) for b in (8, 4)]
    assert kb == pytest.approx([w / 1e3 for w in want], abs=0.051)
    take = next(line for line in lines if line.startswith("Takeaway on loopback: 4-bit cgx"))
    ratio = float(take.split("sends ")[1].split("x")[0])
    speed = float(take.split("steps ")[1].split("x")[0])
    loss = float(take.split("at a loss ")[1].split("%")[0])
    assert quotient_ok(ratio, 1, kb[0], kb[2], 1) and quotient_ok(speed, 2, ms[0], ms[2], 1)
    final = losses[-1]
    assert loss == pytest.approx(100 * (final[2] - final[0]) / final[0], abs=0.051)


def quotient_ok(q: float, q_digits: int, num: float, den: float, digits: int) -> bool:
    """Whether q (printed to q_digits) is num / den of the true values behind num and den
    (printed to digits): within the quotient's range over their rounding."""
    half, q_half = 0.5 * 10**-digits, 0.5 * 10**-q_digits
    lo, hi = (num - half) / (den + half), (num + half) / (den - half)
    return lo - q_half <= q <= hi + q_half
