"""SeCoPa for torch_cgx: per gradient, exact or compressed, which compressor setting within the
user's accuracy budget, which algorithm and how many pipeline segments, by the least predicted
time (torch_cgx.plan.model). Plans are written as JSON and in HiPress's plan format (one
``gradient_id is_compressed num_partitions`` line per gradient) and can be read back to pin
decisions.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from torch_cgx.plan.costs import CompressorCosts, LinkCosts
from torch_cgx.plan.model import (
    ALGORITHMS,
    Option,
    path_of,
    pipeline_applies,
    predict,
    segments_of,
    traits_and_size,
)

# Pipeline segments weighed: 0, the backend's own pipeline (CaSync), for every algorithm; 1, none,
# for the lanes (ring, tree, allgather), which cost more than they save where the cores are
# oversubscribed (measured: ring 0.77x at 16 MiB with 4 ranks on 2 cores). Told apart by the
# contest (the probe measures the pipelined paths).
SEGMENTS = (0,)
LANE_SEGMENTS = (0, 1)
# A compressed choice must beat exact by this factor: within the model's error, exact wins.
MARGIN = 0.95
# And an algorithm other than SRA (the default, with the finest pipeline) must beat it by this
# factor: where two paths tie within the model's noise, the plan does not flip between them.
ALGORITHM_MARGIN = 0.97


def score(option: Option, t: float) -> float:
    """What choosing ranks: the time, handicapped off the default path (exact: by MARGIN's
    inverse, applied where exact is compared; other algorithms than SRA: ALGORITHM_MARGIN)."""
    if option.exact or option.algorithm == "sra":
        return t
    return t / ALGORITHM_MARGIN


@dataclass(frozen=True)
class Budget:
    """What the user accepts: max-min at ``min_bits`` or more (and fp16 / bf16), or exactly the
    compressors named in ``compressors`` (``"topk:ratio=0.01"``, ``"maxmin:bits=4"``)."""

    min_bits: int = 4
    bucket_size: int = 512
    compressors: Tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.min_bits, int) or not 1 <= self.min_bits <= 16:
            raise ValueError(f"min_bits must be an integer in [1, 16], got {self.min_bits!r}")

    @classmethod
    def parse(cls, text: str, bucket_size: int = 512) -> Budget:
        """'4' or 'bits>=4' -> at least 4 bits; 'topk:ratio=0.01,maxmin:bits=2' -> those."""
        t = text.strip().lower().replace(" ", "")
        if t.startswith("bits>="):
            t = t[6:]
        if t.isdigit():
            return cls(min_bits=int(t), bucket_size=bucket_size)
        names = tuple(p for p in _split_specs(t) if p)
        for spec in names:
            _parse_spec(spec)  # names the bad one
        return cls(bucket_size=bucket_size, compressors=names)

    def allowed(self) -> List[Tuple[str, Dict]]:
        """The (compressor, params) settings this budget allows."""
        if self.compressors:
            return [_parse_spec(s) for s in self.compressors]
        out = [("maxmin", {"bits": b, "bucket_size": self.bucket_size})
               for b in range(max(self.min_bits, 1), 9)]  # fmt: skip
        return out + [("fp16", {}), ("bf16", {})]


def _split_specs(text: str) -> List[str]:
    """'topk:ratio=0.01,maxmin:bits=2,bucket_size=64' -> one spec per compressor name."""
    specs: List[str] = []
    for part in text.split(","):
        if ":" in part or "=" not in part or not specs:
            specs.append(part)
        else:
            specs[-1] += "," + part
    return specs


def _parse_spec(spec: str) -> Tuple[str, Dict]:
    from torch_cgx import compressors

    name, _, rest = spec.partition(":")
    params = {}
    for item in filter(None, rest.split(",")):
        k, eq, v = item.partition("=")
        if not eq:
            raise ValueError(f"compressor parameters must be name=value, got {item!r} in {spec!r}")
        params[k] = int(v) if v.lstrip("-").isdigit() else float(v)
    compressors.get(name, **params)  # ValueError names an unknown compressor or parameter
    return name, params


def options(budget: Budget, measured: bool = False) -> List[Option]:
    """Every option the planner weighs: exact, and each allowed compressor with each algorithm and
    each of SEGMENTS; ``measured`` (the contest, which times what it compares): the lanes'
    algorithms also with LANE_SEGMENTS (the probe measures only their pipelined form, so the
    model alone does not pick the other)."""
    out = [Option()]
    for name, params in budget.allowed():
        p = tuple(sorted(params.items()))
        for alg in ALGORITHMS:
            for k in LANE_SEGMENTS if measured and alg != "sra" else SEGMENTS:
                out.append(Option(name, p, alg, k))
    return out


@dataclass
class Decision:
    name: str
    numel: int
    option: Option
    predicted_s: float
    exact_s: float
    pinned: bool = False

    @property
    def compress(self) -> bool:
        return not self.option.exact

    @property
    def partitions(self) -> int:
        """HiPress's num_of_partitions: the pipeline segments a compressed call runs."""
        if not self.compress:
            return 1
        traits = traits_and_size(self.option)[0]
        path = path_of(self.option, traits)
        if not pipeline_applies(self.option, path, self.numel):
            return 1
        return segments_of(self.option, self.numel)


