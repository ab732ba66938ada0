"""What every framework's runner shares, without TensorFlow: the run's progress, the MLPerf
setup events, power sampling, the energy block and the record of a finished run.

The PyTorch reference runner (tools/torch_train.py) imports this module in a process that must
never load TensorFlow, so nothing here may import it, directly or through another module.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field

from hpcai500_tf import __version__, benchmark_layers
from hpcai500_tf import record as record_io
from hpcai500_tf.config import Setup, peak_learning_rate
from hpcai500_tf.energy import sampler as power
from hpcai500_tf.energy.meter_log import read_meter_log
from hpcai500_tf.energy.sources import discover
from hpcai500_tf.engine.mllog import MLLogger
from hpcai500_tf.errors import UserError

CONFIG_FILE = "config.json"
RECORD_FILE = "record.json"
MLPERF_LOG = "mlperf.log"
POWER_SAMPLES = "power-samples.csv"


def fingerprint(config: dict) -> str:
    """What must match for --resume: the whole resolved config."""
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class Progress:
    """Everything about a run's progress that a checkpoint must carry to resume it."""

    config_fingerprint: str
    epochs_done: int = 0
    examples: int = 0
    segments: list[dict] = field(default_factory=list)
    epochs: list[dict] = field(default_factory=list)
    curve: list[dict] = field(default_factory=list)
    init_start: float = 0.0
    run_start: float | None = None
    energy: list[list[dict]] = field(default_factory=list)  # per closed segment, per source

    def elapsed(self, now: float | None = None, open_segment: float | None = None) -> float:
        closed = sum(s["stop"] - s["start"] for s in self.segments)
        return closed + ((now or time.time()) - open_segment if open_segment else 0.0)


def _not_rankable(setup: Setup, workload, problem: dict) -> list[str]:
    reasons = []
    if not workload.measures_quality:
        reasons.append("random data: quality not measured (throughput only)")
    reasons += [f"data: {difference}" for difference in problem.get("data_differences", [])]
    for key, expected in setup.benchmark.problem().items():
        if problem[key] != expected:
            reasons.append(f"{key} is {problem[key]!r}, the benchmark's is {expected!r}")
    return reasons


def make_record(
    setup: Setup,
    layer_values: dict,
    workload,
    progress: Progress,
    flops: dict,
    status: str,
    warnings: list[str],
    artifacts: dict,
    energy: dict,
    framework: str = "tensorflow",
) -> dict:
    """The record of a finished (or stopped) run, from any framework's runner."""
    reasons = _not_rankable(setup, workload, layer_values["L9"])
    quality = record_io.quality_result(
        progress.curve, setup.training.target_quality, workload.measures_quality
    )
    if quality["measured"] and quality["achieved"] is None and status == "completed":
        status = "stopped"
        warnings.append("no evaluation produced a quality above 0")
    examples = quality["examples_to_quality"]
    run_stop = progress.segments[-1]["stop"] if progress.segments else time.time()
    return {
        "schema_version": record_io.SCHEMA_VERSION,
        "kind": record_io.KIND,
        "benchmark": setup.benchmark.name,
        "preset": setup.preset,
        "level": "free",
        "status": status,
        "rankable": not reasons,
        "not_rankable_reasons": reasons,
        "source": {
            "tool": "hpcai500-tf",
            "tool_version": __version__,
            "framework": framework,
            "imported_from": None,
        },
        "layers": layer_values,
        "config": setup.config,
        "timeline": {
            "init_start": progress.init_start,
            "run_start": progress.run_start or progress.init_start,
            "run_stop": max(run_stop, (progress.run_start or progress.init_start) + 1e-6),
            "segments": progress.segments,
            "epochs": progress.epochs,
        },
        "quality": {
            "metric": workload.quality_metric,
            "target": setup.training.target_quality,
            **quality,
            "curve": progress.curve,
        },
        "flops": {
            **flops,
            "total": None if examples is None else flops["per_example_training"] * examples,
        },
        "energy": energy,
        "warnings": warnings,
        "artifacts": artifacts,
    }


