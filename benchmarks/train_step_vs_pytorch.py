"""Train-step throughput of ResNet-50 v1.5: this project's TensorFlow step against a plain
PyTorch step (channels-last, same batch, same machine, same run).

Each (framework, precision) runs in its own process, interleaved over rounds so that drift on
a shared machine hits both sides alike. Per step: forward, loss, backward, SGD update; the
timing syncs by reading the loss back. Reports the median images/s and TF/PyTorch ratios.

    python benchmarks/train_step_vs_pytorch.py [--batch 32] [--image-size 224] [--steps 5]
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

ROOT = Path(__file__).resolve().parents[1]


def tf_step_times(precision: str, batch: int, image_size: int, steps: int, warmup: int):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from hpcai500_tf.config import prepare
    from hpcai500_tf.engine.run import build_engine

    setup = prepare(
        "image_classification",
        "reference",
        [
            "data.source='random'",
            f"data.image_size={image_size}",
            "data.num_classes=1000",
            f"training.batch_per_replica={batch}",
            "training.strategy='default'",
            f"training.precision='{precision}'",
        ],
    )
    engine = build_engine(setup, None)
    images, labels = next(engine.train_batches())
    times = []
    for index in range(warmup + steps):
        start = time.perf_counter()
        float(engine.train_step(images, labels))  # reading the loss back syncs
        if index >= warmup:
            times.append(time.perf_counter() - start)
    return times


def torch_step_times(precision: str, batch: int, image_size: int, steps: int, warmup: int):
    import torch

    sys.path.insert(0, str(ROOT / "tools"))
    from torch_resnet import ResNet50V15

    torch.manual_seed(0)
    model = ResNet50V15(1000).to(memory_format=torch.channels_last).train()
    optimizer = torch.optim.SGD(
        model.parameters(), lr=0.1, momentum=0.875, weight_decay=3.0517578125e-05
    )
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    images = torch.rand(batch, 3, image_size, image_size).to(memory_format=torch.channels_last)
    labels = torch.randint(0, 1000, (batch,))
    times = []
    for index in range(warmup + steps):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "mixed"):
            loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()
        float(loss)
        if index >= warmup:
            times.append(time.perf_counter() - start)
    return times


def run_one(framework: str, precision: str, args) -> dict:
    command = [
        sys.executable,
        __file__,
        "--one",
        framework,
        precision,
        "--batch",
        str(args.batch),
        "--image-size",
        str(args.image_size),
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
    ]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if result.returncode != 0:
        raise SystemExit(f"{framework} {precision} failed:\n{result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--precisions", default="fp32,mixed")
    parser.add_argument("--one", nargs=2, metavar=("FRAMEWORK", "PRECISION"))
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    if args.one:
        framework, precision = args.one
        timer = tf_step_times if framework == "tensorflow" else torch_step_times
        times = timer(precision, args.batch, args.image_size, args.steps, args.warmup)
        print(json.dumps({"times": times}))
        return
    samples = {}
    for _ in range(args.rounds):
        for precision in args.precisions.split(","):
            for framework in ("tensorflow", "pytorch"):
                times = run_one(framework, precision, args)["times"]
                samples.setdefault((framework, precision), []).extend(times)
    rows = []
    print(
        f"ResNet-50 v1.5 train step, batch {args.batch}, {args.image_size}x{args.image_size}, "
        f"median of {args.steps} x {args.rounds} steps (images/s)"
    )
    for precision in args.precisions.split(","):
        rate = {
            fw: args.batch / statistics.median(samples[(fw, precision)])
            for fw in ("tensorflow", "pytorch")
        }
        ratio = rate["tensorflow"] / rate["pytorch"]
        label = "fp32" if precision == "fp32" else "bf16 (mixed)"
        print(
            f"  {label:13s} TensorFlow {rate['tensorflow']:7.2f}   PyTorch "
            f"{rate['pytorch']:7.2f}   TF/PyTorch {ratio:.3f}x"
        )
        rows.append(
            {
                "precision": precision,
                "tensorflow_images_per_s": rate["tensorflow"],
                "pytorch_images_per_s": rate["pytorch"],
                "ratio": ratio,
            }
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
