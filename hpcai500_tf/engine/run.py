"""The TensorFlow backend: the engine (engine/loop.py) as the lifecycle's trainer.

    run_benchmark(setup, data_dir, out_dir, view=..., **options)   -> lifecycle.run
    build_trainer(setup, options, view)                            -> TensorFlowTrainer

Order matters: configs are validated in pure Python, then the strategy is built before any
other TensorFlow op runs, then data and model.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import tensorflow as tf

from hpcai500_tf import benchmark_layers
from hpcai500_tf.config import Setup
from hpcai500_tf.engine import cluster, devices
from hpcai500_tf.engine import strategy as strategies
from hpcai500_tf.engine.loop import Engine
from hpcai500_tf.engine.stop_vote import StopVote
from hpcai500_tf.errors import UserError
from hpcai500_tf.lifecycle import Failure, RunOptions
from hpcai500_tf.lifecycle import run as run_lifecycle
from hpcai500_tf.measure.flops import count_function
from hpcai500_tf.run import data_position
from hpcai500_tf.run.run_record import fingerprint
from hpcai500_tf.workloads import build_workload


def run_benchmark(
    setup: Setup, data_dir: str | None, out_dir: str | Path, *, view=None, **options
) -> tuple[dict | None, Path | None]:
    """Run the benchmark on TensorFlow; returns (record, record path), or (None, None) on a
    worker other than the chief. `options` are `lifecycle.RunOptions`' fields."""
    return run(setup, RunOptions(data_dir=data_dir, out_dir=out_dir, **options), view)


def run(setup: Setup, options: RunOptions, view=None) -> tuple[dict | None, Path | None]:
    """Run the benchmark on TensorFlow (see lifecycle.run)."""
    return run_lifecycle(setup, options, build_trainer, view)


def end_worker(code: int) -> None:
    """End a worker of a multi-worker run that did not complete (`code` not 0), now:
    TensorFlow's orderly shutdown would wait for a lost peer forever. A completed one exits
    as usual."""
    if code:
        cluster.exit_without_shutdown(code)


def build_engine(setup: Setup, data_dir: str | None) -> Engine:
    strategy = strategies.make_strategy(setup.training.strategy, setup.communication)
    workload = build_workload(setup.benchmark.name, setup.config, data_dir)
    return Engine(workload, setup.training, setup.optimizer, strategy)


