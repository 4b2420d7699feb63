"""The planner's collective measurements (every rank of the group calls them in the same order;
only rank 0's figures are used): the link, each algorithm path against its formula, and the
contest that times the options the model cannot tell apart.
"""

from __future__ import annotations

import itertools
import logging
import statistics
import time
from typing import Dict, List, Optional, Tuple

import torch

from torch_cgx.plan.costs import CompressorCosts, Correction, LinkCosts, calibrate
from torch_cgx.plan.model import (
    Option,
    formula_parts,
    path_of,
    pipeline_applies,
    predict,
    traits_and_size,
)
from torch_cgx.plan.planner import MARGIN, Budget, compressors_of, options, score

log = logging.getLogger("torch_cgx.plan")
PROBE_SIZES = (1, 1 << 20)
# Options predicted within this factor of the best are timed against each other (the model's
# error: median 12-14 % on emulated links, tails above 30 %), the best of each path, at most
# CONTEST_MAX of them, at size classes up to CONTEST_NUMEL values (above, a contest costs
# seconds and the model is within a few per cent).
CONTEST = 1.3
CONTEST_MAX = 4
CONTEST_NUMEL = 1 << 23
# Timed rounds at least (3 were too few at 16 MiB on 4 ranks sharing 2 cores: the contest kept
# ring where SRA was 1.28x faster), and more where rounds are short (budget_rounds): up to
# CONTEST_SECONDS a size class, CONTEST_MAX_ROUNDS (7 rounds at 1 MiB on 2 ranks sharing 2 cores
# kept ring where the tree then ran 1.68x faster: there one call in five takes 3-7x the others).
CONTEST_ROUNDS = 7
# The class of CONTEST_NUMEL values decides every larger size too (auto.rules_for), where most
# of a model's bytes are: 7 rounds there kept ring (unpipelined) on 4 emulated hosts, which then
# measured 1.04x and 1.23x the best SRA at 64 and 256 MiB.
CONTEST_TOP_ROUNDS = 15
CONTEST_SECONDS = 0.25
CONTEST_MAX_ROUNDS = 61
# Off the default path, a contest's winner must also have been faster than the default in this
# share of the rounds (pick_winner).
CONTEST_PAIRED = 0.6
# The path probe's budget a size, the same way (with 5 rounds, the same path's ratio varied
# 1.6-10x between four probes on loopback).
PROBE_SECONDS = 0.3
PROBE_MAX_ROUNDS = 41


def probe_link(backend, exact_native, host: CompressorCosts, reps: int = 5) -> LinkCosts:
    """The link as the group's exact allreduce sees it (collective: every rank calls it). The
    small call gives the per-message latency (2 (W - 1) messages); the 4 MiB one the bandwidth
    (2 (W - 1) / W of it on each rank's link, less the summing). Timed as the paths are
    (time_interleaved, with its budget of rounds)."""
    w, ex = backend.size(), [exact_native]
    small, big = (time_interleaved(backend, ex, n, reps, exact_native, PROBE_SECONDS,
                                   PROBE_MAX_ROUNDS)[0] for n in PROBE_SIZES)  # fmt: skip
    n = PROBE_SIZES[1]
    latency = max(small - host.call, 1e-7) / (2 * (w - 1))
    wire = big - small - host.add((w - 1) * n / w)
    moved = 2 * (w - 1) / w * 4 * n
    return LinkCosts(moved / wire if wire > 0 else 1e12, latency)


# Off the benchmark's grid (4 KiB x 4^k), so that its prediction table tests interpolation.
PATH_SIZES = tuple(1 << k for k in range(11, 24, 2))  # 8 KiB, 32 KiB, ... 32 MiB of fp32


def probe_options(budget: Budget) -> Dict[str, Option]:
    """Per algorithm path the budget's options use, the one the probe measures: the first such
    option (max-min at the budget's fewest bits for the dense paths)."""
    out: Dict[str, Option] = {}
    for opt in options(budget)[1:]:
        out.setdefault(path_of(opt, traits_and_size(opt)[0]), opt)
    return out


def settings_of(opt: Option) -> dict:
    """The settings (CGXConfig fields) that run ``opt`` with no per-call agreement; with its
    pipeline unless it has none (segments 1; k > 1 segments are for plan rules only)."""
    if opt.segments > 1:
        raise ValueError(f"{opt.describe()}: k segments exist only as plan rules")
    out = {"settings_per_call": False, "compressor_params": "", "algorithm": opt.algorithm}
    if opt.segments == 1:
        out["pipeline_segment_mb"] = 0
    params = dict(opt.params)
    if opt.exact:
        return {**out, "compressor": "maxmin", "bits": 32}
    if opt.compressor == "maxmin":
        return {**out, "compressor": "maxmin", **params}
    return {**out, "compressor": opt.compressor, "bits": 32, "compressor_params": params}


