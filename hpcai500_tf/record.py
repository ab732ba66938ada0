"""The result record: one versioned JSON file per run, written atomically, validated on load.

A record holds everything needed to recompute the run's score and to judge whether two runs
are comparable. Scores themselves are never stored: `scoring` derives them on every read.
"""

from __future__ import annotations

import glob
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from hpcai500_tf.errors import UserError
from hpcai500_tf.files import MAX_FILE_BYTES, naming, read_regular_file  # noqa: F401 (re-exported)
from hpcai500_tf.layers import LAYER_IDS, LAYER_KEYS  # noqa: F401 (LAYER_KEYS re-exported)
from hpcai500_tf.validation import compile_shape, invalid, is_finite_number

SCHEMA_VERSION = 2  # 2: SPEC section 3's end-of-run reading, first crossing kept; FLOP basis
KIND = "hpcai500-record"
STATUSES = ("completed", "diverged", "stopped", "failed", "imported")

# The record's shape (see `validation` for the notation). Unknown extra keys are allowed
# (forward-compatible: a newer tool may add fields an older one reads past).
_CURVE_POINT = {"epoch": "num", "elapsed_s": "num", "examples": "int", "value": "num"}
_SCHEMA: dict[str, Any] = {
    "schema_version": "int",
    "kind": "str",
    "benchmark": "str",
    "preset": "str",
    "level": "str",
    "status": "str",
    "rankable": "bool",
    "not_rankable_reasons": ["str"],
    "source": {"tool": "str", "tool_version": "str", "framework": "str", "imported_from": "str?"},
    "layers": {layer: "dict" for layer in LAYER_IDS},
    "config": "dict",
    "timeline": {
        "init_start": "num",
        "run_start": "num",
        "run_stop": "num",
        "segments": [{"start": "num", "stop": "num"}],
        "epochs": [{"epoch": "int", "elapsed_s": "num", "examples": "int"}],
    },
    "quality": {
        "measured": "bool",
        "metric": "str",
        "target": "num",
        "achieved": "num?",
        "final": "num?",
        "reached_target": "bool",
        "time_to_quality_s": "num?",
        "examples_to_quality": "int?",
        "reading": "str",
        "first_crossing": "dict?",
        "curve": [_CURVE_POINT],
    },
    "flops": {
        "per_example_training": "num",
        "per_example_forward": "num?",
        "analytical_per_example_forward": "num?",
        "method": "str",
        "basis": "str",
        "counted_op_types": ["str"],
        "uncounted_op_types": ["str"],
        "total": "num?",
    },
    "energy": {
        "measured": "bool",
        "reason": "str?",
        "joules": "num?",
        "interval_s": "num?",
        "scope": "str?",
        "average_watts": "num?",
        "coverage": "num?",
        "sample_hz": "num?",
        "parts_measured": ["str"],
        "parts_not_measured": ["str"],
        "quality_flags": ["str"],
        "sources": ["dict"],
    },
    "warnings": ["str"],
    "artifacts": "dict",
}


ENERGY_SHAPE = _SCHEMA["energy"]  # a throughput record's energy block has it too


# Where a run ran, not what it ran on: two runs of one system on other nodes of a cluster (or
# other GPUs of a node) are the same submission, and comparing them changes no layer.
PLACEMENT_FIELDS = {("L3", "nodes"), ("L3", "gpu_assignment")}
# How a layer's value was found, not the value: records that found one fact in other ways (or
# older ones that do not say) describe the same system.
METHOD_FIELDS = {("L4", "onednn_method")}

FLOAT_RANGE = 2**1024  # the first integer a float cannot hold (float() overflows)


def checked_integer(text: str) -> int:
    """json.loads(parse_int=...): an integer beyond float range is refused where it is read,
    not where arithmetic on it overflows later."""
    value = int(text)
    if abs(value) >= FLOAT_RANGE:
        raise ValueError(f"an integer of {len(text)} digits is beyond the range of a float")
    return value


def reject_constant(name: str):
    """json.loads(parse_constant=...): NaN and Infinity are not JSON."""
    raise ValueError(f"{name} is not JSON")


_CHECK_RECORD = compile_shape(_SCHEMA)
_CHECK_CURVE_POINT = compile_shape(_CURVE_POINT)


