"""``CGX_COMPRESSOR=auto``: the group plans its own allreduces. At creation (or
``set_config(compressor="auto")``) rank 0 measures the compressors' compute costs (cached per host)
and, with every rank, the group's link and each algorithm path (torch_cgx.plan.probe); it then
decides for every size class (powers of two) exact or compressed, how and in how many segments,
times the options the model cannot tell apart (the contest), and hands the rules to every rank
through the store, so that every rank applies the same decision to the same call. The budget is
``CGX_COMPRESSION_QUANTIZATION_BITS`` when it is 1..8 (at least that many bits), else 4.
"""

from __future__ import annotations

import json
import logging
from typing import Dict, List, Optional, Tuple

from torch_cgx.config import ALGORITHMS as ALGORITHM_IDS
from torch_cgx.plan.costs import CompressorCosts, LinkCosts
from torch_cgx.plan.model import SEGMENT_BYTES, Option, predict
from torch_cgx.plan.planner import Budget, choose, options
from torch_cgx.plan.probe import (
    CONTEST,
    CONTEST_NUMEL,
    contested,
    measure,
    option_from,
    option_to,
    tournament,
)
from torch_cgx.settings import quantizes

log = logging.getLogger("torch_cgx.plan")
SIZE_CLASSES = [1 << k for k in range(4, 31)]  # 16 .. 2^30 values; the last rule covers the rest


def budget_of(config) -> Budget:
    bits = config.bits if quantizes(config.bits) else 4
    return Budget(min_bits=bits, bucket_size=config.bucket_size)


def rules_for(
    world: int,
    link: LinkCosts,
    host: CompressorCosts,
    budget: Budget,
    measured: Optional[Dict[int, Option]] = None,
) -> List[dict]:
    """The decision at each size class (the contest's winner where it timed one, the model's
    choice elsewhere), merged where neighbours agree: dicts with max_numel and the option's
    fields (plain data, for the store).

    Above the contest's largest class (CONTEST_NUMEL values), where calls are bandwidth-bound
    and the paths' ratios stay put, the compressor and algorithm that won there are kept (with the
    model's best segments for them) while the model predicts them within CONTEST of its own
    choice: the model alone misjudged exactly such near-ties (loopback, 4 ranks on 2 cores:
    8-bit SRA at 256 MiB, 1.44x the 4-bit tree)."""
    rules: List[dict] = []
    measured = measured or {}
    last = measured.get(CONTEST_NUMEL)
    for n in SIZE_CLASSES:
        o = measured.get(n)
        if o is None:
            o, t, _ = choose(n, world, link, host, budget)
            if last is not None and n > CONTEST_NUMEL:
                kept, kept_t = _same_path(last, n, world, link, host, budget)
                o = kept if kept_t <= CONTEST * t else o
        rule = {"compressor": o.compressor or "", "params": dict(o.params),
                "algorithm": o.algorithm, "segments": o.segments}  # fmt: skip
        if rules and {k: v for k, v in rules[-1].items() if k != "max_numel"} == rule:
            rules[-1]["max_numel"] = n
        else:
            rules.append({"max_numel": n, **rule})
    rules[-1]["max_numel"] = 1 << 62  # the largest class's decision covers the rest
    return rules


def _same_path(won: Option, n: int, world, link, host, budget: Budget) -> Tuple[Option, float]:
    """The option with ``won``'s compressor and algorithm the model predicts fastest at n, and its
    predicted time."""
    same = [
        o
        for o in options(budget, measured=True)
        if (o.compressor, o.params, o.algorithm) == (won.compressor, won.params, won.algorithm)
    ]
    return min(((o, predict(o, n, world, link, host)) for o in same), key=lambda p: p[1])


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


def _pipeline_note(rule: dict) -> str:
    return {0: " pipelined", 1: " unpipelined"}.get(rule["segments"], "")


def describe(rules: List[dict]) -> str:
    parts, low = [], 0
    for r in rules:
        hi = "inf" if r["max_numel"] >= 1 << 62 else str(r["max_numel"])
        what = (
            "exact"
            if not r["compressor"]
            else f"{r['compressor']}{r['params'] or ''} "
            + (f"{r['algorithm']}" + (f" {r['segments']} segments" if r["segments"] > 1 else ""))
            + (_pipeline_note(r) if r["max_numel"] > SEGMENT_BYTES // 4 else "")
        )
        parts.append(f"({low}, {hi}]: {what}")
        low = r["max_numel"]
    return "; ".join(parts)


def _plan_on_rank0(backend, link: LinkCosts, host, budget: Budget, measured) -> List[dict]:
    """Rank 0's rules; [] (exact everywhere, with a warning) when planning fails."""
    if host is None:
        return []
    try:
        rules = rules_for(backend.size(), link, host, budget, measured)
        [to_native(r) for r in rules]  # noqa: B018 - checked before the other ranks see them
    except Exception as e:  # noqa: BLE001 - a failed plan must not fail the group
        log.warning("cgx auto plan failed (%s); every allreduce runs exactly", e)
        return []
    log.info("cgx auto plan at W = %d (link %.3g MB/s, %.1f us a message, budget %d bits): %s",
             backend.size(), link.bandwidth / 1e6, link.latency * 1e6, budget.min_bits,
             describe(rules))  # fmt: skip
    return rules


def install(backend, config, key: str) -> List[dict]:
    """Plans ``backend``'s group (collective) and sets the same rules on every rank (rank 0
    decides, the store carries them); returns them. A failed calibration or plan leaves every
    allreduce exact (logged)."""
    if backend.size() == 1:  # nothing to send
        backend.set_plan([])
        return []
    budget = budget_of(config)
    link, host = measure(backend, config, budget)
    if backend.rank() == 0:  # the size classes whose best options the model cannot tell apart
        contests = contested(backend.size(), link, host, budget, SIZE_CLASSES) if host else []
        backend.store().set(f"{key}/contests", json.dumps(
            [[n, [option_to(o) for o in opts]] for n, opts in contests]))  # fmt: skip
    contests = json.loads(backend.store().get(f"{key}/contests").decode())
    contests = [(n, [option_from(o) for o in opts]) for n, opts in contests]
    measured = tournament(backend, config, contests)  # collective; rank 0's verdicts
    if backend.rank() == 0:
        rules = _plan_on_rank0(backend, link, host, budget, measured)
        backend.store().set(key, json.dumps({"rules": rules}))
    rules = json.loads(backend.store().get(key).decode())["rules"]
    backend.set_plan([to_native(r) for r in rules])
    return rules
