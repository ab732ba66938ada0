"""A record from an MLPerf training log (`:::MLLOG` lines) written by any framework.

The log gives the timeline, the quality curve, the global batch, the epoch size and the
hyperparameters. It does not carry the hardware, the framework or the FLOPs per example:
those come from the command line or a sidecar file (JSON or TOML):

    framework = "pytorch"            # required (or --framework)
    framework_version = "2.13.0"
    flops_per_example = 2.4e10       # required (or --flops-per-example): training FLOPs
    flops_method = "how they were counted"
    flop_basis = "submitter"         # or tensorflow-profiler, pytorch-flop-counter,
                                     # analytical-resnet50-v1 (record.FLOP_BASES)
    preset = "reference"
    target_quality = 0.763           # default: the benchmark's
    epochs = 90                      # the epoch budget (L9); default: the benchmark's
    dataset = "imagenet-1k"          # default: the benchmark's
    [layers.L1]                      # any whole layer, e.g. from `hpcai500-tf sysinfo --json`
    summary = "8 x NVIDIA H100"      # (replaces what the log suggests for that layer)

Timestamps are the log's own (`time_ms`); examples are epochs x `train_samples`. A whole
MLPerf results repository, whose system descriptions say the rest: `mlperf_tree`.
"""

from __future__ import annotations

import datetime
import json
import tomllib
from pathlib import Path

from hpcai500_tf import __version__, config
from hpcai500_tf import record as record_io
from hpcai500_tf.config import LAYER_IDS, Benchmark
from hpcai500_tf.errors import UserError
from hpcai500_tf.mlperf.mllog import benchmark_from_mlperf
from hpcai500_tf.results import record_builder
from hpcai500_tf.validation import compile_shape, invalid, is_finite_number

PREFIX = ":::MLLOG "
LINE = "_line"  # where read_log keeps an event's line number in the log
REQUIRED = {
    "run_start": "the start of the timed run",
    "run_stop": "the end of the timed run",
    "global_batch_size": "the global batch",
    "train_samples": "the epoch size (examples per epoch)",
    "eval_accuracy": "the quality curve",
}
SIDECAR_SHAPE = {  # every key optional; others refused (see `validation` for the notation)
    "framework": "str",
    "framework_version": "str",
    "flops_per_example": "num",
    "flops_method": "str",
    "flop_basis": "str",
    "preset": "str",
    "target_quality": "num",
    "epochs": "int",
    "dataset": "str",
    "benchmark": "str",
    "layers": dict.fromkeys(LAYER_IDS, "dict"),
}
_CHECK_SIDECAR = compile_shape(SIDECAR_SHAPE, closed=True, optional=True)


def read_log(path: Path) -> tuple[list[dict], list[str]]:
    """The log's events in order (each with its line number under LINE), and warnings for
    lines that could not be read."""
    text = record_io.read_regular_file(path, "MLPerf log")
    events, bad = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if PREFIX not in line:
            continue
        try:
            event = json.loads(
                line.split(PREFIX, 1)[1],
                parse_constant=record_io.reject_constant,
                parse_int=record_io.checked_integer,
            )
        except (ValueError, RecursionError):
            bad.append(number)
            continue
        if well_formed_event(event):
            event[LINE] = number
            events.append(event)
        else:
            bad.append(number)
    if not events:
        raise UserError(f"{path}: no ':::MLLOG' lines: not an MLPerf log")
    warnings = (
        [f"{path}: {len(bad)} unreadable :::MLLOG line(s) skipped (line {bad[0]})"] if bad else []
    )
    return events, warnings


def well_formed_event(event) -> bool:
    """An event this importer can use: a string key, a finite time, metadata an object."""
    return (
        isinstance(event, dict)
        and isinstance(event.get("key"), str)
        and is_finite_number(event.get("time_ms"))
        and isinstance(event.get("metadata", {}) or {}, dict)
    )


def read_sidecar(path: str | None) -> dict:
    """What a sidecar file (JSON, or TOML by its suffix) states: keys of SIDECAR_SHAPE only,
    each of its type and in its range; {} without a file."""
    if path is None:
        return {}
    path = Path(path)
    text = record_io.read_regular_file(path, "sidecar file")
    if path.suffix == ".toml":
        try:
            data = tomllib.loads(text)
        except (tomllib.TOMLDecodeError, RecursionError, ValueError) as error:
            raise UserError(f"{path}: not a readable TOML sidecar ({error})") from None
    else:
        data = record_io.parse_json(text, path, "sidecar")
    if not isinstance(data, dict):
        raise UserError(f"{path}: a sidecar must be an object of keys")
    _json_values(data, path)
    _CHECK_SIDECAR(data, "", path)
    record_io.check_data_differences(data.get("layers", {}).get("L9", {}), path)
    for key, words, within in (
        # a target below 0.001 makes (quality / target)^n overflow: refused here, not at scoring
        ("target_quality", "in [0.001, 1]", lambda value: 1e-3 <= value <= 1),
        ("epochs", "in 1..10000", lambda value: 0 < value <= 10_000),
        ("flops_per_example", "in (0, 1e18)", lambda value: 0 < value < 1e18),
    ):
        if key in data and not within(data[key]):
            raise invalid(path, key, words, data[key])
    return data


