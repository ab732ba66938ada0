"""One benchmark run, on any framework: the lifecycle written once.

    run(setup, options, build, observers)   build: the framework's trainer (tensorflow or pytorch)
      prepare      the trainer (devices, workers), the run directory, the progress: new, or
                   restored from the last checkpoint (--resume, its plan run/resume.py made)
      initialise   count the train step's FLOPs, warm it up: before the timed run
      timed_run    the epoch loop (`train_epochs`) under power sampling; whatever ends it
                   early becomes its status (run/status.py)
      finish       every worker's energy (run/energy.py), the MLPerf log closed, the record
                   written

A framework supplies a `Trainer`: the train and eval steps, its data, its checkpoint files,
its layers and the errors only it can name. Everything else is here and in run/, so that both
frameworks get the same statuses for the same failures, the same MLPerf log points, power
sampling, checkpoints and resume, profiler traces and records. What watches the run (the live
view, TensorBoard) is the caller's: `observers` (run/observers.py). Pure Python: this module
imports neither TensorFlow nor torch, nor report/.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from hpcai500_tf import config
from hpcai500_tf import record as record_io
from hpcai500_tf.config import Setup
from hpcai500_tf.energy import sampler as power
from hpcai500_tf.errors import UserError
from hpcai500_tf.mlperf.mllog import MLLogger
from hpcai500_tf.run import directory, predictions, resume, stop
from hpcai500_tf.run import energy as run_energy
from hpcai500_tf.run.checkpoints import cadence, checkpoint_due, restore, save_checkpoint
from hpcai500_tf.run.directory import RunDirectory
from hpcai500_tf.run.mlperf_log import log_setup
from hpcai500_tf.run.observers import Observers
from hpcai500_tf.run.options import RunOptions
from hpcai500_tf.run.progress import Progress, fingerprint
from hpcai500_tf.run.record import make_record
from hpcai500_tf.run.status import (
    Diverged,
    SigtermStop,
    Terminated,
    WorkerRunEnded,
    classify_failure,
    diverged,
    stop_on_sigterm,
)
from hpcai500_tf.run.trainer import Failure, StepTrace, Trainer  # noqa: F401 - re-exported

LOG_EVERY = 10  # steps between loss reads (each syncs the device) and live-view updates


# ----------------------------------------------------------------------------- one run


@dataclass
class Run:
    """What the phases of one run share: the trainer, where the run lives, its progress."""

    setup: Setup
    trainer: Trainer
    run_dir: RunDirectory | None  # None on a worker that does not know it (Slurm, TF_CONFIG)
    resumed: bool
    progress: Progress
    mllog: MLLogger
    observers: Observers = field(default_factory=Observers)  # the chief's (run/observers.py)
    finished: bool = False  # resumed after its last epoch: only the lost record is rebuilt
    flops: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    trace: StepTrace | None = None
    saved_epochs: int | None = None  # epochs the last checkpoint holds
    saved_position: tuple[int, int] | None = None  # (epochs, batches) it holds
    clock: Callable[[], float] = time.monotonic  # what checkpoint cadence is measured by
    stop_request: stop.StopRequest | None = None  # inside the epoch loop: its stop signals
    timed_end: float | None = None  # the last epoch's evaluation done: the timed run's end

    @property
    def rank(self) -> int:
        return self.trainer.rank

    @property
    def workers(self) -> int:
        return self.trainer.workers

    @property
    def chief(self) -> bool:
        return self.rank == 0

    @property
    def samples_path(self) -> Path | None:
        """This worker's power readings: the run's own file on the chief; the others' beside
        their logs, when the launcher made the run directory."""
        return self.run_dir.worker_power_samples(self.rank) if self.run_dir else None


@dataclass
class Outcome:
    """How the timed run ended, and what its power sampler saw."""

    status: str = "completed"
    peer_lost: bool = False  # or stopped by a signal on several workers: no collective after
    interrupted: bool = False  # by Ctrl-C
    exit_code: int = 1  # of a worker other than the chief when the run did not complete
    sampler: power.PowerSampler | None = None
    notes: list[str] = field(default_factory=list)


Build = Callable[[Setup, RunOptions, Observers], Trainer]


def run(
    setup: Setup, options: RunOptions, build: Build, observers=()
) -> tuple[dict | None, Path | None]:
    """Run the benchmark with the trainer `build` makes, watched by `observers` (a list, see
    run/observers.py); returns (record, record path), or (None, None) on a worker other than
    the chief (worker 0 writes the one record)."""
    init_start = time.time()
    watchers = Observers(observers)
    with stop_on_sigterm() as sigterm, stop.noting(), contextlib.ExitStack() as held:
        unlocked = None  # a note where the filesystem cannot lock the run directory
        plan = resume.plan_of(options.resume, setup.training.epochs)  # before the framework
        options = replace(options, resume=plan)
        if plan and setup.training.strategy != "multi_worker":  # one process: its own writer
            unlocked = held.enter_context(_hold(plan.run_dir))
        trainer = build(setup, options, watchers)
        try:
            sigterm.take_back()  # a framework joining its workers may have put its own in place
            one = prepare(setup, options, trainer, watchers, init_start, held, unlocked)
            if one.chief:
                start_watching(one, options)
            initialise(one, options.meter_log)
            outcome = timed_run(one, options.power_hz, sigterm)
            return finish(one, outcome, options)
        finally:
            trainer.close()


def prepare(
    setup: Setup,
    options: RunOptions,
    trainer: Trainer,
    observers: Observers,
    init_start: float,
    held: contextlib.ExitStack,
    unlocked: str | None = None,
) -> Run:
    """The run directory and the progress to start from: new, or restored from its last
    checkpoint. The chief holds the run directory's lock in `held` (where `run` did not
    already; `unlocked` says where the filesystem could not lock it)."""
    config_id = fingerprint(setup.config)
    chief, set_aside = trainer.rank == 0, None
    if options.resume:
        run_dir = options.resume.run_dir
        if chief and setup.training.strategy == "multi_worker":  # rank 0 known only now
            unlocked = held.enter_context(_hold(run_dir))
    elif chief:
        run_dir = (
            RunDirectory(options.run_dir)
            if options.run_dir
            else RunDirectory.new(options.out_dir, setup.benchmark.name, setup.preset)
        )
        unlocked = held.enter_context(_hold(run_dir))
        if options.start_over_unsaved:  # --resume-or-start after a start that saved nothing
            set_aside = directory.set_aside_unsaved_start(run_dir)
        record_io.write_atomic(run_dir.config, config.saved_config(setup))
    else:
        run_dir = RunDirectory(options.run_dir) if options.run_dir else None
    mllog = MLLogger(run_dir.mlperf_log if chief else None)
    one = Run(
        setup, trainer, run_dir, bool(options.resume),
        Progress(config_fingerprint=config_id, init_start=init_start), mllog,
        observers=observers if chief else Observers(), warnings=list(trainer.warnings),
    )  # fmt: skip
    one.warnings += [w for w in (unlocked, set_aside) if w]
    if options.resume:
        one.progress = restore(trainer, run_dir, config_id)
        one.saved_epochs = one.progress.epochs_done
        one.saved_position = (one.progress.epochs_done, one.progress.batches_done)
        one.finished = _record_lost(one)
    else:
        mllog.start("init_start", time_ms=init_start * 1000)
        log_setup(mllog, setup, trainer.global_batch, trainer.workload)
    if options.profile_steps:  # on every worker: none may go on to a collective alone
        _check_profile_steps(one, *options.profile_steps)
    return one


@contextlib.contextmanager
def _hold(run_dir: RunDirectory) -> Iterator[str | None]:
    """The run directory's lock while inside (directory.hold: a second writer is refused
    in one line), except in a worker of the `--workers` launcher, which holds it for all;
    yields the warning of a filesystem that cannot lock."""
    if directory.inherited(run_dir, os.environ):
        yield None
        return
    lock = directory.hold(run_dir)
    try:
        yield lock.warning
    finally:
        lock.release()


def _check_profile_steps(one: Run, first: int, last: int) -> None:
    steps = one.trainer.steps_per_epoch
    done = one.progress.epochs_done * steps + one.progress.batches_done  # a mid-epoch resume's
    total = one.setup.training.epochs * steps
    if not done < first <= last <= total:
        raise UserError(
            f"--profile-steps {first}-{last}: outside the steps this run trains "
            f"({done + 1}-{total})"
        )


def start_watching(one: Run, options: RunOptions) -> None:
    """A profiler trace of the steps asked for (inside the timed run, after warm-up: those
    steps are slower, and the record says so), and the observers told where the run lives."""
    if options.profile_steps:  # checked in `prepare`
        one.trace = one.trainer.step_trace(one.run_dir.tensorboard, *options.profile_steps)
    one.warnings += one.observers.on_run_start(one.run_dir, one.setup)


def _record_lost(one: Run) -> bool:
    """Whether a resumed run had already finished its epochs, so that only its record is
    rebuilt (one that was lost, or the stopped one a stop after the last checkpoint left;
    `state.check_resumable` refused the run where a completed record is there)."""
    if one.progress.epochs_done < one.setup.training.epochs:
        return False
    one.warnings.append("the record was rebuilt by --resume from the run's saved state")
    return True


def initialise(one: Run, meter_log: str | None) -> None:
    """Everything before the timed run: count the train step's FLOPs, warm it up (and, on the
    chief, the checkpoint writer), so that one-time costs stay out of the time to quality."""
    if one.observers:
        one.observers.message("tracing the train step, counting its FLOPs, warming it up")
    one.flops = one.trainer.count_flops()
    one.trainer.warm_up(checkpoints=one.chief)  # the chief writes the checkpoints
    if not one.resumed:
        one.mllog.end("init_stop")
    if one.chief and meter_log and not Path(meter_log).exists():
        one.warnings.append(f"{meter_log}: the meter log did not exist when the run started")
        if one.observers:
            one.observers.message(f"{meter_log} does not exist yet; it is read when the run ends")


# ----------------------------------------------------------------------------- the timed run


def timed_run(one: Run, power_hz: float, sigterm: SigtermStop | None = None) -> Outcome:
    """Train to the epoch budget with power sampled on every worker's node. Whatever ends the
    run (divergence, Ctrl-C or SIGTERM, a lost peer, bad data, a defect) becomes its status
    and a warning: the record is still written (a SIGTERM after training only noted)."""
    if one.finished:
        note = "the record was rebuilt after the run: no readings beyond its checkpoint"
        return Outcome(notes=[note])
    sampler, notes = run_energy.start_power_sampling(power_hz, one.observers)
    if sampler:
        sampler.worker = one.rank  # its measurements and power-sample rows name this worker
    outcome = Outcome(sampler=sampler, notes=notes)
    try:
        train_epochs(one, power=sampler)
    except (KeyboardInterrupt, Exception) as error:  # every ending is a status and a warning
        if sigterm and sigterm.received and not isinstance(error, Diverged):
            # SIGTERM's stop, whatever it raised: Terminated, or on several workers a peer
            # that stopped first (a lost peer; or the framework's own error type, raised while
            # it translated Terminated)
            error = Terminated()
        outcome.status, warning, outcome.peer_lost = classify_failure(error, one)
        one.warnings.append(warning)
        if isinstance(error, stop.AgreedStop | stop.ForcedStop):
            outcome.exit_code = error.exit_code
        elif isinstance(error, Terminated):
            outcome.exit_code = Terminated.exit_code
        elif isinstance(error, KeyboardInterrupt):
            outcome.interrupted = True
    finally:
        if sigterm:
            sigterm.defer = True  # the record is written whatever comes now
        run_energy.stop_sampling(one, sampler)
    return outcome


def train_epochs(one: Run, power=None) -> Progress:
    """Train from `progress.epochs_done` to the budget; returns the final progress.

    The chief checkpoints at the epoch ends `checkpoint_due` picks. `power`, a running
    `PowerSampler`, puts the energy so far into each; the caller stops it and adds the last
    segment's energy after this returns."""
    progress = one.progress
    segment_start, last_checkpoint = time.time(), one.clock()
    if progress.run_start is None:
        progress.run_start = segment_start
        one.mllog.start("run_start", time_ms=segment_start * 1000)
    try:  # this process's segment is kept whatever ends it, opening the data stream too
        batches = one.trainer.train_batches(progress.epochs_done, progress.batches_done)
        with stop.listening() as one.stop_request:
            try:
                _train_to_the_budget(one, batches, segment_start, last_checkpoint, power)
            except stop.AgreedStop:  # every worker stopped after the same step: keep it
                one.stop_request.defer = True  # still listening: a Ctrl-C now cannot abort it
                if one.chief and one.run_dir and one.saved_position != _position(progress):
                    checkpoint(one, segment_start, power)
                raise
    finally:  # the segment, and the energy over it, end with the timed run: not after the
        # last checkpoint's write, which TTQ does not count either
        progress.segments.append({"start": segment_start, "stop": one.timed_end or time.time()})
        if one.trace:
            one.trace.stop()  # a run ended inside the traced steps
    return progress


