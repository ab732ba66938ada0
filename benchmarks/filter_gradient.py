"""The filter gradient of ResNet-50 v1.5's stride-1 convolutions: TensorFlow's
Conv2DBackpropFilter against the matrix products the model uses instead, at batch 32 and
224x224, per precision: for the 1x1 layers (`--kernel 1`) one matmul
(`models/kernels.py: pointwise_filter_gradient`), for the 3x3 layers (`--kernel 3`) one per
kernel tap (`shifted_filter_gradient`, which the model takes in bfloat16 up to 7x7); with
`--kernel 1 --stride 2`, the 1x1 stride-2 projections against the subsampled input's matmul
(`subsampled_filter_gradient`, which the model takes in bfloat16 at outputs up to 14x14 on AMX).

Both sides run as tf.functions on the same tensors, one after the other, median of repeated
calls after a warm-up; each call is synced by reading one value back. Prints each unique shape
and the FLOP-weighted total (time over all those layers of the model, counting repeats).

    python benchmarks/filter_gradient.py [--kernel 1] [--stride 1] [--batch 32] [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def median_seconds(function, arguments: tuple, repeats: int) -> float:
    function(*arguments).numpy().flat[0]  # warm-up: primitive creation, allocation
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        function(*arguments).numpy().flat[0]
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--kernel", type=int, default=1, choices=(1, 3))
    parser.add_argument("--stride", type=int, default=1, choices=(1, 2))
    args = parser.parse_args()
    if args.stride == 2 and args.kernel != 1:
        parser.error("--stride 2 times the 1x1 layers only (--kernel 1)")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from hpcai500_tf.models.kernels import (
        pointwise_filter_gradient,
        shifted_filter_gradient,
        subsampled_filter_gradient,
    )
    from hpcai500_tf.models.resnet import resnet50_v15
    from hpcai500_tf.roofline.workload import layer_shapes

    size, stride = args.kernel, args.stride

    @tf.function
    def native_filter_gradient(inputs, upstream):
        return tf.raw_ops.Conv2DBackpropFilter(
            input=inputs,
            filter_sizes=[size, size, inputs.shape[-1], upstream.shape[-1]],
            out_backprop=upstream,
            strides=[1, stride, stride, 1],
            padding="VALID" if size == 1 else "SAME",
        )

    @tf.function
    def matmul_filter_gradient(inputs, upstream):
        if stride == 2:
            return subsampled_filter_gradient(inputs, upstream)
        if size == 1:
            return pointwise_filter_gradient(inputs, upstream)
        return shifted_filter_gradient(inputs, upstream, (size, size))

    shapes = [
        (shape, count)
        for shape, count in layer_shapes(resnet50_v15(), args.batch)
        if shape.kernel == size and shape.stride == stride and shape.height > 1
    ]
    for dtype in (tf.float32, tf.bfloat16):
        totals = {"native": 0.0, "matmul": 0.0}
        print(
            f"{dtype.name}: {size}x{size} stride-{stride} filter gradient, batch {args.batch}"
            " (GFLOP/s)"
        )
        for shape, count in shapes:
            dims = [shape.batch, shape.height, shape.width]
            inputs = tf.cast(tf.random.normal(dims + [shape.cin]), dtype)
            out = [shape.batch, shape.out_height, shape.out_width, shape.cout]
            upstream = tf.cast(tf.random.normal(out), dtype)
            native = median_seconds(native_filter_gradient, (inputs, upstream), args.repeats)
            matmul = median_seconds(matmul_filter_gradient, (inputs, upstream), args.repeats)
            totals["native"] += native * count
            totals["matmul"] += matmul * count
            print(
                f"  {shape.pixels:>5s} {shape.cin:4d}->{shape.cout:<4d} x{count:<2d}  "
                f"Conv2DBackpropFilter {shape.flops() / native / 1e9:7.1f}  "
                f"matmul {shape.flops() / matmul / 1e9:7.1f}  speed-up {native / matmul:.2f}x"
            )
        print(
            f"  all {size}x{size} layers: {totals['native'] * 1e3:.1f} ms native, "
            f"{totals['matmul'] * 1e3:.1f} ms matmul -> {totals['native'] / totals['matmul']:.2f}x"
        )


if __name__ == "__main__":
    main()
