"""One benchmark run, on any framework: the lifecycle written once.

    run(setup, options, build)      build: the framework's trainer (tensorflow or pytorch)
      prepare      the trainer (devices, workers), the run directory, the progress: new, or
                   restored from the last checkpoint (--resume)
      initialise   count the train step's FLOPs, warm it up: before the timed run
      timed_run    the epoch loop (`train_epochs`) under power sampling; whatever ends it
                   early becomes its status (`classify_failure`)
      finish       every worker's energy, the MLPerf log closed, the record written

A framework supplies a `Trainer`: the train and eval steps, its data, its checkpoint files,
its layers and the errors only it can name. Everything else is here, so that both frameworks
get the same statuses for the same failures, the same MLPerf log points, power sampling,
checkpoints and resume, TensorBoard scalars, profiler traces and records. Pure Python: this
module imports neither TensorFlow nor torch.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import shutil
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from hpcai500_tf import config
from hpcai500_tf import record as record_io
from hpcai500_tf.config import Setup, TrainingConfig
from hpcai500_tf.energy import sampler as power
from hpcai500_tf.errors import UserError
from hpcai500_tf.mlperf.mllog import MLLogger
from hpcai500_tf.report import streams
from hpcai500_tf.report.live import Views
from hpcai500_tf.report.tensorboard import TensorBoardView
from hpcai500_tf.run import data_position, run_directory, run_state, stop
from hpcai500_tf.run.run_directory import RunDirectory
from hpcai500_tf.run.run_record import (
    Diverged,
    Progress,
    data_failed,
    diverged,
    energy_result,
    fingerprint,
    log_setup,
    make_record,
    start_power_sampling,
)

LOG_EVERY = 10  # steps between loss reads (each syncs the device) and live-view updates


# ----------------------------------------------------------------------------- the interface


@dataclass(frozen=True)
class Failure:
    """What a framework's own error means for the run: `kind` is "data" (the input data
    failed mid-run), "peer_lost" (a peer worker died or stopped answering) or "failed"."""

    kind: str
    detail: str


class StepTrace(Protocol):
    """A profiler trace of global train steps `first`-`last` (counted from 1)."""

    first: int
    last: int
    profiler: str  # the profiler's name, for the record's warning

    def before(self, step: int) -> None: ...
    def after(self, step: int, loss) -> None: ...
    def stop(self) -> None: ...
    def files(self) -> list[Path]: ...


class Trainer(Protocol):
    """What a framework supplies to the lifecycle; one per worker process."""

    framework: str  # the record's source.framework: "tensorflow" or "pytorch"
    workload: object  # train_examples, eval_examples, measures_quality, quality_metric
    global_batch: int
    steps_per_epoch: int
    workers: int
    rank: int
    warnings: list[str]  # found while building (devices, data), for the record

    def count_flops(self) -> dict: ...  # the record's flops block, of the step that runs
    def warm_up(self, checkpoints: bool) -> None: ...  # one step undone (and the writer)
    def train_batches(self, epochs_done: int, batches_done: int = 0) -> Iterator: ...
    def agree_stop(self, local: int) -> int: ...  # several workers: a collective (run/stop.py)
    def train_step(self, batch): ...  # returns the loss (reading it is `loss_value`)
    def loss_value(self, loss) -> float: ...  # syncs the device
    def learning_rate(self) -> float: ...
    def evaluate(self) -> float: ...  # the workload's quality over the evaluation split
    def write_checkpoint(self, prefix: Path, epochs_done: int, batches_done: int) -> Path: ...
    # the epochs (and batches of the next) it holds: data_position.held reads it
    def read_checkpoint(self, prefix: Path) -> int | tuple[int, int] | None: ...
    def step_trace(self, log_dir: Path, first: int, last: int) -> StepTrace: ...
    def layers(self) -> dict: ...  # L1-L9 as observed and configured
    def explain(self, error: BaseException) -> Failure | None: ...
    def gather_rows(self, row: list[float]) -> list[list[float]]: ...  # a collective
    def close(self) -> None: ...


@dataclass(frozen=True)
class RunOptions:
    """How to run a benchmark, beyond its config: what `train`'s options say."""

    data_dir: str | None = None
    out_dir: str | Path = "runs"
    resume: str | None = None  # a stopped run's directory
    power_hz: float = 10.0  # 0: no power sampling
    meter_log: str | None = None  # a node meter's log, read when the run ends
    run_dir: str | Path | None = None  # an empty directory the launcher made for the run
    tensorboard: bool = True
    profile_steps: tuple[int, int] | None = None  # global train steps to trace
    allow_cpu: bool = False  # run where the framework sees fewer GPUs than the machine has
    device: str = "auto"  # PyTorch's device: auto, cpu or cuda


