"""Prints (and writes) the planner's decisions for a model's gradients.

    python -m torch_cgx.plan --world 4 --link 1gbit                         # built-in GPT-2 small
    python -m torch_cgx.plan --model mypkg.models:make_net --world 8 --link 25gbit --budget 2
    python -m torch_cgx.plan ... --json plan.json --hipress SeCoPaPlan.txt   # the plan files
    python -m torch_cgx.plan ... --pin plan.json                            # keep its decisions

``--model module:factory`` calls ``factory()`` for a torch module; the built-in ``gpt2`` needs
no import (its parameter shapes follow GPT-2's architecture: ``--n-layer``, ``--n-embd``,
``--vocab``, ``--n-positions``). Codec costs are measured on this host once and cached
(``--recalibrate`` measures again); the link is what you give (plan a cluster from a laptop).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import List, Optional, Tuple

from torch_cgx.plan.costs import LinkCosts, calibrate
from torch_cgx.plan.planner import Budget, compressors_of, plan_gradients, read_pins


def gpt2_sizes(n_layer=12, n_embd=768, vocab=50257, n_positions=1024) -> List[Tuple[str, int]]:
    """(name, numel) of GPT-2's parameters (Hugging Face names), tied output embedding."""
    e = n_embd
    out = [("transformer.wte.weight", vocab * e), ("transformer.wpe.weight", n_positions * e)]
    for i in range(n_layer):
        h = f"transformer.h.{i}"
        out += [(f"{h}.ln_1.weight", e), (f"{h}.ln_1.bias", e),
                (f"{h}.attn.c_attn.weight", e * 3 * e), (f"{h}.attn.c_attn.bias", 3 * e),
                (f"{h}.attn.c_proj.weight", e * e), (f"{h}.attn.c_proj.bias", e),
                (f"{h}.ln_2.weight", e), (f"{h}.ln_2.bias", e),
                (f"{h}.mlp.c_fc.weight", e * 4 * e), (f"{h}.mlp.c_fc.bias", 4 * e),
                (f"{h}.mlp.c_proj.weight", 4 * e * e), (f"{h}.mlp.c_proj.bias", e)]  # fmt: skip
    return out + [("transformer.ln_f.weight", e), ("transformer.ln_f.bias", e)]


def module_sizes(spec: str) -> List[Tuple[str, int]]:
    mod, _, attr = spec.partition(":")
    if not attr:
        raise SystemExit(f"--model must be module:factory, got {spec!r}")
    model = getattr(importlib.import_module(mod), attr)()
    return [(n, p.numel()) for n, p in model.named_parameters() if p.requires_grad]


def parse_args(argv: Optional[List[str]]):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="gpt2", help="gpt2 (built in) or module:factory")
    p.add_argument("--n-layer", type=int, default=12)
    p.add_argument("--n-embd", type=int, default=768)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--n-positions", type=int, default=1024)
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--link", default="1gbit", help="per-rank link rate: 100mbit, 1gbit, ...")
    p.add_argument("--latency", default="50us", help="per-message latency: 50us, 0.2ms, ...")
    p.add_argument("--budget", default="4", help="min bits (4, bits>=2) or compressor specs")
    p.add_argument("--bucket-size", type=int, default=512)
    p.add_argument("--json", help="write the plan as JSON")
    p.add_argument("--hipress", help="write the plan in HiPress's SeCoPaPlan.txt format")
    p.add_argument("--pin", help="a JSON plan whose decisions are kept")
    p.add_argument(
        "--recalibrate", action="store_true", help="measure the compressors' compute costs again"
    )
    p.add_argument("--quiet", action="store_true", help="totals only")
    args = p.parse_args(argv)
    if args.world < 1:
        p.error("--world must be >= 1")
    try:
        args.link_costs = LinkCosts.parse(args.link, args.latency)
        args.budget_obj = Budget.parse(args.budget, args.bucket_size)
    except ValueError as e:
        p.error(str(e))
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if args.model == "gpt2":
        sizes = gpt2_sizes(args.n_layer, args.n_embd, args.vocab, args.n_positions)
    else:
        sizes = module_sizes(args.model)
    pins = read_pins(args.pin) if args.pin else {}
    host = calibrate(compressors_of(args.budget_obj, pins.values()), refresh=args.recalibrate)
    plan = plan_gradients(sizes, args.world, args.link_costs, host, args.budget_obj, pins)
    if not args.quiet:
        print(f"{'id':>4} {'gradient':<40} {'values':>10} {'exact ms':>9} {'plan ms':>9}  choice")
        for i, d in enumerate(plan.decisions):
            pin = " (pinned)" if d.pinned else ""
            print(f"{i:>4} {d.name[-40:]:<40} {d.numel:>10} {d.exact_s * 1e3:>9.3f} "
                  f"{d.predicted_s * 1e3:>9.3f}  {d.option.describe()}{pin}")  # fmt: skip
    planned, exact = plan.total()
    chosen = sum(d.compress for d in plan.decisions)
    gain = exact / planned if planned else 1.0
    print(f"{len(plan.decisions)} gradients, {chosen} compressed; predicted per step "
          f"{planned * 1e3:.2f} ms against {exact * 1e3:.2f} ms exact ({gain:.2f}x) "
          f"at W = {args.world}, {args.link}")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(plan.to_json(), f, indent=1)
    if args.hipress:
        with open(args.hipress, "w") as f:
            f.write(plan.to_hipress())
    return 0


if __name__ == "__main__":
    sys.exit(main())
