"""L9 verified from the data: TFRecord header counts, the count cache, ImageNet and
ExtremeWeather facts and what makes a run on other data not rankable."""

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import tensorflow as tf

from hpcai500_tf import benchmark_layers, config
from hpcai500_tf.data import extreme_weather as ew
from hpcai500_tf.data import imagenet, listing, tfrecords
from hpcai500_tf.errors import UserError
from hpcai500_tf.results.record_builder import not_rankable_reasons
from hpcai500_tf.workloads.extreme_weather import ExtremeWeather
from hpcai500_tf.workloads.image_classification import ImageClassification

from .test_data import IMAGENET_FIXTURE_SETTINGS, imagenet_dir  # noqa: F401  (fixture)


@pytest.fixture(autouse=True)
def _user_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HPCAI500_CACHE", str(tmp_path / "user-cache"))


def _reasons(setup, workload, l9) -> list[str]:
    """Why a run of `workload` with problem `l9` is not rankable, as its record says."""
    return not_rankable_reasons(setup.benchmark, l9, measured=workload.measures_quality)


def _example(label: int, size: int = 40) -> bytes:
    feature = {
        "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
        "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"x" * size])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _write_split(directory, split, labels_per_shard):
    directory.mkdir(parents=True, exist_ok=True)
    shards = len(labels_per_shard)
    for index, labels in enumerate(labels_per_shard):
        with tf.io.TFRecordWriter(str(directory / f"{split}-{index:05d}-of-{shards:05d}")) as w:
            for label in labels:
                w.write(_example(label))
    return directory


@pytest.fixture
def shards(tmp_path):
    """Train: 3 shards of 5, 0 and 7 records; validation: 1 shard of 4; labels 1-3."""
    data = tmp_path / "data"
    _write_split(data, "train", [[1, 2, 3, 1, 2], [], [3, 3, 2, 1, 1, 2, 3]])
    _write_split(data, "validation", [[1, 2, 3, 1]])
    return data


# ------------------------------------------------------------------------ header counting


def test_crc32c_and_framing_match_tensorflow(tmp_path):
    assert tfrecords.crc32c(b"123456789") == 0xE3069283  # the standard check value
    payloads = [b"", b"a", _example(7), bytes(range(256)) * 40]
    path = tmp_path / "records"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for payload in payloads:
            writer.write(payload)
    assert path.read_bytes() == b"".join(tfrecords.frame(p) for p in payloads)


def test_header_count_equals_a_tf_data_count(shards):
    for path in sorted(shards.iterdir()):
        expected = sum(1 for _ in tf.data.TFRecordDataset(str(path)))
        assert tfrecords.count_records(path) == expected
    assert imagenet.split_facts(shards, "train").records == 12
    assert imagenet.split_facts(shards, "validation").records == 4


@pytest.mark.parametrize("cut", [3, 12 + 20, -2])  # inside a header, a payload, a footer
def test_a_truncated_shard_is_one_line_naming_file_and_offset(shards, cut):
    path = shards / "train-00000-of-00003"
    data = path.read_bytes()
    record = len(tfrecords.frame(_example(1)))
    end = 2 * record + cut if cut > 0 else len(data) + cut
    path.write_bytes(data[:end])
    offset = 2 * record if cut > 0 else 4 * record
    with pytest.raises(UserError) as error:
        imagenet.split_facts(shards, "train")
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{path}: truncated TFRecord file")
    assert f"offset {offset} " in message


def test_a_corrupted_length_crc_is_one_line_naming_file_and_offset(shards):
    path = shards / "train-00002-of-00003"
    data = bytearray(path.read_bytes())
    record = len(tfrecords.frame(_example(1)))
    data[3 * record + 9] ^= 0x40  # a bit of the fourth record's length CRC
    path.write_bytes(bytes(data))
    with pytest.raises(UserError) as error:
        tfrecords.count_records(path)
    assert str(error.value) == (
        f"{path}: corrupt TFRecord file: the length header at offset {3 * record} fails its CRC"
    )


# ------------------------------------------------------------------------ the count cache


def test_counts_are_cached_beside_the_data_and_reused(shards, monkeypatch):
    first = imagenet.split_facts(shards, "train")
    kept = json.loads((shards / listing.CACHE_FILE).read_text())["splits"]["train"]
    assert kept["records"] == 12 and kept["fingerprint"] == first.fingerprint

    def fail(*args):
        raise AssertionError("counted again")

    monkeypatch.setattr(tfrecords, "count_records", fail)
    monkeypatch.setattr(tfrecords, "first_records", fail)
    assert imagenet.split_facts(shards, "train") == first


def test_a_changed_shard_invalidates_its_cached_count(shards, monkeypatch):
    imagenet.split_facts(shards, "train")
    with (shards / "train-00001-of-00003").open("ab") as shard:
        shard.write(tfrecords.frame(_example(2)))  # a record appended: the size changes
    counted = []
    count = tfrecords.count_records
    monkeypatch.setattr(tfrecords, "count_records", lambda p: counted.append(p) or count(p))
    assert imagenet.split_facts(shards, "train").records == 13
    assert len(counted) == 3


def test_an_unwritable_data_dir_keeps_counts_in_the_user_cache(shards, tmp_path, monkeypatch):
    (shards / listing.CACHE_FILE).mkdir()  # the data directory's cache cannot be written
    facts = imagenet.split_facts(shards, "train")
    (kept,) = (tmp_path / "user-cache" / "hpcai500-tf" / "data-facts").glob("*.json")
    stored = json.loads(kept.read_text())
    assert stored["data_dir"] == str(shards.resolve())
    assert stored["splits"]["train"]["fingerprint"] == facts.fingerprint
    with monkeypatch.context() as patch:
        patch.setattr(tfrecords, "count_records", lambda p: 1 / 0)
        assert imagenet.split_facts(shards, "train").records == 12  # from the user cache
    monkeypatch.setenv("HPCAI500_CACHE", str(kept))  # a file: no cache directory under it
    assert listing.store(shards, "validation", {"fingerprint": "x"}) is None
    assert listing.lock_file(shards) is None  # nowhere to keep counts: no lock, all count
    assert imagenet.split_facts(shards, "validation").records == 4  # counted, kept nowhere


# ------------------------------------------------------------------------ one worker verifies

ROOT = Path(__file__).resolve().parents[1]

# A worker: waits for GO, verifies the train split, logs its pid once per shard it counts.
WORKER = """
import os, sys, time
from pathlib import Path
from hpcai500_tf.data import imagenet, tfrecords
data, log, go = sys.argv[1:]
count = tfrecords.count_records
def counted(path):
    with open(log, "a") as handle:
        handle.write(f"{os.getpid()}\\n")
    time.sleep(1.0)  # a slow filesystem: the other worker arrives while this one counts
    return count(path)
tfrecords.count_records = counted
Path(f"{go}.{os.getpid()}").touch()
while not Path(go).exists():
    time.sleep(0.01)
print(imagenet.split_facts(data, "train").records)
"""

# Holds the count lock of DATA until killed.
HOLDER = """
import sys, time
from hpcai500_tf.data import listing
with listing.finding(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(120)
"""


def _python(script: str, *args) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", script, *map(str, args)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_workers_verifying_at_once_count_once(shards, tmp_path):
    log, go = tmp_path / "counted", tmp_path / "go"
    workers = [_python(WORKER, shards, log, go) for _ in range(2)]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("go.*"))) < 2 and time.monotonic() < deadline:
        assert all(w.poll() is None for w in workers), [w.communicate() for w in workers]
        time.sleep(0.05)
    go.touch()  # both imported and ready: they verify together
    outputs = [w.communicate(timeout=120) for w in workers]
    assert [out.strip() for out, _ in outputs] == ["12", "12"], outputs
    counters = log.read_text().split()
    assert len(counters) == 3 and len(set(counters)) == 1  # one worker read the 3 shards
    assert set(counters) < {str(w.pid) for w in workers}


