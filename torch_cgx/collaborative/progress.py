"""How the peers agree that an epoch's target batch is reached: a plan per round, no collective
per micro-batch.

Every round (the average that ends an epoch) gathers from each peer a small header: the samples
it contributes, its measured compute rate (samples per second outside rounds) and its batch
size. From that one table every peer computes the same plan for the next epoch:
:func:`plan` gives each peer a number of micro-batches such that

- the batches of all peers together reach ``target_batch_size``;
- each peer's batches end by the same moment ``T`` at the peers' rates, the smallest such
  ``T`` (plus the batches that end by ``T`` anyway, up to 1.25x the target): a peer 3x slower
  is given about a third of a fast peer's batches and is done when the fast ones are, so
  nobody waits for it longer than one of its batches (and no peer is given fewer than one
  batch: a peer slower than the whole epoch holds the round for one batch).

A peer whose rate is unknown (a new one, or before the first epoch) is assumed to run at the mean
of the known rates (all unknown: all equal). The plan is computed from the last round's table,
so in the epoch after a peer leaves, the others' batches fall short of the target by that peer's
share (the step is still the sample-weighted average of what was processed), and in the epoch a
new peer joins the batch exceeds it by the newcomer's share. The next round's table corrects
both.
"""

from __future__ import annotations

import heapq
from typing import List, Optional, Sequence

__all__ = ["FILL", "Rate", "batches_per_peer", "plan"]

FILL = 1.25  # an epoch takes the batches that end by its end up to this times its target


class Rate:
    """A peer's compute rate (samples per second), measured between rounds and smoothed."""

    __slots__ = ("value", "samples", "seconds", "smooth")

    def __init__(self, smooth: float = 0.5) -> None:
        self.value: Optional[float] = None
        self.smooth = smooth
        self.samples, self.seconds = 0, 0.0

    def add(self, samples: int, seconds: float) -> None:
        self.samples += samples
        self.seconds += max(seconds, 0.0)

    def close_epoch(self) -> None:
        """Folds the epoch's samples and seconds into the estimate."""
        if self.samples > 0 and self.seconds > 0:
            newest = self.samples / self.seconds
            old = self.value
            self.value = newest if old is None else self.smooth * newest + (1 - self.smooth) * old
        self.samples, self.seconds = 0, 0.0


def plan(rates: Sequence[Optional[float]], batch_sizes: Sequence[int], target: int) -> List[int]:
    """Micro-batches per peer (at least one each) that reach ``target`` samples together, each
    peer's ending by the smallest common time at ``rates`` (samples/s; None or <= 0: unknown)."""
    if len(rates) != len(batch_sizes) or not rates:
        raise ValueError("plan: one rate and one batch size per peer, at least one peer")
    known = [r for r in rates if r is not None and r > 0]
    mean = sum(known) / len(known) if known else 1.0
    speed = [r if r is not None and r > 0 else mean for r in rates]
    sizes = [max(int(b), 1) for b in batch_sizes]
    counts = [1] * len(sizes)
    total = sum(sizes)
    # the moment each peer's next batch would end; take the earliest until the target is met
    heap = [(2 * b / s, i) for i, (b, s) in enumerate(zip(sizes, speed))]
    heapq.heapify(heap)
    while total < target:
        _, i = heapq.heappop(heap)
        counts[i] += 1
        total += sizes[i]
        heapq.heappush(heap, ((counts[i] + 1) * sizes[i] / speed[i], i))
    # the epoch lasts until the last peer's batches end: batches that end by then cost no
    # time; they are added (earliest first) while the epoch stays within 1.25x its target
    end = max(c * b / s for c, b, s in zip(counts, sizes, speed))
    while heap and heap[0][0] <= end * (1 + 1e-9):
        _, i = heapq.heappop(heap)
        if total + sizes[i] > target * FILL:
            continue
        counts[i] += 1
        total += sizes[i]
        heapq.heappush(heap, ((counts[i] + 1) * sizes[i] / speed[i], i))
    return counts


def batches_per_peer(table, target: int, default_batch: int) -> List[int]:
    """:func:`plan` from a round's header table (rows ``(samples, rate, batch)``); a batch size
    of 0 (not known yet) is the mean of the known ones, else ``default_batch``."""
    known = [int(b) for _, _, b in table if b > 0]
    fill = round(sum(known) / len(known)) if known else default_batch
    rates = [r if r > 0 else None for _, r, _ in table]
    return plan(rates, [int(b) if b > 0 else fill for _, _, b in table], target)
