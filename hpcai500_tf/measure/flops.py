"""FLOPs of the train step that actually runs, counted from its TensorFlow graph.

Each op's count comes from TensorFlow's registered statistics (the same ones the TF profiler
uses; multiply-add = 2). The graph must be traced at a fixed batch: with a None batch
dimension the shape-dependent counts are 0. Ops without a registered count (ReLU, casts,
the fused softmax-cross-entropy, variable updates...) are listed as uncounted.

Only ops that run are counted: those the function's outputs or its stateful ops (variable
updates) depend on. Gradient functions build some ops nothing uses, e.g. the gradient of the
first convolution with respect to the input images; TensorFlow prunes them before running,
and so does the count.

The two convolution gradients are counted here, not by TensorFlow's statistic: that one
takes the forward output as input / stride^2, which undercounts whenever the stride does not
divide the input (a 1x1 map under a stride-2 convolution counts a quarter). Each gradient
costs exactly what the forward convolution does: 2 x (forward output elements) x kh x kw x
input channels, read here from the incoming gradient's shape (the forward output).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import tensorflow as tf
from tensorflow.python.framework import ops as tf_ops

# Ops that move or reshape data, or manage state: no arithmetic to count.
_NO_ARITHMETIC = {
    "Const",
    "Placeholder",
    "Identity",
    "IdentityN",
    "NoOp",
    "ReadVariableOp",
    "AssignVariableOp",
    "Reshape",
    "Shape",
    "ShapeN",
    "Squeeze",
    "ExpandDims",
    "StopGradient",
    "VarHandleOp",
    "Cast",
    "Tile",
    "Pack",
    "Unpack",
    "ConcatV2",
    "StridedSlice",
    "Fill",
    "ZerosLike",
    "OnesLike",
    "GatherV2",
    "Transpose",
    "Slice",
    "Range",
    "Size",
    "Rank",
}


@dataclass(frozen=True)
class FlopCount:
    total: float
    by_op_type: dict[str, float]
    uncounted_op_types: list[str]
    batch: int

    @property
    def per_example(self) -> float:
        return self.total / self.batch


def live_operations(graph: tf.Graph) -> list:
    """The ops the graph's outputs and stateful ops depend on (what runs), in graph order."""
    roots = [t.op for t in getattr(graph, "outputs", [])]
    roots += list(getattr(graph, "control_outputs", []))
    roots += [op for op in graph.get_operations() if op.op_def.is_stateful]
    live, stack = set(), list(roots)
    while stack:
        op = stack.pop()
        if op in live:
            continue
        live.add(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return [op for op in graph.get_operations() if op in live]


def _conv_gradient_flops(op) -> float | None:
    """Conv2DBackpropInput/Filter: inputs are (input or its sizes, filter or its sizes,
    gradient of the forward output)."""
    if op.get_attr("data_format") not in (b"NHWC", "NHWC"):
        return None
    forward_output = op.inputs[2].shape
    if op.type == "Conv2DBackpropInput":
        kernel = op.inputs[1].shape
    else:
        kernel = op.outputs[0].shape
    if not (forward_output.is_fully_defined() and kernel.is_fully_defined()):
        return None
    kh, kw, cin, _ = kernel.as_list()
    return 2.0 * forward_output.num_elements() * kh * kw * cin


_OWN_COUNT = {
    "Conv2DBackpropInput": _conv_gradient_flops,
    "Conv2DBackpropFilter": _conv_gradient_flops,
}


def count_graph(graph: tf.Graph, batch: int) -> FlopCount:
    """Sum the registered FLOP statistics of every op that runs in a graph traced at `batch`."""
    by_type: dict[str, float] = collections.Counter()
    uncounted = set()
    for op in live_operations(graph):
        try:
            if op.type in _OWN_COUNT:
                value = _OWN_COUNT[op.type](op)
            else:
                value = tf_ops.get_stats_for_node_def(graph, op.node_def, "flops").value
        except ValueError:  # a shape the statistic needs is unknown
            value = None
        if value:
            by_type[op.type] += float(value)
        elif op.type not in _NO_ARITHMETIC:
            uncounted.add(op.type)
    if not by_type:
        raise ValueError("no op in the graph has a FLOP count: was it traced at a fixed batch?")
    return FlopCount(sum(by_type.values()), dict(by_type), sorted(uncounted), batch)


def count_function(function, *args, batch: int) -> FlopCount:
    """Count a tf.function's concrete graph for these (fixed-shape) arguments."""
    concrete = function.get_concrete_function(*args)
    return count_graph(concrete.graph, batch)
