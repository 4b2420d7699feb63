"""The stats as flat metrics for loggers (Trainer's and Lightning's callbacks share it)."""

from __future__ import annotations

from typing import Dict, Sequence

NUMBERS = ("bytes_sent", "bytes_exact", "calls_compressed", "calls_exact", "compute_seconds",
           "wire_seconds", "ratio")  # fmt: skip


class StatsMetrics:
    """``metrics(step)``: ``cgx/<counter>`` of the default cgx group (when it is one) and
    ``cgx_hook/<counter>`` of each hook state (``cgx_hook1/...`` for a second), cumulative, plus
    ``<prefix>/bytes_per_step`` since the previous call."""

    def __init__(self, states: Sequence = ()) -> None:
        self.states = list(states)
        self._last: Dict[str, tuple] = {}

    def sources(self):
        import torch_cgx

        out = [("cgx", torch_cgx.stats())] if torch_cgx.is_cgx_group() else []
        return out + [("cgx_hook" if i == 0 else f"cgx_hook{i}", torch_cgx.stats(s))
                      for i, s in enumerate(self.states)]  # fmt: skip

    def metrics(self, step: int) -> Dict[str, float]:
        out: Dict[str, float] = {}
        for prefix, s in self.sources():
            d = s.as_dict()
            out.update({f"{prefix}/{k}": d[k] for k in NUMBERS})
            step0, sent0 = self._last.get(prefix, (0, 0))
            if step > step0:
                out[f"{prefix}/bytes_per_step"] = (d["bytes_sent"] - sent0) / (step - step0)
            self._last[prefix] = (step, d["bytes_sent"])
        return out

    def summary(self) -> str:
        """The one-line stats of each source, one per line."""
        return "\n".join(str(s) for _, s in self.sources())
