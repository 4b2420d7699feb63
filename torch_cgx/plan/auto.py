"""``CGX_COMPRESSOR=auto``: the group plans its own allreduces. At creation (or
``set_config(compressor="auto")``) rank 0 measures the codec (cached per host) and, with every
rank, the group's exact allreduce at two sizes (the link's latency and bandwidth as the group
sees them); it then decides for every size class (powers of two) exact or compressed, how and in
how many segments, and hands the rules to every rank through the store, so that every rank
applies the same decision to the same call. The budget is ``CGX_COMPRESSION_QUANTIZATION_BITS``
when it is 1..8 (at least that many bits), else 4.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from typing import Dict, List

import torch

from torch_cgx.config import ALGORITHMS as ALGORITHM_IDS
from torch_cgx.plan.costs import CodecCosts, Correction, LinkCosts, calibrate
from torch_cgx.plan.model import SEGMENT_BYTES, Option, path_of, predict, traits_and_size
from torch_cgx.plan.planner import Budget, choose, codecs_of, options

log = logging.getLogger("torch_cgx.plan")
SIZE_CLASSES = [1 << k for k in range(4, 31)]  # 16 .. 2^30 values; the last rule covers the rest
PROBE_SIZES = (1, 1 << 20)


def budget_of(config) -> Budget:
    bits = config.bits if 1 <= config.bits <= 8 else 4
    return Budget(min_bits=bits, bucket_size=config.bucket_size)


def _time_exact(backend, native, n: int, reps: int, sync=None) -> float:
    """The median time of ``reps`` allreduces of n values with ``native`` settings; with
    ``sync`` (exact settings), each starts after an untimed 1-value allreduce, as a call
    issued after other work does (not hot on the heels of the previous one)."""
    t = torch.randn(n, generator=torch.Generator().manual_seed(backend.rank()))
    backend.allreduce_with(t, native, False).wait()  # warm
    times, one = [], torch.zeros(1)
    for _ in range(reps):
        if sync is not None:
            backend.allreduce_with(one, sync, False).wait()
        t0 = time.perf_counter()
        backend.allreduce_with(t, native, False).wait()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def probe_link(backend, exact_native, host: CodecCosts, reps: int = 5) -> LinkCosts:
    """The link as the group's exact allreduce sees it (collective: every rank calls it). The
    small call gives the per-message latency (2 (W - 1) messages); the 4 MiB one the bandwidth
    (2 (W - 1) / W of it on each rank's link, less the summing)."""
    w = backend.size()
    small = _time_exact(backend, exact_native, PROBE_SIZES[0], reps)
    big = _time_exact(backend, exact_native, PROBE_SIZES[1], reps)
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


def _native_of(config, opt: Option):
    base = config.replace(settings_per_call=False, pipeline_segment_mb=4, compressor_params="")
    params = dict(opt.params)
    if opt.exact:
        return base.replace(compressor="maxmin", bits=32).to_native()
    if opt.compressor == "maxmin":
        bits, bucket = params["bits"], params["bucket_size"]
        return base.replace(compressor="maxmin", bits=bits, bucket_size=bucket,
                            algorithm=opt.algorithm).to_native()  # fmt: skip
    return base.replace(compressor=opt.compressor, bits=32, compressor_params=params,
                        algorithm=opt.algorithm).to_native()  # fmt: skip


def probe_reps(n: int, reps: int) -> int:
    """More calls where they are short and noisy, fewer where they are long."""
    return 3 * reps if n <= 1 << 16 else reps if n < 1 << 21 else 3


def probe_paths(backend, config, link: LinkCosts, host: CodecCosts, budget: Budget, reps=5):
    """Measures, per algorithm path, the group's own calls against the formulas at PATH_SIZES
    (collective): host.paths[path] is the ratio measured / predicted, interpolated between
    the sizes (costs.Correction). Only rank 0's figures are used."""
    probes = {"exact": Option(), **probe_options(budget)}
    host.paths, paths = {}, {}  # the predictions below are the bare formulas
    sync = _native_of(config, Option())
    for path, opt in probes.items():
        native, points = _native_of(config, opt), []
        for n in PATH_SIZES:
            measured = _time_exact(backend, native, n, probe_reps(n, reps), sync)
            predicted = predict(opt, n, backend.size(), link, host) if backend.rank() == 0 else 1
            points.append((n, max(measured / max(predicted, 1e-9), 1e-3)))
        paths[path] = Correction(tuple(points))
    host.paths = paths


def rules_for(world: int, link: LinkCosts, host: CodecCosts, budget: Budget) -> List[dict]:
    """The decision at each size class, merged where neighbours agree: dicts with max_numel and
    the option's fields (plain data, for the store)."""
    rules: List[dict] = []
    for n in SIZE_CLASSES:
        o = choose(n, world, link, host, budget)[0]
        rule = {"compressor": o.compressor or "", "params": dict(o.params),
                "algorithm": o.algorithm, "segments": o.segments}  # fmt: skip
        if rules and {k: v for k, v in rules[-1].items() if k != "max_numel"} == rule:
            rules[-1]["max_numel"] = n
        else:
            rules.append({"max_numel": n, **rule})
    rules[-1]["max_numel"] = 1 << 62  # the largest class's decision covers the rest
    return rules


def to_native(rule: dict):
    from torch_cgx import _C

    r = _C.PlanRule()
    r.max_numel = int(rule["max_numel"])
    params = dict(rule["params"])
    r.compressor = rule["compressor"]
    if r.compressor == "maxmin":
        r.bits, r.bucket_size = int(params.pop("bits")), int(params.pop("bucket_size"))
    r.params = {k: float(v) for k, v in params.items()}
    r.algorithm = ALGORITHM_IDS[rule["algorithm"]]
    r.segments = int(rule["segments"])
    return r


def rules_of(backend) -> List[dict]:
    """The backend's rules as plain data (to_native's inverse)."""
    names = {i: name for name, i in ALGORITHM_IDS.items()}
    out = []
    for r in backend.plan():
        params = dict(r.params)
        if r.compressor == "maxmin":
            params.update(bits=r.bits, bucket_size=r.bucket_size)
        out.append({"max_numel": r.max_numel, "compressor": r.compressor, "params": params,
                    "algorithm": names[r.algorithm], "segments": r.segments})  # fmt: skip
    return out


def describe(rules: List[dict]) -> str:
    parts, low = [], 0
    for r in rules:
        hi = "inf" if r["max_numel"] >= 1 << 62 else str(r["max_numel"])
        what = (
            "exact"
            if not r["compressor"]
            else f"{r['compressor']}{r['params'] or ''} "
            + (f"{r['algorithm']}" + (f" {r['segments']} segments" if r["segments"] > 1 else ""))
            + (" pipelined" if r["segments"] == 0 and r["max_numel"] > SEGMENT_BYTES // 4 else "")
        )
        parts.append(f"({low}, {hi}]: {what}")
        low = r["max_numel"]
    return "; ".join(parts)


def _plan_on_rank0(backend, link: LinkCosts, host, budget: Budget) -> List[dict]:
    """Rank 0's rules; [] (exact everywhere, with a warning) when planning fails."""
    if host is None:
        return []
    try:
        rules = rules_for(backend.size(), link, host, budget)
        [to_native(r) for r in rules]  # noqa: B018 - checked before the other ranks see them
    except Exception as e:  # noqa: BLE001 - a failed plan must not fail the group
        log.warning("cgx auto plan failed (%s); every allreduce runs exactly", e)
        return []
    log.info("cgx auto plan at W = %d (link %.3g MB/s, %.1f us a message, budget %d bits): %s",
             backend.size(), link.bandwidth / 1e6, link.latency * 1e6, budget.min_bits,
             describe(rules))  # fmt: skip
    return rules


def measure(backend, config, budget: Budget):
    """(link, host costs) of the group (collective): rank 0's codec calibration (None when it
    fails), the exact allreduce's link probe, and, when the codec is known, the paths' probe.
    Only rank 0's figures are used; the others take part in the calls."""
    host = CodecCosts()
    if backend.rank() == 0:
        try:
            host = calibrate(codecs_of(budget))
        except Exception as e:  # noqa: BLE001 - a failed calibration must not fail the group
            log.warning("cgx auto plan: codec calibration failed (%s); compressing nothing", e)
            host = None
    ok = torch.tensor([float(backend.rank() == 0 and host is not None)])
    exact = config.replace(compressor="maxmin", bits=32, compressor_params="").to_native()
    backend.allreduce_with(ok, exact, False).wait()  # every rank learns whether rank 0 has it
    link = probe_link(backend, exact, host or CodecCosts())
    if ok.item() > 0:
        probe_paths(backend, config, link, host or CodecCosts(), budget)
    return link, host


def install(backend, config, key: str) -> List[dict]:
    """Plans ``backend``'s group (collective) and sets the same rules on every rank (rank 0
    decides, the store carries them); returns them. A failed calibration or plan leaves every
    allreduce exact (logged)."""
    if backend.size() == 1:  # nothing to send
        backend.set_plan([])
        return []
    budget = budget_of(config)
    link, host = measure(backend, config, budget)
    if backend.rank() == 0:
        rules = _plan_on_rank0(backend, link, host, budget)
        backend.store().set(key, json.dumps({"rules": rules}))
    rules = json.loads(backend.store().get(key).decode())["rules"]
    backend.set_plan([to_native(r) for r in rules])
    return rules
