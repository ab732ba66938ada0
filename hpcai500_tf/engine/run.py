"""One benchmark run from config to record: set up, count FLOPs, train, write the record.

Order matters: configs are validated in pure Python, then the strategy is built before any
other TensorFlow op runs, then data and model.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import tensorflow as tf

from hpcai500_tf import benchmark_layers
from hpcai500_tf import record as record_io
from hpcai500_tf.config import Setup
from hpcai500_tf.energy import sampler as power
from hpcai500_tf.engine import cluster
from hpcai500_tf.engine import strategy as strategies
from hpcai500_tf.engine.loop import Diverged, Engine
from hpcai500_tf.engine.mllog import MLLogger
from hpcai500_tf.engine.run_record import (
    CONFIG_FILE,
    MLPERF_LOG,
    POWER_SAMPLES,
    RECORD_FILE,
    Progress,
    energy_result,
    fingerprint,
    log_setup,
    make_record,
    start_power_sampling,
)
from hpcai500_tf.errors import UserError
from hpcai500_tf.measure.flops import count_function
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
        "by_op_type_per_example": {
            k: v / engine.global_batch for k, v in sorted(train.by_op_type.items())
        },
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
    return observed | benchmark_layers.run_layers(
        setup,
        engine.workload,
        workers=workers,
        replicas=engine.replicas,
        global_batch=engine.global_batch,
        precision=engine.policy,
        intra_op_threads=threads,
    )


def _gather_energy(engine: Engine, progress: Progress, warnings: list[str]):
    """Every worker's energy over this segment, gathered on all workers (a collective)."""
    own = progress.energy[-1] if progress.energy else []
    try:
        rows = cluster.gather_rows(engine.strategy, power.worker_vector(own))
    except tf.errors.OpError as error:
        warnings.append(
            f"the other workers' energy could not be gathered ({error.__class__.__name__})"
        )
        return [], []
    return power.other_workers(rows.tolist())


