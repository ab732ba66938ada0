"""The TensorFlow backend: the engine (engine/loop.py) as the lifecycle's trainer.

    run_benchmark(setup, data_dir, out_dir, view=..., **options)   -> lifecycle.run
    build_trainer(setup, options, view)                            -> TensorFlowTrainer

Order matters: configs are validated in pure Python, then the strategy is built before any
other TensorFlow op runs, then data and model.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import tensorflow as tf

from hpcai500_tf.config import Setup
from hpcai500_tf.engine import cluster, devices, onednn
from hpcai500_tf.engine import strategy as strategies
from hpcai500_tf.engine.library_layers import library_layers
from hpcai500_tf.engine.loop import Engine
from hpcai500_tf.errors import UserError
from hpcai500_tf.measure.flops import count_function
from hpcai500_tf.models import kernels
from hpcai500_tf.run import data_position
from hpcai500_tf.run.lifecycle import run as run_lifecycle
from hpcai500_tf.run.options import RunOptions
from hpcai500_tf.run.progress import fingerprint
from hpcai500_tf.run.trainer import (
    Failure,
    StepTrace,
    Trainer,
    flops_block,
    refuse_disagreeing_workers,
    refuse_unshardable_config,
    refuse_unshardable_evaluation,
    refuse_unshardable_training,
)
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


def build_engine(setup: Setup, data_dir: str | None, evaluates: bool = False) -> TensorFlowTrainer:
    """The strategy (before any other TensorFlow op), the workload and the trainer over them,
    not yet checked against its devices or its peers (`build_trainer` does that). Where the
    engine `evaluates` (a run, not a FLOPs count), what the config alone shows cannot be
    sharded to the workers is refused before the workload reads any data."""
    strategy = strategies.make_strategy(setup.training.strategy, setup.communication)
    if evaluates:
        _, workers, _ = strategies.describe(strategy, setup.training.strategy)
        refuse_unshardable_config(setup, workers)
    workload = build_workload(setup.benchmark.name, setup.config, data_dir)
    return TensorFlowTrainer(setup, workload, strategy)


class TensorFlowTrainer(Engine, Trainer):
    """The engine (engine/loop.py: model, optimizer, steps, data, checkpoint files) as the
    lifecycle's trainer (run/trainer.py): what only TensorFlow knows of the run, its FLOPs,
    layers, errors and collectives."""

    framework = "tensorflow"

    def __init__(self, setup: Setup, workload, strategy: tf.distribute.Strategy):
        super().__init__(workload, setup.training, setup.optimizer, strategy)
        self.setup = setup
        _, _, self.rank = strategies.describe(strategy, setup.training.strategy)
        self.warnings: list[str] = []

    @property
    def precision(self) -> str:
        return self.policy

    def count_flops(self) -> dict:
        return measure_flops(self, self.zero_batch)

    def train_batches(self, epochs_done: int = 0, batches_done: int = 0):
        """Every epoch's own stream, seeded by its epoch (run/data_position.py)."""
        t = self.setup.training

        def open_epoch(epoch: int, skip: int):
            offset = data_position.epoch_seed(t.seed, epoch) - t.seed
            return Engine.train_batches(self, seed_offset=offset, skip=skip)

        return data_position.epoch_batches(
            open_epoch, epochs_done, batches_done, t.epochs, self.steps_per_epoch
        )

    def agreed_stop(self) -> int:
        return self.votes.agreed()

    def loss_value(self, loss) -> float:
        return float(loss)

    def step_trace(self, log_dir: Path, first: int, last: int) -> TensorFlowStepTrace:
        return TensorFlowStepTrace(log_dir, first, last)

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
        return cluster.gather_rows(self.strategy, row).tolist()

    def communication_layer(self) -> dict:
        """L3: the strategy's collectives (and, on several workers, the timeouts)."""
        name = self.setup.training.strategy
        l3, _, _ = strategies.describe(self.strategy, name)
        if name == "multi_worker":
            c = self.setup.communication
            l3 |= {"timeout_s": c.timeout_s, "join_timeout_s": c.join_timeout_s}
        return l3

    def library_layers(self) -> tuple[dict, dict]:
        """L4 and L5 as TensorFlow reports them, with the devices the run computed on."""
        l4, l5 = library_layers()
        gpus = len(tf.config.list_physical_devices("GPU"))
        return l4, {**l5, "devices_used": devices.devices_used(self.strategy, gpus)}

    def intra_op_threads(self) -> int:
        return (
            tf.config.threading.get_intra_op_parallelism_threads()
            or int(os.environ.get("TF_NUM_INTRAOP_THREADS", 0))
            or len(os.sched_getaffinity(0))  # TensorFlow's default: one per usable core
        )

    def close(self) -> None:
        pass


