"""The throughput record of `train --instances M` and its score: models per minute, as MLPerf
HPC's weak-scaling metric counts them, with the system's aggregate Valid FLOPS beside it.

    PARENT/throughput.json       this record: the members, the window, the energy over it
    PARENT/instance-I/RUN_DIR/   each instance's own run (record, MLPerf log, checkpoints)

The record stores what was measured (which members ran, how each ended, the energy of the
whole window counted once); `score` derives the rest on every read, from the members' own
records and MLPerf logs: the window runs from the earliest run_start of any member to the
latest run_stop of any member (every instance that ran is inside it, converged or not); the
models counted are the members that completed and reached the target; models per minute =
counted / window minutes. Aggregate FLOPS = the counted members' FLOPs over the window;
aggregate Valid FLOPS the same with each member's quality factor; per watt over the window's
average power. A record whose members differ in any of the nine layers (the seed, where a run
ran and how a fact was found apart) is not one submission: refused, naming the layer.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcai500_tf import record as record_io
from hpcai500_tf.errors import UserError
from hpcai500_tf.files import open_regular_file
from hpcai500_tf.layers import LAYER_IDS
from hpcai500_tf.mlperf.mlperf_import import well_formed_event
from hpcai500_tf.run import ensemble
from hpcai500_tf.run.directory import MLPERF_LOG, RECORD_FILE
from hpcai500_tf.validation import compile_shape, invalid

KIND = "hpcai500-throughput"
SCHEMA_VERSION = 1
FILE = "throughput.json"
FORMS = ("weak_scaling", ensemble.FORM)  # ensemble: run/ensemble.py
STATUSES = ("completed", "stopped")
RULE = {
    "name": "MLPerf HPC throughput (weak scaling)",
    "version": "MLPerf HPC v1.0 metric (kept in v2.0 and v3.0): models per minute",
    "window": "from the earliest run_start of any instance to the latest run_stop of any "
    "instance, both read from the instances' MLPerf logs",
    "counted": "an instance that completed and reached the target counts one model; one that "
    "failed, diverged, was stopped or missed the target counts none and stays in the window",
    "pruning": "none: MLPerf lets a submitter prune instances; every instance here is counted",
}

_MEMBER = {
    "index": "int",
    "seed": "int",
    "run_dir": "str?",  # relative to the record's directory; None: the instance made none
    "exit_code": "int?",
    "ended": "str",  # how its process ended, in words
    "hosts": ["str"],  # the nodes it ran on
}
_SCHEMA: dict[str, Any] = {
    "schema_version": "int",
    "kind": "str",
    "form": "str",
    "status": "str",
    "benchmark": "str",
    "preset": "str",
    "instances": "int",
    "workers_per_instance": "int",
    "placement": "str",
    "rule": {"name": "str", "version": "str", "window": "str", "counted": "str", "pruning": "str"},
    "members": [_MEMBER],
    "window": {"start": "num?", "stop": "num?"},
    "energy": record_io.ENERGY_SHAPE,
    "warnings": ["str"],
    "source": {"tool": "str", "tool_version": "str"},
}
_CHECK = compile_shape(_SCHEMA)


def validate(data: Any, path: Path | str) -> dict:
    """A decoded throughput record checked; one line naming the field otherwise."""
    path = Path(path)
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise UserError(f"{path}: not a throughput record ('kind' must be '{KIND}')")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise UserError(
            f"{path}: schema_version {data.get('schema_version')!r} is not supported "
            f"(this tool reads {SCHEMA_VERSION})"
        )
    _CHECK(data, "", path)
    if data["form"] not in FORMS:
        raise invalid(path, "form", f"one of {', '.join(FORMS)}", data["form"])
    if data["status"] not in STATUSES:
        raise invalid(path, "status", f"one of {', '.join(STATUSES)}", data["status"])
    if data["instances"] != len(data["members"]) or data["instances"] < 1:
        raise invalid(path, "instances", "the number of members (at least 1)", data["instances"])
    if [m["index"] for m in data["members"]] != list(range(data["instances"])):
        raise invalid(path, "members", "indexed 0 .. instances - 1 in order", data["members"])
    for member in data["members"]:
        run_dir = member["run_dir"]
        if run_dir is not None and (Path(run_dir).is_absolute() or ".." in Path(run_dir).parts):
            raise invalid(path, "members.run_dir", "a path inside the record's directory", run_dir)
    start, stop = data["window"]["start"], data["window"]["stop"]
    if start is not None and stop is not None and not stop > start:
        raise invalid(path, "window.stop", "after window.start", stop)
    record_io.check_energy(data["energy"], path)
    return data


def is_throughput(path: Path | str) -> bool:
    """Whether a file a user named is a throughput record: JSON whose top-level kind is
    KIND (a nested "kind" is not); any file that cannot be read so is left to the record
    loader to refuse."""
    try:  # a FIFO, a device or a loop is never opened to read (files.py checks its kind)
        data = record_io.parse_json(record_io.read_regular_file(path, "record"), path, "record")
    except (OSError, UserError):
        return False
    return isinstance(data, dict) and data.get("kind") == KIND


def load(path: Path | str) -> dict:
    path = Path(path)
    text = record_io.read_regular_file(path, "throughput record")
    return validate(record_io.parse_json(text, path, "throughput record"), path)


# ----------------------------------------------------------------------------- MLPerf logs


def mlperf_times(log: Path) -> tuple[float | None, float | None, str | None]:
    """(first run_start, last run_stop, its status) of an MLPerf log, in Unix seconds; None
    for what the log does not hold (a run killed before it, or no log at all)."""
    start = stop = status = None
    try:  # never a FIFO or a device: a record's directory is the user's
        with open_regular_file(log, "MLPerf log") as handle:
            lines = handle.read().decode("utf-8", "replace").splitlines()
    except (OSError, UserError):
        return None, None, None
    for line in lines:
        if not line.startswith(":::MLLOG "):
            continue
        try:
            entry = json.loads(line.removeprefix(":::MLLOG "))
        except (ValueError, RecursionError):
            continue  # a line cut by a kill: the rest of the log is still read
        if not _timed_event(entry):
            continue  # not a line this project's logger writes: left out, as a cut one is
        if entry["key"] == "run_start" and start is None:
            start = entry["time_ms"] / 1000
        elif entry["key"] == "run_stop":
            stop = entry["time_ms"] / 1000
            status = (entry.get("metadata") or {}).get("status")
            status = status if isinstance(status, str) else None
    return start, stop, status


def _timed_event(entry) -> bool:
    """An MLPerf log entry the importer can use, at a time in milliseconds a float holds (0
    to 1e16, past the year 300,000)."""
    return well_formed_event(entry) and 0 <= entry["time_ms"] < 1e16


def member_window(members: list[dict]) -> tuple[float | None, float | None]:
    """The window over every member's MLPerf log (see the module's doc)."""
    starts = [m["run_start"] for m in members if m["run_start"] is not None]
    stops = [m["run_stop"] for m in members if m["run_stop"] is not None]
    return (min(starts) if starts else None), (max(stops) if stops else None)


def read_member(parent: Path, member: dict) -> dict:
    """A member as its own files say: its record (None where it wrote none or it cannot be
    read, with the reason), and its MLPerf log's run_start and run_stop."""
    seen = {**member, "record": None, "problem": None, "run_start": None, "run_stop": None}
    if member["run_dir"] is None:
        seen["problem"] = f"no run directory ({member['ended']})"
        return seen
    run_dir = parent / member["run_dir"]
    seen["run_start"], seen["run_stop"], seen["log_status"] = mlperf_times(run_dir / MLPERF_LOG)
    try:
        seen["record"] = record_io.load(run_dir / RECORD_FILE)
    except UserError as error:
        seen["problem"] = f"no record ({member['ended']}): {error}"
    return seen