# ----------------------------------------------------------------------------- SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM (scancel, a Slurm time limit, preemption), raised in the main thread by the
    handler `stop_on_sigterm` installs: it ends a run as Ctrl-C does (a `stopped` record that
    `--resume` continues), and the process exits 143 (128 + SIGTERM)."""

    exit_code = 128 + signal.SIGTERM

    def __init__(self):
        super().__init__("terminated by SIGTERM")


SIGTERM_STOPPED = "stopped by SIGTERM (scancel, a time limit or preemption)"


class _SigtermStop:
    """The SIGTERM handler: the first one raises `Terminated` (or, once `defer` is set, while
    the record is written, is only noted); later ones are ignored, as the run is already
    ending (SIGKILL after the scheduler's grace period remains the hard stop)."""

    replaceable = True  # by stop.listening, inside the epoch loop

    def __init__(self):
        self.received = False
        self.defer = False
        self.installed = False

    def take_back(self) -> None:
        """Install this handler again where it was installed: a framework may replace it
        while it joins its workers (TensorFlow's coordination service does, below Python)."""
        if self.installed:
            signal.signal(signal.SIGTERM, self)

    def __call__(self, signum, frame):
        if self.received:
            return
        self.received = True
        if not self.defer:
            raise Terminated


@contextlib.contextmanager
def stop_on_sigterm():
    """SIGTERM stops the run as Ctrl-C does, while inside; the previous handler is restored
    after. Installed only from the main thread (Python runs signal handlers there) and only
    over the default handler, so that a handler of the caller's own is kept.

    Python runs the handler between bytecodes of the main thread, so a worker blocked inside
    a collective ignores SIGTERM until the collective returns: at once when a peer stopped
    first, within the communication timeout when a peer hangs. One that never returns (a peer
    that never joins) is ended by SIGKILL: the scheduler's, the launcher's or the join
    watchdog's."""
    handler = _SigtermStop()
    handler.installed = (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    )
    if handler.installed:
        signal.signal(signal.SIGTERM, handler)
    try:
        yield handler
    finally:
        if handler.installed:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def exit_code(record: dict) -> int:
    """The exit status of `train` for the chief's record: 0 completed, 143 (128 + SIGTERM)
    stopped by SIGTERM, 1 otherwise (Ctrl-C's stopped record included)."""
    if record["status"] == "completed":
        return 0
    agreed = stop.exit_code_of(record["warnings"])  # an agreed SIGTERM or SIGUSR1 stop
    if record["status"] == "stopped" and agreed:
        return agreed
    if record["status"] == "stopped" and any(
        w.startswith(SIGTERM_STOPPED) for w in record["warnings"]
    ):
        return Terminated.exit_code
    return 1


class WorkerRunEnded(Exception):
    """A worker other than the chief saw the run end early: it exits non-zero (`code`) with
    the reason (the chief writes the record), so that a scheduler never counts that task a
    success."""

    def __init__(self, rank: int, status: str, reason: str, code: int = 1):
        super().__init__(f"worker {rank}: run {status}: {reason}")
        self.code = code


# ----------------------------------------------------------------------------- checkpoints


def checkpoint_due(training: TrainingConfig, epochs_done: int, seconds_since: float) -> bool:
    """Whether the end of epoch `epochs_done` writes a checkpoint, `seconds_since` the last one
    (or the segment's start): after the last epoch always; before it once
    `checkpoint_minutes` of wall time have passed, or every `checkpoint_every` epochs (each 0:
    never)."""
    if epochs_done >= training.epochs:
        return True
    minutes, every = training.checkpoint_minutes, training.checkpoint_every
    by_time = minutes > 0 and seconds_since >= 60 * minutes
    return by_time or (every > 0 and epochs_done % every == 0)


def cadence(training: TrainingConfig) -> str:
    """`training`'s checkpoint cadence in words, for the record."""
    minutes, every = training.checkpoint_minutes, training.checkpoint_every
    ways = [f"every {minutes:g} min of wall time"] if minutes else []
    ways += [f"every {every} epoch(s)"] if every else []
    if not ways:
        return "after the last epoch only"
    return f"{' or '.join(ways)} (at an epoch's end), and after the last epoch"


def save_checkpoint(trainer: Trainer, run_dir: RunDirectory, progress: Progress) -> None:
    """The trainer's checkpoint under a new prefix, then the state naming it (atomically, with
    the write's time in `progress.checkpoints`), then the ones before it removed: a kill at any
    moment leaves a state whose checkpoint is whole."""
    run_dir.checkpoints.mkdir(exist_ok=True)
    started = time.monotonic()
    done, batches = progress.epochs_done, progress.batches_done
    name = data_position.checkpoint_name(done, batches)  # ckpt-N, or ckpt-N-bB mid-epoch
    prefix = trainer.write_checkpoint(run_dir.checkpoints / name, done, batches)
    progress.checkpoints.append(
        {
            "epoch": progress.epochs_done,
            "elapsed_s": progress.elapsed(),
            "write_s": time.monotonic() - started,
        }
    )
    state = {**asdict(progress), "checkpoint": str(prefix), "framework": trainer.framework}
    record_io.write_atomic(run_dir.state, state, overwrite=True)
    for old in run_dir.checkpoints.glob("ckpt*"):  # ckpt, ckpt-N.*, ckpt-N.pt, a _temp dir
        if old.name == prefix.name or old.name.startswith(prefix.name + "."):
            continue
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)


