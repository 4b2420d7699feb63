"""The GPU check (``scripts/gpu_check.sh [--cpu] OUTDIR``; docs/gpu-check.md).

Runs every step of :data:`STEPS` as a subprocess with its own timeout (a failing step never
stops the others), inside an overall budget (a step that would start past it is reported as not
run), and writes ``OUTDIR/report.json``, ``OUTDIR/report.md`` and ``OUTDIR/logs.txt`` (every
step's whole output), then prints the summary table. It uses only what the machine has: the
Python that runs it, the torch it finds (2.11 or newer) and its triton, ninja and
compute-sanitizer where they are; it installs nothing and reaches no network.

``--cpu`` runs the same steps on CPU tensors (the device code's CPU form), at small sizes, so that
``make test`` keeps the check from rotting between GPU sessions.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from typing import List, Optional

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from report import markdown, summary  # noqa: E402
from steps import STEPS, Context, Step  # noqa: E402


def _tail(text: str, limit: int = 3000) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]


def run_step(step: Step, ctx: Context, deadline: float) -> dict:
    """One step's record: status pass / fail / skip / timeout / not run, seconds, tail."""
    record = {"name": step.name, "checks": step.checks}
    left = deadline - time.monotonic()
    why = step.skip(ctx)
    if why:
        return {**record, "status": "skip", "seconds": 0.0, "tail": why, "log": why}
    if left < step.min_seconds:
        why = f"not run: {left:.0f} s of the check's budget left, the step needs {step.min_seconds}"
        return {**record, "status": "not run", "seconds": 0.0, "tail": why, "log": why}
    timeout = min(step.timeout(ctx), left)
    cmd = step.command(ctx)
    record["command"] = " ".join(cmd)
    start = time.monotonic()
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=ctx.env(step), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, errors="replace",
                              timeout=timeout, start_new_session=True)  # fmt: skip
        out, status = done.stdout, "pass" if done.returncode == 0 else "fail"
        record["returncode"] = done.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout if isinstance(e.stdout, str) else (e.stdout or b"").decode(errors="replace")
        out += f"\n[gpu_check] timed out after {timeout:.0f} s"
        status = "timeout"
    record["seconds"] = round(time.monotonic() - start, 1)
    verdict = step.verdict(ctx, out, status) if status != "timeout" else None
    if verdict:  # the step's own rule (a skipped test fails; a refusing sanitizer is a skip)
        status, why = verdict
        out += f"\n[gpu_check] {why}"
    record.update(status=status, tail=_tail(out), log=out)
    record.update(step.collect(ctx))
    return record


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/gpu_check.sh", description=__doc__.split("\n")[0])
    p.add_argument("--cpu", action="store_true", help="CPU tensors, small sizes (make test)")
    p.add_argument(
        "--budget",
        type=float,
        default=0.0,
        help="seconds for all steps (default 480 on a GPU, 150 with --cpu)",
    )
    p.add_argument("--only", default="", help="comma list of step names to run (others: skip)")
    p.add_argument("outdir")
    args = p.parse_args(argv)
    out = pathlib.Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    budget = args.budget or (150.0 if args.cpu else 480.0)
    work = pathlib.Path(tempfile.mkdtemp(prefix="cgx-gpu-check-"))
    ctx = Context(cpu=args.cpu, root=ROOT, work=work, only=set(filter(None, args.only.split(","))))
    (work / "site").mkdir()
    shutil.copy(HERE / "sitecustomize_template.py", work / "site" / "sitecustomize.py")
    start = time.monotonic()
    deadline = start + budget
    records = []
    for step in STEPS:
        record = run_step(step, ctx, deadline)
        records.append(record)
        print(f"[gpu_check] {record['name']:<16} {record['status']:<8} {record['seconds']:>6.1f} s",
              flush=True)  # fmt: skip
    report = {
        "mode": "cpu" if args.cpu else "gpu",
        "seconds": round(time.monotonic() - start, 1),
        "budget": budget,
        "environment": ctx.environment,
        "steps": [{k: v for k, v in r.items() if k != "log"} for r in records],
        "figures": ctx.figures,
        "fallbacks": ctx.fallbacks,
    }
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "report.md").write_text(markdown(report))
    with open(out / "logs.txt", "w") as f:
        for r in records:
            f.write(f"===== {r['name']}: {r['status']} ({r['seconds']} s)\n")
            f.write(f"$ {r.get('command', '')}\n{r['log']}\n")
    shutil.rmtree(work, ignore_errors=True)
    print(summary(report), flush=True)
    bad = [r["name"] for r in records if r["status"] not in ("pass", "skip")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