def _native_of(config, opt: Option):
    """``config`` running ``opt`` (the default 4 MiB pipeline unless opt has none)."""
    return config.replace(**{"pipeline_segment_mb": 4, **settings_of(opt)}).to_native()


def probe_reps(n: int, reps: int) -> int:
    """More calls where they are short and noisy, fewer where they are long."""
    return 3 * reps if n <= 1 << 16 else reps if n < 1 << 21 else 3


def budget_rounds(least: int, round_us: int, seconds: float, most: int) -> int:
    """Rounds to time: ``least``, or as many rounds of ``round_us`` microseconds as fit
    ``seconds``, up to ``most``."""
    return max(least, min(most, int(seconds * 1e6) // max(round_us, 1)))


def _agreed_round_us(backend, elapsed: float, sync) -> int:
    """The group's mean of each rank's ``elapsed`` seconds, in whole microseconds (collective;
    integers below 2^20 sum exactly in fp64 at any world size, so every rank gets the same
    figure)."""
    t = torch.tensor([float(min(int(elapsed * 1e6), 1 << 20))], dtype=torch.float64)
    backend.allreduce_with(t, sync, False).wait()
    return int(t.item()) // backend.size()


def time_interleaved(backend, natives, n: int, rounds: int, sync, seconds=0.0, most=0):
    """The median seconds of each of ``natives``' allreduces of n values (time_rounds)."""
    return [statistics.median(s) for s in time_rounds(backend, natives, n, rounds, sync, seconds,
                                                      most)]  # fmt: skip


def rotating_rounds(calls, least: int, agree=None) -> List[List[float]]:
    """Seconds of each of ``calls`` (each returns the seconds of the part it times) per round:
    a warm-up round, then ``least`` timed rounds, or ``agree(warm-up seconds)`` of them where
    given (it must return the same count on every rank). Each round runs every call once,
    starting with another each round, so that a pause of the machine hits every call alike,
    not one call's whole sample. The probe, the contest and benchmarks.plan time through it."""
    times: List[List[float]] = [[] for _ in calls]
    r, total, start = 0, least, time.perf_counter()
    while r <= total:
        for i in [(r + j) % len(calls) for j in range(len(calls))]:
            seconds = calls[i]()
            if r:  # the first round warms up
                times[i].append(seconds)
        if r == 0 and agree is not None:
            total = agree(time.perf_counter() - start)
        r += 1
    return times


def time_rounds(backend, natives, n: int, rounds: int, sync, seconds=0.0, most=0):
    """Seconds of each of ``natives``' allreduces of n values per round (collective;
    rotating_rounds): at least ``rounds`` timed rounds, more where the warm-up round was short
    (budget_rounds: up to ``seconds`` of rounds, ``most`` rounds; agreed by the group). Each
    call starts after an untimed 1-value call with ``sync`` settings, as a call issued after
    other work does."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(backend.rank()))
    t, one = x.clone(), torch.zeros(1)

    def call(native):
        t.copy_(x)
        backend.allreduce_with(one, sync, False).wait()
        t0 = time.perf_counter()
        backend.allreduce_with(t, native, False).wait()
        return time.perf_counter() - t0

    def agree(warm: float) -> int:
        return budget_rounds(rounds, _agreed_round_us(backend, warm, sync), seconds, most)

    calls = [lambda native=native: call(native) for native in natives]
    return rotating_rounds(calls, rounds, agree if seconds > 0 else None)


def probe_paths(backend, config, link: LinkCosts, host: CompressorCosts, budget: Budget, reps=5):
    """Measures, per algorithm path, the group's own calls against the formulas at PATH_SIZES
    (collective; the paths interleaved, time_interleaved): host.paths[path] is the ratio
    measured / predicted, interpolated between the sizes (costs.Correction). SRA is also
    probed with fp16, whose wire term is 4x max-min 4-bit's and whose compute is cheaper: the two
    give separate factors for the compute and the wire terms (solve_split), so that settings of
    another mix are predicted too. Only rank 0 computes (the others take part in the calls)."""
    probes = {"exact": Option(), **probe_options(budget)}
    second = Option("fp16", (), "sra", 0)
    if "sra" not in probes or ("fp16", {}) not in budget.allowed():
        second = None
    host.paths = {}  # the predictions below are the bare formulas
    runs = [*probes.items(), *([("sra/fp16", second)] if second else [])]
    natives, sync = [_native_of(config, opt) for _, opt in runs], _native_of(config, Option())
    by_size = [time_interleaved(backend, natives, n, probe_reps(n, reps), sync,
                                PROBE_SECONDS, PROBE_MAX_ROUNDS) for n in PATH_SIZES]  # fmt: skip
    timed = {path: [row[i] for row in by_size] for i, (path, _) in enumerate(runs)}
    if backend.rank() != 0:
        return
    w, paths = backend.size(), {}
    for path, opt in probes.items():
        points = tuple((n, max(t / max(predict(opt, n, w, link, host), 1e-9), 1e-3))
                       for n, t in zip(PATH_SIZES, timed[path]))  # fmt: skip
        split = ()
        if path == "sra" and second is not None:
            split = tuple(_split_at(i, n, (opt, timed[path]), (second, timed["sra/fp16"]),
                                    w, link, host) or (n, r, r)
                          for i, (n, r) in enumerate(points))  # fmt: skip
        paths[path] = Correction(points, split)
    host.paths = paths


def _split_at(i, n, first, second, w, link, host):
    """(n, compute factor, wire factor) from two settings' times at PATH_SIZES[i], or None."""
    obs = []
    for opt, times in (first, second):
        _, parts, k = formula_parts(opt, n, w, link, host)
        obs.append((times[i] - host.call, parts, k))
    ab = solve_split(obs)
    return None if ab is None else (n, *ab)


def solve_split(obs) -> Optional[Tuple[float, float]]:
    """Factors (a, b) of the compute and wire terms such that each observation (measured seconds,
    (compute, wire) of one segment, segments k) is k max(a C, b M) + min(a C, b M) (C + M when
    k = 1): linear in (a, b) once it is known which stage is the slower, so each of the four
    combinations is solved and checked; None where no consistent, well-conditioned, positive
    solution exists (then the plain ratio serves)."""
    for slower in itertools.product((0, 1), repeat=len(obs)):
        rows = []
        for (t, (c, m), k), s in zip(obs, slower):
            kc, km = (k, 1) if s == 0 else (1, k)
            rows.append((kc * c, km * m, t))
        (a11, a12, t1), (a21, a22, t2) = rows
        det = a11 * a22 - a12 * a21
        if abs(det) < 0.05 * (abs(a11 * a22) + abs(a12 * a21)) or det == 0:
            continue  # the two settings' mixes are too alike to tell the terms apart
        a, b = (t1 * a22 - a12 * t2) / det, (a11 * t2 - a21 * t1) / det
        if not (0.05 <= a <= 20 and 0.05 <= b <= 20):
            continue
        if all(k == 1 or (a * c >= b * m) == (s == 0) for (_, (c, m), k), s in zip(obs, slower)):
            return a, b
    return None


def measure(backend, config, budget: Budget):
    """(link, host costs) of the group (collective): rank 0's compute calibration (None when it
    fails), the exact allreduce's link probe, and, when the compute is known, the paths' probe.
    Only rank 0's figures are used; the others take part in the calls."""
    host = CompressorCosts()
    if backend.rank() == 0:
        try:
            host = calibrate(compressors_of(budget))
        except Exception as e:  # noqa: BLE001 - a failed calibration must not fail the group
            log.warning("cgx auto plan: compute calibration failed (%s); compressing nothing", e)
            host = None
    ok = torch.tensor([float(backend.rank() == 0 and host is not None)])
    exact = config.replace(compressor="maxmin", bits=32, compressor_params="").to_native()
    backend.allreduce_with(ok, exact, False).wait()  # every rank learns whether rank 0 has it
    link = probe_link(backend, exact, host or CompressorCosts())
    if ok.item() > 0:
        probe_paths(backend, config, link, host or CompressorCosts(), budget)
    return link, host


def option_to(o: Option) -> dict:
    return {"compressor": o.compressor, "params": [list(p) for p in o.params],
            "algorithm": o.algorithm, "segments": o.segments}  # fmt: skip


def option_from(d: dict) -> Option:
    return Option(d["compressor"], tuple(tuple(p) for p in d["params"]), d["algorithm"],
                  int(d["segments"]))  # fmt: skip


def contested(world, link, host, budget: Budget, size_classes) -> List[Tuple[int, List[Option]]]:
    """Per size class (up to CONTEST_NUMEL values), the best option of each path (pipelined or not)
    predicted within CONTEST of the fastest, fastest first (at most CONTEST_MAX), then the budget's
    first compressor (the fewest bits) on those paths where the model prefers another compressor
    there (up to CONTEST_MAX + 1 options in all); where there are two or more (rank 0). The model
    alone put 8-bit SRA before 4-bit on loopback (W = 2) at 16-256 MiB, where it then ran 1.08-1.18x
    slower: the compute's share of a call is what the probe's two settings split least well."""
    out, first_compressor = [], budget.allowed()[0]
    default = (first_compressor[0], tuple(sorted(first_compressor[1].items())))
    for n in size_classes:
        if n > CONTEST_NUMEL:
            break
        best: Dict[Tuple[str, bool], Tuple[float, Option]] = {}
        plain: Dict[Tuple[str, bool], Tuple[float, Option]] = {}  # the first compressor's
        for o in options(budget, measured=True):
            path = "exact" if o.exact else path_of(o, traits_and_size(o)[0])
            path = (path, not o.exact and pipeline_applies(o, path, n))
            t = predict(o, n, world, link, host)
            for table, fits in ((best, True), (plain, (o.compressor, o.params) == default)):
                if fits and (path not in table or t < table[path][0]):
                    table[path] = (t, o)
        ranked = sorted(best.items(), key=lambda p: p[1][0])
        top = ranked[0][1][0]
        close = [(k, o) for k, (t, o) in ranked if t <= CONTEST * top][:CONTEST_MAX]
        twins = sorted((plain[k] for k, o in close
                        if k in plain and plain[k][1] != o and plain[k][0] <= CONTEST * top),
                       key=lambda p: p[0])  # fmt: skip
        close = [o for _, o in close]
        close += [o for _, o in twins][: CONTEST_MAX + 1 - len(close)]
        if len(close) > 1:
            out.append((n, close))
    return out


def pick_winner(opts: List[Option], samples: List[List[float]]) -> Option:
    """The contest's verdict from each option's times per round (rounds aligned): the best
    median with the planner's handicaps (exact unless a compressed option beats it by MARGIN,
    SRA unless another algorithm beats it by ALGORITHM_MARGIN), which must also have been
    faster than the best option of the more default paths that ran (exact, then SRA) in
    CONTEST_PAIRED of the rounds, else that option is the candidate in its place. On 4 emulated
    hosts a contest at 4 MiB kept ring, which then ran 1.14-1.22x SRA; ring was faster than
    SRA in 2-4 of 15 rounds in three contests of the same."""
    med = [statistics.median(s) for s in samples]
    scored = [m * MARGIN if o.exact else score(o, m) for m, o in zip(med, opts)]
    rank = [0 if o.exact else 1 if o.algorithm == "sra" else 2 for o in opts]  # default first
    pick = min(range(len(opts)), key=scored.__getitem__)
    while rank[pick] > 0:
        refs = [i for i in range(len(opts)) if rank[i] < rank[pick]]
        if not refs:
            break
        ref = min(refs, key=scored.__getitem__)
        wins = sum(a < b for a, b in zip(samples[pick], samples[ref]))
        if wins >= CONTEST_PAIRED * len(samples[ref]):
            break
        pick = ref
    return opts[pick]


def tournament(backend, config, contests, reps: int = 5) -> Dict[int, Option]:
    """Times every contested option at its size class (collective; time_rounds, at least
    CONTEST_ROUNDS rounds, CONTEST_TOP_ROUNDS at CONTEST_NUMEL, more within CONTEST_SECONDS);
    returns rank 0's winners (pick_winner), {} on the other ranks."""
    sync, winners = _native_of(config, Option()), {}
    for n, opts in contests:
        natives = [_native_of(config, o) for o in opts]
        floor = CONTEST_ROUNDS if n < CONTEST_NUMEL else CONTEST_TOP_ROUNDS
        least = max(probe_reps(n, reps), floor)
        samples = time_rounds(backend, natives, n, least, sync, CONTEST_SECONDS,
                              CONTEST_MAX_ROUNDS)  # fmt: skip
        if backend.rank() == 0:
            winners[n] = pick_winner(opts, samples)
            log.debug("contest at %d values, %d rounds: %s; kept %s", n, len(samples[0]),
                      ", ".join(f"{o.describe()} {statistics.median(s) * 1e3:.3f} ms"
                                for o, s in zip(opts, samples)),
                      winners[n].describe())  # fmt: skip
    return winners
