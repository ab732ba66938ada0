"""How long verifying ImageNet-1k's split sizes takes before a run, first and from the cache.

Writes (into a temporary directory, removed after) 1,024 train and 128 validation shards of
small tf.train.Example records, 1,281,167 and 50,000 of them as in ImageNet-1k, then builds
the image-classification workload of the reference preset on them three times:
  - first: no count cache, every record header read and CRC-checked, labels sampled;
  - cached: the count cache beside the data is used;
  - evicted: as first, with the count cache removed and the shards' pages dropped from the
    page cache (posix_fadvise DONTNEED): closer to a cold disk.
Targets on this machine: first and evicted < 60 s, cached < 2 s. The shards were just written,
so for "first" they are in the page cache.

    python benchmarks/dataset_verification.py
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from hpcai500_tf.cluster.machine import cpu_facts

ROOT = Path(__file__).resolve().parents[1]
SPLITS = {"train": (1_281_167, 1024), "validation": (50_000, 128)}  # records, shards
TARGETS = {"first": 60.0, "cached": 2.0, "evicted": 60.0}


def framed_records() -> list[bytes]:
    """One framed record per ImageNet label (1-1000), each a few hundred bytes."""
    import tensorflow as tf

    from hpcai500_tf.data import tfrecords

    records = []
    for label in range(1, 1001):
        feature = {
            "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
            "image/encoded": tf.train.Feature(
                bytes_list=tf.train.BytesList(value=[bytes([label % 256]) * 300])
            ),
        }
        example = tf.train.Example(features=tf.train.Features(feature=feature))
        records.append(tfrecords.frame(example.SerializeToString()))
    return records


def write_shards(directory: Path) -> int:
    records = framed_records()
    written = 0
    for split, (total, shards) in SPLITS.items():
        start = 0
        for shard in range(shards):
            stop = total * (shard + 1) // shards
            data = b"".join(records[i % len(records)] for i in range(start, stop))
            (directory / f"{split}-{shard:05d}-of-{shards:05d}").write_bytes(data)
            written += len(data)
            start = stop
    os.sync()  # written back, so that `evict` can drop the pages
    return written


def evict(directory: Path) -> None:
    """Remove the count cache and drop the shards' pages from the page cache."""
    (directory / ".hpcai500-counts.json").unlink()
    for path in directory.glob("*-of-*"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def main() -> int:
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(prefix="hpcai500-verify-") as tmp:
        os.environ["HPCAI500_CACHE"] = str(Path(tmp) / "user-cache")
        data = Path(tmp) / "imagenet"
        data.mkdir()
        began = time.perf_counter()
        size = write_shards(data)
        print(
            f"wrote {sum(n for n, _ in SPLITS.values()):,} records in "
            f"{sum(s for _, s in SPLITS.values())} shards ({size / 2**20:.0f} MiB) "
            f"in {time.perf_counter() - began:.1f} s"
        )
        from hpcai500_tf import config
        from hpcai500_tf.workloads.image_classification import ImageClassification

        preset = config.prepare("image_classification", "reference").config
        seconds = {}
        for run in TARGETS:
            if run == "evicted":
                evict(data)
            began = time.perf_counter()
            workload = ImageClassification(preset, str(data))
            seconds[run] = time.perf_counter() - began
            facts = workload.problem_layer()
            if workload.dataset_name() != "imagenet-1k" or facts["data_differences"]:
                print(f"verification failed: {facts['data_differences']}", file=sys.stderr)
                return 1
        print(f"CPU: {cpu_facts()['cpu_model']} ({os.cpu_count()} logical cores)")
        for run, value in seconds.items():
            verdict = "ok" if value < TARGETS[run] else "MISSED"
            target = TARGETS[run]
            print(f"{run:>7} verification: {value:6.2f} s  (target < {target:g} s: {verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
