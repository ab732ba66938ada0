import keras
import numpy as np
import pytest
import tensorflow as tf

from hpcai500_tf import config
from hpcai500_tf.engine import loop, optimizers, run
from hpcai500_tf.engine.optimizers import (
    LARS,
    ReplicaAgreedLossScaleOptimizer,
    TF1Momentum,
    WarmupDecay,
    all_finite,
)
from hpcai500_tf.errors import UserError


def test_lars_follows_its_update_rule():
    w0 = np.array([[1.0, -2.0], [0.5, 3.0]], np.float32)
    grads = [
        np.array([[0.1, 0.2], [-0.3, 0.4]], np.float32),
        np.array([[0.5, -0.1], [0.2, 0.0]], np.float32),
    ]
    variable = tf.Variable(w0)
    optimizer = LARS(learning_rate=0.5, momentum=0.9, eta=0.01)
    w, m = w0.copy(), np.zeros_like(w0)
    for g in grads:
        optimizer.apply([tf.constant(g)], [variable])
        trust = 0.01 * np.linalg.norm(w) / np.linalg.norm(g)
        m = 0.9 * m + 0.5 * trust * g
        w = w - m
        np.testing.assert_allclose(variable.numpy(), w, rtol=1e-5)


def test_lars_trust_is_one_for_zero_weights():
    variable = tf.Variable(np.zeros(3, np.float32))
    LARS(learning_rate=0.1, momentum=0.0, eta=0.01).apply([tf.ones(3)], [variable])
    np.testing.assert_allclose(variable.numpy(), -0.1 * np.ones(3), rtol=1e-6)


def test_warmup_then_cosine_from_step_0():
    """The reference's: the cosine spans all 110 steps; warm-up overrides its first 10."""
    schedule = WarmupDecay(1.0, 10, 110, "cosine", cosine_start="step_0")
    assert float(schedule(0)) == 0.0
    assert float(schedule(5)) == pytest.approx(0.5)
    assert float(schedule(10)) == pytest.approx(0.5 * (1 + np.cos(np.pi * 10 / 110)))
    assert float(schedule(55)) == pytest.approx(0.5, abs=1e-6)
    assert float(schedule(110)) == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="cosine_start must be"):
        WarmupDecay(1.0, 10, 110, "cosine", cosine_start="later")


def test_warmup_then_cosine_to_zero():
    schedule = WarmupDecay(peak=1.0, warmup_steps=10, total_steps=110, schedule="cosine")
    assert float(schedule(0)) == 0.0
    assert float(schedule(5)) == pytest.approx(0.5)
    assert float(schedule(10)) == pytest.approx(1.0)
    assert float(schedule(60)) == pytest.approx(0.5, abs=1e-6)
    assert float(schedule(110)) == pytest.approx(0.0, abs=1e-6)


def test_step_decay():
    schedule = WarmupDecay(
        peak=1.0,
        warmup_steps=0,
        total_steps=100,
        schedule="step",
        boundaries_steps=[30, 60],
        factor=0.1,
    )
    assert [round(float(schedule(s)), 6) for s in (0, 29, 30, 59, 60, 99)] == [
        1.0,
        1.0,
        0.1,
        0.1,
        0.01,
        0.01,
    ]


def test_lars_in_tf1_form_applies_the_rate_to_its_momentum():
    """form="tf1": m = momentum * m + trust * g; w -= lr * m, over a rate that changes."""
    w0 = np.array([[1.0, -2.0], [0.5, 3.0]], np.float32)
    grads = [
        np.array([[0.1, 0.2], [-0.3, 0.4]], np.float32),
        np.array([[0.5, -0.1], [0.2, 0.0]], np.float32),
    ]
    rates = keras.optimizers.schedules.PiecewiseConstantDecay([0], [0.5, 0.2])  # 0.5, then 0.2
    variable = tf.Variable(w0)
    optimizer = LARS(learning_rate=rates, momentum=0.9, eta=0.01, form="tf1")
    w, m = w0.copy(), np.zeros_like(w0)
    for rate, g in zip((0.5, 0.2), grads, strict=True):
        optimizer.apply([tf.constant(g)], [variable])
        trust = 0.01 * np.linalg.norm(w) / np.linalg.norm(g)
        m = 0.9 * m + trust * g
        w = w - rate * m
        np.testing.assert_allclose(variable.numpy(), w, rtol=1e-5)
    with pytest.raises(ValueError, match="form must be 'keras' or 'tf1'"):
        LARS(form="nesterov")