def run_benchmark(
    setup: Setup,
    data_dir: str | None,
    out_dir: str | Path,
    resume: str | None = None,
    view=None,
    power_hz: float = 10.0,
    meter_log: str | None = None,
    run_dir: str | Path | None = None,
) -> tuple[dict | None, Path | None]:
    """Run the benchmark; returns (record, record path), or (None, None) on a worker other than
    the chief (worker 0 writes the one record of a multi-worker run).

    Power is sampled at `power_hz` during the timed run; `meter_log` names a node meter's log
    (see `energy.meter_log`), read when the run ends. `run_dir` is an empty directory made for
    this run by the multi-worker launcher (otherwise one is made under `out_dir`)."""
    init_start = time.time()
    if resume:
        run_dir = Path(resume)
        if not (run_dir / CONFIG_FILE).is_file():
            raise UserError(f"{run_dir}: not a run directory (no {CONFIG_FILE})")
    config_id = fingerprint(setup.config)
    engine = build_engine(setup, data_dir, None, view)  # strategy first, then TF work
    _, workers, rank = strategies.describe(engine.strategy, setup.training.strategy)
    if workers > 1:
        check_multi_worker(engine, workers, config_id)
    chief = rank == 0
    if not chief:
        view = engine.view = None
    engine.check_data()
    if chief:
        if run_dir is None:
            run_dir = record_io.new_run_dir(out_dir, setup.benchmark.name, setup.preset)
        run_dir = save_dir = Path(run_dir)
        if not resume:
            record_io.write_atomic(run_dir / CONFIG_FILE, setup.config)
    else:
        # Every worker writes checkpoints (the variables are read collectively); only the
        # chief's are kept. The others write to a scratch directory, removed at the end.
        save_dir = scratch_dir(rank)
    # Each worker's power readings; the others' beside their logs when the launcher made the
    # run directory (under Slurm or a user's TF_CONFIG they do not know it).
    samples_path = (
        run_dir / POWER_SAMPLES
        if chief
        else Path(run_dir) / "workers" / f"power-samples-worker{rank}.csv"
        if run_dir
        else None
    )
    mllog = MLLogger(run_dir / MLPERF_LOG if chief else None)
    engine.mllog = mllog
    finished = False  # a finished run whose record was lost: rebuilt from the saved state
    if resume:
        progress = engine.restore(run_dir, config_id)
        if progress.epochs_done >= setup.training.epochs:
            if (run_dir / RECORD_FILE).exists():
                raise UserError(
                    f"{run_dir}: the run already finished all its epochs (its record: "
                    f"{run_dir / RECORD_FILE})"
                )
            finished = True
    else:
        progress = Progress(config_fingerprint=config_id, init_start=init_start)
        mllog.start("init_start", time_ms=init_start * 1000)
        log_setup(mllog, setup, engine.global_batch, engine.workload)
    if view:
        view.message("tracing the train step, counting its FLOPs, warming it up")
    batch = engine.synthetic_batch()
    flops = measure_flops(engine, batch)
    engine.warm_up(batch)
    if setup.training.checkpoint_every:
        engine.warm_up_checkpoints()
    if not resume:
        mllog.end("init_stop")
    warnings, status, peer_lost = [], "completed", False
    if chief and meter_log and not Path(meter_log).exists():
        warnings.append(f"{meter_log}: the meter log did not exist when the run started")
        if view:
            view.message(f"{meter_log} does not exist yet; it is read when the run ends")
    if finished:
        warnings.append("the record was rebuilt by --resume from the run's saved state")
        sampler, notes = (
            None,
            ["the record was rebuilt after the run: no readings beyond its checkpoint"],
        )
    else:
        sampler, notes = start_power_sampling(power_hz, view)  # every worker samples its node
    try:
        if not finished:
            engine.train_epochs(progress, save_dir, power=sampler)
    except Diverged as error:
        status = "diverged"
        warnings.append(str(error))
    except KeyboardInterrupt:
        status = "stopped"
        saved = engine.saved_epochs
        warnings.append(
            f"interrupted by the user after {progress.epochs_done} epoch(s); "
            + (
                "no checkpoint was written yet: it cannot be resumed"
                if saved is None
                else f"the last checkpoint holds {saved}: resume with --resume {run_dir} "
                f"(it continues from epoch {saved + 1})"
            )
        )
    except tf.errors.OpError as error:
        user_error = _user_error_inside(error)
        first_line = (str(error).strip().splitlines() or [""])[-1][:300]
        if user_error is not None:  # bad data found while reading
            status = "failed"
            warnings.append(f"the input data failed mid-run: {user_error}")
        elif workers > 1 and isinstance(error, PEER_LOST):
            status, peer_lost = "stopped", True
            warnings.append(
                f"lost contact with a peer worker ({error.__class__.__name__}: {first_line}); "
                f"resume with --resume {run_dir}"
            )
        else:  # e.g. a corrupt shard (DataLossError) found mid-epoch
            status = "failed"
            warnings.append(f"the run failed: {error.__class__.__name__}: {first_line}")
    except UserError as error:
        status = "failed"
        warnings.append(f"the run failed: {error}")
    except Exception as error:  # noqa: BLE001 - a defect: still a record, and its traceback
        status = "failed"
        where = _write_traceback(run_dir if chief else None)
        warnings.append(f"the run failed: {error.__class__.__name__}: {error}{where}")
    finally:
        if sampler:
            sampler.stop()
            last = progress.segments[-1] if progress.segments else None
            if last:
                progress.energy.append(sampler.measure([(last["start"], last["stop"])]))
            if sampler.sources and samples_path:
                try:
                    sampler.write_samples(samples_path)
                except (OSError, UserError) as error:  # post-processing: never lose the run
                    warnings.append(f"power samples not written: {error}")
    others, others_notes = [], []
    if workers > 1 and not peer_lost and status != "failed":  # a collective needs every peer
        others, others_notes = _gather_energy(engine, progress, warnings)
    if not chief:
        shutil.rmtree(save_dir, ignore_errors=True)
        return None, None
    energy, energy_warnings = energy_result(
        progress, notes + others_notes, power_hz, meter_log, others
    )
    warnings += energy_warnings
    if not (finished and '"key": "run_stop"' in _tail(run_dir / MLPERF_LOG)):
        mllog.end(
            "run_stop", metadata={"status": "success" if status == "completed" else "aborted"}
        )
    mllog.close()
    artifacts = {
        "run_dir": str(run_dir),
        "mlperf_log": str(run_dir / MLPERF_LOG),
        "checkpoints": str(run_dir / "checkpoints"),
        "power_samples": str(run_dir / POWER_SAMPLES) if sampler and sampler.sources else None,
    }
    layer_values = _layers(setup, engine)
    record = make_record(
        setup, layer_values, engine.workload, progress, flops, status, warnings, artifacts, energy
    )
    path = run_dir / RECORD_FILE
    record_io.save(path, record, overwrite=bool(resume))
    return record, path


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


def scratch_dir(rank: int) -> Path:
    """A worker's scratch directory for its checkpoints, removed at the end of its run; the
    ones that workers which died (SIGKILL, os._exit) left behind go at the next start."""
    base = Path(tempfile.gettempdir()) / "hpcai500-tf-scratch"
    base.mkdir(exist_ok=True)
    for old in base.glob("worker*-*"):
        try:
            os.kill(int(old.name.rsplit("-", 1)[1]), 0)
        except ProcessLookupError:
            shutil.rmtree(old, ignore_errors=True)
        except (ValueError, PermissionError):
            continue  # not ours to judge: another user's process, or a name we did not make
    path = base / f"worker{rank}-{os.getpid()}"
    path.mkdir()
    return path


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
    if not cluster.same_on_all_workers(engine.strategy, config_id):
        raise UserError(
            f"the workers were started with different configs (this worker's is {config_id}): "
            "start every worker with the same benchmark, preset and --set values"
        )


def flops_report(setup: Setup, data_dir: str | None) -> dict:
    """FLOPs per example both ways, without training."""
    engine = build_engine(setup, data_dir)
    return {
        **measure_flops(engine, engine.synthetic_batch()),
        "global_batch": engine.global_batch,
        "precision": engine.policy,
    }
