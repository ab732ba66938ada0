"""What every framework's runner shares, without TensorFlow: the run's progress, the MLPerf
setup events, power sampling, the energy block and the record of a finished run.

The PyTorch runner (hpcai500_tf/pytorch/train.py) imports this module in a process that must
never load TensorFlow, so nothing here may import it, directly or through another module.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field

from hpcai500_tf import benchmark_layers
from hpcai500_tf import record as record_io
from hpcai500_tf.config import Setup, peak_learning_rate
from hpcai500_tf.energy import sampler as power
from hpcai500_tf.energy.meter_log import read_meter_log
from hpcai500_tf.energy.sources import discover
from hpcai500_tf.errors import UserError
from hpcai500_tf.mlperf.mllog import MLLogger, mlperf_benchmark_name
from hpcai500_tf.results.record_builder import build_record

MIN_AVERAGE_WATTS = 1e-3  # an average power below this is a sensor or a log out of range


class Diverged(Exception):
    """The loss became NaN or Inf: the run's status is `diverged`, on every framework."""


def diverged(value: float, epoch: int, step: int) -> Diverged:
    """What a run whose loss became `value` at `step` of `epoch` (both from 1) says."""
    return Diverged(f"loss became {value} in epoch {epoch}, step {step}")


def data_failed(reason: object) -> tuple[str, str]:
    """(status, warning) of a run whose input data failed mid-run, on every framework."""
    return "failed", f"the input data failed mid-run: {reason}"


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
    checkpoints: list[dict] = field(default_factory=list)  # epoch, elapsed_s, write_s of each
    batches_done: int = 0  # batches done in epoch epochs_done + 1 (a stop mid-epoch)

    def elapsed(self, now: float | None = None, open_segment: float | None = None) -> float:
        closed = sum(s["stop"] - s["start"] for s in self.segments)
        return closed + ((now or time.time()) - open_segment if open_segment else 0.0)


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
    run_start = progress.run_start or progress.init_start
    run_stop = progress.segments[-1]["stop"] if progress.segments else time.time()
    return build_record(
        setup.benchmark,
        preset=setup.preset,
        status=status,
        tool="hpcai500-tf",
        framework=framework,
        layers=layer_values,
        config=setup.config,
        timeline={
            "init_start": progress.init_start,
            "run_start": run_start,
            "run_stop": max(run_stop, run_start + 1e-6),
            "segments": progress.segments,
            "epochs": progress.epochs,
        },
        curve=progress.curve,
        metric=workload.quality_metric,
        target=setup.training.target_quality,
        measured=workload.measures_quality,
        flops=flops,
        energy=energy,
        warnings=warnings,
        artifacts=artifacts,
    )


def log_setup(mllog: MLLogger, setup: Setup, global_batch: int, workload) -> None:
    """The MLPerf setup events every runner logs between init_start and init_stop."""
    t, o = setup.training, setup.optimizer
    mllog.event("submission_benchmark", mlperf_benchmark_name(setup.benchmark.name))
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
    nodes: int | None = 1,
) -> tuple[dict, list[str]]:
    """The record's energy block over all timed segments, with a node meter log if given and
    the other workers' nodes (their current segment) if any. `nodes`: how many nodes the
    workers ran on (None: unknown), for what a meter log on worker 0's node leaves out.
    Energy is post-processing: what fails here (or gives no finite number) is a warning and
    "not measured", never a lost run."""
    intervals = [(s["start"], s["stop"]) for s in progress.segments]
    interval_s = sum(stop - start for start, stop in intervals)
    try:
        block, warnings = _energy_block(
            progress, notes, hz, (meter_log, nodes), other_workers, intervals, interval_s
        )
    except Exception as error:  # noqa: BLE001 - any failure here must not lose the run
        why, warnings = f"energy could not be computed ({error.__class__.__name__}: {error})", []
    else:
        watts = block.get("average_watts")
        try:
            record_io.dumps(block)  # the record's own writer refuses numbers that are not finite
        except ValueError:
            why = "the readings give a number that is not finite (a sensor or log out of range)"
        else:
            if not (block["measured"] and watts is not None and watts < MIN_AVERAGE_WATTS):
                return block, warnings
            why = (
                f"the readings average {watts:.3g} W, below {MIN_AVERAGE_WATTS:g} W: no machine "
                "that trains draws that (a sensor or log out of range; the score per watt "
                "would not be finite)"
            )
    notes = [*notes, why]
    block = record_io.energy_not_measured(
        "; ".join(notes), interval_s=interval_s, requested_hz=hz or None, notes=notes
    )
    return block, [*warnings, f"energy not measured: {why}"]


def meter_log_scope(nodes: int | None) -> str:
    """What a meter log on worker 0's node leaves out of a run on `nodes` nodes (None: the
    workers' hosts are not known). It starts "worker": a note the meter does not cover."""
    if nodes is None:
        return (
            "workers other than 0: not in the meter log (worker 0's node) where they ran on "
            "other nodes; their hosts were not gathered"
        )
    other = "the other node" if nodes == 2 else f"the other {nodes - 1} nodes"
    return f"workers on {other}: not in the meter log (worker 0's node)"


def _energy_block(progress, notes, hz, meter, other_workers, intervals, interval_s):
    """`meter`: (the meter log or None, the number of nodes the workers ran on or None)."""
    (meter_log, nodes), warnings = meter, []
    measurements = power.combine_segments(progress.energy) + list(other_workers)
    if meter_log:
        try:
            readings, warnings = read_meter_log(meter_log)
            measurements.append(power.meter_measurement(readings, intervals, meter_log))
        except UserError as error:
            warnings.append(f"meter log not used: {error}")
        else:
            notes = notes if nodes == 1 else [*notes, meter_log_scope(nodes)]
    block, more = power.energy_block(measurements, notes, interval_s, hz or None)
    if meter_log:
        block["meter_log"] = str(meter_log)
    return block, warnings + more
