"""Sampling power sources in the background during the timed run, and the record's energy block.

The sampler reads every source at a fixed rate on its own thread (a read costs microseconds
and releases nothing the training loop waits on). A read that fails is counted and leaves a
gap; the run is never stopped by a sensor. After the run, each source's readings become
energy over the run's timed segments (see `integrate`), and the sources in scope add up to the
run's energy: a node meter when there is one (it already includes everything else), otherwise
the GPU boards, CPU packages and DRAM that were measured.
"""

from __future__ import annotations

import math
import socket
import threading
import time
import zlib
from pathlib import Path

from hpcai500_tf.energy.integrate import RunningEnergy, energy_over
from hpcai500_tf.energy.meter_log import read_meter_log
from hpcai500_tf.energy.sources import Source
from hpcai500_tf.errors import UserError
from hpcai500_tf.files import open_for_append
from hpcai500_tf.record import energy_not_measured

MIN_HZ, MAX_HZ = 0.01, 1000.0  # a reading at least every 100 s, at most what a thread keeps up
MLPERF_POWER_MIN_HZ = 1.0
MLPERF_POWER_MIN_COVERAGE = 0.95
NODE = "whole node"
REST_OF_NODE = "the rest of the node (fans, power supplies, network, storage)"


def check_rate(flag: str, hz: float, may_be_off: bool) -> None:
    """Refuse a sampling rate outside [MIN_HZ, MAX_HZ] (but 0, sampling off, where
    `may_be_off`)."""
    if not (MIN_HZ <= hz <= MAX_HZ or may_be_off and hz == 0):
        off = "0 (off) or " if may_be_off else ""
        raise UserError(f"{flag} must be {off}in [{MIN_HZ:g}, {MAX_HZ:g}] samples/s, got {hz}")


