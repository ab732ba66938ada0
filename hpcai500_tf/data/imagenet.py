"""ImageNet TFRecords in the standard layout (`train-*`, `validation-*`) with the reference
preprocessing: training takes a random crop inside the bounding box (area 5-100 %, aspect
3/4-4/3), flips it and resizes to the model size; evaluation resizes and takes the centre crop
(87.5 % of the shorter side). Labels are `image/class/label` minus a configurable offset.

Images leave the pipeline as uint8 pixels, rounded from the resized image: a quarter of the
bytes of float32 to copy to the accelerator, where `normalise` (the channel means, and 255 or
the channel deviations) runs as the model's first computation. Whether the parallel
interleave and map keep their order is left to the dataset's
`tf.data.Options().deterministic`, which the engine sets from `training.deterministic`; the
training interleave reads as many files at once as this process has cores, the evaluation's
EVAL_INTERLEAVE whatever the cores (its order is then the same on every machine).
Workers get whole files when there are at least as many files as workers, else each file's
records split by position: either way a partition of the split, whatever that order.

Before a run, each split's records are counted from the TFRecord headers (no image decoded) and
the labels of the first records of each shard are read; both are kept in a count cache beside
the data, keyed by a fingerprint of the shard listing, and found by one worker per job (the
others wait on a lock beside the cache, then read it).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import TextIO

import tensorflow as tf
from google.protobuf.message import DecodeError

from hpcai500_tf.data import bootstrap_records, listing, tfrecords
from hpcai500_tf.errors import UserError
from hpcai500_tf.files import SHARD_NAME, open_lock_file, shard_set_problem

FEATURES = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/class/label": tf.io.FixedLenFeature([], tf.int64),
    "image/object/bbox/xmin": tf.io.VarLenFeature(tf.float32),
    "image/object/bbox/ymin": tf.io.VarLenFeature(tf.float32),
    "image/object/bbox/xmax": tf.io.VarLenFeature(tf.float32),
    "image/object/bbox/ymax": tf.io.VarLenFeature(tf.float32),
}
CHANNEL_MEANS = (123.68, 116.78, 103.94)
CHANNEL_STDS = (58.393, 57.12, 57.375)
CENTRAL_FRACTION = 0.875


def shard_files(data_dir: str | Path, split: str) -> list[str]:
    """The sorted shard files of a split; a clear error when there are none."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise UserError(f"{data_dir}: data directory not found")
    prefix = {"train": "train-", "validation": "validation-"}[split]
    files = sorted(p for p in data_dir.glob(f"{prefix}*") if p.is_file())
    if not files:
        raise UserError(
            f"{data_dir}: no '{prefix}*' TFRecord shards (expected the ImageNet layout)"
        )
    _check_one_set(data_dir, split, [p.name for p in files])
    return [str(p) for p in files]


def _check_one_set(data_dir: Path, split: str, names: list[str]) -> None:
    """Shards named `<split>-I-of-N` must be one whole set, and then every file of the split
    named so: a set cut short by a failed copy or conversion, or two sets in one folder (a
    re-sharded copy beside the old one, an index file beside its shard), would otherwise train
    on part of the data or read the same records twice, each looking like a valid run."""
    odd = [name for name in names if not SHARD_NAME.fullmatch(name)]
    if odd and len(odd) < len(names):
        named = next(name for name in names if name not in odd)
        raise UserError(
            f"{data_dir}: {odd[0]} is not named like the other {split} shards ({named}); "
            "move it out of the folder"
        )
    if problem := shard_set_problem(names):
        raise UserError(f"{data_dir}: the {split} shards are not one whole set ({problem})")


def normalise(images, method: str = "mean_255"):
    """uint8 (or float) pixels to float32, the model's input: the ImageNet channel means
    subtracted, then divided by 255 ("mean_255": the reference's `normalized_inputs`) or by the
    channel standard deviations ("mean_std"). Run on the device, at the start of the step (see
    the workload)."""
    divisors = {"mean_255": 255.0, "mean_std": CHANNEL_STDS}
    if method not in divisors:
        raise ValueError(f"input_normalisation must be one of {tuple(divisors)}, got {method!r}")
    images = tf.cast(images, tf.float32)
    return (images - CHANNEL_MEANS) / divisors[method]


def to_pixels(image):
    """A resized float image (values 0-255) rounded and saturated to uint8 pixels."""
    return tf.saturate_cast(tf.round(image), tf.uint8)


EVAL_INTERLEAVE = 16  # validation files read at once, whatever this machine's cores