def _check_values(record: dict, path: Path) -> None:
    """What the schema's types cannot say: ranges, and fields that must agree."""
    if record["status"] not in STATUSES:
        raise invalid(path, "status", f"one of {', '.join(STATUSES)}", record["status"])
    needs_result = _check_quality(record, path)
    _check_timeline(record, needs_result, path)
    _check_flops(record, path)
    check_energy(record["energy"], path)


def _check_quality(record: dict, path: Path) -> bool:
    """The quality block against itself and the problem (L9); returns whether the record
    must carry a scored result."""
    quality = record["quality"]
    # A completed run that measured quality must carry its result; a diverged or stopped run,
    # or a throughput-only run, may leave it out (and cannot be scored).
    needs_result = quality["measured"] and record["status"] in ("completed", "imported")
    result_fields = ("achieved", "final", "time_to_quality_s", "examples_to_quality")
    for key in result_fields:
        if needs_result and quality[key] is None:
            raise invalid(
                path, f"quality.{key}", "set for a completed run that measured quality", None
            )
    for key in ("target", "achieved", "final"):
        if quality[key] is not None and not 0 < quality[key] <= 1:
            raise invalid(path, f"quality.{key}", "in (0, 1]", quality[key])
    _check_problem(quality, record["layers"]["L9"], path)
    if quality["achieved"] is not None and quality["reached_target"] != (
        quality["achieved"] >= quality["target"]
    ):
        raise invalid(
            path,
            "quality.reached_target",
            "whether quality.achieved is at or above quality.target",
            quality["reached_target"],
        )
    crossing = quality["first_crossing"]
    if crossing is not None:
        _CHECK_CURVE_POINT(crossing, "quality.first_crossing", path)
        if crossing["value"] < quality["target"]:
            raise invalid(
                path, "quality.first_crossing.value", "at or above quality.target", crossing
            )
    _check_ordered(quality["curve"], "quality.curve", path)
    for index, point in enumerate(quality["curve"]):
        if not 0 <= point["value"] <= 1:
            raise invalid(path, f"quality.curve[{index}].value", "in [0, 1]", point["value"])
    if quality["time_to_quality_s"] is not None and quality["time_to_quality_s"] <= 0:
        raise invalid(
            path, "quality.time_to_quality_s", "> 0 seconds", quality["time_to_quality_s"]
        )
    if quality["examples_to_quality"] is not None and quality["examples_to_quality"] <= 0:
        raise invalid(path, "quality.examples_to_quality", "> 0", quality["examples_to_quality"])
    if needs_result:
        _check_reading(quality, path)
    return needs_result


def _check_problem(quality: dict, problem: dict, path: Path) -> None:
    """One target and one metric: the problem's (layers.L9)."""
    check_data_differences(problem, path)
    for problem_key, key in (("target_quality", "target"), ("quality_metric", "metric")):
        if problem.get(problem_key) != quality[key]:
            stated = f"layers.L9.{problem_key} = {problem.get(problem_key)!r}"
            raise invalid(path, f"quality.{key}", f"the problem's {key} ({stated})", quality[key])


def check_data_differences(problem: dict, path: Path, where: str = "layers.L9") -> None:
    """L9's data_differences, where stated, are a list of words (each a reason a result is
    not rankable)."""
    differences = problem.get("data_differences", [])
    if not isinstance(differences, list) or not all(isinstance(d, str) for d in differences):
        raise invalid(path, f"{where}.data_differences", "a list of strings", differences)


def _check_reading(quality: dict, path: Path) -> None:
    """A scored result is the reading of the last evaluation (SPEC section 3)."""
    if not quality["curve"]:
        raise invalid(path, "quality.curve", "at least one evaluation for a scored run", [])
    end = quality["curve"][-1]
    for key, point_key in (
        ("achieved", "value"),
        ("time_to_quality_s", "elapsed_s"),
        ("examples_to_quality", "examples"),
    ):
        if quality[key] != end[point_key]:
            raise invalid(
                path,
                f"quality.{key}",
                f"the last evaluation's {point_key} ({end[point_key]!r}: the score's reading)",
                quality[key],
            )