def test_a_fixed_loss_scale_unscales_the_gradients_and_applies_every_step():
    """What the reference's FixedLossScalerOptimizer does: loss x scale, gradients / scale,
    no skip (an overflow reaches the weights)."""
    g = np.array([0.5, -0.25], np.float32)
    plain, scaled = tf.Variable([1.0, 2.0]), tf.Variable([1.0, 2.0])
    TF1Momentum(0.1, momentum=0.875).apply([tf.constant(g)], [plain])
    fixed = TF1Momentum(0.1, momentum=0.875, loss_scale_factor=256.0)
    assert float(fixed.scale_loss(tf.constant(1.0))) == 256.0
    fixed.apply([tf.constant(g * 256)], [scaled])
    np.testing.assert_allclose(scaled.numpy(), plain.numpy(), rtol=1e-7)
    fixed.apply([tf.constant([np.inf, 0.0], tf.float32)], [scaled])
    assert not np.isfinite(scaled.numpy()[0])


def _tiny_engine_layers(monkeypatch, policy, overrides=()):
    """The tiny preset's engine under a precision `policy`, and its record's L8."""
    monkeypatch.setattr(loop, "precision_policy", lambda precision: policy)
    previous = keras.mixed_precision.global_policy()
    try:
        setup = config.prepare(
            "image_classification", "tiny", ["training.precision=mixed", *overrides]
        )
        engine = run.build_engine(setup, None)
        return engine, engine.layers()["L8"]
    finally:
        keras.mixed_precision.set_global_policy(previous)  # process-wide: not for later tests


def test_float16_engines_scale_the_loss_alike_on_every_replica(monkeypatch):
    """mixed_float16 (the policy on GPUs) trains with the loss scaling whose skip decision all
    replicas share (tests/test_replicas.py); L8 states that it ran and its initial scale."""
    engine, l8 = _tiny_engine_layers(monkeypatch, "mixed_float16")
    assert isinstance(engine.optimizer, ReplicaAgreedLossScaleOptimizer)
    assert l8["loss_scaling"] == "dynamic" and l8["initial_loss_scale"] == 2.0**15


def test_a_float16_engine_with_a_fixed_loss_scale_records_it(monkeypatch):
    """`optimizer.loss_scaling = "fixed"`: the optimizer scales its own loss (no dynamic
    wrapper over it, which would scale twice), and L8 says so, with the scale."""
    engine, l8 = _tiny_engine_layers(monkeypatch, "mixed_float16", ["optimizer.loss_scaling=fixed"])
    assert type(engine.optimizer) is TF1Momentum and engine.optimizer.loss_scale_factor == 256.0
    assert l8["loss_scaling"] == "fixed" and l8["initial_loss_scale"] == 256.0
    engine, l8 = _tiny_engine_layers(
        monkeypatch, "mixed_bfloat16", ["optimizer.loss_scaling=fixed"]
    )
    assert engine.optimizer.loss_scale_factor is None and l8["loss_scaling"] == "none"


def test_bfloat16_engines_scale_no_loss(monkeypatch):
    """bfloat16 has float32's range: no loss scaling, and L8 says so."""
    engine, l8 = _tiny_engine_layers(monkeypatch, "mixed_bfloat16")
    assert not isinstance(engine.optimizer, keras.optimizers.LossScaleOptimizer)
    assert l8["loss_scaling"] == "none" and l8["initial_loss_scale"] is None


