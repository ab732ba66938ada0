"""The TensorFlow engine: the model and optimizer under a strategy, the train and eval
steps, mixed precision, the input pipeline as distributed datasets, and the checkpoint files.

The run's lifecycle (the epoch loop, time accounting, evaluation cadence, checkpoint cadence,
the MLPerf log, the record) is framework-neutral and lives in lifecycle.py; engine/run.py's
`TensorFlowTrainer` is this engine as its trainer (run/trainer.py). A workload supplies model,
data, loss and quality only.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf
from tensorflow.python.framework import config as tf_config  # disable_op_determinism

from hpcai500_tf.config import OptimizerConfig, TrainingConfig, precision_policy_on
from hpcai500_tf.engine import optimizers
from hpcai500_tf.errors import UserError
from hpcai500_tf.measure.flops import FlopCount, count_function
from hpcai500_tf.models import kernels
from hpcai500_tf.run import predictions, stop
from hpcai500_tf.run.trainer import (
    checkpoint_damaged,
    checkpoint_unrestorable,
    checkpoint_unwritable,
    full_batch_steps,
)
from hpcai500_tf.workloads.interface import Workload


def gathered_in_evaluation_order(batches: list[dict], workers: int) -> dict:
    """An ensemble member's gathered evaluation batches as one batch in evaluation-set
    order. Each step's gathered rows are its replicas' batches in replica order, a worker's
    replicas together and taking its input pipeline's batches in turn, so a worker's rows, in
    the order gathered, are its shard of the split in order (`worker` says whose each row
    is); the shards are then interleaved back (run/predictions.py)."""
    worker = np.concatenate([batch["worker"] for batch in batches])
    keys = [key for key in batches[0] if key != "worker"]
    merged = {key: np.concatenate([batch[key] for batch in batches]) for key in keys}
    return {
        key: predictions.in_evaluation_order([rows[worker == w] for w in range(workers)])
        for key, rows in merged.items()
    }


def precision_policy(precision: str) -> str:
    """`training.precision` as Keras's policy on the devices TensorFlow sees."""
    return precision_policy_on(precision, bool(tf.config.list_physical_devices("GPU")))