def log_setup(mllog: MLLogger, setup: Setup, global_batch: int, workload) -> None:
    """The MLPerf setup events every runner logs between init_start and init_stop."""
    t, o = setup.training, setup.optimizer
    mllog.event(
        "submission_benchmark",
        "resnet" if setup.benchmark.name == "image_classification" else setup.benchmark.name,
    )
    mllog.event("submission_division", "open")
    mllog.event("submission_org", "hpcai500-tf")
    mllog.event("submission_platform", benchmark_layers.hardware_layer()["summary"])
    mllog.event("submission_status", "research")
    mllog.event("cache_clear", True)
    mllog.event("seed", t.seed)
    mllog.event("global_batch_size", global_batch)
    mllog.event("train_samples", workload.train_examples)
    mllog.event("eval_samples", workload.eval_examples)
    mllog.event("gradient_accumulation_steps", 1)
    mllog.event("opt_name", o.name)
    prefix = "sgd_opt" if o.name == "sgd" else "lars_opt"
    mllog.event(f"{prefix}_base_learning_rate", peak_learning_rate(o, global_batch))
    mllog.event(f"{prefix}_momentum", o.momentum)
    mllog.event(f"{prefix}_weight_decay", o.weight_decay)
    mllog.event("opt_learning_rate_warmup_epochs", o.warmup_epochs)
    mllog.event("opt_learning_rate_schedule", o.schedule)
    mllog.event("model_bn_span", t.batch_per_replica)
    mllog.event("label_smoothing", o.label_smoothing)
    if o.name == "lars":
        mllog.event("lars_epsilon", 0.0)
        mllog.event("lars_eta", o.lars_eta)


def start_power_sampling(hz: float, view=None) -> tuple[power.PowerSampler | None, list[str]]:
    """Every power source here, sampled at `hz` (0: off); notes say what is missing and why."""
    if hz == 0:
        return None, ["power sampling was switched off (--power-hz 0)"]
    sources, notes = discover()
    if view:
        names = ", ".join(s.name for s in sources) or "none"
        view.message(f"power sources: {names}" + (f" at {hz:g} Hz" if sources else ""))
    return power.PowerSampler(sources, hz).start(), notes


def energy_result(
    progress: Progress,
    notes: list[str],
    hz: float,
    meter_log: str | None,
    other_workers: list[dict] = (),
) -> tuple[dict, list[str]]:
    """The record's energy block over all timed segments, with a node meter log if given and
    the other workers' nodes (their current segment) if any. Energy is post-processing: what
    fails here (or gives no finite number) is a warning and "not measured", never a lost run."""
    intervals = [(s["start"], s["stop"]) for s in progress.segments]
    interval_s = sum(stop - start for start, stop in intervals)
    try:
        block, warnings = _energy_block(
            progress, notes, hz, meter_log, other_workers, intervals, interval_s
        )
    except Exception as error:  # noqa: BLE001 - any failure here must not lose the run
        why, warnings = f"energy could not be computed ({error.__class__.__name__}: {error})", []
    else:
        try:
            record_io.dumps(block)  # the record's own writer refuses numbers that are not finite
            return block, warnings
        except ValueError:
            why = "the readings give a number that is not finite (a sensor or log out of range)"
    block, more = power.energy_block([], [*notes, why], interval_s, hz or None)
    return block, [*warnings, f"energy not measured: {why}", *more]


def _energy_block(progress, notes, hz, meter_log, other_workers, intervals, interval_s):
    measurements = power.combine_segments(progress.energy) + list(other_workers)
    warnings = []
    if meter_log:
        try:
            readings, warnings = read_meter_log(meter_log)
            measurements.append(power.meter_measurement(readings, intervals, meter_log))
        except UserError as error:
            warnings.append(f"meter log not used: {error}")
    if other_workers and meter_log:
        notes = [*notes, "the meter log is worker 0's node: the other nodes are not in it"]
    block, more = power.energy_block(measurements, notes, interval_s, hz or None)
    if meter_log:
        block["meter_log"] = str(meter_log)
    return block, warnings + more
