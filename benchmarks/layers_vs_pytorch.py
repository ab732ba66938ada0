"""ResNet-50 v1.5's layers one at a time: this project's TensorFlow layers against PyTorch's
(channels-last), forward and forward plus backward, to find which layers make the difference
between the two whole train steps (`train_step_vs_pytorch.py`).

Every unique convolution (input size, channels, kernel, stride) and every unique batch norm
(followed by a ReLU, as the step's fused batch norms are) of the model at batch 32, 224x224,
each taken from the model itself: TensorFlow's from the reference preset's model as `train`
builds it (its CPU kernel set: the 1x1 filter gradient as a matmul and so on), PyTorch's from
`hpcai500_tf.pytorch.resnet`. The backward pass computes the input gradient (not for the
stem, whose input is the image) and the weight gradient from a random upstream gradient. In
bfloat16 both sides keep float32 weights and cast them per call, as their mixed-precision
steps do (Keras's mixed_bfloat16 policy, torch.autocast). Median of repeated calls after a
warm-up; each framework in its own process, interleaved over rounds. Prints per layer shape
the milliseconds of each side, the ratio PyTorch/TensorFlow (above 1: TensorFlow faster) and
the totals over the model's layers (counting repeats).

    python benchmarks/layers_vs_pytorch.py [--precision mixed] [--batch 32] [--repeats 5]
        [--rounds 2] [--keep-freed-memory]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from resnet_step import benchmark_env

ROOT = Path(__file__).resolve().parents[1]


def median_seconds(call, repeats: int) -> float:
    call()  # warm-up: primitive creation, allocation
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def conv_key(height, width, cin, cout, kernel, stride) -> str:
    return f"conv {height}x{width} {cin}->{cout} k{kernel} s{stride}"


def bn_key(height, width, channels) -> str:
    return f"bn+relu {height}x{width}x{channels}"


def tf_layer_times(precision: str, batch: int, repeats: int) -> dict:
    """{key: {"count", "flops", "forward", "backward"}} for the TensorFlow model's layers."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf
    from resnet_step import reference_engine

    engine, _ = reference_engine(precision, batch, 224)
    dtype = tf.bfloat16 if precision == "mixed" else tf.float32
    relu = keras.layers.ReLU()  # the stock ReLU the CPU kernel set puts after a batch norm
    found: dict = {}
    for layer in engine.model.layers:
        if isinstance(layer, keras.layers.Conv2D):
            _, height, width, cin = layer.input.shape
            key = conv_key(
                height, width, cin, layer.filters, layer.kernel_size[0], layer.strides[0]
            )
            stride = layer.strides[0]
            flops = 2.0 * batch * -(-height // stride) * -(-width // stride)
            flops *= layer.kernel_size[0] ** 2 * cin * layer.filters
            apply = layer
        elif type(layer).__name__ in ("FusedBatchNorm", "BatchNormalization", "NativeBatchNorm"):
            # The native kernel set's batch norms are timed as its step runs them: with the
            # ReLU (and a residual add) they fold in, else alone (a stock ReLU after one would
            # be a separate op there, where TensorFlow fuses it into FusedBatchNormV3).
            native = type(layer).__name__ == "NativeBatchNorm"
            residual, folded = getattr(layer, "residual", False), getattr(layer, "relu", False)
            _, height, width, cin = (layer.input[0] if residual else layer.input).shape
            key, flops = bn_key(height, width, cin), 0.0
            if residual:
                apply = lambda x, bn=layer: bn([x, x], training=True)  # noqa: E731
            elif folded or native:
                apply = lambda x, bn=layer: bn(x, training=True)  # noqa: E731
            else:
                apply = lambda x, bn=layer: relu(bn(x, training=True))  # noqa: E731
        else:
            continue
        if key in found:
            found[key]["count"] += 1
            continue
        found[key] = {
            "count": 1,
            "flops": flops,
            "apply": apply,
            "weights": layer.trainable_variables,
            "shape": (batch, height, width, cin),
            "input_gradient": cin != 3,
        }
    return {key: _tf_time(entry, dtype, repeats) for key, entry in found.items()}


def _tf_time(entry: dict, dtype, repeats: int) -> dict:
    import tensorflow as tf

    apply, weights = entry["apply"], list(entry["weights"])
    inputs = tf.cast(tf.random.normal(entry["shape"]), dtype)
    upstream = tf.cast(tf.random.normal(apply(inputs).shape), dtype)

    @tf.function
    def forward(x):
        return apply(x)[0, 0, 0, 0]

    @tf.function
    def backward(x, dy):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = apply(x)
        sources = ([x] if entry["input_gradient"] else []) + weights
        return [g[(0,) * len(g.shape)] for g in tape.gradient(y, sources, dy)]

    forward_time = median_seconds(lambda: forward(inputs).numpy(), repeats)
    backward_time = median_seconds(lambda: [g.numpy() for g in backward(inputs, upstream)], repeats)
    return {
        "count": entry["count"],
        "flops": entry["flops"],
        "forward": forward_time,
        "backward": backward_time,
    }


def torch_layer_times(precision: str, batch: int, repeats: int) -> dict:
    """The same for the PyTorch model's convolutions and batch norms."""
    import torch
    from torch import nn

    from hpcai500_tf.pytorch.resnet import ResNet50V15

    torch.manual_seed(0)
    model = ResNet50V15(1000).to(memory_format=torch.channels_last).train()
    shapes: dict = {}

    def record(module, args, _outputs):
        shapes.setdefault(module, args[0].shape)  # returning nothing keeps the output

    hooks = [
        module.register_forward_hook(record)
        for module in model.modules()
        if isinstance(module, (nn.Conv2d, nn.BatchNorm2d))
    ]
    with torch.no_grad():
        model(torch.zeros(1, 3, 224, 224).to(memory_format=torch.channels_last))
    for hook in hooks:
        hook.remove()
    found: dict = {}
    for module, (_, cin, height, width) in shapes.items():
        if isinstance(module, nn.Conv2d):
            kernel, stride = module.kernel_size[0], module.stride[0]
            key = conv_key(height, width, cin, module.out_channels, kernel, stride)
        else:
            key = bn_key(height, width, cin)
        if key in found:
            found[key]["count"] += 1
        else:
            found[key] = {"count": 1, "module": module, "shape": (batch, cin, height, width)}
    return {key: _torch_time(entry, precision, repeats) for key, entry in found.items()}


def _torch_time(entry: dict, precision: str, repeats: int) -> dict:
    import torch
    from torch import nn

    module = entry["module"]
    apply = module if isinstance(module, nn.Conv2d) else lambda x: torch.relu(module(x))
    dtype = torch.bfloat16 if precision == "mixed" else torch.float32
    inputs = torch.randn(entry["shape"]).to(dtype=dtype, memory_format=torch.channels_last)
    inputs.requires_grad_(entry["shape"][1] != 3)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "mixed")
    with autocast, torch.no_grad():
        upstream = torch.randn_like(apply(inputs)).contiguous(memory_format=torch.channels_last)

    def forward():
        with autocast, torch.no_grad():
            apply(inputs)

    def backward():
        module.zero_grad(set_to_none=True)
        inputs.grad = None
        with autocast:
            outputs = apply(inputs)
        outputs.backward(upstream)

    return {
        "count": entry["count"],
        "forward": median_seconds(forward, repeats),
        "backward": median_seconds(backward, repeats),
    }


