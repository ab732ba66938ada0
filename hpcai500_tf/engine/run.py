"""One benchmark run from config to record: set up, count FLOPs, train, write the record.

Order matters: configs are validated in pure Python, then the strategy is built before any
other TensorFlow op runs, then data and model.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import tensorflow as tf

from hpcai500_tf import benchmark_layers, config
from hpcai500_tf import record as record_io
from hpcai500_tf.config import Setup
from hpcai500_tf.energy import sampler as power
from hpcai500_tf.engine import cluster, devices, run_state
from hpcai500_tf.engine import strategy as strategies
from hpcai500_tf.engine.loop import Engine, cadence
from hpcai500_tf.engine.mllog import MLLogger
from hpcai500_tf.engine.run_record import (
    CONFIG_FILE,
    MLPERF_LOG,
    POWER_SAMPLES,
    RECORD_FILE,
    Diverged,
    Progress,
    data_failed,
    energy_result,
    fingerprint,
    log_setup,
    make_record,
    start_power_sampling,
)
from hpcai500_tf.errors import UserError
from hpcai500_tf.measure.flops import count_function
from hpcai500_tf.report.live import Views
from hpcai500_tf.report.tensorboard import DIRECTORY as TENSORBOARD_DIRECTORY
from hpcai500_tf.report.tensorboard import StepTrace, TensorBoardView
from hpcai500_tf.workloads import build_workload


def build_engine(setup: Setup, data_dir: str | None, mllog=None, view=None) -> Engine:
    strategy = strategies.make_strategy(setup.training.strategy, setup.communication)
    workload = build_workload(setup.benchmark.name, setup.config, data_dir)
    return Engine(workload, setup.training, setup.optimizer, strategy, mllog, view)


def measure_flops(engine: Engine, batch) -> dict:
    """Training FLOPs from the train step the engine runs; forward FLOPs both ways."""
    images = batch[0]
    train = engine.count_flops(batch)
    forward = tf.function(lambda x: engine.model(x, training=False))
    if engine.replicas == 1:
        forward_count = count_function(forward, images, batch=engine.global_batch)
        forward_per_example = forward_count.per_example
    else:
        forward_per_example = None
    return {
        "per_example_training": train.per_example,
        "per_example_forward": forward_per_example,
        "analytical_per_example_forward": engine.workload.analytical_forward_flops(engine.model),
        "method": (
            "TensorFlow registered op statistics (convolution gradients counted exactly) "
            "over the ops that run in the traced train step "
            f"(forward, backward, weight update) at global batch {engine.global_batch}"
            + (
                f" ({engine.local_batch} per worker, as traced)"
                if engine.local_batch != engine.global_batch
                else ""
            )
            + "; "
            "multiply-add = 2"
        ),
        "basis": "tensorflow-profiler",
        "counted_op_types": sorted(train.by_op_type),
        "uncounted_op_types": train.uncounted_op_types,
        # per example of the batch the step was traced at (this worker's), as the total is
        "by_op_type_per_example": {k: v / train.batch for k, v in sorted(train.by_op_type.items())},
    }


def _layers(setup: Setup, engine: Engine) -> dict:
    name = setup.training.strategy
    l3, workers, _ = strategies.describe(engine.strategy, name)
    if name == "multi_worker":
        c = setup.communication
        l3 |= {"timeout_s": c.timeout_s, "join_timeout_s": c.join_timeout_s}
    observed = benchmark_layers.system_layers(workers, l3["collective_implementation"])
    observed["L3"] = l3
    threads = (
        tf.config.threading.get_intra_op_parallelism_threads()
        or int(os.environ.get("TF_NUM_INTRAOP_THREADS", 0))
        or len(os.sched_getaffinity(0))  # TensorFlow's default: one per usable core
    )
    gpus = len(tf.config.list_physical_devices("GPU"))  # L5: what the run computed on
    observed["L5"] = {**observed["L5"], "devices_used": devices.devices_used(engine.strategy, gpus)}
    return observed | benchmark_layers.run_layers(
        setup,
        engine.workload,
        workers=workers,
        replicas=engine.replicas,
        global_batch=engine.global_batch,
        precision=engine.policy,
        initial_loss_scale=engine.initial_loss_scale,
        intra_op_threads=threads,
    )


def gather_energy(run: BenchmarkRun, outcome: Outcome) -> tuple[list[dict], list[str]]:
    """The other workers' energy over this segment, gathered on all workers (a collective), and
    notes naming the workers whose energy the record lacks: all of them where the run ended
    without the collective (a lost peer, SIGTERM, a failure) or the collective failed."""
    if run.workers == 1:
        return [], []
    if outcome.peer_lost or outcome.status == "failed":
        if outcome.exit_code == Terminated.exit_code:
            why = "the run was stopped by SIGTERM: no collective after it"
        elif outcome.peer_lost:
            why = "a peer worker was lost: no collective after it"
        else:
            why = "the run failed: a peer may never join a collective"
        return [], [power.not_gathered(run.workers, "energy", why)]
    own = run.progress.energy[-1] if run.progress.energy else []
    try:
        rows = cluster.gather_rows(run.engine.strategy, power.worker_vector(own))
    except tf.errors.OpError as error:
        why = f"the collective gathering them failed: {error.__class__.__name__}"
        run.warnings.append(f"the other workers' energy could not be gathered ({why})")
        return [], [power.not_gathered(run.workers, "energy", why)]
    others, notes = power.other_workers(rows.tolist())
    if len(run.progress.segments) > 1:
        why = "only their last segment's readings are counted"
        notes.append(power.not_gathered(run.workers, "energy before the last resume", why))
    return others, notes


@dataclass
class BenchmarkRun:
    """What the phases of one run share: the engine, where the run lives, its progress."""

    setup: Setup
    engine: Engine
    workers: int
    rank: int
    run_dir: Path | None  # None on a worker that does not know it (Slurm, a user's TF_CONFIG)
    resumed: bool
    progress: Progress
    mllog: MLLogger
    finished: bool = False  # resumed after its last epoch: only the lost record is rebuilt
    flops: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    tensorboard: TensorBoardView | None = None  # the chief's, when on

    @property
    def chief(self) -> bool:
        return self.rank == 0

    @property
    def samples_path(self) -> Path | None:
        """This worker's power readings: the run's own file on the chief; the others' beside
        their logs, when the launcher made the run directory."""
        if self.chief:
            return self.run_dir / POWER_SAMPLES
        if self.run_dir:
            return self.run_dir / "workers" / f"power-samples-worker{self.rank}.csv"
        return None


@dataclass
class Outcome:
    """How the timed run ended, and what its power sampler saw."""

    status: str = "completed"
    peer_lost: bool = False  # or stopped by SIGTERM on several workers: no collective after
    exit_code: int = 1  # of a worker other than the chief when the run did not complete
    sampler: power.PowerSampler | None = None
    notes: list[str] = field(default_factory=list)


def run_benchmark(
    setup: Setup,
    data_dir: str | None,
    out_dir: str | Path,
    resume: str | None = None,
    view=None,
    power_hz: float = 10.0,
    meter_log: str | None = None,
    run_dir: str | Path | None = None,
    tensorboard: bool = True,
    profile_steps: tuple[int, int] | None = None,
    allow_cpu: bool = False,
) -> tuple[dict | None, Path | None]:
    """Run the benchmark; returns (record, record path), or (None, None) on a worker other than
    the chief (worker 0 writes the one record of a multi-worker run).

    Power is sampled at `power_hz` during the timed run; `meter_log` names a node meter's log
    (see `energy.meter_log`), read when the run ends. `run_dir` is an empty directory made for
    this run by the multi-worker launcher (otherwise one is made under `out_dir`). The chief
    writes TensorBoard scalars to RUN_DIR/tensorboard/ unless `tensorboard` is false, and a
    profiler trace of the global train steps `profile_steps` (first, last) when asked. A
    machine whose GPUs TensorFlow does not see is refused unless `allow_cpu`."""
    init_start = time.time()
    with stop_on_sigterm() as sigterm:
        run = prepare_run(setup, data_dir, out_dir, resume, run_dir, view, init_start, allow_cpu)
        sigterm.take_back()  # a multi-worker strategy's TensorFlow put its own in place
        if run.chief:
            watch_in_tensorboard(run, tensorboard, profile_steps)
        initialise(run, meter_log)
        outcome = timed_run(run, power_hz, sigterm)
        return finish(run, outcome, power_hz, meter_log)


class Terminated(KeyboardInterrupt):
    """SIGTERM (scancel, a Slurm time limit, preemption), raised in the main thread by the
    handler `stop_on_sigterm` installs: it ends a run as Ctrl-C does (a `stopped` record that
    `--resume` continues), and the process exits 143 (128 + SIGTERM, a shell's code for a
    process SIGTERM ended)."""

    exit_code = 128 + signal.SIGTERM

    def __init__(self):
        super().__init__("terminated by SIGTERM")


SIGTERM_STOPPED = "stopped by SIGTERM (scancel, a time limit or preemption)"


class _SigtermStop:
    """The SIGTERM handler: the first one raises `Terminated` (or, once `defer` is set, while
    the record is written, is only noted); later ones are ignored, as the run is already
    ending (SIGKILL after the scheduler's grace period remains the hard stop)."""

    def __init__(self):
        self.received = False
        self.defer = False
        self.installed = False

    def take_back(self) -> None:
        """Install this handler again where it was installed: TensorFlow replaces it, below
        Python, while it builds a multi-worker strategy (its coordination service's own
        handler, under which a SIGTERMed worker just trained on until SIGKILL)."""
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
    a TensorFlow collective (holding the GIL) ignores SIGTERM until the collective returns: at
    once when a peer stopped first, within the communication timeout when a peer hangs. One
    that never returns (a peer that never joins) is ended by SIGKILL, as today: the
    scheduler's after its grace period, the launcher's, or `cluster.JoinWatchdog`'s."""
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
    stopped by SIGTERM, 1 otherwise (Ctrl-C's stopped record included, as before)."""
    if record["status"] == "completed":
        return 0
    if record["status"] == "stopped" and any(
        w.startswith(SIGTERM_STOPPED) for w in record["warnings"]
    ):
        return Terminated.exit_code
    return 1


def prepare_run(
    setup, data_dir, out_dir, resume, run_dir, view, init_start, allow_cpu=False
) -> BenchmarkRun:
    """The strategy (before any other TensorFlow op), the engine, the devices checked, the
    run directory and the progress to start from: new, or restored from its last checkpoint."""
    if resume:  # before any TensorFlow op, and again on every worker (see run_state)
        if not (Path(resume) / CONFIG_FILE).is_file():
            raise UserError(f"{resume}: not a run directory (no {CONFIG_FILE})")
        run_state.check_resumable(resume, setup.training.epochs)
    config_id = fingerprint(setup.config)
    engine = build_engine(setup, data_dir, None, view)
    _, workers, rank = strategies.describe(engine.strategy, setup.training.strategy)
    device_warnings = devices.check_devices(
        engine.strategy, allow_cpu, view if rank == 0 else None, engine.policy
    )
    for warning in getattr(engine.strategy, "hpcai500_cluster_warnings", []):  # e.g. few CPUs
        device_warnings.append(warning)
        if rank == 0 and view:
            view.message(warning)
    if workers > 1:
        check_multi_worker(engine, workers, config_id)
    if rank != 0:
        engine.view = None  # the chief reports the run
    device_warnings += engine.check_data()  # e.g. fewer validation files than workers
    if resume:
        run_dir = Path(resume)
    elif rank == 0:
        run_dir = Path(
            run_dir or record_io.new_run_dir(out_dir, setup.benchmark.name, setup.preset)
        )
        record_io.write_atomic(run_dir / CONFIG_FILE, config.saved_config(setup))
    mllog = engine.mllog = MLLogger(run_dir / MLPERF_LOG if rank == 0 else None)
    run = BenchmarkRun(
        setup, engine, workers, rank, run_dir and Path(run_dir), bool(resume),
        Progress(config_fingerprint=config_id, init_start=init_start), mllog,
        warnings=device_warnings,
    )  # fmt: skip
    if resume:
        run.progress = engine.restore(run.run_dir, config_id)
        run.finished = _record_lost(run)
    else:
        mllog.start("init_start", time_ms=init_start * 1000)
        log_setup(mllog, setup, engine.global_batch, engine.workload)
    return run


def watch_in_tensorboard(run: BenchmarkRun, on: bool, profile_steps) -> None:
    """TensorBoard scalars beside the live view, and a profiler trace of the steps asked for
    (inside the timed run, after warm-up: those steps are slower, and the record says so)."""
    log_dir = run.run_dir / TENSORBOARD_DIRECTORY
    if profile_steps:
        first, last = profile_steps
        done = run.progress.epochs_done * run.engine.steps_per_epoch
        total = run.setup.training.epochs * run.engine.steps_per_epoch
        if not done < first <= last <= total:
            raise UserError(
                f"--profile-steps {first}-{last}: outside the steps this run trains "
                f"({done + 1}-{total})"
            )
        run.engine.trace = StepTrace(log_dir, first, last)
    if on and importlib.util.find_spec("tensorboard") is None:
        run.warnings.append(
            "TensorBoard scalars not written: the tensorboard package is not installed "
            "(it comes with the cpu and cuda extras)"
        )
    elif on:
        run.tensorboard = TensorBoardView(log_dir)
        run.engine.view = Views(run.engine.view, run.tensorboard)


def _record_lost(run: BenchmarkRun) -> bool:
    """Whether a resumed run had already finished its epochs, so that only its record is
    rebuilt (one that was lost, or the stopped one a stop after the last checkpoint left;
    `run_state.check_resumable` refused the run where a completed record is there)."""
    if run.progress.epochs_done < run.setup.training.epochs:
        return False
    run.warnings.append("the record was rebuilt by --resume from the run's saved state")
    return True


def initialise(run: BenchmarkRun, meter_log: str | None) -> None:
    """Everything before the timed run: count the train step's FLOPs, warm it up (and, on the
    chief, the checkpoint writer), so that one-time costs stay out of the time to quality."""
    engine, view = run.engine, run.engine.view
    if view:
        view.message("tracing the train step, counting its FLOPs, warming it up")
    batch = engine.synthetic_batch()
    run.flops = measure_flops(engine, batch)
    engine.warm_up(batch)
    if run.chief:  # the one that writes checkpoints: at least one, after the last epoch
        engine.warm_up_checkpoints()
    if not run.resumed:
        run.mllog.end("init_stop")
    if run.chief and meter_log and not Path(meter_log).exists():
        run.warnings.append(f"{meter_log}: the meter log did not exist when the run started")
        if view:
            view.message(f"{meter_log} does not exist yet; it is read when the run ends")


class WorkerRunEnded(Exception):
    """A worker other than the chief saw the run end early: it exits non-zero (`code`) with
    the reason (the chief writes the record), so that a scheduler never counts that task a
    success."""

    def __init__(self, rank: int, status: str, reason: str, code: int = 1):
        super().__init__(f"worker {rank}: run {status}: {reason}")
        self.code = code


def timed_run(run: BenchmarkRun, power_hz: float, sigterm: _SigtermStop | None = None) -> Outcome:
    """Train to the epoch budget with power sampled on every worker's node. Whatever ends the
    run (divergence, Ctrl-C or SIGTERM, a lost peer, bad data, a defect) becomes its status
    and a warning: the record is still written (a SIGTERM after training only noted)."""
    if run.finished:
        note = "the record was rebuilt after the run: no readings beyond its checkpoint"
        return Outcome(notes=[note])
    sampler, notes = start_power_sampling(power_hz, run.engine.view)
    if sampler:
        sampler.worker = run.rank  # its measurements and power-sample rows name this worker
    outcome = Outcome(sampler=sampler, notes=notes)
    try:
        run.engine.train_epochs(run.progress, run.run_dir if run.chief else None, power=sampler)
    except (KeyboardInterrupt, Exception) as error:  # every ending is a status and a warning
        if sigterm and sigterm.received and not isinstance(error, Diverged):
            # SIGTERM's stop, whatever it raised: Terminated, or on a multi-worker run a peer
            # that stopped first (a lost peer; pybind11's RuntimeError when Terminated is
            # raised while TensorFlow translates that error)
            error = Terminated()
        outcome.status, warning, outcome.peer_lost = classify_failure(error, run)
        run.warnings.append(warning)
        if isinstance(error, Terminated):
            outcome.exit_code = Terminated.exit_code
    finally:
        if sigterm:
            sigterm.defer = True  # the record is written whatever comes now
        _stop_sampling(run, sampler)
    return outcome


def classify_failure(error: BaseException, run: BenchmarkRun) -> tuple[str, str, bool]:
    """(status, warning, whether a peer was lost) for what ended a run early."""
    if isinstance(error, Diverged):
        return "diverged", str(error), False
    if isinstance(error, KeyboardInterrupt):  # Ctrl-C, or SIGTERM (Terminated)
        saved = run.engine.saved_epochs
        where = run.run_dir or "RUN_DIR (the chief's run directory)"
        if not run.chief:  # the chief writes the checkpoints
            resume = f"resume with --resume {where} (from the chief's last checkpoint)"
        elif saved is None:
            resume = "no checkpoint was written yet: it cannot be resumed"
        else:
            resume = (
                f"the last checkpoint holds {saved}: resume with --resume {where} "
                f"(it continues from epoch {saved + 1})"
            )
        done = run.progress.epochs_done
        if isinstance(error, Terminated):  # the peers get it too: skip the energy collective
            return "stopped", f"{SIGTERM_STOPPED} after {done} epoch(s); {resume}", run.workers > 1
        return "stopped", f"interrupted by the user after {done} epoch(s); {resume}", False
    if isinstance(error, tf.errors.OpError):
        user_error = _user_error_inside(error)
        first_line = (str(error).strip().splitlines() or [""])[-1][:300]
        name = error.__class__.__name__
        if user_error is not None:  # bad data found while reading
            return (*data_failed(user_error), False)
        if run.workers > 1 and isinstance(error, PEER_LOST):
            lost = f"lost contact with a peer worker ({name}: {first_line})"
            where = run.run_dir or "RUN_DIR (the chief's run directory)"
            return "stopped", f"{lost}; resume with --resume {where}", True
        return "failed", f"the run failed: {name}: {first_line}", False  # e.g. a corrupt shard
    if isinstance(error, UserError):
        return "failed", f"the run failed: {error}", False
    # A defect: still a record, and its traceback beside it.
    where = _write_traceback(run.run_dir if run.chief else None)
    return "failed", f"the run failed: {error.__class__.__name__}: {error}{where}", False


def _stop_sampling(run: BenchmarkRun, sampler) -> None:
    """Stop the sampler, add the last segment's energy, keep the readings (never fatal)."""
    if not sampler:
        return
    sampler.stop()
    if run.progress.segments:
        last = run.progress.segments[-1]
        run.progress.energy.append(sampler.measure([(last["start"], last["stop"])]))
    if sampler.sources and run.samples_path:
        try:
            sampler.write_samples(run.samples_path)
        except (OSError, UserError) as error:  # post-processing: never lose the run
            run.warnings.append(f"power samples not written: {error}")


def finish(
    run: BenchmarkRun, outcome: Outcome, power_hz: float, meter_log: str | None
) -> tuple[dict | None, Path | None]:
    """Gather every node's energy, close the MLPerf log and write the record (the chief)."""
    others, others_notes = gather_energy(run, outcome)  # a collective where every peer is there
    if not run.chief:
        if outcome.status != "completed":
            reason = "; ".join(run.warnings)
            raise WorkerRunEnded(run.rank, outcome.status, reason, outcome.exit_code)
        return None, None
    energy, energy_warnings = energy_result(
        run.progress, outcome.notes + others_notes, power_hz, meter_log, others
    )
    run.warnings += energy_warnings
    run_dir = run.run_dir
    if not (run.finished and '"key": "run_stop"' in _tail(run_dir / MLPERF_LOG)):
        status = "success" if outcome.status == "completed" else "aborted"
        run.mllog.end("run_stop", metadata={"status": status})
    run.mllog.close()
    sampled = outcome.sampler and outcome.sampler.sources
    artifacts = {
        "run_dir": str(run_dir),
        "mlperf_log": str(run_dir / MLPERF_LOG),
        "checkpoints": str(run_dir / "checkpoints"),
        "checkpoint_cadence": cadence(run.setup.training),
        "checkpoints_written": run.progress.checkpoints,
        "power_samples": str(run_dir / POWER_SAMPLES) if sampled else None,
    }
    artifacts |= _tensorboard_artifacts(run)
    layer_values = _layers(run.setup, run.engine)
    record = make_record(
        run.setup, layer_values, run.engine.workload, run.progress,
        run.flops, outcome.status, run.warnings, artifacts, energy,
    )  # fmt: skip
    path = run_dir / RECORD_FILE
    record_io.save(path, record, overwrite=run.resumed)
    if run.tensorboard:
        _finish_tensorboard(run, record, layer_values, outcome.sampler)
    return record, path


def _tensorboard_artifacts(run: BenchmarkRun) -> dict:
    """Where the run's TensorBoard scalars and profiler trace are; a trace is a warning too,
    since the profiler slows the steps it traces."""
    trace = run.engine.trace
    files = [str(path) for path in trace.files()] if trace else []
    if trace:
        run.warnings.append(
            f"train steps {trace.first}-{trace.last} were traced by the TensorFlow profiler, "
            "which slows them: the time to quality includes that"
            if files
            else f"no profiler trace was written for train steps {trace.first}-{trace.last}"
        )
    tensorboard = run.tensorboard or trace
    return {
        "tensorboard": str(run.run_dir / TENSORBOARD_DIRECTORY) if tensorboard else None,
        "profile_trace": files or None,
    }


def _finish_tensorboard(run: BenchmarkRun, record: dict, layer_values: dict, sampler) -> None:
    """The run's layers (HParams), power and score in TensorBoard; never fatal."""
    from hpcai500_tf import scoring

    board = run.tensorboard
    try:
        board.run_layers(run.run_dir.name, layer_values)
        if sampler and sampler.sources:
            board.power(sampler)
        if record["status"] == "completed" and record["quality"]["measured"]:
            with contextlib.suppress(UserError):
                board.score(run.progress.epochs_done, scoring.score(record, run.setup.benchmark))
    finally:
        board.close()


def _write_traceback(run_dir: Path | None) -> str:
    """The current exception's traceback in RUN_DIR/error.log; a note saying where."""
    import traceback

    if run_dir is None:
        return ""
    try:
        (run_dir / "error.log").write_text(traceback.format_exc())
    except OSError:
        return ""
    return f" (traceback in {run_dir / 'error.log'})"


def _tail(path: Path, size: int = 4096) -> str:
    """The end of a text file ('' if it cannot be read)."""
    try:
        with path.open("rb") as handle:
            handle.seek(max(path.stat().st_size - size, 0))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _user_error_inside(error: tf.errors.OpError) -> UserError | None:
    """A UserError raised inside the input pipeline (e.g. a corrupt sample) reaches the loop
    wrapped in a TensorFlow error; unwrap it."""
    match = re.search(r"UserError: (.*)", str(error))
    return UserError(match.group(1).strip()) if match else None


# What a collective raises when a peer worker dies or stops answering.
PEER_LOST = (
    tf.errors.UnavailableError,
    tf.errors.DeadlineExceededError,
    tf.errors.CancelledError,
    tf.errors.AbortedError,
    tf.errors.InternalError,
)


def check_multi_worker(engine: Engine, workers: int, config_id: str) -> None:
    """Refuse, on every worker, a run the workers disagree on or cannot shard."""
    workload, batch = engine.workload, engine.training.batch_per_replica
    per_worker_replicas = engine.replicas // workers
    if workload.train_examples // workers < batch * per_worker_replicas:
        raise UserError(
            f"{workload.train_examples} training examples cannot be sharded to {workers} "
            f"workers of {batch * per_worker_replicas} examples per step each"
        )
    if workload.eval_examples < workers:
        raise UserError(
            f"{workload.eval_examples} evaluation examples cannot be sharded to {workers} workers"
        )
    # Only the chief writes checkpoints: every variable here is mirrored (synchronised on
    # write), so a save reads the chief's own copy. One synchronised on read (a Keras metric's)
    # would be all-reduced by the save, a collective the other workers would never join.
    variables = [*engine.model.variables, *engine.optimizer.variables]
    on_read = [v.path for v in variables if v.synchronization == "on_read"]
    if on_read:
        raise RuntimeError(f"{on_read[0]}: read collectively, so the chief cannot save alone")
    if not cluster.same_on_all_workers(engine.strategy, config_id):
        raise UserError(
            f"the workers were started with different configs (this worker's is {config_id}): "
            "start every worker with the same benchmark, preset and --set values"
        )


def flops_report(setup: Setup, allow_cpu: bool = False) -> dict:
    """FLOPs per example both ways, without training (the setup's data is not read), on the
    devices a run would use (checked as a run's are)."""
    engine = build_engine(setup, None)
    devices.check_devices(engine.strategy, allow_cpu, policy=engine.policy)
    return {
        **measure_flops(engine, engine.synthetic_batch()),
        "global_batch": engine.global_batch,
        "precision": engine.policy,
    }