# ----------------------------------------------------------------------------- the score


@dataclass
class ThroughputScore:
    form: str
    benchmark: str
    instances: int
    counted: int
    window_s: float
    models_per_minute: float
    aggregate_flops: float
    aggregate_valid_flops: float
    average_watts: float | None
    valid_flops_per_watt: float | None
    energy_note: str
    members: list[dict] = field(default_factory=list)  # index, status, quality, counted, why
    rule: str = ""

    @property
    def rank_value(self) -> float:
        return self.models_per_minute

    def summary(self) -> str:
        return (
            f"{self.counted} of {self.instances} instance(s) reached the target in "
            f"{self.window_s:.1f} s: {self.models_per_minute:.3g} models/min"
        )


def layer_difference(records: list[dict]) -> str | None:
    """The first layer in which the members' records differ (their seeds, where they ran and
    how a fact was found apart: scoring.submission_key), as one line; None where they agree."""
    from hpcai500_tf.results.scoring import submission_key

    keys = [json.loads(submission_key(rec)) for rec in records]
    for key in keys:  # an ensemble member's own bootstrap sample is its seed's kind
        key[ensemble.SAMPLE_FIELD[0]].pop(ensemble.SAMPLE_FIELD[1], None)
    for layer in LAYER_IDS:
        values = [key[layer] for key in keys]
        if any(value != values[0] for value in values[1:]):
            other = next(i for i, value in enumerate(values) if value != values[0])
            names = sorted(
                name
                for name in set(values[0]) | set(values[other])
                if values[0].get(name) != values[other].get(name)
            )
            return (
                f"instances 0 and {other} differ in layer {layer} ({', '.join(names)}): "
                "not one submission"
            )
    return None