def restore(trainer: Trainer, run_dir: RunDirectory, fingerprint_now: str) -> Progress:
    """The progress and the trainer's model and optimizer of a stopped run's last checkpoint,
    each checked first (`run_state`, then the trainer's own reading), so that nothing damaged
    is found mid-training."""
    state = run_state.read_state(run_dir.path)
    if state["config_fingerprint"] != fingerprint_now:
        raise UserError(
            f"{run_dir}: it was started with another config; resume it with the "
            "same benchmark, preset and --set values, or with --resume alone"
        )
    if state["framework"] != trainer.framework:
        raise UserError(
            f"{run_dir}: it was trained with {state['framework']}; resume it with "
            f"--framework {state['framework']} (or --resume alone)"
        )
    prefix = run_state.checkpoint_prefix(run_dir.path, state)
    # None: written before checkpoints held it; (epochs, batches) for a mid-epoch one
    held = data_position.held(trainer.read_checkpoint(prefix))
    if held is not None and held[0] != state["epochs_done"]:
        raise UserError(
            f"{run_dir.state}: says {state['epochs_done']} epochs were done, but its "
            f"checkpoint {prefix} holds {held[0]}: resume refused"
        )
    data_position.check_held(held, state, prefix)
    del state["checkpoint"], state["framework"]
    return Progress(**state)


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
    view: object | None = None  # the chief's live view (and TensorBoard)
    finished: bool = False  # resumed after its last epoch: only the lost record is rebuilt
    flops: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    tensorboard: TensorBoardView | None = None  # the chief's, when on
    trace: StepTrace | None = None
    saved_epochs: int | None = None  # epochs the last checkpoint holds
    saved_position: tuple[int, int] | None = None  # (epochs, batches) it holds
    clock: Callable[[], float] = time.monotonic  # what checkpoint cadence is measured by
    stop_request: stop.StopRequest | None = None  # inside the epoch loop: its stop signals

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