class TensorFlowTrainer:
    """The engine behind the lifecycle's `Trainer` interface (lifecycle.py)."""

    framework = "tensorflow"

    def __init__(self, setup: Setup, engine: Engine, workers: int, rank: int, warnings):
        self.setup, self.engine = setup, engine
        self.workload = engine.workload
        self.global_batch = engine.global_batch
        self.steps_per_epoch = engine.steps_per_epoch
        self.workers, self.rank = workers, rank
        self.warnings = warnings

    @functools.cached_property
    def zero_batch(self):
        """The zero batch the step is traced, counted and warmed up on (no data is read)."""
        return self.engine.synthetic_batch()

    def count_flops(self) -> dict:
        return measure_flops(self.engine, self.zero_batch)

    def warm_up(self, checkpoints: bool) -> None:
        self.engine.warm_up(self.zero_batch)
        if checkpoints:
            self.engine.warm_up_checkpoints()
        if self.workers > 1:  # traced (and its collective made) before the timed run
            self.agree_stop(0)

    def train_batches(self, epochs_done: int, batches_done: int = 0):
        """Every epoch's own stream, seeded by its epoch (data_position.py)."""
        t = self.setup.training

        def open_epoch(epoch: int, skip: int):
            offset = data_position.epoch_seed(t.seed, epoch) - t.seed
            return self.engine.train_batches(seed_offset=offset, skip=skip)

        return data_position.epoch_batches(
            open_epoch, epochs_done, batches_done, t.epochs, self.steps_per_epoch
        )

    @functools.cached_property
    def _stop_vote(self) -> StopVote:
        return StopVote(self.engine.strategy)

    def agree_stop(self, local: int) -> int:
        return self._stop_vote.agree(local)

    def train_step(self, batch):
        return self.engine.train_step(*batch)

    def loss_value(self, loss) -> float:
        return float(loss)

    def learning_rate(self) -> float:
        return self.engine.learning_rate()

    def evaluate(self) -> float:
        return self.engine.evaluate()

    def write_checkpoint(self, prefix: Path, epochs_done: int, batches_done: int = 0) -> Path:
        return self.engine.write_checkpoint(prefix, epochs_done, batches_done)

    def read_checkpoint(self, prefix: Path) -> tuple[int, int] | None:
        return self.engine.read_checkpoint(prefix)

    def step_trace(self, log_dir: Path, first: int, last: int):
        return StepTrace(log_dir, first, last)

    def layers(self) -> dict:
        return run_layers(self.setup, self.engine)

    def explain(self, error: BaseException) -> Failure | None:
        """What a TensorFlow error means: bad data raised inside the input pipeline, a lost
        peer (what a collective raises when one dies or stops answering), or a failed op."""
        if not isinstance(error, tf.errors.OpError):
            return None
        user_error = _user_error_inside(error)
        if user_error is not None:
            return Failure("data", str(user_error))
        first_line = (str(error).strip().splitlines() or [""])[-1][:300]
        detail = f"{error.__class__.__name__}: {first_line}"
        return Failure("peer_lost" if isinstance(error, PEER_LOST) else "failed", detail)

    def gather_rows(self, row: list[float]) -> list[list[float]]:
        return cluster.gather_rows(self.engine.strategy, row).tolist()

    def close(self) -> None:
        pass


def build_trainer(setup: Setup, options: RunOptions, view=None) -> TensorFlowTrainer:
    """The strategy (before any other TensorFlow op), the engine, its devices checked and, on
    several workers, that they agree on the config and can shard the data."""
    engine = build_engine(setup, options.data_dir)
    _, workers, rank = strategies.describe(engine.strategy, setup.training.strategy)
    chief_view = view if rank == 0 else None
    warnings = devices.check_devices(engine.strategy, options.allow_cpu, chief_view, engine.policy)
    for warning in getattr(engine.strategy, "hpcai500_cluster_warnings", []):  # e.g. few CPUs
        warnings.append(warning)
        if chief_view:
            chief_view.message(warning)
    if workers > 1:
        check_multi_worker(engine, workers, fingerprint(setup.config))
    warnings += engine.check_data(chief_view)  # e.g. fewer validation files than workers
    return TensorFlowTrainer(setup, engine, workers, rank, warnings)


class StepTrace:
    """A TensorFlow profiler trace of global train steps `first`..`last` (counted from 1 over
    the whole run), written under the TensorBoard directory for its profile plugin."""

    profiler = "the TensorFlow profiler"

    def __init__(self, log_dir: Path, first: int, last: int):
        if not 1 <= first <= last:
            raise ValueError(f"profile steps must be 1 <= first <= last, got {first}-{last}")
        self.log_dir, self.first, self.last = Path(log_dir), first, last
        self.active = False

    def before(self, step: int) -> None:
        if step == self.first:
            tf.profiler.experimental.start(str(self.log_dir))
            self.active = True

    def after(self, step: int, loss) -> None:
        if self.active and step == self.last:
            float(loss)  # the traced steps have run to their end
            self.stop()

    def stop(self) -> None:
        if self.active:
            tf.profiler.experimental.stop()
            self.active = False

    def files(self) -> list[Path]:
        """The trace files written (the profile plugin's xplane protobufs)."""
        return sorted(self.log_dir.glob("plugins/profile/*/*.xplane.pb"))


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


def run_layers(setup: Setup, engine: Engine) -> dict:
    """L1-L9 of a TensorFlow run: the system as observed, the run as configured."""
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