@pytest.mark.parametrize(
    "precision, policy",
    [
        ("fp32", "float32"),
        ("fp16", "mixed_float16"),
        ("bf16", "mixed_bfloat16"),
        ("mixed", "mixed_bfloat16"),
    ],  # fmt: skip
)
def test_precision_by_name_and_the_devices_choice(precision, policy):
    """`mixed` is the device's choice (bf16 on this CPU-only machine); fp16 and bf16 by name."""
    assert loop.precision_policy(precision) == policy


def test_an_unknown_precision_is_one_line():
    with pytest.raises(UserError, match="must be fp32, mixed, fp16 or bf16, got 'fp8'"):
        config.prepare("image_classification", "tiny", ["training.precision=fp8"])


def test_tf1_momentum_is_one_fused_kernel_per_variable_taking_the_formulas_steps():
    """ResourceApplyMomentum, TF1's kernel: accum = m accum + g; w -= lr accum, traced or
    eager, over a rate that changes; one kernel per variable and no separate assign."""
    rates = keras.optimizers.schedules.PiecewiseConstantDecay([0, 1], [0.5, 0.2, 0.1])
    variables = [tf.Variable([[1.0, -2.0], [0.5, 3.0]]), tf.Variable([0.25, -0.75])]
    optimizer = TF1Momentum(rates, momentum=0.875)
    optimizer.build(variables)
    step = tf.function(lambda grads: optimizer.apply(grads, variables))
    grads = [np.array([[0.1, 0.2], [-0.3, 0.4]], np.float32), np.array([0.5, -0.1], np.float32)]
    expected = [v.numpy() for v in variables]
    accums = [np.zeros_like(w) for w in expected]
    for rate, apply in zip((0.5, 0.2, 0.1), (optimizer.apply, step, step), strict=True):
        scaled = [g * rate * 10 for g in grads]  # a different gradient each step
        if apply is step:
            apply([tf.constant(g) for g in scaled])
        else:
            apply([tf.constant(g) for g in scaled], variables)
        for i, g in enumerate(scaled):
            accums[i] = np.float32(0.875) * accums[i] + g
            expected[i] = expected[i] - np.float32(rate) * accums[i]
            np.testing.assert_allclose(variables[i].numpy(), expected[i], rtol=1e-6)
    ops = [op.type for op in step.get_concrete_function(grads).graph.get_operations()]
    assert ops.count("ResourceApplyMomentum") == len(variables)
    # Written out, each variable took an assign and an assign_sub; now at most one assign is
    # left, the optimizer's own.
    assert "AssignSubVariableOp" not in ops and ops.count("AssignVariableOp") <= 1


def test_coupled_decay_in_the_update_is_the_gradient_of_the_decay_term():
    """take_coupled_decay(wd, decayed): accum = m accum + g + wd w for the decayed variables,
    accum = m accum + g for the others; w -= lr accum."""
    kernel, bias = tf.Variable([[1.0, -2.0], [0.5, 3.0]]), tf.Variable([0.25, -0.75])
    optimizer = TF1Momentum(0.1, momentum=0.875)
    optimizer.build([kernel, bias])
    assert optimizer.take_coupled_decay(0.01, [kernel])
    step = tf.function(lambda grads: optimizer.apply(grads, [kernel, bias]))
    grads = [np.array([[0.1, 0.2], [-0.3, 0.4]], np.float32), np.array([0.5, -0.1], np.float32)]
    w, b = kernel.numpy(), bias.numpy()
    accum_w, accum_b = np.zeros_like(w), np.zeros_like(b)
    for _ in range(3):
        step([tf.constant(g) for g in grads])
        accum_w = 0.875 * accum_w + grads[0] + 0.01 * w
        accum_b = 0.875 * accum_b + grads[1]
        w, b = w - 0.1 * accum_w, b - 0.1 * accum_b
        np.testing.assert_allclose(kernel.numpy(), w, rtol=1e-6)
        np.testing.assert_allclose(bias.numpy(), b, rtol=1e-6)
    assert not TF1Momentum(0.1, momentum=0.0).take_coupled_decay(0.01, [])  # nothing to fold into


