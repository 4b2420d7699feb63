"""The fragment schedule of (Streaming) DiLoCo: which fragment's reduction starts and which is
applied after a given inner step.

Inner steps are counted from 1 (the first ``inner_optimizer.step()`` is step 1). With ``H =
sync_every`` and ``K`` fragments, fragment ``f`` has the offset ``o_f = floor(H (f + 1) / K)``
(``o_{K-1} = H``), as torchft spreads its fragments: fragment 0 first, fragment ``K - 1`` at
the end of the period. After inner step ``t``:

- fragment ``f``'s reduction **starts** when ``(t + d - o_f) % H == 0`` (``d`` =
  ``fragment_sync_delay``): its pseudo-gradient is taken from the parameters of step ``t``;
- fragment ``f``'s result is **applied** (outer step, then the mix with ``fragment_update_alpha``)
  when ``t >= 1`` and ``(t - o_f) % H == 0``.

``d < floor(H / K)`` (the smallest gap between two fragments' syncs), so at most one reduction is
in flight, a fragment's reduction always starts after its previous one was applied, and the
first start is at step ``o_f - d >= 1``. With ``K = 1`` this is DiLoCo: one sync every ``H``
steps.
"""

from __future__ import annotations

from typing import List

__all__ = ["Schedule"]


def _count(value, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


class Schedule:
    """The staggered schedule of ``num_fragments`` fragments synced every ``sync_every`` inner
    steps, each applied ``fragment_sync_delay`` steps after its reduction starts."""

    __slots__ = ("sync_every", "num_fragments", "delay", "offsets")

    def __init__(self, sync_every: int, num_fragments: int, fragment_sync_delay: int = 0):
        self.sync_every = _count(sync_every, "sync_every", 1)
        self.num_fragments = _count(num_fragments, "num_fragments", 1)
        if self.sync_every < self.num_fragments:
            raise ValueError(
                f"sync_every ({sync_every}) must be >= the number of fragments "
                f"({num_fragments}): one fragment syncs at a time"
            )
        self.delay = _count(fragment_sync_delay, "fragment_sync_delay", 0)
        gap = self.sync_every // self.num_fragments
        if self.delay >= gap:
            raise ValueError(
                f"fragment_sync_delay must be < sync_every // number of fragments = {gap}, "
                f"got {fragment_sync_delay} (a fragment's result must be applied before the "
                "next fragment's reduction starts)"
            )
        h, k = self.sync_every, self.num_fragments
        self.offsets = [h * (f + 1) // k for f in range(k)]

    def starts_at(self, step: int) -> List[int]:
        """The fragments whose reduction starts after inner step ``step``."""
        h, d = self.sync_every, self.delay
        return [f for f, o in enumerate(self.offsets) if step >= 1 and (step + d - o) % h == 0]

    def applies_at(self, step: int) -> List[int]:
        """The fragments whose averaged pseudo-gradient is applied after inner step ``step``."""
        h = self.sync_every
        return [f for f, o in enumerate(self.offsets) if step >= 1 and (step - o) % h == 0]

    def as_dict(self) -> dict:
        return {
            "sync_every": self.sync_every,
            "num_fragments": self.num_fragments,
            "fragment_sync_delay": self.delay,
            "offsets": list(self.offsets),
        }

    def check(self, saved: dict) -> None:
        """ValueError unless ``saved`` (a checkpoint's ``as_dict()``) is this schedule."""
        mine = self.as_dict()
        for key, value in mine.items():
            if saved.get(key) != value:
                raise ValueError(
                    f"the checkpoint's schedule has {key}={saved.get(key)!r}, this DiLoCo "
                    f"{value!r}: resume with the same sync_every, fragments and delay"
                )