def run_one(framework: str, args) -> dict:
    command = [
        sys.executable,
        __file__,
        "--one",
        framework,
        "--precision",
        args.precision,
        "--batch",
        str(args.batch),
        "--repeats",
        str(args.repeats),
    ]
    env = benchmark_env(ROOT, args.keep_freed_memory)
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
    if result.returncode != 0:
        raise SystemExit(f"{framework} failed:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def report(rounds: list[dict]) -> None:
    """Per layer shape, the median over rounds of each side's times, and the totals."""
    keys = list(rounds[0]["tensorflow"])
    missing = [k for k in keys if k not in rounds[0]["pytorch"]]
    if missing:
        raise SystemExit(f"shapes only TensorFlow's model has: {', '.join(missing)}")
    print(
        f"{'layer (input, batch first)':34s} {'n':>3s}  {'TF fwd':>7s} {'PT fwd':>7s}  "
        f"{'TF f+b':>7s} {'PT f+b':>7s}  PT/TF  TF GFLOP/s (f+b)"
    )
    totals = {"tensorflow": 0.0, "pytorch": 0.0}
    kind_totals: dict = {}
    for key in keys:
        med = {
            (fw, part): statistics.median(r[fw][key][part] for r in rounds)
            for fw in totals
            for part in ("forward", "backward")
        }
        count = rounds[0]["tensorflow"][key]["count"]
        flops = rounds[0]["tensorflow"][key]["flops"] * 3  # forward, input and filter gradients
        rate = f"{flops / med[('tensorflow', 'backward')] / 1e9:8.1f}" if flops else ""
        print(
            f"{key:34s} {count:3d}  {med[('tensorflow', 'forward')] * 1e3:7.1f} "
            f"{med[('pytorch', 'forward')] * 1e3:7.1f}  "
            f"{med[('tensorflow', 'backward')] * 1e3:7.1f} "
            f"{med[('pytorch', 'backward')] * 1e3:7.1f}  "
            f"{med[('pytorch', 'backward')] / med[('tensorflow', 'backward')]:5.2f}  {rate}"
        )
        kind = key.split()[0]
        for fw in totals:
            totals[fw] += med[(fw, "backward")] * count
            kind_totals[(kind, fw)] = (
                kind_totals.get((kind, fw), 0.0) + med[(fw, "backward")] * count
            )
    for kind in sorted({k for k, _ in kind_totals}):
        tf_s, pt_s = kind_totals[(kind, "tensorflow")], kind_totals[(kind, "pytorch")]
        print(
            f"all {kind} layers, forward+backward: TensorFlow {tf_s:.3f} s, PyTorch "
            f"{pt_s:.3f} s, PT/TF {pt_s / tf_s:.3f}"
        )
    print(
        f"all layers: TensorFlow {totals['tensorflow']:.3f} s, PyTorch "
        f"{totals['pytorch']:.3f} s, PT/TF {totals['pytorch'] / totals['tensorflow']:.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--precision", default="mixed", choices=("fp32", "mixed"))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--keep-freed-memory", action="store_true")
    parser.add_argument("--one", choices=("tensorflow", "pytorch"))
    args = parser.parse_args()
    if args.one:
        timer = tf_layer_times if args.one == "tensorflow" else torch_layer_times
        print(json.dumps(timer(args.precision, args.batch, args.repeats)))
        return
    rounds = [
        {fw: run_one(fw, args) for fw in ("tensorflow", "pytorch")} for _ in range(args.rounds)
    ]
    print(
        f"ResNet-50 v1.5 layers, {args.precision}, batch {args.batch}, 224x224, "
        f"{args.repeats} calls x {args.rounds} rounds (ms, median)"
        + (", glibc keeping freed memory" if args.keep_freed_memory else "")
    )
    report(rounds)


if __name__ == "__main__":
    main()
