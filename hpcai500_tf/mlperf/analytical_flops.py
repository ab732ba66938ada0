"""FLOPs of a model counted from its architecture alone, without a framework: what an imported
result needs when the log carries no count (`import-mlperf` of an MLPerf results tree).

The count is the one `models.resnet.analytical_forward_flops` makes of the Keras model (2 x
the multiply-adds of every convolution and dense layer at the input size; tests hold the two
equal), and a training step is 3 x forward (forward, and the two gradients of backward), as
`hpcai500-tf flops` shows it beside the profiled count.
"""

from __future__ import annotations

import math

STAGE_FILTERS = (64, 128, 256, 512)  # ResNet-50's four stages (models/resnet.py)
RESNET50_BLOCKS = (3, 4, 6, 3)
EXPANSION = 4
TRAINING_PASSES = 3  # forward + backward (gradients of activations and of weights)


def _conv(kernel: int, channels_in: int, channels_out: int, size: int) -> int:
    """2 x multiply-adds of a square convolution whose output is size x size."""
    return 2 * kernel * kernel * channels_in * channels_out * size * size


def resnet50_v15_forward_flops(image_size: int = 224, num_classes: int = 1000) -> float:
    """ResNet-50 v1.5 forward, per example: the stem's 7x7 stride-2 convolution and max pool,
    four stages of bottlenecks (the stride in the 3x3 convolution, a projection where the
    shape changes), the dense classifier; "same" padding, so a stride of 2 halves rounding up."""
    size = math.ceil(image_size / 2)
    total = _conv(7, 3, STAGE_FILTERS[0], size)
    size, channels = math.ceil(size / 2), STAGE_FILTERS[0]
    for stage, (filters, count) in enumerate(zip(STAGE_FILTERS, RESNET50_BLOCKS, strict=True)):
        for block in range(count):
            stride = 2 if block == 0 and stage > 0 else 1
            out_size, out_channels = math.ceil(size / stride), filters * EXPANSION
            if stride != 1 or channels != out_channels:
                total += _conv(1, channels, out_channels, out_size)
            total += _conv(1, channels, filters, size)
            total += _conv(3, filters, filters, out_size)
            total += _conv(1, filters, out_channels, out_size)
            size, channels = out_size, out_channels
    return float(total + 2 * channels * num_classes)


def resnet50_v15_training_flops(image_size: int = 224, num_classes: int = 1000) -> dict:
    """The training count per example and how it was made, as a record's `flops` block
    states it (basis `analytical-resnet50-v1.5`)."""
    forward = resnet50_v15_forward_flops(image_size, num_classes)
    return {
        "per_example_training": TRAINING_PASSES * forward,
        "per_example_forward": None,
        "analytical_per_example_forward": forward,
        "method": (
            f"analytical: ResNet-50 v1.5 at {image_size}x{image_size}, {num_classes} classes: "
            f"2 x the multiply-adds of every convolution and dense layer = {forward:.4g} FLOPs "
            f"forward, x {TRAINING_PASSES} (forward + backward; the weight update's few FLOPs "
            "per parameter, batch norm and activations not counted)"
        ),
        "basis": "analytical-resnet50-v1.5",
        "counted_op_types": [],
        "uncounted_op_types": [],
    }