def test_a_lock_is_waited_for_only_so_long_and_dies_with_its_holder(shards, monkeypatch):
    holder = _python(HOLDER, shards)
    try:
        assert holder.stdout.readline() == "locked\n"
        monkeypatch.setattr(listing, "LOCK_WAIT_S", 0.3)
        with pytest.raises(UserError) as raised:
            imagenet.split_facts(shards, "train")
        lock = shards / ".hpcai500-counts.lock"
        assert str(raised.value) == (
            f"{lock}: waited 0.3 s for another worker to verify the data "
            f"(held by pid {holder.pid} on {socket.gethostname()}); it still holds this lock"
        )
    finally:
        holder.kill()  # SIGKILL: nothing cleans up, the lock file stays
        holder.communicate()
    assert lock.exists()
    assert imagenet.split_facts(shards, "train").records == 12  # the lock died with it


def test_an_error_found_under_the_lock_reaches_the_workers_waiting(shards, monkeypatch):
    path = shards / "train-00002-of-00003"
    data = bytearray(path.read_bytes())
    record = len(tfrecords.frame(_example(1)))
    data[3 * record + 9] ^= 0x40  # a bit of the fourth record's length CRC
    path.write_bytes(bytes(data))
    counted, count = [], tfrecords.count_records

    def slow(path):
        counted.append(path)
        time.sleep(0.3)
        return count(path)

    monkeypatch.setattr(tfrecords, "count_records", slow)
    errors = []

    def worker():
        try:
            imagenet.split_facts(shards, "train")
        except UserError as error:
            errors.append(str(error))

    threads = [threading.Thread(target=worker) for _ in range(3)]  # a lock file each
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    expected = (
        f"{path}: corrupt TFRecord file: the length header at offset {3 * record} fails its CRC"
    )
    assert errors == [expected] * 3
    assert len(counted) == 3  # one worker read the shards; the others took its error


