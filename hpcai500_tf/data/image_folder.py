"""ImageNet-layout TFRecord shards from an image-folder tree (one folder per class): what
`tools/make_imagenet_tfrecords.py` runs.

SRC_DIR/<class>/<image>.{jpg,jpeg,png,...}: classes are numbered in sorted folder order from
`first_label` (1 in the ImageNet layout, where 0 is the background class). Non-JPEG images are
re-encoded as JPEG. Each record holds `image/encoded`, `image/class/label`, `image/format`,
`image/height`, `image/width`, `image/filename` and a whole-image `image/object/bbox/*`.
Shards are written as `<split>-NNNNN-of-MMMMM`, all into temporary files first and renamed
only when every one is written: a failure leaves no shard, and a split is never added to.
"""

from __future__ import annotations

import os
from pathlib import Path

from hpcai500_tf.files import check_output_directory
from hpcai500_tf.tensorflow_import import import_tensorflow

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif"}


def _feature(tf, value):
    if isinstance(value, bytes):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
    if isinstance(value, float):
        return tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))


def example(tf, path: Path, label: int):
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ValueError(f"{path}: cannot read it ({error.strerror or error})") from None
    try:
        image = tf.io.decode_image(data, channels=3, expand_animations=False)
    except tf.errors.InvalidArgumentError:
        raise ValueError(f"{path}: not a readable image") from None
    if path.suffix.lower() not in (".jpg", ".jpeg"):
        data = tf.io.encode_jpeg(image, quality=95).numpy()
    height, width = int(image.shape[0]), int(image.shape[1])
    features = {
        "image/encoded": _feature(tf, data),
        "image/format": _feature(tf, b"JPEG"),
        "image/class/label": _feature(tf, label),
        "image/height": _feature(tf, height),
        "image/width": _feature(tf, width),
        "image/filename": _feature(tf, path.name.encode()),
        "image/object/bbox/xmin": _feature(tf, 0.0),
        "image/object/bbox/ymin": _feature(tf, 0.0),
        "image/object/bbox/xmax": _feature(tf, 1.0),
        "image/object/bbox/ymax": _feature(tf, 1.0),
    }
    return tf.train.Example(features=tf.train.Features(feature=features))


def convert(src: Path, out: Path, split: str, shards: int, first_label: int) -> int:
    """Write the shards; returns the number of records. Raises ValueError on bad input."""
    if not src.is_dir():
        raise ValueError(f"{src}: not a directory")
    classes = sorted(p.name for p in src.iterdir() if p.is_dir())
    if not classes:
        raise ValueError(f"{src}: no class folders")
    items = [
        (path, first_label + index)
        for index, name in enumerate(classes)
        for path in sorted((src / name).iterdir())
        if path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES
    ]
    if not items:
        raise ValueError(f"{src}: no images in the class folders")
    if shards < 1:
        raise ValueError(f"--shards must be >= 1, got {shards}")
    shards = min(shards, len(items))
    check_output_directory("OUT_DIR", out)
    names = [out / f"{split}-{shard:05d}-of-{shards:05d}" for shard in range(shards)]
    if out.is_dir() and (present := sorted(out.glob(f"{split}-*"))):
        raise ValueError(
            f"{present[0]}: already exists; refusing to add {split} shards beside it "
            "(a split must be one set: write it where it is not yet)"
        )
    import_tensorflow()  # its native start-up lines kept off the console
    import tensorflow as tf

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(f"{out}: cannot create it ({error.strerror or error})") from None
    temporaries = [name.with_name(f".{name.name}.tmp") for name in names]
    try:
        for shard, tmp in enumerate(temporaries):
            _write_shard(tf, tmp, items[shard::shards])
    except tf.errors.OpError as error:  # e.g. a full disk
        _remove(temporaries)
        raise ValueError(f"{out}: cannot write the shards ({error.message})") from None
    except BaseException:
        _remove(temporaries)
        raise
    for tmp, name in zip(temporaries, names, strict=True):
        os.replace(tmp, name)
    return len(items)


def _remove(paths: list[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


def _write_shard(tf, path: Path, items: list[tuple[Path, int]]) -> None:
    with tf.io.TFRecordWriter(str(path)) as writer:
        for image, label in items:
            writer.write(example(tf, image, label).SerializeToString())
