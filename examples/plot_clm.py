"""Loss against wall time and against step from run_clm.py's JSON summaries (``--json``).

    python examples/plot_clm.py out.png gloo.json cgx4.json diloco.json [--title TEXT]

One line per summary: the logged training loss (mean over the ranks) at each logged step, against
the seconds since training began (left) and against the step (right); the legend gives the
method, the bytes one rank sent per step and the final model's held-out loss.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional


def label(summary: dict) -> str:
    mb = summary["bytes_per_step"] / 1e6
    return f"{summary['method']}: {mb:.3g} MB/step, held-out {summary['eval_loss']:.3f}"


def plot(summaries: List[dict], path: str, title: str = "") -> str:
    from matplotlib.figure import Figure  # rendered with Agg: no display needed

    fig = Figure(figsize=(13, 4.2), layout="constrained")
    ax_t, ax_s = fig.subplots(1, 2)
    for s in summaries:
        steps, seconds, losses = zip(*s["curve"])
        ax_t.plot(seconds, losses, marker=".", label=label(s))
        ax_s.plot(steps, losses, marker=".", label=s["method"])
    ax_t.set_xlabel("wall time since training began (s, rank 0)")
    ax_s.set_xlabel("optimizer step")
    for ax in (ax_t, ax_s):
        ax.set_ylabel("training loss (mean over ranks)")
        ax.grid(True, alpha=0.3)
    ax_t.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    fig.savefig(path, dpi=110)
    return path


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="plot_clm.py", description=__doc__.splitlines()[0])
    p.add_argument("out", help="the PNG to write")
    p.add_argument("summaries", nargs="+", help="run_clm.py --json files")
    p.add_argument("--title", default="")
    args = p.parse_args(argv)
    summaries = []
    for name in args.summaries:
        with open(name) as f:
            summaries.append(json.load(f))
    print(plot(summaries, args.out, args.title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