def score(path: Path | str, data: dict | None = None):
    """The throughput record at `path` scored from its members' files (an ensemble's:
    ensemble.score); one line where it cannot be (stopped, no member ran, members that
    differ in a layer)."""
    from hpcai500_tf import config
    from hpcai500_tf.results import scoring

    path = Path(path)
    data = load(path) if data is None else data
    if data["status"] != "completed":
        raise UserError(f"{path}: the instances were {data['status']}: no throughput to score")
    members = [read_member(path.parent, m) for m in data["members"]]
    records = [m["record"] for m in members if m["record"] is not None]
    if not records:
        raise UserError(f"{path}: no instance wrote a record: nothing to score")
    problem = layer_difference(records)
    if problem:
        raise UserError(f"{path}: {problem}")
    start, stop = member_window(members)
    if start is None or stop is None or not stop > start:
        raise UserError(
            f"{path}: the instances' MLPerf logs give no window (run_start to run_stop)"
        )
    benchmark = config.load_benchmark(data["benchmark"])
    if data["form"] == ensemble.FORM:
        return ensemble.score(path, data, members, (start, stop), benchmark)
    total = valid = 0.0
    shown = []
    for member in members:
        rec, why = member["record"], member["problem"]
        counted = False
        if rec is not None and rec["status"] != "completed":
            why = f"status {rec['status']}"
        elif rec is not None and not rec["quality"]["reached_target"]:
            why = f"missed the target ({rec['quality']['achieved']} < {rec['quality']['target']})"
        elif rec is not None:
            one = scoring.score(rec, benchmark)
            total += one.total_flops
            valid += one.total_flops * one.quality_factor
            counted = True
        quality = rec["quality"]["achieved"] if rec is not None else None
        shown.append(
            {"index": member["index"], "seed": member["seed"], "quality": quality,
             "status": rec["status"] if rec else "no record", "counted": counted, "why": why,
             "run_start": member["run_start"], "run_stop": member["run_stop"]}
        )  # fmt: skip
    window_s = stop - start
    counted = sum(m["counted"] for m in shown)
    watts, note = scoring.scored_power(data["energy"])
    per_watt = None if watts is None else valid / window_s / watts
    values = (counted / (window_s / 60), total / window_s, valid / window_s)
    if not all(math.isfinite(v) for v in values):
        raise UserError(f"{path}: the score is not a finite number (window {window_s:.3g} s)")
    return ThroughputScore(
        data["form"], data["benchmark"], data["instances"], counted, window_s, values[0],
        values[1], values[2], watts, per_watt, note, shown, data["rule"]["version"],
    )  # fmt: skip


@dataclass
class ThroughputRanking:
    form: str
    benchmark: str
    entries: list[tuple[str, ThroughputScore]]
    refused: list[tuple[str, list[str]]]


def member_refusals(path: Path | str, data: dict, level_name: str) -> list[str]:
    """What the ranking rules at `level_name` (scoring.refusal, the rules a time-to-quality
    record is ranked by) say against any member's record, each reason once."""
    from hpcai500_tf import config
    from hpcai500_tf.results import scoring

    benchmark, level = config.load_benchmark(data["benchmark"]), config.load_level(level_name)
    reasons: list[str] = []
    for member in data["members"]:
        rec = read_member(Path(path).parent, member)["record"]
        if rec is not None:
            found = scoring.refusal(
                rec, benchmark, level, result_needed=False,
                sample_allowed=data["form"] == ensemble.FORM,
            )  # fmt: skip
            reasons += [f"instance {member['index']}: {why}" for why in found]
    return list(dict.fromkeys(reasons))


def rank(
    paths: list[str], benchmark: str | None = None, level: str = "free"
) -> list[ThroughputRanking]:
    """One ranking per form and benchmark, by models per minute (an ensemble's: by Valid
    FLOPS); a record that cannot be
    scored, whose members the level's rules refuse, or of another benchmark than
    `benchmark`, is refused with its reasons in its form and benchmark's ranking."""
    groups: dict[tuple[str, str], ThroughputRanking] = {}
    for path in paths:
        data = load(path)
        key = (data["form"], data["benchmark"])
        ranking = groups.setdefault(key, ThroughputRanking(*key, [], []))
        if benchmark is not None and data["benchmark"] != benchmark:
            ranking.refused.append((path, [f"benchmark '{data['benchmark']}', not '{benchmark}'"]))
            continue
        try:
            one = score(path, data)
        except UserError as error:
            ranking.refused.append((path, [str(error)]))
            continue
        reasons = member_refusals(path, data, level)
        if reasons:
            ranking.refused.append((path, reasons))
        else:
            ranking.entries.append((path, one))
    rankings = [groups[key] for key in sorted(groups)]
    for ranking in rankings:
        ranking.entries.sort(key=lambda item: item[1].rank_value, reverse=True)
    return rankings
