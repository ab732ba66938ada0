"""Placing a workload on the roofline: each convolution and dense layer of its model as a
point (operational intensity from its shapes, achieved FLOPS from timing it alone at the
benchmark's batch and precision) and the whole train step (FLOPs from the profiler, memory
traffic estimated as the minimum per layer: input, weights and output in each of the forward,
backward-input and backward-filter passes).
"""

from __future__ import annotations

import keras

from hpcai500_tf.roofline.timed_ops import ConvShape, conv


def layer_shapes(model: keras.Model, batch: int) -> list[tuple[ConvShape, int]]:
    """Unique (shape, how many layers share it) of every Conv2D and Dense layer. A model made
    of parts (e.g. Faster R-CNN: backbone, RPN, and a box head run once per sampled region)
    names them and how many times each runs per example with `roofline_parts()`."""
    unique: dict[tuple, list] = {}
    parts = model.roofline_parts() if hasattr(model, "roofline_parts") else [(model, 1)]
    for part, per_example in parts:
        for layer in part.layers:
            rows = batch * per_example
            if isinstance(layer, keras.layers.Conv2D):
                _, height, width, cin = layer.input.shape
                shape = ConvShape(
                    layer.name, rows, height, width, cin, layer.filters,
                    layer.kernel_size[0], layer.strides[0],
                )  # fmt: skip
            elif isinstance(layer, keras.layers.Dense):
                shape = ConvShape(layer.name, rows, 1, 1, layer.input.shape[-1], layer.units, 1, 1)
            else:
                continue
            key = (shape.batch, shape.height, shape.width, shape.cin, shape.cout)
            key += (shape.kernel, shape.stride)
            unique.setdefault(key, [shape, 0])[1] += 1
    return [(shape, count) for shape, count in unique.values()]


def step_traffic_bytes(shapes: list[tuple[ConvShape, int]], itemsize: int) -> float:
    """Minimum bytes one train step moves: three passes over every layer's operands."""
    return sum(3 * shape.bytes(itemsize) * count for shape, count in shapes)


def layer_points(
    shapes: list[tuple[ConvShape, int]],
    dtype: str,
    itemsize: int,
    min_seconds: float,
    progress=None,
    chain: int = 1,
) -> list[dict]:
    points = []
    for index, (shape, count) in enumerate(shapes):
        achieved, timing = conv(shape, dtype, "forward", min_seconds, chain)
        points.append(
            {
                "layer": (
                    f"{shape.kernel}x{shape.kernel}/{shape.stride} {shape.pixels} "
                    f"{shape.cin}->{shape.cout}"
                ),
                "count": count,
                "batch": shape.batch,
                "flops": shape.flops(),
                "bytes": shape.bytes(itemsize),
                "operational_intensity": shape.flops() / shape.bytes(itemsize),
                "achieved_flops": achieved,
                "spread": timing.spread,
            }
        )
        if progress:
            progress(index + 1, len(shapes))
    return points
