"""Energy over the timed run from sampled readings: the arithmetic, with nothing of sensors in it.

A source gives either a cumulative energy counter ("counter", joules, possibly wrapping at a
known range) or instantaneous power ("power", watts). Both become energy over the run's
intervals the same way:

- counters are unwrapped (a fall means the counter wrapped once, if its range is known);
  energy between two readings is their difference, taken pro rata where an interval cuts the
  pair;
- power is integrated as a piecewise-linear curve through the samples (trapezoids), cut
  exactly at the interval's ends.

Only time between two consecutive readings no further apart than the gap limit counts as
covered; a longer gap is left out of the energy and of the covered time alike, so average
power is measured joules / covered seconds and nothing is filled in. The gap limit is
max(2 s, 3 x the median spacing of the source's readings).
"""

from __future__ import annotations

import heapq
import math
import statistics
from dataclasses import dataclass

MIN_GAP_LIMIT_S = 2.0
GAP_FACTOR = 3.0


@dataclass(frozen=True)
class Measured:
    """One source's energy over a set of intervals."""

    joules: float
    covered_s: float  # seconds of the intervals lying between close-enough readings
    interval_s: float  # total length of the intervals
    samples: int  # readings taken inside the intervals
    spacing_s: float | None = None  # median time between the readings used
    counter_faults: int = 0  # counter pairs that fell without a known range (left out)

    @property
    def coverage(self) -> float:
        return self.covered_s / self.interval_s if self.interval_s > 0 else 0.0

    @property
    def average_watts(self) -> float | None:
        return self.joules / self.covered_s if self.covered_s > 0 else None

    @property
    def sample_hz(self) -> float:
        """The source's reading rate over the run: 1 / median spacing of the readings used."""
        return 1.0 / self.spacing_s if self.spacing_s else 0.0


def gap_limit(times: list[float]) -> float:
    spacings = [b - a for a, b in zip(times, times[1:], strict=False) if b > a]
    if not spacings:
        return MIN_GAP_LIMIT_S
    return max(MIN_GAP_LIMIT_S, GAP_FACTOR * statistics.median(spacings))


def _pair_energy(kind, t0, v0, t1, v1, a, b, wrap):
    """Energy of one reading pair restricted to [a, b] (a, b inside [t0, t1]); None on fault."""
    if kind == "power":
        span = t1 - t0

        def watts(t):
            return v0 + (v1 - v0) * (t - t0) / span

        return (watts(a) + watts(b)) / 2 * (b - a)
    delta = v1 - v0
    if delta < 0:
        if wrap is None:
            return None
        delta += wrap
    return delta * (b - a) / (t1 - t0)


def energy_over(
    readings: list[tuple[float, float]],
    kind: str,
    intervals: list[tuple[float, float]],
    wrap: float | None = None,
) -> Measured:
    """Energy of one source over `intervals` from its (time, value) readings, time-ordered."""
    if kind not in ("counter", "power"):
        raise ValueError(f"kind must be 'counter' or 'power', got {kind!r}")
    times = [t for t, _ in readings]
    limit = gap_limit(times)
    joules = covered = 0.0
    faults = 0
    spacings = []
    for start, stop in intervals:
        for (t0, v0), (t1, v1) in zip(readings, readings[1:], strict=False):
            a, b = max(t0, start), min(t1, stop)
            if b <= a or t1 - t0 > limit:
                continue
            energy = _pair_energy(kind, t0, v0, t1, v1, a, b, wrap)
            if energy is None:
                faults += 1
                continue
            joules += energy
            covered += b - a
            spacings.append(t1 - t0)
    return Measured(
        joules=joules,
        covered_s=covered,
        interval_s=sum(stop - start for start, stop in intervals),
        samples=sum(1 for t in times if any(s <= t <= e for s, e in intervals)),
        spacing_s=statistics.median(spacings) if spacings else None,
        counter_faults=faults,
    )