def _check_timeline(record: dict, needs_result: bool, path: Path) -> None:
    """Segments in order, epochs never going backwards, the result within the timed run."""
    timeline = record["timeline"]
    if timeline["run_stop"] <= timeline["run_start"]:
        raise invalid(path, "timeline.run_stop", "after timeline.run_start", timeline["run_stop"])
    for index, segment in enumerate(timeline["segments"]):
        if segment["stop"] <= segment["start"]:
            raise invalid(
                path, f"timeline.segments[{index}].stop", "after its start", segment["stop"]
            )
    if needs_result and not timeline["segments"]:
        raise invalid(path, "timeline.segments", "at least one timed segment for a scored run", [])
    _check_ordered(timeline["epochs"], "timeline.epochs", path)
    for index, epoch in enumerate(timeline["epochs"]):
        seconds = epoch.get("seconds", 0.0)
        if not is_finite_number(seconds) or seconds < 0:
            raise invalid(
                path, f"timeline.epochs[{index}].seconds", "a finite number >= 0", seconds
            )
    run_s = sum(s["stop"] - s["start"] for s in timeline["segments"])
    ttq = record["quality"]["time_to_quality_s"]
    if ttq is not None and timeline["segments"] and ttq > run_s * (1 + 1e-9) + 1e-6:
        raise invalid(
            path, "quality.time_to_quality_s", f"within the run's {run_s:.6g} timed seconds", ttq
        )


def _check_flops(record: dict, path: Path) -> None:
    """A known basis, a positive count, and the total the count and the examples give."""
    flops = record["flops"]
    if flops["basis"] not in FLOP_BASES:
        raise invalid(path, "flops.basis", f"one of {', '.join(FLOP_BASES)}", flops["basis"])
    if flops["per_example_training"] <= 0:
        raise invalid(path, "flops.per_example_training", "> 0", flops["per_example_training"])
    examples = record["quality"]["examples_to_quality"]
    expected_total = None if examples is None else flops["per_example_training"] * examples
    if expected_total is None and flops["total"] is not None:
        raise invalid(
            path, "flops.total", "null when quality.examples_to_quality is null", flops["total"]
        )
    if expected_total is not None and (
        flops["total"] is None or not math.isclose(flops["total"], expected_total, rel_tol=1e-6)
    ):
        raise invalid(
            path,
            "flops.total",
            f"flops.per_example_training x quality.examples_to_quality = {expected_total:.6g}",
            flops["total"],
        )


def check_energy(energy: dict, path: Path) -> None:
    """Measured energy is positive and scoped; energy not measured says why (a record's, a
    throughput record's: ENERGY_SHAPE)."""
    if energy["measured"]:
        for key in ("joules", "interval_s", "average_watts", "coverage"):
            if energy[key] is None or energy[key] <= 0:
                raise invalid(
                    path, f"energy.{key}", "> 0 when energy.measured is true", energy[key]
                )
        if energy["coverage"] > 1 + 1e-9:
            raise invalid(
                path, "energy.coverage", "a fraction of the run in (0, 1]", energy["coverage"]
            )
        if not energy["scope"]:
            raise invalid(path, "energy.scope", "set when energy.measured is true", energy["scope"])
    elif not energy["reason"]:
        raise invalid(
            path, "energy.reason", "a reason when energy.measured is false", energy["reason"]
        )
    if energy["sample_hz"] is not None and energy["sample_hz"] <= 0:
        raise invalid(path, "energy.sample_hz", "> 0 or null", energy["sample_hz"])


def _check_ordered(points: list[dict], where: str, path: Path) -> None:
    """Epochs, elapsed times and example counts never go backwards, and are not negative."""
    epoch = elapsed = examples = 0
    for index, point in enumerate(points):
        if point["epoch"] < epoch or point["elapsed_s"] < elapsed or point["examples"] < examples:
            for key, floor in (("epoch", epoch), ("elapsed_s", elapsed), ("examples", examples)):
                if point[key] < floor:
                    expected = ">= 0" if index == 0 else f">= the previous entry's ({floor})"
                    raise invalid(path, f"{where}[{index}].{key}", expected, point[key])
        epoch, elapsed, examples = point["epoch"], point["elapsed_s"], point["examples"]


