"""Procedural images a ResNet can learn: oriented gratings, one orientation per class.

Every example is a pure function of (seed, index), generated on the fly with stateless random
ops, so runs are reproducible and no dataset is downloaded. Phase, frequency, tint, brightness
and noise vary per example; only the orientation carries the class.

Like ImageNet's, the images are uint8 pixels (the workload normalises them on the device): the
grating, centred on mid-grey, is scaled by PIXEL_SCALE per unit of amplitude, rounded and
saturated. The parallel map keeps its order unless the dataset's `tf.data.Options` say
otherwise (the engine sets them from `training.deterministic`).
"""

from __future__ import annotations

import math

import tensorflow as tf

EVAL_SEED_OFFSET = 1_000_003
MID_GREY = 128.0
PIXEL_SCALE = 40.0  # pixel values per unit of grating amplitude: about +-3.2 fits in 0-255


def procedural_example(index, seed: int, image_size: int, num_classes: int, noise: float):
    """One (uint8 image, label): a noisy grating whose orientation encodes the label."""
    index = tf.cast(index, tf.int32)
    key = tf.stack([tf.constant(seed, tf.int32), index])
    label = tf.random.stateless_uniform([], key, 0, num_classes, dtype=tf.int32)
    u = tf.random.stateless_uniform([6], key + [0, 7919])
    angle = math.pi * (tf.cast(label, tf.float32) + 0.3 * (u[0] - 0.5)) / num_classes
    cycles = 1.5 + 2.5 * u[1]
    phase = 2.0 * math.pi * u[2]
    grid = tf.linspace(0.0, 1.0, image_size)
    ys, xs = tf.meshgrid(grid, grid, indexing="ij")
    wave = tf.sin(2.0 * math.pi * cycles * (xs * tf.cos(angle) + ys * tf.sin(angle)) + phase)
    tint = 0.5 + tf.random.stateless_uniform([3], key + [0, 104729])
    image = wave[..., None] * tint * (0.5 + u[3]) + (u[4] - 0.5)
    image += noise * tf.random.stateless_normal([image_size, image_size, 3], key + [0, 1299709])
    return tf.saturate_cast(tf.round(MID_GREY + PIXEL_SCALE * image), tf.uint8), label


def procedural_dataset(
    examples: int,
    seed: int,
    image_size: int,
    num_classes: int,
    noise: float,
    training: bool,
    shard: tuple[int, int] = (1, 0),
    shuffle_seed: int | None = None,
    sample=None,
    train_examples: int = 0,
) -> tf.data.Dataset:
    """Examples [0, examples) of the split, drawn by `seed`; training shuffles each epoch,
    seeded by `shuffle_seed` (default `seed`). `sample` (training only): the example indices
    to train on instead (a bootstrap sample, run/bootstrap.py), shuffled so within. The
    evaluation split's keys start past the training split's (`train_examples`), so that no
    evaluation example is a training one."""
    offset = 0 if training else max(EVAL_SEED_OFFSET, train_examples)
    if sample is not None and training:
        indices = tf.data.Dataset.from_tensor_slices(tf.constant(sample, tf.int64))
        examples = len(sample)
    else:
        indices = tf.data.Dataset.range(examples)
    indices = indices.shard(*shard)
    if training:
        order = seed if shuffle_seed is None else shuffle_seed
        indices = indices.shuffle(examples, seed=order, reshuffle_each_iteration=True)
    return indices.map(
        lambda i: procedural_example(i + offset, seed, image_size, num_classes, noise),
        num_parallel_calls=tf.data.AUTOTUNE,
    )


def random_dataset(image_size: int, num_classes: int, seed: int) -> tf.data.Dataset:
    """One random example (uint8 pixels) repeated forever: input cost ~0, for throughput-only
    runs."""
    pixels = tf.random.stateless_uniform([image_size, image_size, 3], [seed, 0], 0, 256, tf.int32)
    image = tf.cast(pixels, tf.uint8)
    label = tf.random.stateless_uniform([], [seed, 1], 0, num_classes, dtype=tf.int32)
    return tf.data.Dataset.from_tensors((image, label)).repeat()
