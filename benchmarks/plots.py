"""Plots of benchmark records (matplotlib, drawn off-screen: no display and no pyplot state).

- :func:`plot_allreduce`: effective bandwidth (size / time) against size, one line per method,
  log-log, from allreduce benchmark records (``size`` bytes, ``algo``, ``bits``, ``time_us``,
  ``world``).
- :func:`plot_collaborative`: held-out loss and global steps against wall-clock time, one line
  per system, from ``benchmarks.collaborative``'s curves.
- :func:`plot_training`: training loss against wall-clock time and against step, one row per
  workload, one line per method, from ``benchmarks.train`` records.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, Iterable, List, Sequence


def _figure(rows: int, cols: int, width: float, height: float):
    from matplotlib.figure import Figure  # Figure.savefig renders with Agg, no backend switch

    fig = Figure(figsize=(width * cols, height * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    return fig, axes


_CGX_ALGOS = ("sra", "ring")


def allreduce_label(record: dict) -> str:
    """``cgx-<algo>-<N>bit`` for cgx rows, ``<compressor>-<algo>`` for ``--compressors`` rows;
    the method's own name (gloo, fp16, powersgd1, ...) for the others, whose names already say
    what they send."""
    if record.get("compressor"):
        return f"{record['compressor']}-{record['algo']}"
    if record["algo"] in _CGX_ALGOS:
        return f"cgx-{record['algo']}-{int(record['bits'])}bit"
    return record["algo"]


def plot_allreduce(records: Iterable[dict], path: str, title: str = "") -> str:
    """Effective bandwidth (size / time, GB/s) against size (bytes), log-log, per method.

    Records repeated for the same (method, world, size) are averaged. With several world sizes
    among the records each line's label says which. Returns ``path``.
    """
    records = list(records)
    if not records:
        raise ValueError("plot_allreduce: no records")
    worlds = sorted({int(r["world"]) for r in records})
    times: Dict[tuple, List[float]] = defaultdict(list)
    for r in records:
        label = allreduce_label(r)
        if len(worlds) > 1:
            label += f" (W={int(r['world'])})"
        times[(label, int(r["size"]))].append(float(r["time_us"]))
    lines: Dict[str, List[tuple]] = defaultdict(list)
    for (label, size), ts in times.items():
        t = sum(ts) / len(ts) * 1e-6
        if t > 0:
            lines[label].append((size, size / t / 1e9))
    fig, axes = _figure(1, 1, 7.0, 4.5)
    ax = axes[0][0]
    colors = _colors(len(lines))
    for i, label in enumerate(lines):  # first-seen order: the records' own method order
        pts = sorted(lines[label])
        style = "-" if label.startswith("cgx") else "--"  # cgx solid, the others dashed
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", ms=3, label=label,
                color=colors[i])  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("effective bandwidth = size / time (GB/s)")
    world_note = ", ".join(f"W={w}" for w in worlds)
    ax.set_title(title or f"allreduce bandwidth ({world_note})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.savefig(path, dpi=110)
    return path


def _colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab20" if n > 10 else "tab10"]
    return [cmap(i % cmap.N) for i in range(n)]


def _smooth(values: Sequence[float], window: int) -> List[float]:
    """Trailing moving average (the first points average what there is)."""
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def plot_training(records: Iterable[dict], path: str) -> str:
    """Loss against wall-clock seconds (left) and against step (right), one row per workload.

    Each method is one color: the per-step loss faintly, a trailing moving average over about a
    twentieth of the run on top. Returns ``path``.
    """
    by_workload: Dict[str, List[dict]] = defaultdict(list)
    for r in records:
        by_workload[r["workload"]].append(r)
    if not by_workload:
        raise ValueError("plot_training: no records")
    fig, axes = _figure(len(by_workload), 2, 6.5, 4.0)
    for row, (workload, recs) in enumerate(by_workload.items()):
        ax_t, ax_s = axes[row]
        colors = _colors(len(recs))  # distinct up to 20 methods (every compressor)
        for i, r in enumerate(recs):
            color = colors[i]
            loss = r["losses"]
            window = max(1, len(loss) // 20)
            smooth = _smooth(loss, window)
            steps = list(range(1, len(loss) + 1))
            for ax, x in ((ax_t, r["wall_s"]), (ax_s, steps)):
                if window > 1:
                    ax.plot(x, loss, color=color, alpha=0.25, lw=0.8)
                ax.plot(x, smooth, color=color, lw=1.6, label=r["method"])
        world = recs[0].get("world", "?")
        ax_t.set_title(f"{workload}: loss vs wall-clock (W={world})")
        ax_t.set_xlabel("wall-clock time (s, slowest rank)")
        ax_s.set_title(f"{workload}: loss vs step")
        ax_s.set_xlabel("step")
        for ax in (ax_t, ax_s):
            ax.set_ylabel("training loss (mean over ranks)")
            ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.3)
        ax_t.legend(fontsize="small" if len(recs) <= 10 else "x-small", ncol=1 + len(recs) // 11)
    fig.savefig(path, dpi=110)
    return path


def plot_collaborative(curves: Dict[str, dict], path: str, title: str = "") -> str:
    """``curves[system]`` has ``loss`` and ``epochs``: lists of ``(seconds, value)``."""
    fig, axes = _figure(1, 2, 5.0, 3.6)
    for (system, c), color in zip(curves.items(), _colors(len(curves))):
        for ax, key in zip(axes[0], ("loss", "epochs")):
            if c.get(key):
                ax.plot(*zip(*c[key]), label=system, color=color)
    axes[0][0].set(xlabel="seconds in the collaboration", ylabel="held-out loss (peer 0)")
    axes[0][1].set(xlabel="seconds in the collaboration", ylabel="global steps (peer 0)")
    for ax in axes[0]:
        ax.grid(alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.savefig(path, dpi=110)
    return path