def validate(record: Any, path: Path | str = "<record>") -> dict:
    """Check a decoded record; raise UserError naming the file, the field and what was expected."""
    path = Path(path)
    if not isinstance(record, dict):
        raise UserError(f"{path}: a record must be a JSON object")
    if record.get("kind") != KIND:
        raise UserError(f"{path}: not an hpcai500 record ('kind' must be '{KIND}')")
    version = record.get("schema_version")
    if version == 1:
        record = migrate_from_v1(record, path)
    elif version != SCHEMA_VERSION:
        raise UserError(
            f"{path}: schema_version {version!r} is not supported "
            f"(this tool reads 1 and {SCHEMA_VERSION})"
        )
    _CHECK_RECORD(record, "", path)
    _check_values(record, path)
    return record


def parse_json(text: str, path: Path | str, what: str) -> Any:
    """JSON with one clear line for what Python's parser cannot take (deep nesting, integers
    of thousands of digits, NaN or Infinity, which JSON does not have)."""
    try:
        return json.loads(text, parse_constant=reject_constant, parse_int=checked_integer)
    except json.JSONDecodeError as error:
        raise UserError(f"{path}: not JSON ({error.msg} at line {error.lineno})") from None
    except RecursionError:
        raise UserError(f"{path}: {what} nested too deeply") from None
    except ValueError as error:
        raise UserError(f"{path}: not a valid {what} ({error})") from None


def load(path: Path | str) -> dict:
    """Read and validate one record file."""
    path = Path(path)
    return validate(parse_json(read_regular_file(path, "record file"), path, "record"), path)


def dumps(data: Any) -> str:
    """JSON as the project writes it; a non-finite number is a defect, never written."""
    try:
        return json.dumps(data, indent=2, allow_nan=False) + "\n"
    except ValueError as error:
        raise ValueError(f"refusing to write a non-finite number as JSON ({error})") from None


def remove_orphans(path: Path) -> None:
    """The temporary files a killed write of `path` left beside it (see write_atomic)."""
    for orphan in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        if orphan.is_file() and not orphan.is_symlink():
            orphan.unlink(missing_ok=True)


def write_atomic(path: Path | str, data: Any, *, overwrite: bool = False) -> Path:
    """Write JSON through a temp file and rename, so a crash never leaves half a file."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise UserError(f"{path}: already exists; refusing to overwrite it")
    path.parent.mkdir(parents=True, exist_ok=True)
    text = dumps(data)
    remove_orphans(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; a record is an ordinary file
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as error:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(error, OSError) and error.filename is None:  # a full disk's write
            raise naming(error, path) from None
        raise
    return path


def _umask() -> int:
    """The process's umask, read without changing it where Linux reports it (os.umask would
    set it for a moment, under every thread)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask


def save(path: Path | str, record: dict, *, overwrite: bool = False) -> Path:
    """Validate, then write atomically: an invalid record is never written, nor one whose
    counts no reader takes back."""
    validate(record, path)
    _check_counts(record, Path(path))
    return write_atomic(path, record, overwrite=overwrite)


