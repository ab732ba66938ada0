"""Learning-rate schedules and optimizers: SGD with momentum in TF1's form or Keras's, LARS
(both written here), fixed loss scaling, and dynamic loss scaling whose skip decision every
replica shares.

Weight decay is coupled, as in the reference: wd x ||w||^2 / 2 joins the loss (gradient wd x w),
applied to all variables or to all but BN and bias variables (`decay_all_variables`).
"""

from __future__ import annotations

import dataclasses
import math

import keras
import tensorflow as tf

from hpcai500_tf.config import OptimizerConfig
from hpcai500_tf.run.schedule import warmup_decay


class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup from 0 to `peak`, then cosine decay to 0 or step decay by epochs.

    The cosine starts at step 0 and spans every step (`cosine_start="step_0"`: the reference's
    `tf.train.cosine_decay(peak, step, total_steps)`, which the warm-up overrides until it
    ends, so the rate drops from `peak` to the cosine's value there), or starts where the
    warm-up ends and spans the steps after it ("warmup_end")."""

    def __init__(
        self,
        peak: float,
        warmup_steps: int,
        total_steps: int,
        schedule: str,
        boundaries_steps: list[int] | None = None,
        factor: float = 0.1,
        cosine_start: str = "warmup_end",
    ):
        if cosine_start not in ("step_0", "warmup_end"):
            raise ValueError(f"cosine_start must be 'step_0' or 'warmup_end', got {cosine_start!r}")
        self.peak = peak
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.schedule = schedule
        self.boundaries_steps = list(boundaries_steps or [])
        self.factor = factor
        self.cosine_start = cosine_start

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        warmup = tf.cast(self.warmup_steps, tf.float32)
        if self.schedule == "cosine":
            start = 0.0 if self.cosine_start == "step_0" else warmup
            span = tf.maximum(tf.cast(self.total_steps, tf.float32) - start, 1.0)
            progress = tf.clip_by_value((step - start) / span, 0.0, 1.0)
            decayed = self.peak * 0.5 * (1.0 + tf.cos(math.pi * progress))
        else:
            passed = tf.add_n(
                [tf.cast(step >= b, tf.float32) for b in self.boundaries_steps]
                or [tf.constant(0.0)]
            )
            decayed = self.peak * tf.pow(self.factor, passed)
        if self.warmup_steps == 0:
            return decayed
        return tf.where(step < warmup, self.peak * step / warmup, decayed)

    def get_config(self):
        return {
            "peak": self.peak,
            "warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
            "schedule": self.schedule,
            "boundaries_steps": self.boundaries_steps,
            "factor": self.factor,
            "cosine_start": self.cosine_start,
        }


class TF1Momentum(keras.optimizers.Optimizer):
    """SGD with momentum in TF1 `tf.train.MomentumOptimizer`'s form, the reference's optimizer:
    accum = momentum x accum + grad; var -= lr x accum.

    Keras's SGD folds the rate into its velocity instead (v = momentum x v - lr x grad;
    var += v): the two take the same steps while the rate is constant and differ whenever it
    changes (warm-up, decay), where this one applies today's rate to the whole accumulated
    gradient. Each variable's update is one kernel: TensorFlow's fused ResourceApplyMomentum,
    the kernel TF1's MomentumOptimizer runs, with these exact two steps (where written out as
    Keras ops it took two assigns and three element-wise ops)."""

    def __init__(self, learning_rate=0.01, momentum=0.9, name="tf1_momentum", **kwargs):
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        if not 0 <= momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        self.momentum = momentum
        self.coupled_decay = 0.0
        self._decayed_indices: frozenset[int] = frozenset()
        self._scalars: dict = {}

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        self.accumulators = [self.add_variable_from_reference(v, "accumulator") for v in variables]

    def take_coupled_decay(self, rate: float, variables: list) -> bool:
        """Add rate x w to the gradient of each of `variables` (built ones) in the update
        itself: the gradient of rate x ||w||^2 / 2, which the loss then need not carry. One
        kernel per variable (accum += rate / momentum x w, before the momentum kernel
        multiplies accum by momentum), where the loss's gradient takes two (a product and
        the sum with the model's gradient). False, taking nothing, without momentum."""
        if not self.momentum:
            return False
        self.coupled_decay = float(rate)
        self._decayed_indices = frozenset(self._get_variable_index(v) for v in variables)
        return True

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        self._scalars = {}  # this update's scalar operands, made once per device and dtype
        try:
            super()._backend_update_step(grads, trainable_variables, learning_rate)
        finally:
            self._scalars = {}

    def _scalar(self, name: str, value, variable):
        """`value` as a scalar of the variable's dtype on its device: one tensor that all the
        variables there share in this update (a cast or constant per variable is 161 ops more
        for ResNet-50, each of them a node the step's graph executes)."""
        key = (name, variable.dtype, variable.device)
        if key not in self._scalars:
            self._scalars[key] = tf.cast(value, variable.dtype)
        return self._scalars[key]

    def update_step(self, gradient, variable, learning_rate):
        if isinstance(variable, keras.Variable):
            variable = variable.value  # the tf.Variable (this replica's, under a strategy)
        index = self._get_variable_index(variable)
        accumulator = self.accumulators[index].value
        if self.coupled_decay and index in self._decayed_indices:
            tf.raw_ops.ResourceApplyGradientDescent(  # accum -= alpha x w
                var=accumulator.handle,
                alpha=self._scalar("decay", -self.coupled_decay / self.momentum, variable),
                delta=variable,
                use_locking=False,
            )
        tf.raw_ops.ResourceApplyMomentum(
            var=variable.handle,
            accum=accumulator.handle,
            lr=self._scalar("learning_rate", learning_rate, variable),
            grad=tf.cast(gradient, variable.dtype),
            momentum=self._scalar("momentum", self.momentum, variable),
            use_locking=False,
            use_nesterov=False,
        )

    def get_config(self):
        return {**super().get_config(), "momentum": self.momentum}