def test_the_engine_adds_the_decay_in_the_update_as_its_loss_would(monkeypatch):
    """The tiny preset (TF1 momentum, decay on all variables) at a decay large enough to show:
    after one step every accumulator holds the same sum as where the loss carries the decay's
    gradient, the loss is the same, and the decay's share is far above the difference."""
    overrides = ["optimizer.weight_decay=0.1", "data.source=random"]
    setup = config.prepare("image_classification", "tiny", overrides)
    in_update = run.build_engine(setup, None)
    assert in_update.decay_in_update
    monkeypatch.setattr(optimizers, "decay_in_update", lambda *args: False)
    in_loss = run.build_engine(setup, None)
    assert not in_loss.decay_in_update
    images, labels = next(in_update.train_batches())
    steps = [getattr(e, "traced_train_step", e.train_step) for e in (in_update, in_loss)]
    losses = [float(step(images, labels)) for step in steps]
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
    for a, b, w in zip(
        in_update.optimizer.accumulators,
        in_loss.optimizer.accumulators,
        in_loss.model.trainable_variables,
        strict=True,
    ):
        share = 0.1 * np.abs(w.numpy()).max()  # the decay's part of the gradient
        assert np.abs(a.numpy() - b.numpy()).max() <= 1e-4 * max(share, 1e-3)


def _traced_op_types(function, *args) -> list[str]:
    return [op.type for op in function.get_concrete_function(*args).graph.get_operations()]


def test_tf1_momentum_makes_its_scalars_once_for_all_variables():
    """The rate, the momentum and the decay's factor: one tensor each per update, whatever
    the number of variables (a cast or constant per variable was 161 ops more for ResNet-50);
    the update still takes the formula's steps."""

    def traced(count: int) -> list[str]:
        variables = [tf.Variable(tf.ones([2])) for _ in range(count)]
        optimizer = TF1Momentum(0.1, momentum=0.875)
        optimizer.build(variables)
        optimizer.take_coupled_decay(0.01, variables)
        step = tf.function(lambda grads: optimizer.apply(grads, variables))
        ops = _traced_op_types(step, [tf.ones([2])] * count)
        assert ops.count("ResourceApplyMomentum") == count
        return ops

    few, many = traced(2), traced(6)
    assert few.count("Const") == many.count("Const")
    assert few.count("Cast") == many.count("Cast")


def _reads_in_traced_apply(optimizer, count: int) -> int:
    """ReadVariableOps in one traced `apply` of `count` gradients, its cond's branches
    included."""
    variables = [tf.Variable([1.0, 2.0]) for _ in range(count)]
    optimizer.build(variables)
    step = tf.function(lambda grads: optimizer.apply(grads, variables))
    graph = step.get_concrete_function([tf.ones([2])] * count).graph.as_graph_def()
    nodes = [*graph.node, *(n for f in graph.library.function for n in f.node_def)]
    return sum(node.op == "ReadVariableOp" for node in nodes)