@dataclass
class Plan:
    world: int
    link: LinkCosts
    budget: Budget
    decisions: List[Decision] = field(default_factory=list)

    def total(self) -> Tuple[float, float]:
        """(predicted seconds of the plan, of all exact) per step."""
        return (sum(d.predicted_s for d in self.decisions),
                sum(d.exact_s for d in self.decisions))  # fmt: skip

    def to_json(self) -> dict:
        return {
            "world": self.world,
            "link": asdict(self.link),
            "budget": asdict(self.budget),
            "gradients": [
                {"id": i, "name": d.name, "numel": d.numel, "compress": d.compress,
                 "partitions": d.partitions,
                 "option": asdict(d.option), "predicted_s": d.predicted_s,
                 "exact_s": d.exact_s, "pinned": d.pinned}
                for i, d in enumerate(self.decisions)
            ],
        }  # fmt: skip

    def to_hipress(self) -> str:
        """HiPress's SeCoPaPlan.txt: ``gradient_id is_compressed num_partitions`` per line."""
        return "".join(
            f"{i} {int(d.compress)} {d.partitions}\n" for i, d in enumerate(self.decisions)
        )


def choose(
    n: int, world: int, link: LinkCosts, host: CompressorCosts, budget: Budget, elem: int = 4
) -> Tuple[Option, float, float]:
    """(the fastest option, its predicted time, exact's) for one tensor of ``n`` values."""
    exact = predict(Option(), n, world, link, host, elem)
    best, best_t, best_score = Option(), exact, float("inf")
    for opt in options(budget)[1:]:
        t = predict(opt, n, world, link, host, elem)
        if t < MARGIN * exact and score(opt, t) < best_score:
            best, best_t, best_score = opt, t, score(opt, t)
    return best, best_t, exact


def plan_gradients(
    sizes: Sequence[Tuple[str, int]],
    world: int,
    link: LinkCosts,
    host: CompressorCosts,
    budget: Budget,
    pinned: Optional[Dict[str, Option]] = None,
) -> Plan:
    """A decision per (name, numel); names in ``pinned`` keep the given option."""
    plan = Plan(world, link, budget)
    pinned = pinned or {}
    for name, n in sizes:
        if name in pinned:
            opt = pinned[name]
            t = predict(opt, n, world, link, host)
            plan.decisions.append(
                Decision(name, n, opt, t, predict(Option(), n, world, link, host), True)
            )
            continue
        opt, t, exact = choose(n, world, link, host, budget)
        plan.decisions.append(Decision(name, n, opt, t, exact))
    return plan


def read_pins(path: str) -> Dict[str, Option]:
    """The decisions of a JSON plan file, by gradient name (to pin them in a new plan)."""
    with open(path) as f:
        data = json.load(f)
    try:
        out = {}
        for g in data["gradients"]:
            o = g["option"]
            out[g["name"]] = Option(o["compressor"], tuple(tuple(p) for p in o["params"]),
                                    o["algorithm"], int(o["segments"]))  # fmt: skip
        return out
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path} is not a torch_cgx plan file: {e!r}") from None


def compressors_of(budget: Budget, pins: Iterable[Option] = ()) -> List[Tuple[str, Dict]]:
    """Every compressor setting a plan may need costs for."""
    seen = {(n, tuple(sorted(p.items()))) for n, p in budget.allowed()}
    seen |= {(o.compressor, o.params) for o in pins if not o.exact}
    return [(n, dict(p)) for n, p in sorted(seen)]