Build = Callable[[Setup, RunOptions, object], Trainer]


def run(
    setup: Setup, options: RunOptions, build: Build, view=None
) -> tuple[dict | None, Path | None]:
    """Run the benchmark with the trainer `build` makes; returns (record, record path), or
    (None, None) on a worker other than the chief (worker 0 writes the one record)."""
    init_start = time.time()
    with stop_on_sigterm() as sigterm, stop.noting(), contextlib.ExitStack() as held:
        unlocked = None  # a note where the filesystem cannot lock the run directory
        if options.resume:  # before the framework starts, and again on every worker
            resumed = RunDirectory(options.resume)
            if not resumed.config.is_file():
                raise UserError(f"{resumed}: not a run directory (no {resumed.config.name})")
            run_state.check_resumable(options.resume, setup.training.epochs)
            if setup.training.strategy != "multi_worker":  # one process: its own writer, now
                unlocked = held.enter_context(_hold(resumed))
        trainer = build(setup, options, view)
        try:
            sigterm.take_back()  # a framework joining its workers may have put its own in place
            one = prepare(setup, options, trainer, view, init_start, held, unlocked)
            if one.chief:
                watch_in_tensorboard(one, options)
            initialise(one, options.meter_log)
            outcome = timed_run(one, options.power_hz, sigterm)
            return finish(one, outcome, options)
        finally:
            trainer.close()


def prepare(
    setup: Setup,
    options: RunOptions,
    trainer: Trainer,
    view,
    init_start: float,
    held: contextlib.ExitStack,
    unlocked: str | None = None,
) -> Run:
    """The run directory and the progress to start from: new, or restored from its last
    checkpoint. The chief holds the run directory's lock in `held` (where `run` did not
    already; `unlocked` says where the filesystem could not lock it)."""
    config_id = fingerprint(setup.config)
    chief = trainer.rank == 0
    if options.resume:
        run_dir = RunDirectory(options.resume)
        if chief and setup.training.strategy == "multi_worker":  # rank 0 known only now
            unlocked = held.enter_context(_hold(run_dir))
    elif chief:
        run_dir = (
            RunDirectory(options.run_dir)
            if options.run_dir
            else RunDirectory.new(options.out_dir, setup.benchmark.name, setup.preset)
        )
        unlocked = held.enter_context(_hold(run_dir))
        record_io.write_atomic(run_dir.config, config.saved_config(setup))
    else:
        run_dir = RunDirectory(options.run_dir) if options.run_dir else None
    mllog = MLLogger(run_dir.mlperf_log if chief else None)
    one = Run(
        setup, trainer, run_dir, bool(options.resume),
        Progress(config_fingerprint=config_id, init_start=init_start), mllog,
        view=view if chief else None, warnings=list(trainer.warnings),
    )  # fmt: skip
    one.warnings += [unlocked] if unlocked else []
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
    """The run directory's lock while inside (run_directory.hold: a second writer is refused
    in one line), except in a worker of the `--workers` launcher, which holds it for all;
    yields the warning of a filesystem that cannot lock."""
    if run_directory.inherited(run_dir, os.environ):
        yield None
        return
    lock = run_directory.hold(run_dir)
    try:
        yield lock.warning
    finally:
        lock.release()


def _check_profile_steps(one: Run, first: int, last: int) -> None:
    steps = one.trainer.steps_per_epoch
    done, total = one.progress.epochs_done * steps, one.setup.training.epochs * steps
    if not done < first <= last <= total:
        raise UserError(
            f"--profile-steps {first}-{last}: outside the steps this run trains "
            f"({done + 1}-{total})"
        )