def _position(progress: Progress) -> tuple[int, int]:
    return progress.epochs_done, progress.batches_done


def _train_to_the_budget(one: Run, batches, segment_start, last_checkpoint, power) -> None:
    """The epochs left, each evaluated and checkpointed as the config says."""
    t = one.setup.training
    for epoch in range(one.progress.epochs_done, t.epochs):
        train_epoch(one, epoch, batches, segment_start)
        if (epoch + 1) % t.eval_every == 0 or epoch + 1 == t.epochs:
            evaluate(one, epoch, segment_start)
        if epoch + 1 == t.epochs:
            one.timed_end = time.time()
        if (
            one.chief
            and one.run_dir
            and checkpoint_due(t, epoch + 1, one.clock() - last_checkpoint)
        ):
            checkpoint(one, segment_start, power)
            last_checkpoint = one.clock()


def train_epoch(one: Run, epoch: int, batches: Iterator, segment_start: float) -> None:
    """One epoch's steps, the loss read (and checked) every `LOG_EVERY` steps and at the end."""
    trainer, observers, trace, mllog = one.trainer, one.observers, one.trace, one.mllog
    steps, batch = trainer.steps_per_epoch, trainer.global_batch
    start = one.progress.batches_done  # > 0: resumed where a stop left this epoch
    if observers:
        observers.on_epoch_start(epoch + 1, one.setup.training.epochs, steps)
    epoch_start = time.time()
    first_step = epoch * steps  # global steps before this epoch's
    value = math.nan
    for step in range(start, steps):
        vote = _stop_if_agreed(one, step, start, epoch_start)
        if step == 0:  # after the stop check: a stop before this epoch's first step keeps it out
            mllog.start("epoch_start", metadata={"epoch_num": epoch + 1})
            mllog.start("block_start", metadata={"first_epoch_num": epoch + 1, "epoch_count": 1})
        examples = next(batches)
        if trace:
            trace.before(first_step + step + 1)
        loss = trainer.train_step(examples, vote)
        if trace:
            trace.after(first_step + step + 1, loss)
        if (step + 1) % LOG_EVERY == 0 or step + 1 == steps:
            value = trainer.loss_value(loss)  # reading it back syncs the device
            if not math.isfinite(value):
                raise diverged(value, epoch + 1, step + 1)
            if observers:
                rate = (step + 1 - start) * batch / (time.time() - epoch_start)
                observers.on_step(step + 1, value, trainer.learning_rate(), rate)
    progress = one.progress
    seconds = time.time() - epoch_start + progress.epoch_seconds_done  # with a stop's before
    progress.examples += (steps - start) * batch
    progress.epochs_done, progress.batches_done, progress.epoch_seconds_done = epoch + 1, 0, 0.0
    progress.epochs.append(
        {
            "epoch": epoch + 1,
            "elapsed_s": progress.elapsed(open_segment=segment_start),
            "examples": progress.examples,
            "seconds": seconds,
            "loss": value,
        }
    )
    mllog.end("block_stop", metadata={"first_epoch_num": epoch + 1})
    mllog.end("epoch_stop", metadata={"epoch_num": epoch + 1})
    if observers:
        observers.on_epoch_end(epoch + 1, value, steps * batch / seconds)


