"""FLOPs of the train step that actually runs, counted from its TensorFlow graph.

Each op's count comes from TensorFlow's registered statistics (the same ones the TF profiler
uses; multiply-add = 2). The graph must be traced at a fixed batch: with a None batch
dimension the shape-dependent counts are 0. Ops without a registered count (ReLU, casts,
the fused softmax-cross-entropy, variable updates...) are listed as uncounted.
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


def count_graph(graph: tf.Graph, batch: int) -> FlopCount:
    """Sum the registered FLOP statistics of every op in a graph traced at `batch`."""
    by_type: dict[str, float] = collections.Counter()
    uncounted = set()
    for op in graph.get_operations():
        try:
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