def build_trainer(setup: Setup, options: RunOptions, view=None) -> TensorFlowTrainer:
    """The strategy (before any other TensorFlow op), the trainer, its devices checked and,
    on several workers, that they agree on the config and can shard the data."""
    trainer = build_engine(setup, options.data_dir, evaluates=True)
    chief_view = view if trainer.rank == 0 else None
    warnings = devices.check_devices(
        trainer.strategy, options.allow_cpu, chief_view, trainer.policy
    )
    for warning in getattr(trainer.strategy, "hpcai500_cluster_warnings", []):  # e.g. few CPUs
        warnings.append(warning)
        if chief_view:
            chief_view.message(warning)
    model, training = setup.config.get("model", {}), setup.config.get("training", {})
    slower = (
        kernels.auto_fallback(model.get("kernels", "auto"), bool(training.get("xla"))),
        onednn.system_allocator_warning(os.environ, onednn.reported_by_tensorflow()),
    )
    for warning in filter(None, slower):  # a run that could have been faster says why not
        warnings.append(warning)
        if chief_view:
            chief_view.message(warning)
    if trainer.workers > 1:
        check_multi_worker(trainer, fingerprint(setup.config))
    warnings += trainer.check_data(chief_view)  # e.g. fewer validation files than workers
    trainer.warnings = warnings
    return trainer


class TensorFlowStepTrace(StepTrace):
    """A TensorFlow profiler trace of global train steps `first`..`last` (counted from 1 over
    the whole run), written under the TensorBoard directory for its profile plugin (its
    xplane protobufs)."""

    profiler = "the TensorFlow profiler"
    pattern = "plugins/profile/*/*.xplane.pb"

    def start(self) -> None:
        tf.profiler.experimental.start(str(self.log_dir))

    def finish(self) -> None:
        tf.profiler.experimental.stop()

    def wait(self, loss) -> None:
        float(loss)


def measure_flops(engine: Engine, batch) -> dict:
    """Training FLOPs from the train step the engine runs; forward FLOPs both ways."""
    images = batch[0]
    train = engine.step_flops(batch)
    forward = tf.function(lambda x: engine.model(x, training=False))
    if engine.replicas == 1:
        forward_count = count_function(forward, images, batch=engine.global_batch)
        forward_per_example = forward_count.per_example
    else:
        forward_per_example = None
    return flops_block(
        per_example_training=train.per_example,
        per_example_forward=forward_per_example,
        analytical_per_example_forward=engine.workload.analytical_forward_flops(engine.model),
        method=(
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
        basis="tensorflow-profiler",
        by_op_type=train.by_op_type,
        batch=train.batch,  # this worker's, as traced, as the total is
        uncounted_op_types=train.uncounted_op_types,
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


def check_multi_worker(engine: Engine, config_id: str) -> None:
    """Refuse, on every worker, a run the workers disagree on or cannot shard."""
    workload, batch, workers = engine.workload, engine.training.batch_per_replica, engine.workers
    per_worker_replicas = engine.replicas // workers
    refuse_unshardable_training(workload.train_examples, workers, batch * per_worker_replicas)
    refuse_unshardable_evaluation(workload.eval_examples, workers)
    # Only the chief writes checkpoints: every variable here is mirrored (synchronised on
    # write), so a save reads the chief's own copy. One synchronised on read (a Keras metric's)
    # would be all-reduced by the save, a collective the other workers would never join.
    variables = [*engine.model.variables, *engine.optimizer.variables]
    on_read = [v.path for v in variables if v.synchronization == "on_read"]
    if on_read:
        raise RuntimeError(f"{on_read[0]}: read collectively, so the chief cannot save alone")
    refuse_disagreeing_workers(cluster.same_on_all_workers(engine.strategy, config_id), config_id)


def flops_report(setup: Setup, allow_cpu: bool = False) -> dict:
    """FLOPs per example both ways, without training (the setup's data is not read), on the
    devices a run would use (checked as a run's are)."""
    engine = build_engine(setup, None)
    devices.check_devices(engine.strategy, allow_cpu, policy=engine.policy)
    return {
        **engine.count_flops(),
        "global_batch": engine.global_batch,
        "precision": engine.policy,
    }