class _RunningMedian:
    """The median of a growing multiset, as `statistics.median` gives it, in O(log n) per
    value: the lower half in a max-heap (negated), the upper half in a min-heap."""

    def __init__(self):
        self.low: list[float] = []
        self.high: list[float] = []

    def add(self, value: float) -> None:
        if not self.low or value <= -self.low[0]:
            heapq.heappush(self.low, -value)
        else:
            heapq.heappush(self.high, value)
        if len(self.low) > len(self.high) + 1:
            heapq.heappush(self.high, -heapq.heappop(self.low))
        elif len(self.high) > len(self.low):
            heapq.heappush(self.low, -heapq.heappop(self.high))

    def value(self) -> float | None:
        if not self.low:
            return None
        if len(self.low) > len(self.high):
            return -self.low[0]
        return (-self.low[0] + self.high[0]) / 2


class RunningEnergy:
    """`energy_over(readings, kind, [(start, stop)], wrap)` for readings that only grow and a
    stop that only moves on: each `update` walks only the readings added since the last one,
    so a checkpoint's energy costs the same late in a run as early.

    Pairs no longer apart than MIN_GAP_LIMIT_S are counted as they arrive, in time order (the
    sums are the full integration's, to the bit); the gap limit is followed from counts. Only
    where a source's median spacing makes the limit exceed MIN_GAP_LIMIT_S (read slower than
    every 2/3 s) does `update` fall back to the full integration, over that source's few
    readings."""

    def __init__(self, kind: str, start: float, wrap: float | None = None):
        if kind not in ("counter", "power"):
            raise ValueError(f"kind must be 'counter' or 'power', got {kind!r}")
        self.kind, self.start, self.wrap = kind, start, wrap
        self.used = 0  # readings taken so far: all at or before the last stop
        self.joules = self.covered = 0.0
        self.faults = self.samples = 0
        self.spacings = _RunningMedian()  # of the pairs counted
        # Every spacing > 0, as `gap_limit` reads them: how many keep 3 x spacing <= the
        # minimum limit, the largest of those and the smallest of the others.
        self.gaps = self.short_gaps = 0
        self.largest_short = -math.inf
        self.smallest_long = math.inf

    def update(self, readings: list[tuple[float, float]], stop: float) -> Measured:
        """The energy over [start, stop] from `readings` (time-ordered, the same list each
        call, longer or as long) up to `stop`; readings after `stop` wait for a later call."""
        for index in range(self.used, len(readings)):
            t1, v1 = readings[index]
            if t1 > stop:
                break
            if index:
                self._pair(*readings[index - 1], t1, v1)
            self.samples += t1 >= self.start
            self.used = index + 1
        if self._limit_above_minimum():
            return energy_over(readings[: self.used], self.kind, [(self.start, stop)], self.wrap)
        return Measured(
            joules=self.joules,
            covered_s=self.covered,
            interval_s=stop - self.start,
            samples=self.samples,
            spacing_s=self.spacings.value(),
            counter_faults=self.faults,
        )

    def _pair(self, t0: float, v0: float, t1: float, v1: float) -> None:
        spacing = t1 - t0
        if spacing > 0:
            self.gaps += 1
            if GAP_FACTOR * spacing <= MIN_GAP_LIMIT_S:
                self.short_gaps += 1
                self.largest_short = max(self.largest_short, spacing)
            else:
                self.smallest_long = min(self.smallest_long, spacing)
        a = max(t0, self.start)
        if t1 <= a or spacing > MIN_GAP_LIMIT_S:
            return  # before the interval, or beyond the limit whatever the median
        energy = _pair_energy(self.kind, t0, v0, t1, v1, a, t1, self.wrap)
        if energy is None:
            self.faults += 1
            return
        self.joules += energy
        self.covered += t1 - a
        self.spacings.add(spacing)

    def _limit_above_minimum(self) -> bool:
        """Whether `gap_limit` of the readings so far exceeds MIN_GAP_LIMIT_S, from the counts
        (exact: 3 x spacing grows with the spacing, so the median's ranks decide)."""
        n, short = self.gaps, self.short_gaps
        if n == 0 or 2 * short > n:  # the median, or both middle spacings, short
            return False
        if 2 * short < n - 1 or n % 2:  # the median, or both middle spacings, long
            return True
        median = (self.largest_short + self.smallest_long) / 2  # as statistics.median has it
        return GAP_FACTOR * median > MIN_GAP_LIMIT_S