def _stop_if_agreed(one: Run, step: int, start: int, epoch_start: float) -> int | None:
    """Before step `step` of the epoch (this segment began it at `start`, at `epoch_start`):
    raise `stop.AgreedStop` where the workers agree that a stop signal came (one worker: where
    it came), with the progress at this step boundary, the epoch's training seconds so far
    kept for its resumed end; else the vote the step is to carry (several workers: this
    worker's signal or 0; one worker: None)."""
    request = one.stop_request
    local = request.signum if request else 0
    agreed = local if one.workers == 1 else one.trainer.agreed_stop()
    if not agreed:
        return None if one.workers == 1 else local
    progress = one.progress
    progress.examples += (step - start) * one.trainer.global_batch
    progress.batches_done = step
    if step > start:  # this segment trained some of the epoch
        progress.epoch_seconds_done += time.time() - epoch_start
    raise stop.AgreedStop(agreed, local=local == agreed)


def evaluate(one: Run, epoch: int, segment_start: float) -> None:
    """The workload's quality after `epoch`, on the curve and in the MLPerf log."""
    if not one.trainer.workload.measures_quality:
        return
    one.mllog.start("eval_start", metadata={"epoch_num": epoch + 1})
    quality = one.trainer.evaluate()
    predictions.keep(one, epoch + 1)  # an ensemble member's probabilities, beside its record
    progress = one.progress
    progress.curve.append(
        {
            "epoch": epoch + 1,
            "elapsed_s": progress.elapsed(open_segment=segment_start),
            "examples": progress.examples,
            "value": quality,
        }
    )
    one.mllog.event("eval_accuracy", quality, metadata={"epoch_num": epoch + 1})
    one.mllog.end("eval_stop", metadata={"epoch_num": epoch + 1})
    if one.observers:
        one.observers.on_eval(epoch + 1, quality, one.setup.training.target_quality)