def watch_in_tensorboard(one: Run, options: RunOptions) -> None:
    """TensorBoard scalars beside the live view, and a profiler trace of the steps asked for
    (inside the timed run, after warm-up: those steps are slower, and the record says so)."""
    log_dir = one.run_dir.tensorboard
    if options.profile_steps:  # checked in `prepare`
        one.trace = one.trainer.step_trace(log_dir, *options.profile_steps)
    if options.tensorboard and importlib.util.find_spec("tensorboard") is None:
        one.warnings.append(
            "TensorBoard scalars not written: the tensorboard package is not installed "
            "(it comes with the cpu and cuda extras)"
        )
    elif options.tensorboard:
        one.tensorboard = TensorBoardView(log_dir)
        one.view = Views(one.view, one.tensorboard)


def _record_lost(one: Run) -> bool:
    """Whether a resumed run had already finished its epochs, so that only its record is
    rebuilt (one that was lost, or the stopped one a stop after the last checkpoint left;
    `run_state.check_resumable` refused the run where a completed record is there)."""
    if one.progress.epochs_done < one.setup.training.epochs:
        return False
    one.warnings.append("the record was rebuilt by --resume from the run's saved state")
    return True


def initialise(one: Run, meter_log: str | None) -> None:
    """Everything before the timed run: count the train step's FLOPs, warm it up (and, on the
    chief, the checkpoint writer), so that one-time costs stay out of the time to quality."""
    if one.view:
        one.view.message("tracing the train step, counting its FLOPs, warming it up")
    one.flops = one.trainer.count_flops()
    one.trainer.warm_up(checkpoints=one.chief)  # the chief writes the checkpoints
    if not one.resumed:
        one.mllog.end("init_stop")
    if one.chief and meter_log and not Path(meter_log).exists():
        one.warnings.append(f"{meter_log}: the meter log did not exist when the run started")
        if one.view:
            one.view.message(f"{meter_log} does not exist yet; it is read when the run ends")


# ----------------------------------------------------------------------------- the timed run


def timed_run(one: Run, power_hz: float, sigterm: _SigtermStop | None = None) -> Outcome:
    """Train to the epoch budget with power sampled on every worker's node. Whatever ends the
    run (divergence, Ctrl-C or SIGTERM, a lost peer, bad data, a defect) becomes its status
    and a warning: the record is still written (a SIGTERM after training only noted)."""
    if one.finished:
        note = "the record was rebuilt after the run: no readings beyond its checkpoint"
        return Outcome(notes=[note])
    sampler, notes = start_power_sampling(power_hz, one.view)
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
        _stop_sampling(one, sampler)
    return outcome


def train_epochs(one: Run, power=None) -> Progress:
    """Train from `progress.epochs_done` to the budget; returns the final progress.

    The chief checkpoints at the epoch ends `checkpoint_due` picks. `power`, a running
    `PowerSampler`, puts the energy so far into each; the caller stops it and adds the last
    segment's energy after this returns."""
    progress = one.progress
    batches = one.trainer.train_batches(progress.epochs_done, progress.batches_done)
    segment_start, last_checkpoint = time.time(), one.clock()
    if progress.run_start is None:
        progress.run_start = segment_start
        one.mllog.start("run_start", time_ms=segment_start * 1000)
    try:
        with stop.listening() as one.stop_request:
            _train_to_the_budget(one, batches, segment_start, last_checkpoint, power)
    except stop.AgreedStop:  # every worker stopped after the same step: keep it
        one.stop_request.defer = True
        if one.chief and one.run_dir and one.saved_position != _position(progress):
            checkpoint(one, segment_start, power)
        raise
    finally:
        progress.segments.append({"start": segment_start, "stop": time.time()})
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
        if (
            one.chief
            and one.run_dir
            and checkpoint_due(t, epoch + 1, one.clock() - last_checkpoint)
        ):
            checkpoint(one, segment_start, power)
            last_checkpoint = one.clock()


