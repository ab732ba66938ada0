"""The ImageNet TFRecord input pipeline alone against the train step it feeds, at 224x224.

Writes JPEG TFRecord shards of ImageNet-like images (about 500x375, smooth structure plus
noise, so JPEG sizes are realistic), then measures in one run:
  - the training pipeline (read, decode-and-crop, flip, resize, round to uint8, batch) alone,
    on every core this process may use (`os.sched_getaffinity`);
  - the engine's ResNet-50 v1.5 train step on a fixed batch of the same shape (on a GPU where
    TensorFlow sees one), normalisation of the uint8 batch included.
Reports images/s of both (medians over timed windows), pipeline / train step, the pipeline's
images/s per core, and the cores per GPU the pipeline needs to feed each GPU training rate
given with --gpu-images-per-s (a figure you supply for your GPU and precision; none is assumed).

    python benchmarks/input_pipeline.py [--images 512] [--batch 32] [--precision fp32]
        [--gpu-images-per-s 1500 3000]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write_shards(directory: Path, images: int, shards: int = 4) -> None:
    import numpy as np
    import tensorflow as tf

    from hpcai500_tf.data.image_folder import convert

    rng = np.random.default_rng(0)
    source = directory / "images"
    for index in range(images):
        folder = source / f"class_{index % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        height, width = int(rng.integers(330, 420)), int(rng.integers(450, 520))
        y, x = np.mgrid[0:height, 0:width] / 60.0
        base = np.stack(
            [
                np.sin(x * rng.uniform(0.5, 2) + c) * np.cos(y * rng.uniform(0.5, 2))
                for c in range(3)
            ],
            -1,
        )
        pixels = np.clip(127 + 80 * base + rng.normal(0, 20, base.shape), 0, 255)
        (folder / f"{index}.jpg").write_bytes(
            tf.io.encode_jpeg(pixels.astype(np.uint8), quality=90).numpy()
        )
    convert(source, directory / "records", "train", shards, first_label=1)


def pipeline_rate(records: Path, batch: int, seconds: float) -> tuple[float, list[float]]:
    from hpcai500_tf.data import imagenet

    dataset = imagenet.imagenet_dataset(records, True, 224, 1, seed=0, shuffle_buffer=256)
    dataset = dataset.repeat().batch(batch, drop_remainder=True).prefetch(4)
    iterator = iter(dataset)
    for _ in range(3):
        next(iterator)  # warm-up
    rates = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        for _ in range(4):
            images, _ = next(iterator)
        images.numpy()
        rates.append(4 * batch / (time.perf_counter() - start))
    return statistics.median(rates), rates


def train_step_rate(batch: int, precision: str, steps: int) -> float:
    from hpcai500_tf.config import prepare
    from hpcai500_tf.engine.run import build_engine

    setup = prepare(
        "image_classification",
        "reference",
        [
            "data.source=random",
            "data.num_classes=1000",
            f"training.batch_per_replica={batch}",
            "training.strategy=default",
            f"training.precision={precision}",
        ],
    )
    engine = build_engine(setup, None)
    batch_values = next(engine.train_batches())
    float(engine.train_step(batch_values))
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        float(engine.train_step(batch_values))
        times.append(time.perf_counter() - start)
    return batch / statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--precision", default="fp32", choices=("fp32", "mixed", "fp16", "bf16"))
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument(
        "--gpu-images-per-s",
        type=float,
        nargs="+",
        default=[1500.0, 3000.0],
        help="training images/s of one GPU to feed (your figure for your GPU and precision)",
    )
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    cores = len(os.sched_getaffinity(0))
    shards = max(1, min(args.images, max(4, cores)))  # enough files to interleave on every core
    with tempfile.TemporaryDirectory() as tmp:
        write_shards(Path(tmp), args.images, shards)
        pipeline, windows = pipeline_rate(Path(tmp) / "records", args.batch, args.seconds)
    step = train_step_rate(args.batch, args.precision, args.steps)
    per_core = pipeline / cores
    print(f"224x224, batch {args.batch}, {args.images} JPEG images in {shards} shards")
    print(f"  input pipeline alone  {pipeline:8.1f} images/s (median of {len(windows)} windows)")
    print(f"  cores used            {cores:8d} (os.sched_getaffinity)")
    print(f"  per core              {per_core:8.1f} images/s")
    print(f"  train step ({args.precision:5s})    {step:8.1f} images/s")
    print(f"  pipeline / train step {pipeline / step:8.1f}x")
    print("cores per GPU the pipeline needs (GPU rate / images/s per core):")
    for gpu_rate in args.gpu_images_per_s:
        needed = gpu_rate / per_core
        print(
            f"  a GPU training {gpu_rate:8.1f} images/s: {needed:6.1f} cores "
            f"({math.ceil(needed)} whole cores)"
        )


if __name__ == "__main__":
    main()