def _json_values(data, path: Path, key: str = "") -> None:
    """Refuse what a record (JSON) cannot carry: TOML dates and times, integers beyond float
    range; named by key."""
    if isinstance(data, dict):
        for name, value in data.items():
            _json_values(value, path, f"{key}.{name}" if key else str(name))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            _json_values(value, path, f"{key}[{index}]")
    elif isinstance(data, datetime.date | datetime.time):  # datetime is a date
        raise UserError(
            f"{path}: '{key}' is a TOML date or time ({data}); a sidecar takes strings and "
            "numbers: quote it"
        )
    elif isinstance(data, int) and abs(data) >= record_io.FLOAT_RANGE:
        raise UserError(f"{path}: '{key}' is an integer beyond the range of a float")


def _first(events: list[dict], key: str) -> dict | None:
    return next((e for e in events if e["key"] == key), None)


def _value(events: list[dict], key: str):
    """The value of the first event of `key`, or None."""
    event = _first(events, key)
    return None if event is None else event.get("value")


def _seconds(event: dict) -> float:
    return float(event["time_ms"]) / 1000


def build_record(
    log_path: str, sidecar: dict, benchmark_name: str | None = None
) -> tuple[dict, list[str]]:
    """The record of an MLPerf log (see the module's doc for what else it needs)."""
    path = Path(log_path)
    events, warnings = read_log(path)
    return record_from_events(events, warnings, path, sidecar, benchmark_name)


def record_from_events(
    events: list[dict],
    warnings: list[str],
    path: Path,
    sidecar: dict,
    benchmark_name: str | None = None,
    record_config: dict | None = None,
    flops: dict | None = None,
) -> tuple[dict, list[str]]:
    """The record of a log's events; `record_config` is what the record keeps of how it was
    imported (default: the log's path and the sidecar), `flops` the count without its total
    (default: the sidecar's flops_per_example, method and basis)."""
    _require(events, sidecar, path)
    benchmark = config.load_benchmark(_benchmark_name(events, sidecar, benchmark_name, path))
    timeline, curve, global_batch = _timeline_and_curve(events, path)
    layers = _layers(events, sidecar, benchmark, global_batch, path)
    status_value = (_first(events, "run_stop").get("metadata") or {}).get("status", "success")
    status = "imported" if status_value == "success" else "stopped"
    if status == "stopped":
        warnings.append(f"the log's run_stop says '{status_value}'")
    record = record_builder.build_record(
        benchmark,
        preset=sidecar.get("preset", "imported"),
        status=status,
        tool=f"hpcai500-tf import-mlperf {__version__}",
        framework=sidecar["framework"],
        imported_from=str(path),
        layers=layers,
        config=record_config or {"imported_from": str(path), "sidecar": sidecar},
        timeline=timeline,
        curve=curve,
        metric=benchmark.quality_metric,
        target=float(layers["L9"]["target_quality"]),
        measured=True,
        flops=flops
        or {
            "per_example_training": float(sidecar["flops_per_example"]),
            "per_example_forward": None,
            "analytical_per_example_forward": None,
            "method": sidecar.get("flops_method", "given by the submitter with the log"),
            "basis": sidecar.get("flop_basis", "submitter"),
            "counted_op_types": [],
            "uncounted_op_types": [],
        },
        energy=record_io.energy_not_measured("an MLPerf training log carries no power readings"),
        warnings=warnings,
        artifacts={"mlperf_log": str(path)},
        trained_epochs=trained_epochs(timeline, curve),
    )
    record_io.validate(record, path)  # what the log says wrong is named by the log's path
    return record, warnings


def trained_epochs(timeline: dict, curve: list[dict]) -> float:
    """The last epoch the log ended or evaluated."""
    return max([e["epoch"] for e in timeline["epochs"]] + [p["epoch"] for p in curve], default=0)


def _require(events: list[dict], sidecar: dict, path: Path) -> None:
    """The events every record needs, and what the log cannot say: the framework and the
    FLOPs per example."""
    keys = {e["key"] for e in events}
    missing = [key for key in REQUIRED if key not in keys]
    if missing:
        needed = "; ".join(f"{key} ({REQUIRED[key]})" for key in missing)
        raise UserError(f"{path}: the log lacks keys the record needs: {needed}")
    for key, what in (("framework", "--framework"), ("flops_per_example", "--flops-per-example")):
        if key not in sidecar:
            raise UserError(
                f"{path}: the log does not give the {key.replace('_', ' ')}: "
                f"pass {what} or '{key}' in a sidecar"
            )
    flops_given = sidecar["flops_per_example"]
    if not is_finite_number(flops_given) or not 0 < flops_given < 1e18:
        raise UserError(f"flops per example must be in (0, 1e18), got {flops_given!r}")