def train_epoch(one: Run, epoch: int, batches: Iterator, segment_start: float) -> None:
    """One epoch's steps, the loss read (and checked) every `LOG_EVERY` steps and at the end."""
    trainer, view, trace, mllog = one.trainer, one.view, one.trace, one.mllog
    steps, batch = trainer.steps_per_epoch, trainer.global_batch
    start = one.progress.batches_done  # > 0: resumed where a stop left this epoch
    if not start:  # else logged by the segment the stop ended
        mllog.start("epoch_start", metadata={"epoch_num": epoch + 1})
        mllog.start("block_start", metadata={"first_epoch_num": epoch + 1, "epoch_count": 1})
    if view:
        view.epoch_start(epoch + 1, one.setup.training.epochs, steps)
    epoch_start = time.time()
    first_step = epoch * steps  # global steps before this epoch's
    value = math.nan
    for step in range(start, steps):
        _stop_if_agreed(one, step, start)
        examples = next(batches)
        if trace:
            trace.before(first_step + step + 1)
        loss = trainer.train_step(examples)
        if trace:
            trace.after(first_step + step + 1, loss)
        if (step + 1) % LOG_EVERY == 0 or step + 1 == steps:
            value = trainer.loss_value(loss)  # reading it back syncs the device
            if not math.isfinite(value):
                raise diverged(value, epoch + 1, step + 1)
            if view:
                rate = (step + 1 - start) * batch / (time.time() - epoch_start)
                view.step(step + 1, value, trainer.learning_rate(), rate)
    seconds = time.time() - epoch_start
    progress = one.progress
    progress.examples += (steps - start) * batch
    progress.epochs_done, progress.batches_done = epoch + 1, 0
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
    if view:
        view.epoch_end(epoch + 1, value, steps * batch / seconds)


def _stop_if_agreed(one: Run, step: int, start: int) -> None:
    """Before step `step` of the epoch (this segment began it at `start`): raise
    `stop.AgreedStop` where the workers agree that a stop signal came (one worker: where it
    came), with the progress at this step boundary."""
    request = one.stop_request
    local = request.signum if request else 0
    agreed = local if one.workers == 1 else one.trainer.agree_stop(local)
    if not agreed:
        return
    progress = one.progress
    progress.examples += (step - start) * one.trainer.global_batch
    progress.batches_done = step
    raise stop.AgreedStop(agreed, local=local == agreed)


def evaluate(one: Run, epoch: int, segment_start: float) -> None:
    """The workload's quality after `epoch`, on the curve and in the MLPerf log."""
    if not one.trainer.workload.measures_quality:
        return
    one.mllog.start("eval_start", metadata={"epoch_num": epoch + 1})
    quality = one.trainer.evaluate()
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
    if one.view:
        one.view.evaluation(epoch + 1, quality, one.setup.training.target_quality)


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


def classify_failure(error: BaseException, one: Run) -> tuple[str, str, bool]:
    """(status, warning, whether a peer was lost) for what ended a run early."""
    where = one.run_dir or "RUN_DIR (the chief's run directory)"
    if isinstance(error, Diverged):
        return "diverged", str(error), False
    if isinstance(error, stop.AgreedStop):  # every worker after the same step: all still here
        return "stopped", _agreed_stop_warning(error, one, where), False
    if isinstance(error, KeyboardInterrupt):  # Ctrl-C, or SIGTERM (Terminated)
        saved = one.saved_epochs
        if not one.chief:  # the chief writes the checkpoints
            resume = f"resume with --resume {where} (from the chief's last checkpoint)"
        elif saved is None:
            resume = "no checkpoint was written yet: it cannot be resumed"
        else:
            resume = (
                f"the last checkpoint holds {saved}: resume with --resume {where} "
                f"(it continues from epoch {saved + 1})"
            )
        done = one.progress.epochs_done
        # The peers get it too, each at its own point of the loop: no energy collective after.
        several = one.workers > 1
        if isinstance(error, Terminated):
            return "stopped", f"{SIGTERM_STOPPED} after {done} epoch(s); {resume}", several
        return "stopped", f"interrupted by the user after {done} epoch(s); {resume}", several
    failure = one.trainer.explain(error)
    if failure and failure.kind == "data":
        return (*data_failed(failure.detail), False)
    if failure and failure.kind == "peer_lost" and one.workers > 1:
        lost = f"lost contact with a peer worker ({failure.detail})"
        return "stopped", f"{lost}; resume with --resume {where}", True
    if failure:
        return "failed", f"the run failed: {failure.detail}", False
    if isinstance(error, UserError):
        return "failed", f"the run failed: {error}", False
    # A defect: still a record, and its traceback beside it.
    logged = _write_traceback(one.run_dir if one.chief else None)
    return "failed", f"the run failed: {error.__class__.__name__}: {error}{logged}", False


