"""What a run left on disk, read for its report page: the record, the power samples and the
TensorBoard scalars, each as far as it can be read.

A report shows what exists. Nothing here raises for a missing or damaged file inside a run
directory: it leaves a note saying what is missing and why, and the page shows the note. Only
an argument that is neither a run directory nor a readable record is refused (UserError).
"""

from __future__ import annotations

import csv
import importlib.util
import math
from dataclasses import dataclass, field
from pathlib import Path

from hpcai500_tf import record as record_io
from hpcai500_tf.errors import UserError
from hpcai500_tf.report import event_files
from hpcai500_tf.run.directory import RECORD_FILE, RunDirectory

POWER_COLUMNS = ["worker", "source", "unix_s", "value", "unit"]
STEP_THROUGHPUT_TAG = "train/examples_per_second"


@dataclass
class PowerSeries:
    """One source's power in watts over time: readings of a power source, or the energy
    differences of a counter source over their time differences."""

    label: str
    points: list[tuple[float, float]]  # (unix seconds, watts)


@dataclass
class RunFiles:
    """One run as found on disk. `missing` holds (topic, note) pairs: what could not be read
    and why; topics are "record", "power" and "throughput"."""

    argument: str  # as the user gave it
    name: str  # the run directory's or the record file's name
    run_dir: Path | None
    record_path: Path | None
    record: dict | None = None
    power: list[PowerSeries] = field(default_factory=list)
    step_throughput: list[tuple[int, float]] = field(default_factory=list)
    missing: list[tuple[str, str]] = field(default_factory=list)

    def notes(self, topic: str) -> list[str]:
        return [note for about, note in self.missing if about == topic]


def load_run(argument: str) -> RunFiles:
    """A run directory, or a record file (its run directory beside it when it is named
    record.json). Refuses, in one line naming it, an argument that is neither."""
    path = Path(argument)
    if path.is_dir():
        if not _holds_a_run(path):
            raise UserError(
                f"{argument}: not a run directory (none of the files a run writes is in it)"
            )
        run = RunFiles(argument, path.resolve().name, path, RunDirectory(path).record)
        _read_record_in_directory(run)
    elif path.exists():
        try:
            record = record_io.load(path)
        except UserError as error:
            raise UserError(f"{error} (report takes run directories and record files)") from None
        run_dir = path.parent if path.name == RECORD_FILE else None
        name = path.resolve().parent.name if run_dir else path.stem
        run = RunFiles(argument, name, run_dir, path, record)
    else:
        raise UserError(f"{argument}: no such run directory or record file")
    if run.run_dir is None:
        alone = "a record file given alone (its run directory would hold them)"
        run.missing.append(("power", f"power samples: {alone}"))
        run.missing.append(("throughput", f"per-step throughput (TensorBoard events): {alone}"))
        return run
    directory = RunDirectory(run.run_dir)
    run.power, notes = read_power_samples(directory.power_samples)
    run.missing += [("power", note) for note in notes]
    run.step_throughput, notes = read_step_throughput(directory.tensorboard)
    run.missing += [("throughput", note) for note in notes]
    return run


def _holds_a_run(path: Path) -> bool:
    try:
        return RunDirectory(path).holds_a_run()
    except OSError as error:
        raise UserError(f"{path}: cannot read it ({error.strerror or error})") from None


def _read_record_in_directory(run: RunFiles) -> None:
    """The directory's record, or a note: a run directory renders even without one."""
    if not run.record_path.exists():
        run.missing.append(
            ("record", f"record: no {RECORD_FILE} in {run.argument} (the run wrote none)")
        )
        return
    try:
        run.record = record_io.load(run.record_path)
    except UserError as error:
        run.missing.append(("record", f"record: {error}"))


# ----------------------------------------------------------------------------- power samples


