"""What an ensemble member's bootstrap sample of ImageNet-size TFRecords costs
(data/bootstrap_records.py): drawing it, and reading its stream against the whole split's.

Writes (into a temporary directory, removed after) the shards of benchmarks/
dataset_verification.py: 1,024 train shards holding 1,281,167 small tf.train.Example records
(and 128 validation shards), as ImageNet-1k's split sizes. Then:
  - the reference preset's workload built on them, whole split and as member 0 (the count
    cache already filled by a first build, so the difference is the draw, the count vector
    and the shard indices);
  - one pass of this worker's training records, before the shuffle buffer and decoding
    (which are the same for both): the whole split's records, and the member's (each record
    tagged with its index and given as often as drawn), counted in batches of 1,024; both
    must come to 1,281,167 records.
No image is decoded (the records hold no JPEG): the pass measures the reading and the
expansion only; a real run decodes after them (not measured here).

    python benchmarks/bootstrap_stream.py
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

from hpcai500_tf.cluster.machine import cpu_facts

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = 1_281_167


def _shards_writer():
    """benchmarks/dataset_verification.py's `write_shards` (not a package)."""
    spec = importlib.util.spec_from_file_location(
        "dataset_verification", ROOT / "benchmarks" / "dataset_verification.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pass(dataset) -> tuple[int, float]:
    """(records, seconds) of one pass over `dataset`, read in batches of 1,024."""
    import tensorflow as tf

    began = time.perf_counter()
    records = 0
    for batch in dataset.batch(1024).prefetch(tf.data.AUTOTUNE):
        records += int(batch.shape[0])
    return records, time.perf_counter() - began


def main() -> int:
    sys.path.insert(0, str(ROOT))
    verification = _shards_writer()
    with tempfile.TemporaryDirectory(prefix="hpcai500-bootstrap-") as tmp:
        os.environ["HPCAI500_CACHE"] = str(Path(tmp) / "user-cache")
        data = Path(tmp) / "imagenet"
        data.mkdir()
        size = verification.write_shards(data)
        print(f"wrote the train and validation shards ({size / 2**20:.0f} MiB)")
        from hpcai500_tf import config
        from hpcai500_tf.data import bootstrap_records, imagenet
        from hpcai500_tf.workloads.image_classification import ImageClassification

        whole = config.prepare("image_classification", "reference").config
        member = config.prepare("image_classification", "reference", ["data.bootstrap_member=0"])
        ImageClassification(whole, str(data))  # counts the shards once, into the count cache
        seconds = {}
        for name, preset in (("whole split", whole), ("member 0", member.config)):
            began = time.perf_counter()
            workload = ImageClassification(preset, str(data))
            seconds[name] = time.perf_counter() - began
        sample = workload.facts["training_sample"]
        print(f"CPU: {cpu_facts()['cpu_model']} ({os.cpu_count()} logical cores)")
        for name, value in seconds.items():
            print(f"workload built ({name}, counts cached): {value:.2f} s")
        print(f"member 0 draws {sample['draws']:,}: {sample['distinct_examples']:,} distinct")
        plain = imagenet.imagenet_records(data, True, 10)
        records = imagenet.imagenet_records(data, True, 10, first_indices=workload._first_indices)
        drawn = bootstrap_records.expanded(records, workload._draw_counts)
        for name, dataset in (("whole split", plain), ("member 0", drawn)):
            count, value = _pass(dataset)
            if count != EXAMPLES:
                print(f"{name}: {count:,} records, not {EXAMPLES:,}", file=sys.stderr)
                return 1
            print(f"one pass, {name}: {value:.1f} s ({count / value:,.0f} records/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