class Engine:
    """The model and optimizer built under a strategy, and the steps that train them."""

    def __init__(
        self,
        workload: Workload,
        training: TrainingConfig,
        optimizer: OptimizerConfig,
        strategy: tf.distribute.Strategy,
    ):
        self.workload = workload
        self.training = training
        self.optimizer_config = optimizer
        self.strategy = strategy
        self.replicas = strategy.num_replicas_in_sync
        self.global_batch = training.batch_per_replica * self.replicas
        self.steps_per_epoch = full_batch_steps(workload.train_examples, self.global_batch)
        self.policy = precision_policy(training.precision)
        keras.mixed_precision.set_global_policy(self.policy)
        keras.utils.set_random_seed(training.seed)
        # Set either way: op determinism is process-wide and would outlive this engine.
        if training.deterministic:
            tf_config.enable_op_determinism()
        else:
            tf_config.disable_op_determinism()
        with strategy.scope():
            self.model = workload.build_model()
            self.optimizer = optimizers.build_optimizer(
                optimizer, self.global_batch, self.steps_per_epoch, training.epochs
            )
            if self.policy == "mixed_float16":
                self.optimizer = optimizers.ReplicaAgreedLossScaleOptimizer(self.optimizer)
            self.optimizer.build(self.model.trainable_variables)
        # Where dynamic loss scaling runs (float16), the scale it starts from (the record's L8).
        self.initial_loss_scale = getattr(self.optimizer, "initial_scale", None)
        self.decayed = optimizers.decayed_variables(self.model, optimizer.decay_all_variables)
        # The decay's gradient added in the optimizer's update where it can (TF1 momentum).
        self.decay_in_update = optimizers.decay_in_update(self.optimizer, optimizer, self.decayed)
        # The variables of a term the model's kernels ask for (weight decay covers its own).
        covered = self.decayed if optimizer.weight_decay else []
        self.unchecked = kernels.finiteness_variables(self.model, covered)
        # XLA compiles each replica's loss and gradients only; the all-reduce and the
        # optimizer's apply (merge calls, loss-scale skip) stay in the plain train step.
        self._compiled_loss_and_gradients = (
            tf.function(self._loss_and_gradients, jit_compile=True) if training.xla else None
        )
        self.traced_train_step = tf.function(self._train_step)
        # The stop votes the last steps carried, summed over the workers (run/stop.py).
        self.votes = stop.PendingVotes(lambda summed: summed.numpy().tolist())
        self.eval_step = tf.function(self._eval_step, reduce_retracing=True)
        # The epochs a checkpoint holds, in it: a resume checks state.json against it.
        self.checkpoint_epochs = tf.Variable(0, dtype=tf.int64, trainable=False)
        # and the batches done in the next epoch (a stop's checkpoint, mid-epoch)
        self.checkpoint_batches = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.checkpoint = tf.train.Checkpoint(
            model=self.model, optimizer=self.optimizer, epochs_done=self.checkpoint_epochs,
            batches_done=self.checkpoint_batches,
        )  # fmt: skip
        # Written by a traced function: an eager write walks every object in Python each time
        # (0.2-0.4 s for ResNet-50 here); the traced one only runs its save ops (~0.03 s).
        self._write_checkpoint = tf.function(
            self.checkpoint.write, input_signature=[tf.TensorSpec([], tf.string)]
        )

    # ------------------------------------------------------------------ steps

    def _loss_and_gradients(self, images, labels):
        """One replica's loss and its gradients of the scaled loss: no cross-replica op, so
        this is the part XLA compiles (`training.xla`)."""
        config = self.optimizer_config
        with tf.GradientTape() as tape:
            per_example = self.workload.per_example_loss(
                self.model, images, labels, config.label_smoothing
            )
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=self.global_batch)
            if config.weight_decay:
                l2 = tf.add_n([tf.nn.l2_loss(tf.cast(v, tf.float32)) for v in self.decayed])
                if self.decay_in_update:  # its gradient: in the update (decay_in_update)
                    l2 = tf.stop_gradient(l2)
                loss += config.weight_decay * l2 / self.replicas
            scaled = self.optimizer.scale_loss(loss)
        return loss, tape.gradient(scaled, self.model.trainable_variables)

    def _replica_train_step(self, images, labels, compiled, votes):
        """Loss and gradients (XLA-compiled when `compiled`), then the optimizer's apply, which
        all-reduces the gradients and is never compiled; the loss, with `votes` behind it
        where given (what the step's reduction carries to every worker)."""
        if compiled:
            loss, gradients = self._compiled_loss_and_gradients(images, labels)
        else:
            loss, gradients = self._loss_and_gradients(images, labels)
        self.optimizer.apply(gradients, self.model.trainable_variables)
        loss += self._weights_finite_check()
        if votes is None:
            return loss
        return tf.concat([tf.reshape(loss, [1]), tf.cast(votes, loss.dtype)], axis=0)

    def _weights_finite_check(self):
        """A term the model's kernels ask for (`models.kernels.finiteness_term`): 0 or NaN."""
        return kernels.finiteness_term(self.unchecked)

    def _train_step(self, images, labels, votes=None, compiled=True):
        """One step on every replica; the summed loss, and with `votes` (this worker's stop
        vote, run/stop.py) their sums over every replica, carried by the loss's own
        all-reduce. `compiled=False` traces the same step without its XLA part, in one graph
        (what the FLOP count reads)."""
        compiled = compiled and self._compiled_loss_and_gradients is not None
        losses = self.strategy.run(self._replica_train_step, (images, labels, compiled, votes))
        summed = self.strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)
        return summed if votes is None else (summed[0], summed[1:])

    def train_step(self, batch, vote: int | None = None):
        """One step on every replica of `batch` (images, labels); the summed loss. `vote`:
        this worker's stop signal (0: none), summed over the workers by the step and kept in
        `votes` (None: the step carries no vote)."""
        if vote is None:
            return self.traced_train_step(*batch)
        loss, summed = self.traced_train_step(*batch, tf.constant(stop.vote(vote)))
        self.votes.push(summed)
        return loss

    def _eval_step(self, images, labels):
        """The workload's per-example evaluation outputs, gathered from every replica (by
        replica, a worker's replicas together); an ensemble member's also say the worker
        whose input pipeline each example came from (`worker`)."""
        keeps = getattr(self.workload, "keeps_predictions", False)
        local_replicas = self.local_batch // self.training.batch_per_replica

        def replica(images, labels):
            outputs = self.workload.eval_outputs(self.model, images, labels)
            if keeps:
                replica_id = tf.distribute.get_replica_context().replica_id_in_sync_group
                worker = tf.cast(replica_id, tf.int32) // local_replicas
                outputs["worker"] = tf.fill(tf.shape(labels)[:1], worker)  # one per example
            return outputs

        outputs = self.strategy.run(replica, (images, labels))
        return tf.nest.map_structure(lambda v: self.strategy.gather(v, axis=0), outputs)

    # ------------------------------------------------------------------ data

    def _dataset(self, training: bool, seed: int, skip: int = 0):
        def dataset_fn(context: tf.distribute.InputContext):
            batch = context.get_per_replica_batch_size(self.global_batch)
            dataset = self.workload.dataset(
                training, seed, (context.num_input_pipelines, context.input_pipeline_id)
            )
            if training:
                dataset = dataset.repeat()
            # The workload's parallel interleaves and maps take their order from this option.
            options = tf.data.Options()
            options.deterministic = self.training.deterministic
            if not training and getattr(self.workload, "keeps_predictions", False):
                options.deterministic = True  # an ensemble member's rows: evaluation order
            dataset = dataset.with_options(options)
            dataset = dataset.batch(batch, drop_remainder=training)
            if skip:  # a resumed epoch's steps trained before the stop: each of this
                # pipeline's replicas took one of its batches per step
                dataset = dataset.skip(
                    skip * (context.num_replicas_in_sync // context.num_input_pipelines)
                )
            return dataset.prefetch(tf.data.AUTOTUNE)

        return self.strategy.distribute_datasets_from_function(dataset_fn)

    def train_batches(self, seed_offset: int = 0, skip: int = 0):
        """The training stream seeded `training.seed + seed_offset`, the batches of its first
        `skip` steps dropped."""
        return iter(self._dataset(True, self.training.seed + seed_offset, skip))

    def check_data(self, view=None) -> list[str]:
        """Refuse training data whose images do not fit the model: the workload's input shape
        and `input_dtype`. Reads no data. Returns the workload's data warnings, shown on
        `view` too."""
        images_spec = self._dataset(True, self.training.seed).element_spec[0]
        specs = getattr(images_spec, "_value_specs", None) or (images_spec,)
        expected = tuple(self.workload.input_shape())
        dtype = tf.as_dtype(self.workload.input_dtype)
        for spec in specs:
            if tuple(spec.shape[1:]) != expected or spec.dtype != dtype:
                raise UserError(
                    f"the training data gives {spec.dtype.name} images of shape "
                    f"{tuple(spec.shape[1:])}; the model expects {dtype.name} {expected}"
                )
        warnings = self.workload.data_warnings(self.workers)
        for warning in warnings if view else ():
            view.message(warning)
        return warnings

    def synthetic_batch(self):
        """A zero batch with the training data's element spec: for tracing and warm-up, so
        that no training data is touched before the run starts."""
        dtype = self.workload.input_dtype  # as check_data reads it
        images = tf.zeros(self.workload.input_shape(), dtype)
        labels = self.workload.empty_label()

        def dataset_fn(context: tf.distribute.InputContext):
            batch = context.get_per_replica_batch_size(self.global_batch)
            return (
                tf.data.Dataset.from_tensors((images, labels))
                .repeat()
                .batch(batch, drop_remainder=True)
            )

        return next(iter(self.strategy.distribute_datasets_from_function(dataset_fn)))

    @functools.cached_property
    def zero_batch(self):
        """The zero batch the step is traced, counted and warmed up on (no data is read)."""
        return self.synthetic_batch()

    def warm_up(self, checkpoints: bool = False) -> None:
        """Run the train step once on the zero batch and put every variable back: the first
        execution's one-time costs (graph optimisation, kernel set-up) stay out of the timed
        run; with `checkpoints`, the checkpoint writer's too."""
        variables = [*self.model.variables, *self.optimizer.variables]
        saved = [tf.identity(v) for v in variables]
        # The step the run takes: on several workers, the one carrying a stop vote.
        float(self.train_step(self.zero_batch, 0 if self.workers > 1 else None))
        self.votes.clear()
        for variable, value in zip(variables, saved, strict=True):
            variable.assign(value)
        if checkpoints:
            self.warm_up_checkpoints()

    def step_flops(self, batch) -> FlopCount:
        """FLOPs of this engine's own train step, traced at the batch it trains on. A worker's
        traced step holds its own replicas only, so the count is per this worker's batch. With
        XLA the step is traced without its compiled part: the same ops, in the one graph the
        count reads (it does not enter the call of a compiled function)."""
        images, labels = batch
        plain = (False,) if self._compiled_loss_and_gradients is not None else ()
        votes = tf.constant(stop.vote(0)) if self.workers > 1 else None  # as the run's step
        return count_function(
            self.traced_train_step, images, labels, votes, *plain, batch=self.local_batch
        )

    @property
    def local_batch(self) -> int:
        """Examples per step on this worker (the global batch over all workers)."""
        try:
            local_replicas = len(self.strategy.extended.worker_devices)
        except RuntimeError:  # the default strategy: one replica
            local_replicas = 1
        return self.training.batch_per_replica * local_replicas

    @property
    def workers(self) -> int:
        """Workers reading the data, one input pipeline each (every one has as many replicas)."""
        return self.global_batch // self.local_batch

    def evaluate(self) -> float:
        batches = [
            tf.nest.map_structure(lambda v: v.numpy(), self.eval_step(images, labels))
            for images, labels in self._dataset(False, self.training.seed)
        ]
        if not batches:
            raise UserError("the evaluation split produced no examples")
        if getattr(self.workload, "keeps_predictions", False):
            batches = [gathered_in_evaluation_order(batches, self.workers)]
        return self.workload.quality(batches)

    # ------------------------------------------------------------------ checkpoints

    def warm_up_checkpoints(self) -> None:
        """Trace the checkpoint writer and run it once into a scratch directory: its one-time
        costs (1-2 s) stay out of the timed run, and no checkpoint the user has is touched."""
        with tempfile.TemporaryDirectory(prefix="hpcai500-warm-up-") as scratch:
            self._write_checkpoint(str(Path(scratch) / "ckpt"))

    def write_checkpoint(self, prefix: Path, epochs_done: int, batches_done: int = 0) -> Path:
        """The model and optimizer, with the epochs (and batches of the next) they hold, under
        `prefix` (its index and data files); returns the prefix written."""
        self.checkpoint_epochs.assign(epochs_done)
        self.checkpoint_batches.assign(batches_done)
        try:
            return Path(self._write_checkpoint(str(prefix)).numpy().decode())
        except tf.errors.OpError as error:  # a full disk: ResourceExhaustedError, no path
            shutil.rmtree(f"{prefix}_temp", ignore_errors=True)  # its unfinished shards
            raise checkpoint_unwritable(prefix, error) from None

    def read_checkpoint(self, prefix: Path) -> tuple[int, int] | None:
        """The model and optimizer of the checkpoint at `prefix`, every tensor checked against
        its checksum first; returns the (epochs, batches of the next) it holds (None: written
        before it held them)."""
        held, batches = self._verify_checkpoint(prefix)
        objects = {"model": self.model, "optimizer": self.optimizer}
        if held is not None:  # else written before checkpoints held their epochs
            objects["epochs_done"] = self.checkpoint_epochs
        if batches is not None:  # else written before they held a stop's batches
            objects["batches_done"] = self.checkpoint_batches
        checkpoint = tf.train.Checkpoint(**objects)
        try:
            checkpoint.read(str(prefix)).assert_existing_objects_matched()
        except (tf.errors.OpError, ValueError, TypeError, IndexError, AssertionError) as error:
            raise checkpoint_unrestorable(prefix, error) from None
        return None if held is None else (held, batches or 0)

    @staticmethod
    def _verify_checkpoint(prefix: Path) -> tuple[int | None, int | None]:
        """Read every tensor of the checkpoint at `prefix` (TensorFlow checks each one's
        checksum as it reads it); returns the epochs and batches it holds (each None: written
        before it held them). A damaged one is one line naming it."""
        keys = ("epochs_done/.ATTRIBUTES/VARIABLE_VALUE", "batches_done/.ATTRIBUTES/VARIABLE_VALUE")
        try:
            reader = tf.train.load_checkpoint(str(prefix))
            for name in reader.get_variable_to_dtype_map():
                reader.get_tensor(name)
            held = [int(reader.get_tensor(k)) if reader.has_tensor(k) else None for k in keys]
            return held[0], held[1]
        except (tf.errors.OpError, ValueError, TypeError, IndexError, RuntimeError) as error:
            raise checkpoint_damaged(prefix, error) from None

    def learning_rate(self) -> float:
        optimizer = getattr(self.optimizer, "inner_optimizer", self.optimizer)
        return float(optimizer.learning_rate)
