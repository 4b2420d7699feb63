"""The derived figures of a record of byte counters (``bytes_sent``, ``bytes_exact``): the base
of :class:`torch_cgx.counters.Stats` and :class:`torch_cgx.hook_stats.HookStats`, in a module of
its own so that neither of those imports the other's module to get it."""

from __future__ import annotations

import dataclasses

__all__ = ["ByteCounts"]


class ByteCounts:
    """What a dataclass of counters with ``bytes_sent`` and ``bytes_exact`` derives from them
    (:class:`Stats`, :class:`torch_cgx.hook_stats.HookStats`)."""

    @property
    def bytes_saved(self) -> int:
        return self.bytes_exact - self.bytes_sent

    @property
    def ratio(self) -> float:
        """How many times fewer bytes than exact fp32 (1.0 before any call)."""
        return self.bytes_exact / self.bytes_sent if self.bytes_sent else 1.0

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out.update(bytes_saved=self.bytes_saved, ratio=self.ratio)
        return out
