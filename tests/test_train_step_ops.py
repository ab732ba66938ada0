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


def test_a_float16_step_updates_each_variable_in_one_kernel_and_checks_finiteness_once(step_ops):
    """The tiny preset under float16 (as on GPUs) on the GPU kernel set, weight decay on all
    variables: per variable one momentum kernel and one decay kernel, one IsFinite for all
    gradients, no element-wise moving-statistics update."""
    counts = step_ops.traced_step_ops("gpu-fused-batch-norm", "mixed_float16", 16, 2, "tiny")
    from hpcai500_tf import config
    from hpcai500_tf.models.kernels import FusedBatchNorm
    from hpcai500_tf.workloads import build_workload

    setup = config.prepare("image_classification", "tiny", ["data.source='random'"])
    model = build_workload(setup.benchmark.name, setup.config, None).build_model()
    variables = len(model.trainable_variables)
    batch_norms = sum(isinstance(layer, FusedBatchNorm) for layer in model._flatten_layers())
    assert counts["ResourceApplyMomentum"] == variables
    assert counts["ResourceApplyGradientDescent"] == variables  # decay_all_variables
    assert counts["L2Loss"] == variables  # the decay term's value, no gradient of it
    assert counts["IsFinite"] == 1
    assert counts["FusedBatchNormV3"] == batch_norms
    # Two assigns per batch norm, a few for the loss scale's counters; written out, the
    # moving-statistics update took two subtractions (and a product) per statistic.
    assert 2 * batch_norms <= counts["AssignVariableOp"] <= 2 * batch_norms + 8
    assert counts["AssignSubVariableOp"] == 0 and counts["Sub"] < batch_norms