def read_power_samples(path: Path) -> tuple[list[PowerSeries], list[str]]:
    """Every source's power over time from a run's power-samples.csv, and notes on what is
    missing (no file, a header that is not the sampler's, malformed or cut-off lines)."""
    if not path.exists():
        why = "sampling was off, or found no power source"
        return [], [f"power samples: no {path.name} in the run directory ({why})"]
    try:
        text = record_io.read_regular_file(path, "power-samples file")
    except UserError as error:
        return [], [f"power samples: {error}"]
    rows = csv.reader(text.splitlines())
    header = next(rows, None)
    if header != POWER_COLUMNS:
        expected = ",".join(POWER_COLUMNS)
        return [], [f"power samples: {path.name} does not start with the header {expected}"]
    readings: dict[tuple[int, str, str], list[tuple[float, float]]] = {}
    bad_lines, notes = [], []
    try:
        for row in rows:
            reading = _power_row(row)
            if reading is None:
                bad_lines.append(rows.line_num)
                continue
            worker, source, unit, stamp, value = reading
            readings.setdefault((worker, source, unit), []).append((stamp, value))
    except csv.Error as error:  # e.g. a NUL byte: what came before is kept
        notes.append(f"power samples: {path.name} unreadable from line {rows.line_num} ({error})")
    if bad_lines:
        notes.append(
            f"power samples: {len(bad_lines)} malformed line(s) of {path.name} left out "
            f"(first: line {bad_lines[0]})"
        )
    several_workers = len({worker for worker, _, _ in readings}) > 1
    series = []
    for (worker, source, unit), points in readings.items():
        label = f"worker {worker}: {source}" if several_workers else source
        watts = counter_watts(sorted(points)) if unit == "J" else sorted(points)
        if watts:
            series.append(PowerSeries(label, watts))
    if not series:
        notes.append(f"power samples: {path.name} holds no usable reading")
    return series, notes


def _power_row(row: list[str]) -> tuple[int, str, str, float, float] | None:
    """One line's (worker, source, unit, unix seconds, value), or None where it is malformed."""
    if len(row) != len(POWER_COLUMNS) or row[4] not in ("W", "J") or not row[1]:
        return None
    try:
        worker, stamp, value = int(row[0]), float(row[2]), float(row[3])
    except ValueError:
        return None
    if not (math.isfinite(stamp) and math.isfinite(value)) or value < 0:
        return None
    return worker, row[1], row[4], stamp, value


def counter_watts(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Watts of an energy counter: its differences over their time differences, at the middle
    of each pair. Pairs where the counter fell (wrapped) or time stood still are left out."""
    watts = []
    for (t0, e0), (t1, e1) in zip(points, points[1:], strict=False):
        if t1 > t0 and e1 >= e0 and math.isfinite(rate := (e1 - e0) / (t1 - t0)):
            watts.append(((t0 + t1) / 2, rate))
    return watts


# ----------------------------------------------------------------------------- TensorBoard


def read_step_throughput(directory: Path) -> tuple[list[tuple[int, float]], list[str]]:
    """`train/examples_per_second` by global step from a run's TensorBoard event files, and
    notes on what is missing (no directory, no tensorboard package, unreadable, damaged or
    cut-off files). A step written twice (a resumed run) keeps its last value. TensorFlow is
    never imported (see report.event_files)."""
    what = "per-step throughput (TensorBoard events)"
    if not directory.is_dir():
        return [], [f"{what}: no {directory.name}/ directory in the run directory"]
    if importlib.util.find_spec("tensorboard") is None:
        return [], [f"{what}: the tensorboard package is not installed (pip install tensorboard)"]
    try:
        files = sorted(p for p in directory.rglob("*tfevents*") if p.is_file())
    except OSError as error:
        return [], [f"{what}: {directory.name}/ cannot be listed ({error.strerror or error})"]
    if not files:
        return [], [f"{what}: no event file in {directory.name}/"]
    by_step: dict[int, float] = {}
    notes = []
    for path in files:
        name = path.relative_to(directory.parent)
        try:
            records, damage = event_files.read_records(path)
            by_step.update(event_files.scalar_values(records, STEP_THROUGHPUT_TAG))
        except Exception as error:  # noqa: BLE001 - a damaged file is a note, never a lost page
            notes.append(f"{what}: {name} could not be read ({error.__class__.__name__})")
            continue
        if damage:
            notes.append(f"{what}: {name} {damage}; what comes before it is shown")
    if not by_step:
        notes.append(f"{what}: no {STEP_THROUGHPUT_TAG} values in {directory.name}/")
    return sorted(by_step.items()), notes
