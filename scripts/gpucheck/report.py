"""The GPU check's report: Markdown (``report.md``) and the printed summary, from the dict that
run.py also writes as ``report.json``."""

from __future__ import annotations

from typing import Dict, List, Optional

ENV_KEYS = ("device", "capability", "memory_gib", "multiprocessors", "driver", "kernel", "cpus",
            "python", "torch", "torch_cuda", "triton", "nccl", "nvcc")  # fmt: skip


def _f(v: Optional[float], fmt: str = "{:.3g}") -> str:
    return "-" if v is None else fmt.format(v)


def _steps(report: Dict) -> List[str]:
    rows = ["| step | status | seconds | checks |", "|---|---|---|---|"]
    for s in report["steps"]:
        rows.append(f"| {s['name']} | {s['status']} | {s['seconds']} | {s['checks']} |")
    return rows


def _codecs(records: List[Dict]) -> List[str]:
    rows = ["| compressor | verify | copy GB/s | encode | decode_add | fused enc | fused dec | "
            "torch enc | torch dec | best enc / copy | best dec / copy |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in records:
        name = r["name"] + (f" {r['params'].get('bits')}b" if r["name"] == "maxmin" else "")
        enc = r["fused_encode_gbps"] or r["encode_gbps"]
        dec = r["fused_decode_add_gbps"] or r["decode_add_gbps"]
        ops = ("copy", "encode", "decode_add", "fused_encode", "fused_decode_add", "torch_encode",
               "torch_decode_add")  # fmt: skip
        cells = [r[f"{op}_gbps"] for op in ops]
        ratios = [enc / r["copy_gbps"], dec / r["copy_gbps"]]
        rows.append(f"| {name} | {r['verify']} | " + " | ".join(_f(c) for c in cells) + " | "
                    + " | ".join(_f(c, "{:.3f}") for c in ratios) + " |")  # fmt: skip
    return rows


def _allreduce(rows_in: List[Dict]) -> List[str]:
    if not rows_in:
        return []
    keys = list(rows_in[0])
    rows = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    rows += ["| " + " | ".join(str(r.get(k, "")) for k in keys) + " |" for r in rows_in]
    return rows


def markdown(report: Dict) -> str:
    env = report["environment"]
    out = [f"# GPU check report ({report['mode']} mode, {report['seconds']} s of a "
           f"{report['budget']:.0f} s budget)", ""]  # fmt: skip
    out += [f"- {k}: {env[k]}" for k in ENV_KEYS if env.get(k) not in (None, "")]
    tools = {k: bool(v) for k, v in env.get("tools", {}).items()}
    out += [f"- tools present: {tools}", "", "## Steps", ""] + _steps(report)
    if report["fallbacks"]:
        out += ["", "## Fused kernels that fell back to the reference", ""]
        out += [f"- {f['step']}: {f['decision']}" for f in report["fallbacks"]]
    else:
        out += ["", "No fused kernel fell back to the reference in any step."]
    if report["figures"].get("codecs"):
        out += ["", "## Codecs (GB/s of fp32 input)", ""] + _codecs(report["figures"]["codecs"])
    if report["figures"].get("allreduce"):
        out += ["", "## Allreduce, 2 ranks", ""] + _allreduce(report["figures"]["allreduce"])
    failing = [s for s in report["steps"] if s["status"] not in ("pass", "skip")]
    for s in failing + [s for s in report["steps"] if s["status"] == "skip"]:
        out += ["", f"## {s['name']}: {s['status']}", "", "```", s["tail"].rstrip(), "```"]
    return "\n".join(out) + "\n"


def summary(report: Dict) -> str:
    env = report["environment"]
    lines = [f"GPU check ({report['mode']}): {env.get('device', '?')}, torch {env.get('torch')}, "
             f"triton {env.get('triton')}, CUDA {env.get('torch_cuda')}; "
             f"{report['seconds']} s"]  # fmt: skip
    for s in report["steps"]:
        lines.append(f"  {s['name']:<16} {s['status']:<8} {s['seconds']:>6.1f} s")
    for r in report["figures"].get("codecs", []):
        enc = r["fused_encode_gbps"] or r["encode_gbps"]
        dec = r["fused_decode_add_gbps"] or r["decode_add_gbps"]
        lines.append(f"  {r['name']:<12} enc/copy {enc / r['copy_gbps']:.3f}  "
                     f"dec/copy {dec / r['copy_gbps']:.3f}  fused {r['fused'] or '-'}")  # fmt: skip
    lines.append(f"  fallbacks: {len(report['fallbacks'])}")
    bad = [s["name"] for s in report["steps"] if s["status"] not in ("pass", "skip")]
    lines.append("RESULT: " + ("pass" if not bad else "FAIL (" + ", ".join(bad) + ")"))
    return "\n".join(lines)
