"""The training engine: one strategy-aware loop for every workload.

It owns distribution, mixed precision, the train and eval steps, time accounting (segments,
so a resumed run is never double-counted), evaluation cadence, checkpoints, divergence,
the MLPerf log and the record. A workload supplies model, data, loss and quality only.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import keras
import tensorflow as tf
from tensorflow.python.framework import config as tf_config  # disable_op_determinism

from hpcai500_tf import record as record_io
from hpcai500_tf.config import OptimizerConfig, TrainingConfig, precision_policy_on
from hpcai500_tf.engine import optimizers, run_state
from hpcai500_tf.engine.mllog import MLLogger
from hpcai500_tf.engine.run_record import Progress, diverged
from hpcai500_tf.engine.run_state import STATE_FILE
from hpcai500_tf.errors import UserError
from hpcai500_tf.measure.flops import FlopCount, count_function
from hpcai500_tf.models import kernels
from hpcai500_tf.workloads.interface import Workload


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


def precision_policy(precision: str) -> str:
    """`training.precision` as Keras's policy on the devices TensorFlow sees."""
    return precision_policy_on(precision, bool(tf.config.list_physical_devices("GPU")))


class Engine:
    """Builds the model under a strategy and trains it to the epoch budget."""

    def __init__(
        self,
        workload: Workload,
        training: TrainingConfig,
        optimizer: OptimizerConfig,
        strategy: tf.distribute.Strategy,
        mllog: MLLogger | None = None,
        view=None,
    ):
        self.workload = workload
        self.training = training
        self.optimizer_config = optimizer
        self.strategy = strategy
        self.mllog = mllog or MLLogger(None)
        self.view = view
        self.replicas = strategy.num_replicas_in_sync
        self.saved_epochs: int | None = None  # epochs the last checkpoint holds
        self.clock = time.monotonic  # what checkpoint cadence is measured by
        self.trace = None  # a profiler trace of chosen steps (report.tensorboard.StepTrace)
        self.global_batch = training.batch_per_replica * self.replicas
        self.steps_per_epoch = workload.train_examples // self.global_batch
        if self.steps_per_epoch < 1:
            raise UserError(
                f"{workload.train_examples} training examples make no full batch of "
                f"{self.global_batch}: lower training.batch_per_replica"
            )
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
        # The variables of a term the model's kernels ask for (weight decay covers its own).
        covered = self.decayed if optimizer.weight_decay else []
        self.unchecked = kernels.finiteness_variables(self.model, covered)
        # XLA compiles each replica's loss and gradients only; the all-reduce and the
        # optimizer's apply (merge calls, loss-scale skip) stay in the plain train step.
        self._compiled_loss_and_gradients = (
            tf.function(self._loss_and_gradients, jit_compile=True) if training.xla else None
        )
        self.train_step = tf.function(self._train_step)
        self.eval_step = tf.function(self._eval_step, reduce_retracing=True)
        # The epochs a checkpoint holds, in it: a resume checks state.json against it.
        self.checkpoint_epochs = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.checkpoint = tf.train.Checkpoint(
            model=self.model, optimizer=self.optimizer, epochs_done=self.checkpoint_epochs
        )
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
                loss += config.weight_decay * l2 / self.replicas
            scaled = self.optimizer.scale_loss(loss)
        return loss, tape.gradient(scaled, self.model.trainable_variables)

    def _replica_train_step(self, images, labels, compiled):
        """Loss and gradients (XLA-compiled when `compiled`), then the optimizer's apply, which
        all-reduces the gradients and is never compiled."""
        if compiled:
            loss, gradients = self._compiled_loss_and_gradients(images, labels)
        else:
            loss, gradients = self._loss_and_gradients(images, labels)
        self.optimizer.apply(gradients, self.model.trainable_variables)
        return loss + self._weights_finite_check()

    def _weights_finite_check(self):
        """A term the model's kernels ask for (`models.kernels.finiteness_term`): 0 or NaN."""
        return kernels.finiteness_term(self.unchecked)

    def _train_step(self, images, labels, compiled=True):
        """One step on every replica; the summed loss. `compiled=False` traces the same step
        without its XLA part, in one graph (what the FLOP count reads)."""
        compiled = compiled and self._compiled_loss_and_gradients is not None
        losses = self.strategy.run(self._replica_train_step, (images, labels, compiled))
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    def _eval_step(self, images, labels):
        """The workload's per-example evaluation outputs, gathered from every replica."""

        def replica(images, labels):
            return self.workload.eval_outputs(self.model, images, labels)

        outputs = self.strategy.run(replica, (images, labels))
        return tf.nest.map_structure(lambda v: self.strategy.gather(v, axis=0), outputs)

    # ------------------------------------------------------------------ data

    def _dataset(self, training: bool, seed: int):
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
            dataset = dataset.with_options(options)
            return dataset.batch(batch, drop_remainder=training).prefetch(tf.data.AUTOTUNE)

        return self.strategy.distribute_datasets_from_function(dataset_fn)

    def train_batches(self, seed_offset: int = 0):
        return iter(self._dataset(True, self.training.seed + seed_offset))

    def check_data(self) -> list[str]:
        """Refuse training data whose images do not fit the model: the workload's input shape
        and `input_dtype`. Reads no data. Returns the workload's data warnings, shown too."""
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
        for warning in warnings if self.view else ():
            self.view.message(warning)
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

    def warm_up(self, batch) -> None:
        """Run the train step once and put every variable back: the first execution's
        one-time costs (graph optimisation, kernel set-up) stay out of the timed run."""
        variables = [*self.model.variables, *self.optimizer.variables]
        saved = [tf.identity(v) for v in variables]
        float(self.train_step(*batch))
        for variable, value in zip(variables, saved, strict=True):
            variable.assign(value)

    def count_flops(self, batch) -> FlopCount:
        """FLOPs of this engine's own train step, traced at the batch it trains on. A worker's
        traced step holds its own replicas only, so the count is per this worker's batch. With
        XLA the step is traced without its compiled part: the same ops, in the one graph the
        count reads (it does not enter the call of a compiled function)."""
        images, labels = batch
        plain = (False,) if self._compiled_loss_and_gradients is not None else ()
        return count_function(self.train_step, images, labels, *plain, batch=self.local_batch)

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
        return self.workload.quality(batches)

    # ------------------------------------------------------------------ checkpoints

    def warm_up_checkpoints(self) -> None:
        """Trace the checkpoint writer and run it once into a scratch directory: its one-time
        costs (1-2 s) stay out of the timed run, and no checkpoint the user has is touched."""
        with tempfile.TemporaryDirectory(prefix="hpcai500-warm-up-") as scratch:
            self._write_checkpoint(str(Path(scratch) / "ckpt"))

    def save(self, run_dir: Path, progress: Progress) -> None:
        """Write the model and optimizer under a new prefix, then the state naming it
        (atomically, with the write's time in `progress.checkpoints`), then remove the ones
        before it: a kill at any moment leaves a state whose checkpoint is whole."""
        directory = run_dir / "checkpoints"
        directory.mkdir(exist_ok=True)
        started = time.monotonic()
        self.checkpoint_epochs.assign(progress.epochs_done)
        prefix = self._write_checkpoint(str(directory / f"ckpt-{progress.epochs_done}"))
        prefix = prefix.numpy().decode()
        progress.checkpoints.append(
            {
                "epoch": progress.epochs_done,
                "elapsed_s": progress.elapsed(),
                "write_s": time.monotonic() - started,
            }
        )
        record_io.write_atomic(
            run_dir / STATE_FILE, {**asdict(progress), "checkpoint": prefix}, overwrite=True
        )
        self.saved_epochs = progress.epochs_done
        for old in directory.glob("ckpt*"):  # ckpt (before numbering), ckpt-N.*, a _temp dir
            if old.name.startswith(Path(prefix).name + "."):
                continue
            if old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.unlink(missing_ok=True)

    def restore(self, run_dir: Path, fingerprint_now: str) -> Progress:
        """The progress and the model and optimizer of a stopped run's last checkpoint, each
        checked first (`run_state`): the checkpoint's own epoch count against the state's and
        every tensor against its checksum, so that nothing damaged is found mid-training."""
        state = run_state.read_state(run_dir)
        if state["config_fingerprint"] != fingerprint_now:
            raise UserError(
                f"{run_dir}: it was started with another config; resume it with the "
                "same benchmark, preset and --set values, or with --resume alone"
            )
        prefix = run_state.checkpoint_prefix(run_dir, state)
        del state["checkpoint"]
        held = self._verify_checkpoint(prefix)
        if held is not None and held != state["epochs_done"]:
            raise UserError(
                f"{run_dir / STATE_FILE}: says {state['epochs_done']} epochs were done, but "
                f"its checkpoint {prefix} holds {held}: resume refused"
            )
        checkpoint = self.checkpoint
        if held is None:  # written before checkpoints held their epochs
            checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer)
        try:
            checkpoint.read(str(prefix)).assert_existing_objects_matched()
        except (tf.errors.OpError, ValueError, TypeError, IndexError, AssertionError) as error:
            raise UserError(
                f"{prefix}: cannot restore the checkpoint ({_first_line(error)})"
            ) from None
        self.saved_epochs = state["epochs_done"]
        return Progress(**state)

    @staticmethod
    def _verify_checkpoint(prefix: Path) -> int | None:
        """Read every tensor of the checkpoint at `prefix` (TensorFlow checks each one's
        checksum as it reads it); returns the epochs it holds (None: written before it held
        them). A damaged one is one line naming it."""
        key = "epochs_done/.ATTRIBUTES/VARIABLE_VALUE"
        try:
            reader = tf.train.load_checkpoint(str(prefix))
            for name in reader.get_variable_to_dtype_map():
                reader.get_tensor(name)
            return int(reader.get_tensor(key)) if reader.has_tensor(key) else None
        except (tf.errors.OpError, ValueError, TypeError, IndexError, RuntimeError) as error:
            raise UserError(f"{prefix}: the checkpoint is damaged ({_first_line(error)})") from None

    # ------------------------------------------------------------------ the loop

    def train_epochs(
        self, progress: Progress, run_dir: Path | None, log_every: int = 10, power=None
    ) -> Progress:
        """Train from `progress.epochs_done` to the budget; returns the final progress.

        Checkpoints go to `run_dir` (None: none, as on a worker other than the chief) at the
        epoch ends `checkpoint_due` picks. `power`, a running `PowerSampler`, puts the energy
        so far into each; the caller stops it and adds the last segment's energy after this
        returns."""
        t = self.training
        batches = self.train_batches(seed_offset=progress.epochs_done)
        segment_start, last_checkpoint = time.time(), self.clock()
        if progress.run_start is None:
            progress.run_start = segment_start
            self.mllog.start("run_start", time_ms=segment_start * 1000)
        try:
            for epoch in range(progress.epochs_done, t.epochs):
                self._train_epoch(epoch, batches, progress, segment_start, log_every)
                if (epoch + 1) % t.eval_every == 0 or epoch + 1 == t.epochs:
                    self._evaluate(epoch, progress, segment_start)
                if run_dir and checkpoint_due(t, epoch + 1, self.clock() - last_checkpoint):
                    self._checkpoint(run_dir, progress, segment_start, power)
                    last_checkpoint = self.clock()
        finally:
            progress.segments.append({"start": segment_start, "stop": time.time()})
            if self.trace:
                self.trace.stop()  # a run ended inside the traced steps
        return progress

    def _checkpoint(self, run_dir: Path, progress: Progress, segment_start: float, power) -> None:
        """Save the progress so far, the open segment closed now with its energy so far."""
        stop, energy = power.measure_so_far(segment_start) if power else (time.time(), [])
        snapshot = Progress(
            **{
                **asdict(progress),
                "segments": [*progress.segments, {"start": segment_start, "stop": stop}],
                "energy": [*progress.energy, energy],
            }
        )
        self.save(run_dir, snapshot)
        progress.checkpoints = snapshot.checkpoints

    def _train_epoch(self, epoch, batches, progress, segment_start, log_every):
        self.mllog.start("epoch_start", metadata={"epoch_num": epoch + 1})
        self.mllog.start("block_start", metadata={"first_epoch_num": epoch + 1, "epoch_count": 1})
        if self.view:
            self.view.epoch_start(epoch + 1, self.training.epochs, self.steps_per_epoch)
        epoch_start = time.time()
        loss = None
        first_step = epoch * self.steps_per_epoch  # global steps before this epoch's
        for step in range(self.steps_per_epoch):
            images, labels = next(batches)
            if self.trace:
                self.trace.before(first_step + step + 1)
            loss = self.train_step(images, labels)
            if self.trace:
                self.trace.after(first_step + step + 1, loss)
            if (step + 1) % log_every == 0 or step + 1 == self.steps_per_epoch:
                value = float(loss)  # reading back the value syncs the device
                if not math.isfinite(value):
                    raise diverged(value, epoch + 1, step + 1)
                if self.view:
                    seconds = time.time() - epoch_start
                    self.view.step(
                        step + 1,
                        value,
                        self._learning_rate(),
                        (step + 1) * self.global_batch / seconds,
                    )
        seconds = time.time() - epoch_start
        progress.examples += self.steps_per_epoch * self.global_batch
        progress.epochs_done = epoch + 1
        elapsed = progress.elapsed(open_segment=segment_start)
        progress.epochs.append(
            {
                "epoch": epoch + 1,
                "elapsed_s": elapsed,
                "examples": progress.examples,
                "seconds": seconds,
                "loss": float(loss),
            }
        )
        self.mllog.end("block_stop", metadata={"first_epoch_num": epoch + 1})
        self.mllog.end("epoch_stop", metadata={"epoch_num": epoch + 1})
        if self.view:
            self.view.epoch_end(
                epoch + 1, float(loss), self.steps_per_epoch * self.global_batch / seconds
            )

    def _evaluate(self, epoch, progress, segment_start):
        if not self.workload.measures_quality:
            return
        self.mllog.start("eval_start", metadata={"epoch_num": epoch + 1})
        quality = self.evaluate()
        elapsed = progress.elapsed(open_segment=segment_start)
        progress.curve.append(
            {
                "epoch": epoch + 1,
                "elapsed_s": elapsed,
                "examples": progress.examples,
                "value": quality,
            }
        )
        self.mllog.event("eval_accuracy", quality, metadata={"epoch_num": epoch + 1})
        self.mllog.end("eval_stop", metadata={"epoch_num": epoch + 1})
        if self.view:
            self.view.evaluation(epoch + 1, quality, self.training.target_quality)

    def _learning_rate(self) -> float:
        optimizer = getattr(self.optimizer, "inner_optimizer", self.optimizer)
        return float(optimizer.learning_rate)


def _first_line(error: BaseException) -> str:
    """An error's name and the first line of its message, at most 200 characters."""
    lines = str(error).strip().splitlines()
    return f"{error.__class__.__name__}: {lines[0][:200] if lines else ''}"