class PowerSampler:
    def __init__(self, sources: list[Source], hz: float = 10.0, worker: int = 0, clock=time.time):
        if not MIN_HZ <= hz <= MAX_HZ:
            raise ValueError(f"sampling rate must be in [{MIN_HZ:g}, {MAX_HZ:g}], got {hz}")
        self.sources = sources
        self.hz = hz
        self.worker = worker
        self.clock = clock
        self.readings: dict[str, list[tuple[float, float]]] = {s.name: [] for s in sources}
        self.failed: dict[str, int] = {s.name: 0 for s in sources}
        self.first_error: dict[str, str] = {}
        self._running: dict[str, RunningEnergy] = {}  # per source: `measure_so_far`'s totals
        self._lock = threading.Lock()  # readings stay in time order across threads
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample_once(self) -> None:
        with self._lock:
            self._sample()

    def _sample(self) -> None:
        for source in self.sources:
            stamp = self.clock()
            try:
                value = float(source.read())
                if not math.isfinite(value) or value < 0:
                    raise ValueError(f"not a finite, non-negative reading: {value}")
            except Exception as error:  # any sensor fault: a gap, never a lost run
                self.failed[source.name] += 1
                self.first_error.setdefault(
                    source.name, f"{error.__class__.__name__}: {error}".strip(": ")
                )
                continue
            self.readings[source.name].append((stamp, value))

    def _loop(self) -> None:
        period = 1.0 / self.hz
        next_tick = time.monotonic() + period
        while not self._stop.wait(max(0.0, next_tick - time.monotonic())):
            self.sample_once()
            next_tick += period

    def start(self) -> PowerSampler:
        self.sample_once()
        if self.sources:
            self._thread = threading.Thread(target=self._loop, name="power-sampler", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            self.sample_once()  # a last reading after the run's stop brackets the interval

    def measure(self, intervals: list[tuple[float, float]]) -> list[dict]:
        """Per-source energy over `intervals`, as plain data (kept across resumes)."""
        results = []
        for source in self.sources:
            readings = list(self.readings[source.name])
            measured = energy_over(readings, source.kind, intervals, source.wrap_j)
            results.append(self._result(source, measured))
        return results

    def measure_so_far(self, start: float) -> tuple[float, list[dict]]:
        """Take a reading, then each source's energy from `start` to now, and now: a
        checkpoint's. A running total per source walks only the readings since the last call
        (`integrate.RunningEnergy`), so the cost per checkpoint does not grow with the run."""
        with self._lock:
            self._sample()
            stop = self.clock()  # every reading so far is at or before it
        results = []
        for source in self.sources:
            running = self._running.get(source.name)
            if running is None or running.start != start:
                running = RunningEnergy(source.kind, start, source.wrap_j)
                self._running[source.name] = running
            results.append(self._result(source, running.update(self.readings[source.name], stop)))
        return stop, results

    def _result(self, source: Source, measured) -> dict:
        errors = self.failed[source.name], self.first_error.get(source.name)
        return _measurement(source, self.worker, measured, *errors)

    def write_samples(self, path: Path) -> None:
        """Append every reading to a CSV beside the record (source, unix seconds, value).
        Raises UserError where `path` is a symbolic link or cannot be written."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with open_for_append(path) as handle:
            if handle.tell() == 0:
                handle.write("worker,source,unix_s,value,unit\n")
            for source in self.sources:
                unit = "J" if source.kind == "counter" else "W"
                for stamp, value in self.readings[source.name]:
                    handle.write(f"{self.worker},{source.name},{stamp:.4f},{value:.6f},{unit}\n")


def _identity(source: Source, worker: int) -> dict:
    return {
        "name": source.name,
        "part": source.part,
        "kind": source.kind,
        "method": source.method,
        "worker": worker,
        "host": socket.gethostname(),
        "uuid": source.uuid or None,
    }


def _measurement(source: Source, worker: int, measured, failed_reads: int, first_error) -> dict:
    """One source's energy over the run, as plain data for the record (and across resumes)."""
    return {
        **_identity(source, worker),
        "joules": measured.joules,
        "covered_s": measured.covered_s,
        "samples": measured.samples,
        "sample_hz": measured.sample_hz,
        "failed_reads": failed_reads,
        "first_error": first_error,
        "counter_faults": measured.counter_faults,
    }


def meter_measurement(
    readings: list[tuple[float, float]], intervals: list[tuple[float, float]], path: str
) -> dict:
    """A node meter log's energy over the run, in the same form as a sampled source's."""
    source = Source("meter", NODE, "power", f"node meter log {path}")
    measured = energy_over(readings, "power", intervals)
    return _measurement(source, 0, measured, failed_reads=0, first_error=None)


def meter_log_over(path: str, intervals: list[tuple[float, float]]) -> tuple[dict | None, list]:
    """A node meter log read and measured over `intervals`, and its warnings; None, with why in
    the warnings, where it cannot be used (energy is post-processing: never a lost run)."""
    try:
        readings, warnings = read_meter_log(path)
    except UserError as error:
        return None, [f"meter log not used: {error}"]
    return meter_measurement(readings, intervals, path), warnings


def combine_segments(segments: list[list[dict]]) -> list[dict]:
    """Add up per-source measurements of several timed segments (a resumed run)."""
    combined: dict[tuple, dict] = {}
    for segment in segments:
        for item in segment:
            key = (item["worker"], item["name"])
            if key not in combined:
                combined[key] = dict(item)
                continue
            total = combined[key]
            covered = total["covered_s"] + item["covered_s"]
            if covered > 0:  # the reading rate, weighted by the time each segment covered
                total["sample_hz"] = (
                    total["sample_hz"] * total["covered_s"] + item["sample_hz"] * item["covered_s"]
                ) / covered
            for field in ("joules", "covered_s", "samples", "failed_reads", "counter_faults"):
                total[field] += item[field]
            total["first_error"] = total["first_error"] or item["first_error"]
    return list(combined.values())


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def energy_block(
    measurements: list[dict], notes: list[str], interval_s: float, requested_hz: float | None
) -> tuple[dict, list[str]]:
    """The record's `energy` object from per-source measurements over the whole timed run, and
    the warnings it raises. `notes` say which kinds of source were missing and why."""
    warnings = []
    for item in measurements:
        item["coverage"] = item["covered_s"] / interval_s if interval_s > 0 else 0.0
        item["average_watts"] = item["joules"] / item["covered_s"] if item["covered_s"] else None
        if item["failed_reads"]:
            warnings.append(
                f"power source {item['name']}: {item['failed_reads']} failed read(s), first: "
                f"{item['first_error']}"
            )
        if item["counter_faults"]:
            warnings.append(
                f"power source {item['name']}: its counter fell {item['counter_faults']} "
                "time(s) with no known range; those spans were left out"
            )
    usable = [m for m in measurements if m["covered_s"] > 0 and m["joules"] > 0]
    for item in measurements:
        if item["covered_s"] <= 0:
            warnings.append(f"power source {item['name']}: no reading covers the timed run")
        elif item["joules"] <= 0:
            warnings.append(f"power source {item['name']}: its energy did not move (left out)")
    node = [m for m in usable if m["part"] == NODE]
    # A meter log covers worker 0's node; other workers' nodes add what was sampled there.
    in_scope = node + [m for m in usable if m.get("node", m["worker"]) != 0] if node else usable
    if not in_scope:
        reason = "; ".join(notes) or "no power source gave a reading during the timed run"
        block = energy_not_measured(
            reason,
            interval_s=interval_s,
            sources=measurements,
            requested_hz=requested_hz,
            notes=notes,
        )
        return block, warnings
    counts: dict[str, int] = {}
    for item in in_scope:
        if item["part"] != NODE:
            counts[item["part"]] = counts.get(item["part"], 0) + item.get("count", 1)
    parts = [_plural(n, part) for part, n in counts.items()]
    if node and not counts:
        parts = [NODE]
        scope = f"{NODE} (meter log)"
        not_measured = [n for n in notes if n.startswith("worker")]  # the meter has the rest
    elif node:
        parts = [f"{NODE} of worker 0", *parts]
        scope = f"{NODE} of worker 0 (meter log), other workers' " + ", ".join(parts[1:])
        not_measured = [*notes, REST_OF_NODE + " of the other workers"]
    else:
        scope = ", ".join(parts) + " only"
        not_measured = [*notes, REST_OF_NODE]
    coverage = min(m["coverage"] for m in in_scope)
    rate = min(m["sample_hz"] for m in in_scope)
    flags = []
    if rate < MLPERF_POWER_MIN_HZ:
        flags.append(f"below MLPerf-power quality: {rate:.2f} samples/s (< 1 per second)")
    if coverage < MLPERF_POWER_MIN_COVERAGE:
        flags.append(f"below MLPerf-power quality: readings cover {coverage:.1%} of the run")
    warnings += flags
    block = {
        "interval_s": interval_s,
        "requested_hz": requested_hz,
        "sources": measurements,
        "notes": notes,
        "measured": True,
        "reason": None,
        "joules": sum(m["joules"] for m in in_scope),
        "scope": scope,
        "average_watts": sum(m["average_watts"] for m in in_scope),
        "coverage": coverage,
        "sample_hz": rate,
        "parts_measured": parts,
        "parts_not_measured": not_measured,
        "quality_flags": flags,
    }
    return block, warnings


def live_reading(sources: list[Source], seconds: float, hz: float) -> list[dict]:
    """Sample `sources` for `seconds` and measure that interval: the `power` command's check."""
    sampler = PowerSampler(sources, hz).start()
    start = sampler.clock()
    time.sleep(seconds)
    stop = sampler.clock()
    sampler.stop()
    measurements = sampler.measure([(start, stop)])
    energy_block(measurements, [], stop - start, hz)  # fills coverage, rate, average power
    return measurements


def meter_log_summary(path: str) -> tuple[dict, list[str]]:
    """What a meter log holds, measured over its own span: for checking the file before a run."""
    readings, warnings = read_meter_log(path)
    first, last = readings[0][0], readings[-1][0]
    measurement = meter_measurement(readings, [(first, last)], path)
    energy_block([measurement], [], last - first, None)
    return {**measurement, "first": first, "last": last, "readings": len(readings)}, warnings


# ------------------------------------------------------------------------ other workers
# Each worker samples its own sources; worker 0 gathers a fixed-length vector per worker (a
# collective carries numbers only, one length on every worker). CPU packages and DRAM are read
# host-wide: only the lowest-ranked worker of a host is counted. NVML GPUs are the ones each
# worker uses: every worker's are counted, a board two workers see (same UUID) once.

HOST_PARTS = ("CPU package", "DRAM")
GPU = "GPU board"
GPU_SLOTS = 16  # boards carried per worker; more are left out, with a note
_FIELDS = ("count", "joules", "covered_s", "samples", "hz_seconds", "failed_reads")
_SLOT = ("board", *_FIELDS[1:])  # a GPU slot: the board's id in place of a count
_HEAD = 2 + len(HOST_PARTS) * len(_FIELDS)  # host id, GPU count, the host-wide parts
VECTOR_LENGTH = _HEAD + GPU_SLOTS * len(_SLOT)


def host_id() -> float:
    """This host as a number exact in float64 (a collective cannot carry its name)."""
    return float(zlib.crc32(socket.gethostname().encode()))


def board_id(measurement: dict) -> float:
    """A GPU board as a number exact in float64: crc32 of its NVML UUID (of host and source
    name where NVML gave none), the same on every worker that sees the board."""
    key = measurement.get("uuid") or f"{measurement['host']}:{measurement['name']}"
    return float(zlib.crc32(key.encode()))


def _fields(measurement: dict) -> dict:
    """One source's measurement as the `_FIELDS` a vector carries."""
    return {
        "count": 1,
        "joules": measurement["joules"],
        "covered_s": measurement["covered_s"],
        "samples": measurement["samples"],
        "hz_seconds": measurement["sample_hz"] * measurement["covered_s"],
        "failed_reads": measurement["failed_reads"],
    }


def _totals(items: list[dict]) -> dict:
    """Several sources' `_FIELDS` as one: energy, samples and faults add up, covered time and
    Hz x s are averaged per source."""
    count = sum(item["count"] for item in items)
    total = {key: sum(item[key] for item in items) for key in _FIELDS}
    for key in ("covered_s", "hz_seconds"):
        total[key] = sum(item[key] * item["count"] for item in items) / max(count, 1)
    return total


def worker_vector(measurements: list[dict]) -> list[float]:
    """[host id, GPU boards, for each host-wide part its `_FIELDS`, then `GPU_SLOTS` boards:
    id, joules, covered s, samples, Hz x s, failed (unused slots 0)], VECTOR_LENGTH long."""
    gpus = [m for m in measurements if m["part"] == GPU]
    vector = [host_id(), float(len(gpus))]
    for part in HOST_PARTS:
        totals = _totals([_fields(m) for m in measurements if m["part"] == part])
        vector += [float(totals[key]) for key in _FIELDS]
    for gpu in gpus[:GPU_SLOTS]:
        vector += [board_id(gpu), *(float(_fields(gpu)[key]) for key in _FIELDS[1:])]
    return vector + [0.0] * (VECTOR_LENGTH - len(vector))


def _boards(vector: list[float]) -> list[dict]:
    """The GPU slots a worker filled, as `_FIELDS` with the board's id."""
    used = min(int(vector[1]), GPU_SLOTS)
    size = len(_SLOT)
    slots = [vector[_HEAD + size * i : _HEAD + size * (i + 1)] for i in range(used)]
    return [{**dict(zip(_SLOT, slot, strict=True)), "count": 1} for slot in slots]


def _summed(rank: int, node: int, part: str, totals: dict, method: str) -> dict:
    """A worker's sources of one part, summed, as the record's measurement of them."""
    return {
        "name": f"worker{rank}:{part.lower().replace(' ', '_')}s",
        "part": part,
        "kind": "sum",
        "count": int(totals["count"]),
        "method": method,
        "worker": rank,
        "host": None,
        "node": node,  # the lowest rank on its host; 0: worker 0's node (a meter log's)
        "joules": totals["joules"],
        "covered_s": totals["covered_s"],
        "samples": int(totals["samples"]),
        "sample_hz": totals["hz_seconds"] / totals["covered_s"] if totals["covered_s"] else 0.0,
        "failed_reads": int(totals["failed_reads"]),
        "first_error": None,
        "counter_faults": 0,
    }


def other_workers(vectors: list[list[float]]) -> tuple[list[dict], list[str]]:
    """Measurements of workers 1..N from everyone's vectors (row = rank): CPU packages and DRAM
    once per host, GPU boards once per board; notes for a node with no reading and for boards
    beyond the slots. (Worker 0's boards beyond the slots are not checked for sharing.)"""
    hosts = {vectors[0][0]: 0}
    boards = {board["board"] for board in _boards(vectors[0])}
    measurements, notes = [], []
    for rank, vector in enumerate(vectors[1:], start=1):
        node = hosts.setdefault(vector[0], rank)
        mine = []
        for index, part in enumerate(HOST_PARTS if node == rank else ()):
            start = 2 + index * len(_FIELDS)
            totals = dict(zip(_FIELDS, vector[start : start + len(_FIELDS)], strict=True))
            if totals["count"]:
                method = f"{int(totals['count'])} source(s) sampled on worker {rank}"
                mine.append(_summed(rank, node, part, totals, method))
        gpus = _boards(vector)
        new = [gpu for gpu in gpus if gpu["board"] not in boards]
        boards.update(gpu["board"] for gpu in new)
        if new:
            method = f"{len(new)} GPU board(s) sampled on worker {rank}"
            if len(new) < len(gpus):
                method += f"; {len(gpus) - len(new)} more seen by a lower rank, counted there"
            mine.append(_summed(rank, node, GPU, _totals(new), method))
        if int(vector[1]) > GPU_SLOTS:
            notes.append(
                f"worker {rank}: {int(vector[1]) - GPU_SLOTS} of its {int(vector[1])} GPU "
                f"boards not gathered (at most {GPU_SLOTS} per worker)"
            )
        if node == rank and not mine and not gpus:
            notes.append(f"worker {rank}: no power source on its node")
        measurements += mine
    return measurements, notes


def node_count(vectors: list[list[float]]) -> int:
    """How many hosts the workers ran on: the distinct host ids of their gathered vectors."""
    return len({vector[0] for vector in vectors})


def not_gathered(workers: int, what: str, why: str) -> str:
    """A note naming the workers other than 0 (of `workers`) whose `what` the record lacks, and
    why: worker notes start "worker" (a node meter does not cover them)."""
    others = "worker 1" if workers == 2 else f"workers 1-{workers - 1}"
    return f"{others}: {what} not gathered ({why})"
