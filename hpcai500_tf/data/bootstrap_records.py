"""A bootstrap sample's training stream over a TFRecord split (an ensemble member's ImageNet
data, data/bootstrap.py): a stable index for every record, and each record given as often as
the member drew it.

Record r (counted from 0) of shard file s, the files in `imagenet.shard_files` order (sorted
names: the verified listing's), is example `first_indices[s] + r`, where `first_indices[s]`
is the number of records in the files before s (their counts from the TFRecord headers, kept
with the listing, data/imagenet.py `split_facts`). The draw's N indices become one count per
example (`draw_counts`, numpy.bincount); the stream reads every record once, tags it with its
index as it leaves its file, and gives it `count` times (0: not at all) with tf.data ops only
(a gather from the counts and `tf.repeat`, BLOCK records at a time), no per-example Python.
What follows is the whole split's: the shuffle buffer seeded by the epoch's seed
(run/data_position.py) and the decoding with its random crop, so the copies of one record are
spread through the buffer and cropped each anew, and a resumed epoch, built again with its
seed and its trained batches skipped, continues the same stream where the data's order is
deterministic (`training.deterministic`).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

# Records are tagged and repeated a block at a time (a file's next BLOCK records): a map per
# record took 82 s for ImageNet's 1,281,167 against 9.6 s for the plain read, blocks of 16
# 8.6-10.6 s against 5.1-9.5 s (benchmarks/bootstrap_stream.py, a loaded 2-core machine).
BLOCK = 16
INDEX_METHOD = (
    "example i is record r (counted from 0) of shard file s, the train-* files in sorted name "
    "order: i = the records of the files before s (counted from their TFRecord headers) + r"
)


def first_indices(shard_records) -> list[int]:
    """Each shard file's first example index: the records of the files before it."""
    return np.cumsum([0, *shard_records], dtype=np.int64)[:-1].tolist()


def draw_counts(sample: np.ndarray, examples: int) -> np.ndarray:
    """How many times each of examples 0 .. `examples` - 1 was drawn (int32)."""
    return np.bincount(sample, minlength=examples).astype(np.int32)


def indexed(path, first, count: int = 1, index: int = 0) -> tf.data.Dataset:
    """The records of file `path`, whose first is example `first`, in blocks of up to BLOCK
    (example indices, serialized records); with `count` > 1 only its records at positions
    `index`, `index` + `count`, ... (a worker's part of a file, imagenet.worker_records)."""
    records = tf.data.TFRecordDataset(path)
    if count > 1:
        parts = records.enumerate().shard(count, index).batch(BLOCK)
        return parts.map(lambda positions, block: (first + positions, block))

    def numbered(number, block):
        size = tf.shape(block, out_type=tf.int64)[0]
        return first + number * BLOCK + tf.range(size, dtype=tf.int64), block

    return records.batch(BLOCK).enumerate().map(numbered)


def expanded(dataset: tf.data.Dataset, counts: np.ndarray) -> tf.data.Dataset:
    """The serialized records of `dataset` (blocks of example indices and records, as
    `indexed` gives them), each as many times as `counts` says, in the order they come."""
    table = tf.constant(counts, tf.int32)
    return dataset.map(lambda indices, block: tf.repeat(block, tf.gather(table, indices))).unbatch()
