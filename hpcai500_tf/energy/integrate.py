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
