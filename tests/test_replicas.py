"""Two replicas on two logical CPU devices: loss scaling decided alike on every replica, and
XLA compiling each replica's loss and gradients but never the cross-replica update.

Logical devices must be configured before TensorFlow initialises, so each check runs in a
fresh Python process and prints its findings as one JSON line.
"""

import json
import subprocess
import sys

import pytest

TWO_CPUS = """
import json, sys
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
"""

LOSS_SCALING = (
    TWO_CPUS
    + """
from hpcai500_tf.engine.optimizers import ReplicaAgreedLossScaleOptimizer
stock = sys.argv[1] == "stock"
keras.mixed_precision.set_global_policy("mixed_float16")
facts = {}


def loss_scale_optimizer():
    inner = keras.optimizers.SGD(0.01)
    if stock:
        return keras.optimizers.LossScaleOptimizer(inner)
    return ReplicaAgreedLossScaleOptimizer(inner)


def per_replica(strategy, values):
    return strategy.experimental_distribute_values_from_function(
        lambda context: tf.constant(values[context.replica_id_in_sync_group])
    )


def replica_values(strategy, value):
    return [float(v) for v in strategy.experimental_local_results(value)]


# A step with merge calls (MirroredStrategy as the engine runs it): replica 1's half of the
# batch is huge, so its float16 gradients of the scaled loss overflow; replica 0's do not.
# Every weight and bias is 0.1 (no random initialiser), so the premise does not depend on the
# draw: replica 0's outputs are 0.19 and its largest float16 value in the backward pass is
# about 2**15 x 0.19 = 6,200, a tenth of float16's maximum (65,504), whatever the CPU rounds;
# replica 1's outputs are about 3,600 and its gradients about 2**15 x 1,800 = 6e7: Inf.
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    constant = keras.initializers.Constant(0.1)
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(3, kernel_initializer=constant, bias_initializer=constant),
            keras.layers.Dense(1, kernel_initializer=constant, bias_initializer=constant),
        ]
    )
    optimizer = loss_scale_optimizer()
    optimizer.build(model.trainable_variables)
before = [v.numpy() for v in model.trainable_variables]
inputs = per_replica(strategy, [np.full((2, 4), 0.5, np.float32), np.full((2, 4), 3e4, np.float32)])


@tf.function
def step(x):
    def replica(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(tf.cast(model(x), tf.float32))) / 4.0
            scaled = optimizer.scale_loss(loss)
        gradients = tape.gradient(scaled, model.trainable_variables)
        locally_finite = keras.optimizers.LossScaleOptimizer.check_finite(optimizer, gradients)
        optimizer.apply(gradients, model.trainable_variables)
        return tf.cast(locally_finite, tf.float32)

    return strategy.run(replica, (x,))


with strategy.scope():
    facts["merge_call"] = not tf.__internal__.distribute.strategy_supports_no_merge_call()
facts["locally_finite"] = replica_values(strategy, step(inputs))
copies = [getattr(v.value, "values", [v.value]) for v in model.trainable_variables]
facts["unchanged"] = all(
    np.array_equal(c.numpy(), b) for cs, b in zip(copies, before) for c in cs
)
facts["finite"] = all(np.isfinite(c.numpy()).all() for cs in copies for c in cs)
facts["scales"] = [float(c.numpy()) for c in getattr(optimizer.dynamic_scale.value, "values", [])]

# Without merge calls (as under XLA on GPUs, or on TPUs) each replica runs the loss scale's
# cond itself: its finiteness must be the same on both, or the apply's all-reduce waits for a
# replica that skipped. Keras's own apply cannot run there on CPUs (its iteration counter
# broadcasts through a merge call), so the decision itself is checked.
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
strategy.extended._use_merge_call = lambda: False
with strategy.scope():
    optimizer = loss_scale_optimizer()
gradients = per_replica(strategy, [[1.0, 2.0], [1.0, np.inf]])


@tf.function
def decide(gradients):
    def replica(gradient):
        no_merge = tf.__internal__.distribute.strategy_supports_no_merge_call()
        return tf.cast(optimizer.check_finite([gradient]), tf.float32), no_merge

    return strategy.run(replica, (gradients,))


finite, no_merge = decide(gradients)
facts["no_merge_call"] = bool(no_merge)
facts["no_merge_call_finite"] = replica_values(strategy, finite)
print(json.dumps(facts))
"""
)