def _agreed_stop_warning(error: stop.AgreedStop, one: Run, where) -> str:
    """What an agreed stop's record says: the signal, the position, how to resume."""
    done, batches = one.progress.epochs_done, one.progress.batches_done
    if not one.chief:
        resume = f"resume with --resume {where} (from the chief's checkpoint at the stop)"
    elif one.saved_position == (done, batches):
        at = data_position.checkpoint_name(done, batches)
        resume = f"its checkpoint {at} was written at the stop: resume with --resume {where}"
    else:  # no run directory to write it in
        resume = "no checkpoint was written at the stop: it cannot be resumed from there"
    return stop.warning(error, done, batches, resume)


def _stop_sampling(one: Run, sampler) -> None:
    """Stop the sampler, add the last segment's energy, keep the readings (never fatal)."""
    if not sampler:
        return
    sampler.stop()
    if one.progress.segments:
        last = one.progress.segments[-1]
        one.progress.energy.append(sampler.measure([(last["start"], last["stop"])]))
    if sampler.sources and one.samples_path:
        try:
            sampler.write_samples(one.samples_path)
        except (OSError, UserError) as error:  # post-processing: never lose the run
            one.warnings.append(f"power samples not written: {error}")


# ----------------------------------------------------------------------------- the record


def gather_energy(one: Run, outcome: Outcome) -> tuple[list[dict], list[str], int | None]:
    """The other workers' energy over this segment, gathered on all workers (a collective),
    notes naming the workers whose energy the record lacks (all of them where the run ended
    without the collective: a lost peer, SIGTERM, a failure; or the collective failed), and
    how many hosts the workers ran on (None where nothing was gathered)."""
    if one.workers == 1:
        return [], [], 1
    if outcome.peer_lost or outcome.status == "failed":
        if outcome.exit_code == Terminated.exit_code:
            why = "the run was stopped by SIGTERM: no collective after it"
        elif outcome.interrupted:
            why = "the run was interrupted (Ctrl-C): no collective after it"
        elif outcome.peer_lost:
            why = "a peer worker was lost: no collective after it"
        else:
            why = "the run failed: a peer may never join a collective"
        return [], [power.not_gathered(one.workers, "energy", why)], None
    own = one.progress.energy[-1] if one.progress.energy else []
    try:
        rows = one.trainer.gather_rows(power.worker_vector(own))
    except Exception as error:  # noqa: BLE001 - a failed collective costs the energy, not the run
        why = f"the collective gathering them failed: {error.__class__.__name__}"
        one.warnings.append(f"the other workers' energy could not be gathered ({why})")
        return [], [power.not_gathered(one.workers, "energy", why)], None
    vectors = [list(row) for row in rows]
    others, notes = power.other_workers(vectors)
    if len(one.progress.segments) > 1:
        why = "only their last segment's readings are counted"
        notes.append(power.not_gathered(one.workers, "energy before the last resume", why))
    return others, notes, power.node_count(vectors)


