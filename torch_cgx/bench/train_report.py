"""Reporting of the training benchmark (torch_cgx/bench/train.py): comparisons and the table."""

from __future__ import annotations

import math
from typing import List


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