def interleave_width(files: int) -> int:
    """How many shard files the interleave reads at once: one per core this process may run
    on, no more than there are files."""
    return max(1, min(len(os.sched_getaffinity(0)), files))


def _train_image(encoded, bbox, image_size: int, seed: int):
    """The random crop, flipped and resized. The crop's op seed comes from the pipeline's seed
    (+1: 0 means "unseeded", which TensorFlow refuses under op determinism)."""
    shape = tf.io.extract_jpeg_shape(encoded)
    begin, size, _ = tf.image.sample_distorted_bounding_box(
        shape,
        bounding_boxes=bbox,
        min_object_covered=0.1,
        aspect_ratio_range=(0.75, 1.33),
        area_range=(0.05, 1.0),
        max_attempts=100,
        seed=seed + 1,
        use_image_if_no_bounding_boxes=True,
    )
    offset_y, offset_x, _ = tf.unstack(begin)
    height, width, _ = tf.unstack(size)
    window = tf.stack([offset_y, offset_x, height, width])
    image = tf.image.decode_and_crop_jpeg(encoded, window, channels=3)
    image = tf.image.random_flip_left_right(image)
    return tf.image.resize(image, [image_size, image_size], method="bilinear")


def _eval_image(encoded, image_size: int):
    shape = tf.io.extract_jpeg_shape(encoded)
    height, width = shape[0], shape[1]
    crop = tf.cast(CENTRAL_FRACTION * tf.cast(tf.minimum(height, width), tf.float32), tf.int32)
    window = tf.stack([(height - crop + 1) // 2, (width - crop + 1) // 2, crop, crop])
    image = tf.image.decode_and_crop_jpeg(encoded, window, channels=3)
    return tf.image.resize(image, [image_size, image_size], method="bilinear")


def parse_example(serialized, training: bool, image_size: int, label_offset: int, seed: int = 0):
    """One record to (uint8 image, label); `seed` seeds the training crop."""
    features = tf.io.parse_single_example(serialized, FEATURES)
    label = tf.cast(features["image/class/label"], tf.int32) - label_offset
    encoded = features["image/encoded"]
    if training:
        coords = [
            tf.sparse.to_dense(features[f"image/object/bbox/{k}"])
            for k in ("ymin", "xmin", "ymax", "xmax")
        ]
        bbox = tf.reshape(tf.stack(coords, axis=-1), [1, -1, 4])
        image = _train_image(encoded, bbox, image_size, seed)
    else:
        image = _eval_image(encoded, image_size)
    return to_pixels(image), label


def imagenet_dataset(
    data_dir: str | Path,
    training: bool,
    image_size: int,
    label_offset: int,
    seed: int,
    shard: tuple[int, int] = (1, 0),
    shuffle_buffer: int = 10_000,
    cache: bool = False,
    cache_dir: str = "",
) -> tf.data.Dataset:
    """Decoded, preprocessed (uint8 image, label) pairs of one worker's shard, a partition of
    the split over the workers (`worker_records`). The parallel interleave and map follow
    `tf.data.Options().deterministic` (True unless the caller's options say otherwise).
    `cache` keeps the worker's serialized records after the first full pass, before the
    shuffle buffer and decoding (crops and order still vary by epoch; the file order is the
    first pass's): in memory, or in files under `cache_dir` (`cache_prefix`)."""
    dataset = imagenet_records(data_dir, training, seed, shard, cache, cache_dir)
    return decoded(dataset, training, image_size, label_offset, seed, shuffle_buffer)


def imagenet_records(
    data_dir: str | Path,
    training: bool,
    seed: int,
    shard: tuple[int, int] = (1, 0),
    cache: bool = False,
    cache_dir: str = "",
    first_indices: list[int] | None = None,
) -> tf.data.Dataset:
    """The serialized records of one worker's shard (its files shuffled by `seed` when
    training), cached where `cache` says: the part of `imagenet_dataset` an epoch's stream
    may share with the others (`decoded` shuffles and decodes each epoch by its own seed).
    With `first_indices` (each file's first example index, data/bootstrap_records.py), the
    records come in blocks with their example indices."""
    split = "train" if training else "validation"
    files = shard_files(data_dir, split)
    if first_indices is not None and len(first_indices) != len(files):
        raise UserError(
            f"{data_dir}: {len(files)} {split} shard file(s), {len(first_indices)} when their "
            "records were counted: the data changed during the run"
        )
    dataset, files_here, read = worker_records(files, *shard, first_indices=first_indices)
    if training:
        dataset = dataset.shuffle(files_here, seed=seed, reshuffle_each_iteration=True)
    # The evaluation's order is the same on every machine (an ensemble's members, on nodes of
    # other core counts, merge their rows by it): files read EVAL_INTERLEAVE at a time.
    width = interleave_width(files_here) if training else min(EVAL_INTERLEAVE, files_here)
    dataset = dataset.interleave(read, cycle_length=width, num_parallel_calls=tf.data.AUTOTUNE)
    if cache:
        indexed = first_indices is not None
        prefix = cache_dir and cache_prefix(cache_dir, data_dir, split, files, shard, indexed)
        dataset = dataset.cache(prefix)
    return dataset


def decoded(
    dataset: tf.data.Dataset,
    training: bool,
    image_size: int,
    label_offset: int,
    seed: int,
    shuffle_buffer: int = 10_000,
) -> tf.data.Dataset:
    """`imagenet_records`' records shuffled (training, by `seed`) and decoded."""
    if training:
        dataset = dataset.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    return dataset.map(
        lambda s: parse_example(s, training, image_size, label_offset, seed),
        num_parallel_calls=tf.data.AUTOTUNE,
    )


_CLAIMED: dict[str, TextIO] = {}  # cache prefix -> its lock file, held while this process runs


def cache_prefix(
    cache_dir: str,
    data_dir: str | Path,
    split: str,
    files: list[str],
    shard: tuple[int, int],
    indexed: bool = False,
) -> str:
    """Where worker `shard` keeps its records of `split` in `cache_dir`: named by a digest of
    the data directory, its shard listing, the worker's place and whether each record is kept
    with its index, so that a cache of other data, of another worker or of other elements is
    never read. While this process runs it holds a lock there; the partial files a killed
    process left (tf.data's `_N.lockfile` would block) are removed. Where another process
    holds that cache, this one takes the next copy (`-2`, `-3`, ...): each instance of
    `--instances M` on one node keeps a copy of its own."""
    if not Path(cache_dir).is_dir():
        missing = not os.path.lexists(cache_dir)
        raise UserError(
            f"data.cache_dir '{cache_dir}' "
            + ("does not exist: make it first" if missing else "is not a directory")
        )
    key = [str(Path(data_dir).resolve()), listing.fingerprint([Path(f) for f in files]), *shard]
    key += ["indexed"] if indexed else []  # the prefixes of plain records stay as they were
    digest = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]
    base = Path(cache_dir).resolve() / f"hpcai500-{split}-{digest}"
    # A process caching these records already (another instance of `--instances M` on this
    # node: same data, same place) holds the first: the next copy is this one's.
    for copy in range(1, MAX_CACHE_COPIES + 1):
        prefix = base if copy == 1 else base.with_name(f"{base.name}-{copy}")
        if str(prefix) in _CLAIMED or _claim(prefix):
            return str(prefix)
    raise UserError(
        f"{base}: {MAX_CACHE_COPIES} processes on this node are caching the same records "
        f"(each holds one of {base}[-N].hpcai500-lock)"
    )


MAX_CACHE_COPIES = 64


def _claim(prefix: Path) -> bool:
    """Take `prefix`'s lock for this process (False: another holds it), and remove the partial
    files a killed process left there (tf.data's `_N.lockfile` would block)."""
    lock = open_lock_file(f"{prefix}.hpcai500-lock", "data.cache_dir lock")  # never a link
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return False
    except OSError:
        pass  # no flock here: other processes cannot be seen, so nothing is removed
    else:
        for partial in prefix.parent.glob(f"{prefix.name}_*"):
            partial.unlink(missing_ok=True)
    _CLAIMED[str(prefix)] = lock
    return True


def worker_records(
    files: list[str], count: int, index: int, first_indices: list[int] | None = None
) -> tuple[tf.data.Dataset, int, Callable[..., tf.data.Dataset]]:
    """(file names, how many, reader) of worker `index` of `count`: whole files when there
    are at least as many files as workers, else every file with its records split by position
    (record i to worker i % count) before any interleave, so that no order can make shards
    overlap. With `first_indices` (each file's first example index), the files come with
    them and the reader gives blocks of (example indices, records) (data/bootstrap_records.py)."""
    whole = len(files) >= count
    names = files[index::count] if whole else files
    if first_indices is not None:
        firsts = first_indices[index::count] if whole else first_indices
        parts = (1, 0) if whole else (count, index)
        return (
            tf.data.Dataset.from_tensor_slices((names, tf.constant(firsts, tf.int64))),
            len(names),
            lambda path, first: bootstrap_records.indexed(path, first, *parts),
        )
    if whole:
        return tf.data.Dataset.from_tensor_slices(names), len(names), tf.data.TFRecordDataset
    return (
        tf.data.Dataset.from_tensor_slices(names),
        len(names),
        lambda path: tf.data.TFRecordDataset(path).shard(count, index),
    )


def sharding_warning(data_dir: str | Path, split: str, workers: int) -> str | None:
    """The one-line warning for a split with fewer shard files than workers (slower reads)."""
    files = len(shard_files(data_dir, split))
    if files >= workers:
        return None
    return (
        f"the {split} split has {files} TFRecord file(s) for {workers} workers: its records "
        "are split by position within each file, so every worker reads every file"
    )


LABEL_SAMPLE_PER_SHARD = 4
READERS = 16  # shards read at once while verifying
COUNT_METHOD = "TFRecord length headers, each length's CRC-32C checked; no record decoded"
LABEL_SAMPLE_METHOD = (
    f"image/class/label of the first {LABEL_SAMPLE_PER_SHARD} records of each shard "
    "(a sample: not every record is read)"
)


@dataclass(frozen=True)
class SplitFacts:
    """What a split's shards hold: records counted, a fingerprint of the listing, and the
    labels of a sample of records (label -> how often)."""

    records: int
    fingerprint: str
    sampled_labels: dict[int, int]
    # Each shard file's records, in `shard_files` order (what a record's index is built from:
    # data/bootstrap_records.py); () where they were not kept.
    shard_records: tuple[int, ...] = ()


def split_facts(data_dir: str | Path, split: str) -> SplitFacts:
    """Count a split's records from the TFRecord headers and sample its labels, or take both
    from the count cache while the shard listing is unchanged (see `listing`): one worker
    reads the shards (READERS files at a time, to hide a network filesystem's latency) while
    the others wait for its result."""
    files = [Path(p) for p in shard_files(data_dir, split)]
    fingerprint = listing.fingerprint(files)
    if kept := _kept_facts(data_dir, split, fingerprint, files):
        return kept
    with listing.finding(data_dir):
        if kept := _kept_facts(data_dir, split, fingerprint, files):
            return kept  # found by the worker this one waited for
        with ThreadPoolExecutor(min(READERS, len(files))) as pool:
            counts, labels = zip(*pool.map(_shard_facts, files), strict=True)
        sampled = dict(sorted(Counter(chain(*labels)).items()))
        facts = SplitFacts(sum(counts), fingerprint, sampled, tuple(counts))
        listing.store(
            data_dir,
            split,
            {
                "fingerprint": fingerprint,
                "records": facts.records,
                "shard_records": [[f.name, n] for f, n in zip(files, counts, strict=True)],
                "label_sample_per_shard": LABEL_SAMPLE_PER_SHARD,
                "sampled_labels": [[label, n] for label, n in facts.sampled_labels.items()],
            },
        )
    return facts


def _kept_facts(
    data_dir: str | Path, split: str, fingerprint: str, files: list[Path]
) -> SplitFacts | None:
    """The split's facts from the count cache, or None (none kept, a damaged entry, or one
    kept before each shard's records were: counted again then)."""
    kept = listing.load(data_dir, split, fingerprint)
    if not kept or kept.get("label_sample_per_shard") != LABEL_SAMPLE_PER_SHARD:
        return None
    try:
        labels = {int(label): int(n) for label, n in kept["sampled_labels"]}
        names, counts = zip(*kept["shard_records"], strict=True)
        counts = tuple(int(n) for n in counts)
        if list(names) != [f.name for f in files] or min(counts) < 0:
            return None
        if sum(counts) != int(kept["records"]):
            return None
        return SplitFacts(int(kept["records"]), fingerprint, labels, counts)
    except (KeyError, TypeError, ValueError):
        return None


def _shard_facts(path: Path) -> tuple[int, list[int]]:
    """(records, sampled labels) of one shard."""
    return tfrecords.count_records(path), _first_labels(path)


def _first_labels(path: Path) -> list[int]:
    labels = []
    for offset, data in tfrecords.first_records(path, LABEL_SAMPLE_PER_SHARD):
        try:
            example = tf.train.Example.FromString(data)
        except DecodeError:
            raise UserError(
                f"{path}: the record at offset {offset} is not a tf.train.Example"
            ) from None
        values = example.features.feature["image/class/label"].int64_list.value
        if len(values) != 1:
            raise UserError(
                f"{path}: the record at offset {offset} has no single 'image/class/label'"
            )
        labels.append(int(values[0]))
    return labels