def checkpoint(one: Run, segment_start: float, power) -> None:
    """Save the progress so far, the open segment closed now with its energy so far."""
    stop, energy = power.measure_so_far(segment_start) if power else (time.time(), [])
    progress = one.progress
    snapshot = Progress(
        **{
            **asdict(progress),
            "segments": [*progress.segments, {"start": segment_start, "stop": stop}],
            "energy": [*progress.energy, energy],
        }
    )
    save_checkpoint(one.trainer, one.run_dir, snapshot)
    progress.checkpoints = snapshot.checkpoints
    one.saved_epochs = snapshot.epochs_done
    one.saved_position = _position(snapshot)


# ----------------------------------------------------------------------------- the record


def finish(one: Run, outcome: Outcome, options: RunOptions) -> tuple[dict | None, Path | None]:
    """Gather every node's energy, close the MLPerf log and write the record (the chief)."""
    layers = _once(one.trainer.layers)
    measured = run_energy.record_energy(one, outcome, options.power_hz, options.meter_log, layers)
    if not one.chief:
        if outcome.status != "completed":
            reason = "; ".join(one.warnings)
            raise WorkerRunEnded(one.rank, outcome.status, reason, outcome.exit_code)
        return None, None
    layer_values = layers()
    energy, energy_warnings = measured
    one.warnings += energy_warnings
    run_dir = one.run_dir
    sampled = outcome.sampler and outcome.sampler.sources
    artifacts = {
        "run_dir": str(run_dir),
        "mlperf_log": str(run_dir.mlperf_log),
        "checkpoints": str(run_dir.checkpoints),
        "checkpoint_cadence": cadence(one.setup.training),
        "checkpoints_written": one.progress.checkpoints,
        "power_samples": str(run_dir.power_samples) if sampled else None,
        "tensorboard": None,  # an observer's (TensorBoard's), or the profiler trace's
        "profile_trace": None,
    }
    one.observers.on_record(artifacts, one.warnings)
    if not (one.finished and '"key": "run_stop"' in _tail(run_dir.mlperf_log)):
        status = "success" if outcome.status == "completed" else "aborted"
        run_start, run_stop = one.progress.timed_span()  # as the record's timeline says
        at = max(run_stop * 1000, int(run_start * 1000) + 1)  # the log's whole ms: after
        one.mllog.end("run_stop", metadata={"status": status}, time_ms=at)
    one.mllog.close()
    _trace_artifacts(one, artifacts)
    record = make_record(
        one.setup, layer_values, one.trainer.workload, one.progress, one.flops,
        outcome.status, one.warnings, artifacts, energy, framework=one.trainer.framework,
    )  # fmt: skip
    record_io.save(run_dir.record, record, overwrite=one.resumed)
    one.observers.on_end(record, layer_values, outcome.sampler, one.progress.epochs_done)
    return record, run_dir.record


def _once(layers: Callable[[], dict]) -> Callable[[], dict]:
    """`layers`, asked for at most once: the trainer's L1-L9, for the energy and the record."""
    held = []

    def once() -> dict:
        if not held:
            held.append(layers())
        return held[0]

    return once


def _trace_artifacts(one: Run, artifacts: dict) -> None:
    """Where the run's profiler trace is; a trace is a warning too, since the profiler slows
    the steps it traces."""
    trace = one.trace
    if not trace:
        return
    files = [str(path) for path in trace.files()]
    one.warnings.append(
        f"train steps {trace.first}-{trace.last} were traced by {trace.profiler}, "
        "which slows them: the time to quality includes that"
        if files
        else f"no profiler trace was written for train steps {trace.first}-{trace.last}"
    )
    artifacts["tensorboard"] = str(one.run_dir.tensorboard)
    artifacts["profile_trace"] = files or None


def _tail(path: Path, size: int = 4096) -> str:
    """The end of a text file ('' if it cannot be read)."""
    try:
        with path.open("rb") as handle:
            handle.seek(max(path.stat().st_size - size, 0))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