class LARS(keras.optimizers.Optimizer):
    """Layer-wise adaptive rate scaling (You et al., 2017) with heavy-ball momentum.

    trust = eta * ||w|| / ||g|| (1 where either norm is 0); with the rate in the momentum
    (`form="keras"`) m = momentum * m + lr * trust * g; w -= m, or applied to it (TF1's form,
    "tf1") m = momentum * m + trust * g; w -= lr * m. The gradient arrives with weight decay
    already in it (coupled decay).
    """

    def __init__(
        self, learning_rate=0.1, momentum=0.9, eta=0.001, form="keras", name="lars", **kwargs
    ):
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        if form not in ("keras", "tf1"):
            raise ValueError(f"form must be 'keras' or 'tf1', got {form!r}")
        self.momentum = momentum
        self.eta = eta
        self.form = form

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        self.momentums = [self.add_variable_from_reference(v, "momentum") for v in variables]

    def update_step(self, gradient, variable, learning_rate):
        learning_rate = tf.cast(learning_rate, variable.dtype)
        gradient = tf.cast(gradient, variable.dtype)
        w_norm = tf.norm(variable)
        g_norm = tf.norm(gradient)
        trust = tf.where((w_norm > 0) & (g_norm > 0), self.eta * w_norm / g_norm, 1.0)
        momentum = self.momentums[self._get_variable_index(variable)]
        if self.form == "tf1":
            self.assign(momentum, self.momentum * momentum + trust * gradient)
            self.assign_sub(variable, learning_rate * momentum)
            return
        self.assign(momentum, self.momentum * momentum + learning_rate * trust * gradient)
        self.assign_sub(variable, momentum)

    def get_config(self):
        config = {**super().get_config(), "momentum": self.momentum, "eta": self.eta}
        return {**config, "form": self.form}


class ReplicaAgreedLossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
    """Keras's dynamic loss scaling, with the finiteness of the gradients agreed by all replicas.

    Keras tests each replica's own gradients, before they are all-reduced. Where the strategy
    uses merge calls (MirroredStrategy, MultiWorkerMirroredStrategy without XLA) it then takes
    replica 0's answer for everyone: an overflow on another replica is all-reduced into the
    update as Inf and the run diverges. Where it does not (those strategies inside XLA on GPUs,
    TPUStrategy) each replica decides alone: replicas that disagree skip and apply on different
    sides, and the all-reduce inside the apply waits for peers that never come. Here whether a
    replica overflowed (0 or 1) is all-reduced first: the step is skipped, and the scale halved,
    on every replica as soon as one of them overflows. One scalar all-reduce per step.

    An optimizer that already scales its loss by a fixed factor (`optimizer.loss_scaling =
    "fixed"`: Keras's `loss_scale_factor`, what the reference's FixedLossScalerOptimizer does)
    is returned as it is: dynamic scaling over it would scale the loss twice.
    """

    def __new__(cls, inner_optimizer=None, *args, **kwargs):
        if getattr(inner_optimizer, "loss_scale_factor", None) is not None:
            return inner_optimizer  # not an instance of cls: __init__ does not run
        return super().__new__(cls)

    def _stateful_handle_finite_grads(self, grads, trainable_variables):
        """Finite gradients: unscaled and applied, and the scale doubled after
        `dynamic_growth_steps` finite steps in a row, as Keras does; the scale is read once
        for all gradients, where Keras divides each gradient by the variable itself (one
        read of it per gradient: 161 ops more for ResNet-50)."""
        scale = tf.convert_to_tensor(self.dynamic_scale)
        variables = trainable_variables or self._trainable_variables
        unscaled = [
            g if g is None or self._overwrite_variable_with_gradient(v) else g / scale
            for g, v in zip(grads, variables, strict=True)
        ]
        self.inner_optimizer.apply(unscaled, trainable_variables=trainable_variables)

        def grow() -> None:
            self.step_counter.assign(0)
            self.dynamic_scale.assign(scale * 2.0)

        def count() -> None:
            self.step_counter.assign_add(1)

        tf.cond(tf.equal(self.step_counter, self.dynamic_growth_steps - 1), grow, count)

    def check_finite(self, grads):
        """True on every replica when no replica's gradients hold an Inf or NaN."""
        locally_finite = all_finite([g for g in grads if g is not None])
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return locally_finite
        overflowed = tf.cast(tf.logical_not(locally_finite), tf.float32)
        replicas_overflowed = context.all_reduce(tf.distribute.ReduceOp.SUM, overflowed)
        return tf.equal(replicas_overflowed, 0.0)


def all_finite(tensors: list):
    """True when no tensor holds an Inf or NaN: one IsFinite and one All over the tensors laid
    end to end (one copy of them), where Keras takes one of each per tensor (two kernels per
    gradient on a GPU)."""
    flat_shape = tf.constant([-1])  # one for all: a shape constant per tensor is an op each
    flat = [tf.reshape(tf.cast(t, tf.float32), flat_shape) for t in tensors]
    return tf.reduce_all(tf.math.is_finite(tf.concat(flat, axis=0)))


def fixed_loss_scale(config: OptimizerConfig, policy: str) -> float | None:
    """The fixed factor the loss is scaled by (`loss_scaling = "fixed"` under float16), else
    None: bfloat16 and float32 scale no loss, and dynamic scaling wraps the optimizer."""
    if policy == "mixed_float16" and config.loss_scaling == "fixed":
        return config.loss_scale
    return None


def build_optimizer(
    config: OptimizerConfig, global_batch: int, steps_per_epoch: int, epochs: int
) -> keras.optimizers.Optimizer:
    """The configured optimizer and schedule. Under float16 with `loss_scaling = "fixed"` it
    scales its own loss (Keras's `loss_scale_factor`; the precision policy is Keras's global
    one, set before), and `ReplicaAgreedLossScaleOptimizer` leaves it so."""
    steps = warmup_decay(config, global_batch, steps_per_epoch, epochs)  # run/schedule.py
    schedule = WarmupDecay(**dataclasses.asdict(steps))
    scale = {"loss_scale_factor": fixed_loss_scale(config, keras.config.dtype_policy().name)}
    if config.name == "lars":
        return LARS(
            schedule,
            momentum=config.momentum,
            eta=config.lars_eta,
            form=config.momentum_form,
            **scale,
        )
    if config.momentum_form == "tf1":
        return TF1Momentum(schedule, momentum=config.momentum, **scale)
    return keras.optimizers.SGD(schedule, momentum=config.momentum, **scale)


def decay_in_update(
    optimizer: keras.optimizers.Optimizer, config: OptimizerConfig, decayed: list
) -> bool:
    """Whether the (built) optimizer adds weight decay's gradient to `decayed` in its own
    update (TF1 momentum: `TF1Momentum.take_coupled_decay`), so that the loss's decay term
    needs no gradient. The same sum, wd x w, as the loss's gradient after the all-reduce."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    if not config.weight_decay or not isinstance(inner, TF1Momentum):
        return False
    return inner.take_coupled_decay(config.weight_decay, decayed)


def decayed_variables(model: keras.Model, decay_all: bool) -> list:
    """The variables weight decay applies to: all trainable ones, or all but BN and biases."""
    if decay_all:
        return list(model.trainable_variables)
    return [v for v in model.trainable_variables if len(v.shape) > 1]
