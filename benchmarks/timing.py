"""Timing helpers shared by the benchmarks: medians over alternating rounds, the load of other
processes, iteration counts by size, thread settings, the CPU's name, command-line lists."""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import time
from typing import Callable, Dict, List

import torch

from torch_cgx import codec

MB = 1 << 20


def auto_iters(size_mb: float) -> int:
    """Timed iterations for a size: 40 up to 4 MB, then fewer (12 at 64 MB, 6 at 256 MB)."""
    return int(max(5, min(40, round(100 / math.sqrt(max(size_mb, 1e-9))))))


def auto_torch_iters(iters: int) -> int:
    """The torch-ops codec is several times slower: half the iterations, at least 3."""
    return max(3, iters // 2)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# ---- verification ---------------------------------------------------------------------------


class OtherLoad:
    """CPU time used by *other* processes while a measurement runs, as a fraction of all cores
    (0 = the machine was otherwise idle, 1 = every core was busy with something else). Read
    from /proc/stat minus this process's own CPU time; ``None`` where /proc/stat is missing or
    the window is shorter than 0.25 s."""

    def __init__(self) -> None:
        self._start = self._sample()

    @staticmethod
    def _sample():
        try:
            with open("/proc/stat") as f:
                fields = [int(v) for v in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        tick = os.sysconf("SC_CLK_TCK")
        busy = (sum(fields[:8]) - fields[3] - fields[4]) / tick  # all but idle and iowait
        t = os.times()
        return busy, t.user + t.system, time.monotonic()

    def fraction(self) -> float | None:
        end = self._sample()
        if self._start is None or end is None:
            return None
        busy, own, wall = (e - s for e, s in zip(end, self._start))
        if wall < 0.25:  # /proc/stat counts in ticks (10 ms): too coarse for shorter windows
            return None
        return min(1.0, max(0.0, (busy - own) / (wall * (os.cpu_count() or 1))))


def alternate_rounds(
    fns: Dict[str, Callable[[], object]], iters: Dict[str, int], warmup: int
) -> Dict[str, float]:
    """Median seconds of each function. Each round calls every function that still needs samples
    once, in an order rotated every round, so that drifts of the machine hit all alike. (Not the
    planner's ``probe.time_interleaved``, which times native allreduces across the ranks.)"""
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    samples: Dict[str, List[float]] = {name: [] for name in names}
    for r in range(max(iters.values())):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            if len(samples[name]) >= iters[name]:
                continue
            t0 = time.perf_counter()
            fns[name]()
            samples[name].append(time.perf_counter() - t0)
    return {name: statistics.median(s) for name, s in samples.items()}


def set_threads(n: int) -> None:
    torch.set_num_threads(n)
    if codec.num_threads() != n:  # resizing restarts the codec's pool: only when it changes
        codec.set_num_threads(n)


# ---- command-line lists ----------------------------------------------------------------------


def parse_list(text: str, conv: Callable[[str], object], what: str) -> list:
    """``"1,2,4"`` -> ``[conv("1"), conv("2"), conv("4")]``; argparse's error on a bad item."""
    try:
        values = [conv(v.strip()) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad {what} list: {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"empty {what} list")
    return values


def resolve_threads(spec: str, all_threads: int) -> List[int]:
    """``"1,all"`` -> ``[1, all_threads]`` (duplicates dropped, order kept)."""
    result: List[int] = []
    for v in parse_list(spec, str, "threads"):
        n = all_threads if v == "all" else int(v)
        if n < 1:
            raise argparse.ArgumentTypeError(f"thread counts must be >= 1, got {n}")
        if n not in result:
            result.append(n)
    return result
