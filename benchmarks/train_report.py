"""Reporting of the training benchmark (benchmarks/train.py): comparisons and the table."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import List, Optional


def add_comparisons(records: List[dict]) -> None:
    """comm_overhead_ms (vs noop), overhead_ratio_vs_gloo and loss_delta_vs_gloo_pct."""
    by = {(r["workload"], r["method"]): r for r in records}
    for r in records:
        noop, gloo = by.get((r["workload"], "noop")), by.get((r["workload"], "gloo"))
        if noop is not None:
            r["comm_overhead_ms"] = r["step_ms"] - noop["step_ms"]
        if gloo is not None:
            mine, ref = r["comm_overhead_ms"], gloo["comm_overhead_ms"]
            # A negative overhead is noise (slower noop steps): no ratio.
            if mine is not None and ref is not None and mine >= 0 and ref > 0:
                r["overhead_ratio_vs_gloo"] = mine / ref
            if gloo["final_loss"] != 0:
                delta = (r["final_loss"] - gloo["final_loss"]) / abs(gloo["final_loss"])
                r["loss_delta_vs_gloo_pct"] = 100 * delta


def _fmt(v, spec: str, suffix: str = "") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:{spec}}{suffix}"


def table(records: List[dict]) -> str:
    head = (
        "| workload | method | step ms | comm ms | vs gloo | samples/s | wire MB/step "
        "| final loss | delta vs gloo | eval |"
    )
    lines = [head, "|" + "---|" * 2 + "---:|" * 7 + "---|"]
    for r in records:
        ev = ", ".join(f"{k} {v:.4g}" for k, v in sorted(r["eval"].items()))
        cells = [
            r["workload"],
            r["method"],
            _fmt(r["step_ms"], ".1f"),
            _fmt(r["comm_overhead_ms"], ".1f"),
            _fmt(r["overhead_ratio_vs_gloo"], ".2f", "x"),
            _fmt(r["samples_per_s"], ".1f"),
            _fmt(r["wire_bytes_per_step"] / 1e6, ".3f"),
            _fmt(r["final_loss"], ".4f"),
            _fmt(r["loss_delta_vs_gloo_pct"], "+.2f", "%"),
            ev or "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _tail_mean(losses: List[float], last: int) -> float:
    tail = losses[-last:] if losses else []
    return sum(tail) / len(tail) if tail else float("nan")


def convergence_table(records: List[dict], last: int = 20) -> str:
    """Markdown: per method, each workload's mean training loss over the last ``last`` steps and
    its difference to gloo's, plus the evaluation; one column group per workload."""
    workloads = list(dict.fromkeys(r["workload"] for r in records))
    methods = list(dict.fromkeys(r["method"] for r in records))
    by = {(r["workload"], r["method"]): r for r in records}
    head = ["method", "wire MB/step"]
    for w in workloads:
        head += [f"{w} loss (last {last})", f"{w} vs gloo", f"{w} eval"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 2) + "---|"]
    for m in methods:
        cells = [m]
        wire = [by[(w, m)]["wire_bytes_per_step"] for w in workloads if (w, m) in by]
        cells.append(_fmt(wire[0] / 1e6 if wire else None, ".3f"))
        for w in workloads:
            r, ref = by.get((w, m)), by.get((w, "gloo"))
            if r is None:
                cells += ["-", "-", "-"]
                continue
            mine = _tail_mean(r["losses"], last)
            base = _tail_mean(ref["losses"], last) if ref is not None else float("nan")
            delta = 100 * (mine - base) / abs(base) if base and math.isfinite(base) else None
            ev = ", ".join(f"{k} {v:.4g}" for k, v in sorted(r["eval"].items()))
            cells += [_fmt(mine, ".4f"), _fmt(delta, "+.2f", "%"), ev or "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m benchmarks.train_report RUN.json [--last N]``: the convergence table of
    a training benchmark's records (``--json`` of benchmarks.train)."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.train_report")
    p.add_argument("json", help="records written by benchmarks.train --json")
    p.add_argument("--last", type=int, default=20, help="steps averaged at the end (20)")
    args = p.parse_args(argv)
    with open(args.json) as f:
        data = json.load(f)
    print(convergence_table(data["records"] if isinstance(data, dict) else data, args.last))
    return 0


if __name__ == "__main__":
    sys.exit(main())