def run_two_cpus(script: str, *args: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_an_overflow_on_one_replica_skips_the_step_on_every_replica():
    """Replica 1's gradients overflow, replica 0's do not: both skip the step, keep finite
    weights and halve the loss scale, with merge calls; without them both decide alike.
    Keras's own LossScaleOptimizer (`python -c SCRIPT stock`) applies Inf instead."""
    facts = run_two_cpus(LOSS_SCALING, "agreed")
    assert facts["merge_call"] and facts["no_merge_call"], facts
    # The premise: only replica 1's gradients overflowed (the facts say what happened if not).
    assert facts["locally_finite"] == [1.0, 0.0], facts
    assert facts["unchanged"] and facts["finite"]
    assert facts["scales"] == [2.0**14, 2.0**14]
    assert facts["no_merge_call_finite"] == [0.0, 0.0]


XLA = (
    TWO_CPUS
    + """
from hpcai500_tf import config
from hpcai500_tf.engine.run import build_engine


def engine(xla):
    overrides = ["training.strategy=mirrored", f"training.xla={str(xla).lower()}"]
    return build_engine(config.prepare("image_classification", "tiny", overrides), None)


plain, compiled = engine(False), engine(True)
# One batch for both engines, each replica's half as the plain engine's data gave it.
images, labels = next(plain.train_batches())
halves = [
    [v.numpy() for v in plain.strategy.experimental_local_results(part)]
    for part in (images, labels)
]


def batch_of(e):
    return tuple(
        e.strategy.experimental_distribute_values_from_function(
            lambda context, part=part: tf.constant(part[context.replica_id_in_sync_group])
        )
        for part in halves
    )


facts = {"replicas": compiled.replicas}
for name, e in (("plain", plain), ("xla", compiled)):
    batch = batch_of(e)
    facts[name + "_losses"] = [float(e.train_step(batch)) for _ in range(4)]
    facts[name + "_flops"] = e.step_flops(batch).total

graph_function = compiled.traced_train_step.get_concrete_function(*batch_of(compiled))
facts["outer_xla"] = graph_function.function_def.attr["_XlaMustCompile"].b
facts["outer_ops"] = sorted({op.type for op in graph_function.graph.get_operations()})
facts["calls"] = []
for op in graph_function.graph.get_operations():
    if op.type in ("StatefulPartitionedCall", "PartitionedCall"):
        definition = graph_function.graph._get_function(op.get_attr("f").name).definition
        facts["calls"].append(
            {
                "device": op.device,
                "xla": definition.attr["_XlaMustCompile"].b,
                "ops": sorted({node.op for node in definition.node_def}),
            }
        )
print(json.dumps(facts))
"""
)


@pytest.mark.slow  # ~45 s on 2 cores: XLA compiles on the CPU
def test_xla_compiles_each_replicas_gradients_but_not_the_update():
    """With training.xla the engine's outer train step is a plain graph: one XLA-compiled call
    per replica computes loss and gradients (the forward and backward convolutions live only
    there), and the all-reduce and the optimizer update stay outside. The losses follow the
    engine without XLA, and the FLOP count reads the same ops."""
    facts = run_two_cpus(XLA)
    assert facts["replicas"] == 2
    assert facts["xla_losses"] == pytest.approx(facts["plain_losses"], rel=5e-3)
    assert facts["xla_flops"] == facts["plain_flops"] > 0
    assert facts["outer_xla"] is False
    compiled = [call for call in facts["calls"] if call["xla"]]
    assert len(compiled) == 2 and len({call["device"] for call in compiled}) == 2
    for call in compiled:
        assert {"Conv2D", "Conv2DBackpropFilter", "Conv2DBackpropInput"} <= set(call["ops"])
        assert not any(op.startswith(("Collective", "Nccl")) for op in call["ops"])
    assert "Conv2D" not in facts["outer_ops"]
    assert "CollectiveReduceV2" in facts["outer_ops"]  # the gradients' all-reduce, outside


RESUMED_STREAM = (
    TWO_CPUS
    + """
from hpcai500_tf import config
from hpcai500_tf.engine.run import build_engine

setup = config.prepare(
    "image_classification", "tiny", ["training.strategy=mirrored", "training.deterministic=true"]
)
engine = build_engine(setup, None)


def labels(step):
    return [v.numpy().tolist() for v in engine.strategy.experimental_local_results(step[1])]


whole = engine.train_batches()
steps = [labels(next(whole)) for _ in range(4)]
print(json.dumps({"steps": steps, "resumed": labels(next(engine.train_batches(0, 3)))}))
"""
)


def test_a_resumed_stream_skips_every_replicas_batches_of_the_steps_done():
    """Each of a worker's replicas takes one of its pipeline's batches a step: a resume after
    3 steps starts where step 4 of the stream never stopped starts (it used to skip 3
    batches, not 3 x 2, and trained steps 2 and 3's batches again)."""
    facts = run_two_cpus(RESUMED_STREAM)
    assert facts["steps"][0] != facts["steps"][1]  # the premise: steps differ
    assert facts["resumed"] == facts["steps"][3]