def finish(one: Run, outcome: Outcome, options: RunOptions) -> tuple[dict | None, Path | None]:
    """Gather every node's energy, close the MLPerf log and write the record (the chief)."""
    # A collective where every peer is there.
    others, others_notes, nodes = gather_energy(one, outcome)
    if not one.chief:
        if outcome.status != "completed":
            reason = "; ".join(one.warnings)
            raise WorkerRunEnded(one.rank, outcome.status, reason, outcome.exit_code)
        return None, None
    layer_values = one.trainer.layers()
    if nodes is None:  # not gathered: the cluster's hosts where the run's L3 names them
        nodes = len(layer_values["L3"].get("nodes") or []) or None
    energy, energy_warnings = energy_result(
        one.progress, outcome.notes + others_notes, options.power_hz, options.meter_log, others,
        nodes,
    )  # fmt: skip
    one.warnings += energy_warnings + streams.lost_warnings()
    run_dir = one.run_dir
    if not (one.finished and '"key": "run_stop"' in _tail(run_dir.mlperf_log)):
        status = "success" if outcome.status == "completed" else "aborted"
        one.mllog.end("run_stop", metadata={"status": status})
    one.mllog.close()
    sampled = outcome.sampler and outcome.sampler.sources
    artifacts = {
        "run_dir": str(run_dir),
        "mlperf_log": str(run_dir.mlperf_log),
        "checkpoints": str(run_dir.checkpoints),
        "checkpoint_cadence": cadence(one.setup.training),
        "checkpoints_written": one.progress.checkpoints,
        "power_samples": str(run_dir.power_samples) if sampled else None,
    }
    artifacts |= _tensorboard_artifacts(one)
    record = make_record(
        one.setup, layer_values, one.trainer.workload, one.progress, one.flops,
        outcome.status, one.warnings, artifacts, energy, framework=one.trainer.framework,
    )  # fmt: skip
    record_io.save(run_dir.record, record, overwrite=one.resumed)
    if one.tensorboard:
        _finish_tensorboard(one, record, layer_values, outcome.sampler)
    return record, run_dir.record


def _tensorboard_artifacts(one: Run) -> dict:
    """Where the run's TensorBoard scalars and profiler trace are; a trace is a warning too,
    since the profiler slows the steps it traces."""
    trace = one.trace
    files = [str(path) for path in trace.files()] if trace else []
    if trace:
        one.warnings.append(
            f"train steps {trace.first}-{trace.last} were traced by {trace.profiler}, "
            "which slows them: the time to quality includes that"
            if files
            else f"no profiler trace was written for train steps {trace.first}-{trace.last}"
        )
    written = one.tensorboard or trace
    return {
        "tensorboard": str(one.run_dir.tensorboard) if written else None,
        "profile_trace": files or None,
    }


def _finish_tensorboard(one: Run, record: dict, layer_values: dict, sampler) -> None:
    """The run's layers (HParams), power and score in TensorBoard; never fatal."""
    from hpcai500_tf.results import scoring

    board = one.tensorboard
    try:
        board.run_layers(one.run_dir.name, layer_values)
        if sampler and sampler.sources:
            board.power(sampler)
        if record["status"] == "completed" and record["quality"]["measured"]:
            with contextlib.suppress(UserError):
                board.score(one.progress.epochs_done, scoring.score(record, one.setup.benchmark))
    finally:
        board.close()


def _write_traceback(run_dir: RunDirectory | None) -> str:
    """The current exception's traceback in RUN_DIR/error.log; a note saying where."""
    if run_dir is None:
        return ""
    try:
        run_dir.error_log.write_text(traceback.format_exc())
    except OSError:
        return ""
    return f" (traceback in {run_dir.error_log})"


def _tail(path: Path, size: int = 4096) -> str:
    """The end of a text file ('' if it cannot be read)."""
    try:
        with path.open("rb") as handle:
            handle.seek(max(path.stat().st_size - size, 0))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