def _check_counts(data: Any, path: Path) -> None:
    """Every integer of a record within float range, as `load` reads them (checked_integer):
    a count of hundreds of digits would be written and then refused by every reader."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        name, value = stack.pop()
        if isinstance(value, dict):
            stack += [(f"{name}.{key}" if name else str(key), v) for key, v in value.items()]
        elif isinstance(value, list):
            stack += [(f"{name}[{index}]", v) for index, v in enumerate(value)]
        elif isinstance(value, int) and abs(value) >= FLOAT_RANGE:
            digits = math.floor(math.log10(abs(value))) + 1  # str() of it may be refused
            raise UserError(
                f"{path}: '{name}' must be an integer within the range of a float, got one of "
                f"about {digits} digits"
            )


READING = (
    "end of the run: the quality of the last evaluation, at the end of the last required epoch, "
    "and the time to it (SPEC section 3)"
)


def energy_not_measured(
    reason: str, *, interval_s: float | None = None, sources: list[dict] = (), **context
) -> dict:
    """The energy block of a record whose energy was not measured, and why: a source with no
    power readings at all (an imported log), or a run whose sources gave none in scope.
    `sources` are the measurements that were taken (none usable); `context` adds what the
    sampler records beside them (the requested rate, its notes)."""
    return {
        "interval_s": interval_s,
        **context,
        "sources": list(sources),
        "measured": False,
        "reason": reason,
        **dict.fromkeys(("joules", "scope", "average_watts", "coverage", "sample_hz")),
        **{key: [] for key in ("parts_measured", "parts_not_measured", "quality_flags")},
    }


def quality_result(curve: list[dict], target: float, measured: bool) -> dict:
    """The score's reading (SPEC section 3): the run is timed to its last evaluation, which
    ends the last required epoch, and scored by the quality it ends with. The first
    evaluation at or above target (what MLPerf would time) is kept beside it."""
    result = {
        "measured": measured,
        "reached_target": False,
        "achieved": None,
        "final": None,
        "time_to_quality_s": None,
        "examples_to_quality": None,
        "reading": READING,
        "first_crossing": None,
    }
    if not measured or not curve:
        return result
    end = curve[-1]
    first = next((p for p in curve if p["value"] >= target), None)
    result.update(
        reached_target=end["value"] >= target,
        achieved=end["value"] or None,
        final=end["value"] or None,
        time_to_quality_s=end["elapsed_s"],
        examples_to_quality=end["examples"],
        first_crossing=None if first is None else dict(first),
    )
    return result


def migrate_from_v1(record: dict, path: Path | str) -> dict:
    """A schema-1 record in schema 2: re-read at the end of the run (schema 1 timed the first
    evaluation at or above target) and name its FLOP basis. The file is not changed."""
    try:
        migrated = json.loads(json.dumps(record))
        quality, flops = migrated["quality"], migrated["flops"]
        curve = quality["curve"]
        measured = quality["measured"]
        quality.update(quality_result(curve, quality["target"], measured))
        examples = quality["examples_to_quality"]
        if examples is not None:
            flops["total"] = flops["per_example_training"] * examples
        flops["basis"] = basis_from_method(flops["method"], migrated["source"]["framework"])
    except (KeyError, TypeError, AttributeError) as error:
        raise UserError(f"{path}: a schema-1 record missing what it needs ({error!r})") from None
    migrated["schema_version"] = SCHEMA_VERSION
    migrated.setdefault("warnings", []).append(
        "read from schema 1: re-scored at the end of the run (schema 1 timed the first "
        "evaluation at or above target)"
    )
    return migrated


FLOP_BASES = {
    "tensorflow-profiler": "TensorFlow's op statistics over the train step that ran",
    "pytorch-flop-counter": "torch.utils.flop_counter over one train step (no update)",
    "analytical-resnet50-v1": "ResNet-50 v1: 3.86 GMACs forward x 2 x 3 = 23.16 GFLOPs/image",
    "analytical-resnet50-v1.5": "ResNet-50 v1.5 at 224x224: 8.18 GFLOPs forward x 3 = 24.54 GFLOPs",
    "submitter": "a count given by the submitter with an imported log",
}


def basis_from_method(method: str, framework: str) -> str:
    """The FLOP basis a schema-1 record's count was made on, from its method text."""
    if method.startswith("TensorFlow registered op statistics"):
        return "tensorflow-profiler"
    if method.startswith("torch.utils.flop_counter"):
        return "pytorch-flop-counter"
    if method.startswith("analytical: ResNet-50 (v1)"):
        return "analytical-resnet50-v1"
    return "submitter"


def training_throughput(record: dict) -> float | None:
    """Examples per second of training: the epochs' own training time where the record has
    it (evaluation and checkpoints left out), else the whole timed run (imported records)."""
    epochs = record["timeline"]["epochs"]
    if not epochs:
        return None
    if all("seconds" in epoch for epoch in epochs):
        seconds = sum(epoch["seconds"] for epoch in epochs)
    else:
        seconds = sum(s["stop"] - s["start"] for s in record["timeline"]["segments"])
    if not seconds > 0:
        return None
    rate = epochs[-1]["examples"] / seconds
    return rate if math.isfinite(rate) else None  # e.g. 5e-324 s: no throughput to show