def _benchmark_name(events: list[dict], sidecar: dict, given: str | None, path: Path) -> str:
    """The benchmark: --benchmark, else the sidecar's, else the log's submission_benchmark."""
    name = given or sidecar.get("benchmark")
    submitted = _first(events, "submission_benchmark")
    if name is None and submitted is not None:
        name = benchmark_from_mlperf(str(submitted.get("value")))
    if name is None:
        raise UserError(f"{path}: the log names no benchmark: give --benchmark")
    return name


def _timeline_and_curve(events: list[dict], path: Path) -> tuple[dict, list[dict], int]:
    """The timed run, its epochs and its evaluations (examples are epochs x train_samples),
    and the global batch."""
    run_start = _seconds(_first(events, "run_start"))
    run_stop = _seconds(_first(events, "run_stop"))
    if run_stop <= run_start:
        raise UserError(f"{path}: run_stop is not after run_start")
    epoch_size, global_batch = _value(events, "train_samples"), _value(events, "global_batch_size")
    for key, number in (("train_samples", epoch_size), ("global_batch_size", global_batch)):
        if isinstance(number, bool) or not isinstance(number, int) or not 0 < number < 1e12:
            raise UserError(
                f"{path}: '{key}' must be a positive integer below 1e12, got {number!r:.80}"
            )
    curve = []
    for event in (e for e in events if e["key"] == "eval_accuracy"):
        accuracy = event.get("value")
        if (
            isinstance(accuracy, bool)
            or not isinstance(accuracy, int | float)
            or not 0 <= accuracy <= 1
        ):
            raise UserError(f"{path}: eval_accuracy {accuracy!r} is not a fraction in [0, 1]")
        epoch = epoch_of(event, path)
        curve.append(
            {
                "epoch": epoch,
                "elapsed_s": _seconds(event) - run_start,
                "examples": int(round(epoch * epoch_size)),
                "value": float(accuracy),
            }
        )
    epochs = [
        {
            "epoch": int(epoch_of(e, path)),
            "elapsed_s": _seconds(e) - run_start,
            "examples": int(epoch_of(e, path)) * epoch_size,
        }
        for e in events
        if e["key"] == "epoch_stop"
    ]
    init = _first(events, "init_start")
    timeline = {
        "init_start": _seconds(init) if init else run_start,
        "run_start": run_start,
        "run_stop": run_stop,
        "segments": [{"start": run_start, "stop": run_stop}],
        "epochs": epochs,
    }
    return timeline, curve, global_batch


def epoch_of(event: dict, path: Path) -> float:
    """The epoch an epoch_stop or eval_accuracy line states (metadata.epoch_num)."""
    metadata = event.get("metadata") or {}
    epoch = metadata.get("epoch_num", metadata.get("epoch_count"))
    if not is_finite_number(epoch) or not 0 <= epoch <= 10_000:
        raise UserError(
            f"{path}: an '{event['key']}' line has no metadata.epoch_num in 0..10000 "
            f"(got {epoch!r:.80})"
        )
    return epoch


def first_values(events: list[dict]) -> dict:
    """Each key's first value, in one pass (linear in the log)."""
    values: dict = {}
    for event in events:
        values.setdefault(event["key"], event.get("value"))
    return values


def log_hyperparameters(events: list[dict]) -> dict:
    """L8 as the log states it: the optimizer's keys (opt_*, sgd_opt_*, lars_*), the seed and
    label smoothing, each key's first value."""
    values = first_values(events)
    return {
        key: values[key]
        for key in sorted(values)
        if key.startswith(("opt_", "sgd_opt", "lars_opt", "lars_"))
        or key in ("seed", "label_smoothing")
    }


def _layers(
    events: list[dict], sidecar: dict, benchmark: Benchmark, global_batch: int, path: Path
) -> dict:
    """What the log suggests for each layer, replaced by any layer the sidecar states; the
    problem (L9) carries the one target and the benchmark's metric."""
    problem = {
        "dataset": sidecar.get("dataset", benchmark.dataset),
        "quality_metric": benchmark.quality_metric,
        "target_quality": float(sidecar.get("target_quality", benchmark.target_quality)),
        "epochs": sidecar.get("epochs", benchmark.epochs),
    }
    layers = {
        "L1": {"summary": _value(events, "submission_platform")},
        "L2": {},
        "L3": {},
        "L4": {},
        "L5": {
            "framework": sidecar["framework"],
            "framework_version": sidecar.get("framework_version"),
        },
        "L6": {"parallelism": "data_parallel", "synchronous": True, "global_batch": global_batch},
        "L7": {},
        "L8": log_hyperparameters(events),
        "L9": problem,
    }
    layers |= sidecar.get("layers", {})  # the submitter's statement replaces what the log says
    # One target: the problem's (L9), whichever way the sidecar gave it.
    target = layers["L9"].get("target_quality")
    if isinstance(target, bool) or not isinstance(target, int | float) or not 0 < target <= 1:
        raise UserError(f"{path}: the target quality must be a fraction in (0, 1], got {target!r}")
    layers["L9"] = {**layers["L9"], "quality_metric": benchmark.quality_metric}
    return layers
