"""benchmarks/train_step_ops.py: the ops of a traced step counted by type, nested functions
included; and the step's structure it reports: one fused update per variable, one finiteness
check for all gradients, the moving statistics updated by the batch-norm kernel."""

import importlib.util
from pathlib import Path

import pytest
import tensorflow as tf

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "train_step_ops.py"


@pytest.fixture(scope="module")
def step_ops():
    spec = importlib.util.spec_from_file_location("train_step_ops", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_count_enters_both_branches_of_a_cond_once(step_ops):
    @tf.function
    def step(x):
        return tf.cond(x > 0, lambda: tf.sqrt(x) * 2.0, lambda: tf.exp(x) + tf.exp(x))

    graph = step.get_concrete_function(tf.constant(1.0)).graph.as_graph_def()
    counts = step_ops.graph_op_types(graph)
    assert counts["Sqrt"] == 1 and counts["Mul"] == 1
    assert counts["Exp"] == 2 and counts["AddV2"] == 1
    assert counts["Greater"] == 1
    kernels = step_ops.kernel_count(counts)
    assert kernels == sum(counts.values()) - sum(
        n for op, n in counts.items() if op in step_ops.NOT_KERNELS
    )
    assert kernels == 6  # Greater, Sqrt, Mul, Exp x 2, AddV2: the cond and constants are not


def test_the_count_leaves_out_what_tensorflow_prunes_and_keeps_what_has_effects(step_ops):
    """The ops TensorFlow executes: what an output or a stateful op needs, in the graph and in
    each branch of a cond; an unused value (the gradient tape's zeros) is pruned, an assign
    nothing reads is not."""
    counter = tf.Variable(0.0)

    @tf.function
    def step(x):
        tf.exp(x)  # read by nothing: pruned
        counter.assign_add(tf.sqrt(x))  # read by nothing, but it changes state: executed

        def positive():
            tf.square(x)  # pruned in the branch too
            return x * 2.0

        return tf.cond(x > 0, positive, lambda: x - 1.0)

    traced = step.get_concrete_function(tf.constant(1.0))
    graph = traced.graph.as_graph_def()
    everything = step_ops.graph_op_types(graph)
    executed = step_ops.graph_op_types(graph, returned=step_ops.returned_nodes(traced.graph))
    assert everything["Exp"] == 1 and everything["Square"] == 1
    assert executed["Exp"] == 0 and executed["Square"] == 0
    assert executed["Sqrt"] == 1 and executed["AssignAddVariableOp"] == 1
    assert executed["Mul"] == 1 and executed["Sub"] == 1 and executed["Greater"] == 1


def test_the_compiled_count_reads_only_what_xla_must_compile(step_ops):
    inner = tf.function(lambda x: tf.sqrt(x) * 2.0, jit_compile=True)

    @tf.function
    def step(x):
        return inner(x) + tf.exp(x)

    graph = step.get_concrete_function(tf.constant(1.0)).graph.as_graph_def()
    compiled = step_ops.graph_op_types(graph, compiled_only=True)
    assert compiled["Sqrt"] == 1 and compiled["Mul"] == 1
    assert compiled["Exp"] == 0 and compiled["AddV2"] == 0
    assert step_ops.graph_op_types(graph)["Exp"] == 1


@pytest.fixture(scope="module")
def tiny_model():
    """(trainable variables, batch norms) of the tiny preset's model on the GPU kernel set."""
    from hpcai500_tf import config
    from hpcai500_tf.models.kernels import FusedBatchNorm
    from hpcai500_tf.workloads import build_workload

    setup = config.prepare("image_classification", "tiny", ["data.source='random'"])
    model = build_workload(setup.benchmark.name, setup.config, None).build_model()
    batch_norms = sum(isinstance(layer, FusedBatchNorm) for layer in model._flatten_layers())
    return len(model.trainable_variables), batch_norms


def test_a_float16_step_updates_each_variable_in_one_kernel_and_checks_finiteness_once(
    step_ops, tiny_model
):
    """The tiny preset under float16 (as on GPUs) on the GPU kernel set, weight decay on all
    variables: per variable one momentum kernel and one decay kernel, one IsFinite for all
    gradients, no element-wise moving-statistics update."""
    counts = step_ops.traced_step_ops("gpu-fused-batch-norm", "mixed_float16", 16, 2, "tiny")
    variables, batch_norms = tiny_model
    assert counts["ResourceApplyMomentum"] == variables
    assert counts["ResourceApplyGradientDescent"] == variables  # decay_all_variables
    assert counts["L2Loss"] == variables  # the decay term's value, no gradient of it
    assert counts["IsFinite"] == 1
    assert counts["FusedBatchNormV3"] == batch_norms
    # Two assigns per batch norm, a few for the loss scale's counters; written out, the
    # moving-statistics update took two subtractions (and a product) per statistic.
    assert 2 * batch_norms <= counts["AssignVariableOp"] <= 2 * batch_norms + 8
    assert counts["AssignSubVariableOp"] == 0 and counts["Sub"] < batch_norms


def test_under_xla_the_compiled_part_holds_the_fused_batch_norm(step_ops, tiny_model):
    """`training.xla` on the GPU kernel set under float16: what XLA compiles (each replica's
    loss and gradients) holds one FusedBatchNormV3 and one FusedBatchNormGradV3 per batch
    norm, and none of the optimizer's update, which the step runs outside it."""
    variables, batch_norms = tiny_model
    args = ("gpu-fused-batch-norm", "mixed_float16", 16, 2, "tiny")
    compiled = step_ops.traced_step_ops(*args, xla=True, compiled_only=True)
    assert compiled["FusedBatchNormV3"] == batch_norms
    assert compiled["FusedBatchNormGradV3"] == batch_norms
    assert compiled["ResourceApplyMomentum"] == 0 and compiled["IsFinite"] == 0
    whole = step_ops.traced_step_ops(*args, xla=True)
    assert whole["ResourceApplyMomentum"] == variables and whole["IsFinite"] == 1