# ------------------------------------------------------------------------ ImageNet L9


def _image_classification(data_dir, *overrides):
    setup = config.prepare(
        "image_classification",
        "tiny",
        [*IMAGENET_FIXTURE_SETTINGS, *overrides],
    )
    return setup, ImageClassification(setup.config, str(data_dir))


def _l9(setup, workload) -> dict:
    return benchmark_layers.run_layers(
        setup,
        workload,
        workers=1,
        replicas=1,
        global_batch=32,
        precision="fp32",
        intra_op_threads=1,
    )["L9"]


def test_a_subset_is_not_called_imagenet_1k_and_is_not_rankable(shards):
    setup, workload = _image_classification(shards)
    l9 = _l9(setup, workload)
    assert l9["dataset"] == "imagenet-format TFRecords (12 train, 4 validation records)"
    assert workload.dataset_name() == l9["dataset"]
    assert (l9["train_examples"], l9["eval_examples"]) == (12, 4)
    assert l9["data_fingerprint"]["train"] == imagenet.split_facts(shards, "train").fingerprint
    assert l9["label_check"] == {
        "method": imagenet.LABEL_SAMPLE_METHOD,
        "records": 12,  # the first 4 of each shard: 4 + 0 + 4 train, 4 validation
        "min": 1,
        "max": 3,
        "allowed_min": 1,
        "allowed_max": 3,
        "outside": 0,
    }
    reasons = _reasons(setup, workload, l9)
    assert "data: the train split holds 12 records, ImageNet-1k's 1,281,167" in reasons
    assert "data: the validation split holds 4 records, ImageNet-1k's 50,000" in reasons
    assert any("num_classes 3 with label_offset 1" in r for r in reasons)
    assert not any("outside" in r for r in reasons)


def test_out_of_range_labels_make_the_run_not_rankable(shards):
    setup, workload = _image_classification(shards, "data.label_offset=0")  # labels 1-3 vs 0-2
    l9 = _l9(setup, workload)
    check = l9["label_check"]
    assert (check["allowed_min"], check["allowed_max"], check["max"]) == (0, 2, 3)
    assert check["outside"] == 4  # label 3: 1 + 2 times in the train sample, 1 in validation
    reasons = _reasons(setup, workload, l9)
    assert f"data: 4 of {check['records']} sampled labels lie outside 0-2" in " ".join(reasons)


def test_a_configured_cap_is_a_difference(shards):
    setup, workload = _image_classification(shards, "data.train_examples=8")
    assert workload.train_examples == 8
    assert "data.train_examples = 8 is used instead of the 12 records" in " ".join(
        _l9(setup, workload)["data_differences"]
    )