def test_the_loss_scale_is_read_once_and_grows_and_halves_as_keras_does():
    """Dynamic loss scaling: the gradients divided by the scale read once (Keras reads it
    once per gradient); the scale doubles after `dynamic_growth_steps` finite steps in a row
    and halves, skipping the update, on an Inf."""

    def scaled(cls=ReplicaAgreedLossScaleOptimizer):
        return cls(keras.optimizers.SGD(0.5), initial_scale=8.0, dynamic_growth_steps=2)

    def reads_per_gradient(cls) -> int:  # (SGD's own update reads each variable once)
        many, few = (_reads_in_traced_apply(scaled(cls), n) for n in (6, 2))
        return (many - few) // 4

    assert reads_per_gradient(ReplicaAgreedLossScaleOptimizer) == 1
    assert reads_per_gradient(keras.optimizers.LossScaleOptimizer) == 2
    variables = [tf.Variable([1.0, 2.0]) for _ in range(4)]
    optimizer = scaled()
    optimizer.build(variables)
    step = tf.function(lambda grads: optimizer.apply(grads, variables))
    grads = [tf.constant([8.0, -16.0])] * 4  # the scaled gradients of [1, -2]
    step(grads)
    np.testing.assert_allclose(variables[0].numpy(), [0.5, 3.0])
    assert float(optimizer.dynamic_scale.numpy()) == 8.0
    step(grads)
    assert float(optimizer.dynamic_scale.numpy()) == 16.0  # two finite steps in a row
    np.testing.assert_allclose(variables[3].numpy(), [0.0, 4.0])
    step([tf.constant([np.inf, 0.0])] * 4)
    assert float(optimizer.dynamic_scale.numpy()) == 8.0
    np.testing.assert_allclose(variables[3].numpy(), [0.0, 4.0])  # the step was skipped


def test_all_finite_is_one_check_over_every_tensor():
    tensors = [tf.ones([2, 3]), tf.zeros([4]), tf.constant(1.0)]
    assert bool(all_finite(tensors))
    for bad in (np.inf, -np.inf, np.nan):
        assert not bool(all_finite([*tensors, tf.constant([0.0, bad])]))
    mixed = [tf.ones([2], tf.float16), tf.constant([1.0, np.nan], tf.bfloat16)]
    assert not bool(all_finite(mixed)) and bool(all_finite(mixed[:1]))


TWO_REPLICA_MOMENTUM = """
from hpcai500_tf.engine.optimizers import TF1Momentum
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    kernel, bias = tf.Variable([[1.0, -2.0], [0.5, 3.0]]), tf.Variable([0.25, -0.75])
    optimizer = TF1Momentum(0.1, momentum=0.875)
    optimizer.build([kernel, bias])
optimizer.take_coupled_decay(0.01, [kernel])
grads = [[np.full((2, 2), 0.5, np.float32), np.full(2, 0.25, np.float32)],
         [np.full((2, 2), -0.1, np.float32), np.full(2, 0.75, np.float32)]]


@tf.function
def step():
    def replica():
        i = tf.distribute.get_replica_context().replica_id_in_sync_group
        chosen = [tf.where(i == 0, g0, g1) for g0, g1 in zip(*grads)]
        optimizer.apply(chosen, [kernel, bias])
    strategy.run(replica)


step()
step()
print(json.dumps({
    "kernel": [c.numpy().tolist() for c in kernel.values],
    "bias": [c.numpy().tolist() for c in bias.values],
}))
"""


def test_tf1_momentum_updates_every_replicas_copy_by_the_all_reduced_gradient():
    """Under MirroredStrategy the fused kernels update each replica's own copy of the variable
    and of its accumulator, with the sum of the replicas' gradients and the decay once."""
    from tests.test_replicas import TWO_CPUS, run_two_cpus

    facts = run_two_cpus(TWO_CPUS + TWO_REPLICA_MOMENTUM)
    w, b = np.array([[1.0, -2.0], [0.5, 3.0]]), np.array([0.25, -0.75])
    accum_w, accum_b = np.zeros_like(w), np.zeros_like(b)
    for _ in range(2):
        accum_w = 0.875 * accum_w + np.full((2, 2), 0.4) + 0.01 * w
        accum_b = 0.875 * accum_b + np.full(2, 1.0)
        w, b = w - 0.1 * accum_w, b - 0.1 * accum_b
    for copy in facts["kernel"]:
        np.testing.assert_allclose(copy, w, rtol=1e-6)
    for copy in facts["bias"]:
        np.testing.assert_allclose(copy, b, rtol=1e-6)