def test_an_evaluation_cap_is_never_recorded_as_applied(shards):
    """Every validation record is evaluated: data.eval_examples was logged and recorded as the
    evaluation's size ("is used instead") while the evaluation read them all."""
    setup, workload = _image_classification(shards, "data.eval_examples=2")
    records = imagenet.split_facts(shards, "validation").records
    assert records != 2 and workload.eval_examples == records
    assert (
        f"data.eval_examples = 2 is not applied: all {records} records of the validation split"
        in " ".join(_l9(setup, workload)["data_differences"])
    )


def test_imagenet_1k_split_sizes_and_reference_classes_are_rankable(shards, monkeypatch):
    sizes = {"train": 1_281_167, "validation": 50_000}
    monkeypatch.setattr(
        imagenet,
        "split_facts",
        lambda data_dir, split: imagenet.SplitFacts(sizes[split], "f" * 64, {1: 4, 1000: 4}),
    )
    setup = config.prepare("image_classification", "reference")
    workload = ImageClassification(setup.config, str(shards))
    l9 = _l9(setup, workload)
    assert l9["dataset"] == "imagenet-1k" and l9["data_differences"] == []
    assert _reasons(setup, workload, l9) == []


# ------------------------------------------------------------------------ ExtremeWeather L9


def _year_file(path, samples=2, height=32, width=48):
    with h5py.File(path, "w") as handle:
        handle.create_dataset("images", data=np.ones((samples, 16, height, width), "f4"))
        handle.create_dataset("boxes", data=-np.ones((samples, 15, 5), "f4"))


def test_extreme_weather_l9_records_what_the_files_hold(tmp_path):
    data = tmp_path / "ewa"
    data.mkdir()
    _year_file(data / "climo_1979.h5", samples=3)
    _year_file(data / "climo_1980.h5", samples=2)
    setup = config.prepare("extreme_weather", "tiny", ["data.source=hdf5"])
    workload = ExtremeWeather(setup.config, str(data))
    l9 = _l9(setup, workload)
    assert l9["dataset"] == "extremeweather-format HDF5 (1 train and 1 eval years, 32x48)"
    assert (l9["train_years"], l9["eval_years"]) == ([1979], [1980])
    assert l9["samples_per_file"] == {"climo_1979.h5": 3, "climo_1980.h5": 2}
    assert (l9["train_examples"], l9["eval_examples"]) == (3, 2)
    assert (l9["image_shape"], l9["channels"]) == ([32, 48], 16)
    assert l9["data_fingerprint"]["train"] == listing.fingerprint([data / "climo_1979.h5"])
    reasons = _reasons(setup, workload, l9)
    assert any(r.startswith("data: train_years 1979 differ from the reference's") for r in reasons)
    assert "data: images are 32x48, the published data 768x1152" in reasons
    assert "data: data.downsample 2, the reference's 1" in reasons


def test_extreme_weather_reference_files_are_named_extremeweather(tmp_path, monkeypatch):
    monkeypatch.setattr(ew, "PUBLISHED_IMAGE_SHAPE", (32, 48))  # 25 full-size years are 1.4 GB
    setup = config.prepare("extreme_weather", "reference")
    data = tmp_path / "ewa"
    data.mkdir()
    for year in (*setup.config["data"]["train_years"], *setup.config["data"]["eval_years"]):
        _year_file(data / f"climo_{year}.h5", samples=1)
    workload = ExtremeWeather(setup.config, str(data))
    l9 = _l9(setup, workload)
    assert l9["dataset"] == "extremeweather" and l9["data_differences"] == []
    assert _reasons(setup, workload, l9) == []


def test_synthetic_extreme_weather_says_what_it_is():
    setup = config.prepare("extreme_weather", "tiny")
    workload = ExtremeWeather(setup.config, None)
    l9 = _l9(setup, workload)
    assert l9["dataset"] == "synthetic-extremeweather"
    assert l9["samples_per_file"] == {"climo_1979.h5": 16, "climo_1980.h5": 16}
    assert l9["data_differences"][0].startswith("synthetic files generated by hpcai500-tf")
