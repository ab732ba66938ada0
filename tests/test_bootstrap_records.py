"""An ensemble member's bootstrap sample of ImageNet TFRecords (data/bootstrap_records.py):
each record's index from the verified shard listing, the member's stream holding each record
as often as it was drawn (over one epoch, over any number of workers, from the cache), and a
stopped member's stream resumed at the same batch."""

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from hpcai500_tf import config
from hpcai500_tf.data import bootstrap, bootstrap_records, imagenet, listing
from hpcai500_tf.engine import run
from hpcai500_tf.errors import UserError
from hpcai500_tf.workloads import build_workload

from .test_data import IMAGENET_FIXTURE_SETTINGS, imagenet_dir  # noqa: F401  (fixture)

MEMBER = [*IMAGENET_FIXTURE_SETTINGS, "data.bootstrap_member=1", "training.batch_per_replica=4"]


@pytest.fixture(autouse=True)
def _user_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HPCAI500_CACHE", str(tmp_path / "user-cache"))


def _record(shard: int, position: int) -> bytes:
    feature = {
        "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[1])),
        "image/encoded": tf.train.Feature(
            bytes_list=tf.train.BytesList(value=[f"shard {shard} record {position}".encode()])
        ),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


@pytest.fixture
def uneven(tmp_path):
    """Train shards of 5, 0 and 37 distinct records (the last more than one block of
    bootstrap_records.BLOCK), and one validation shard."""
    data = tmp_path / "uneven"
    data.mkdir()
    sizes = (5, 0, 37)
    for shard, size in enumerate(sizes):
        with tf.io.TFRecordWriter(str(data / f"train-{shard:05d}-of-00003")) as writer:
            for position in range(size):
                writer.write(_record(shard, position))
    with tf.io.TFRecordWriter(str(data / "validation-00000-of-00001")) as writer:
        writer.write(_record(9, 0))
    return data


def _in_listing_order(data_dir) -> list[bytes]:
    """The train records, file after file in sorted name order: record i is example i."""
    files = imagenet.shard_files(data_dir, "train")
    return [r.numpy() for path in files for r in tf.data.TFRecordDataset(path)]


def _pairs(dataset) -> list[tuple[int, bytes]]:
    """(example index, record) of each record of `dataset`'s blocks."""
    return [(int(index), record.numpy()) for index, record in dataset.unbatch()]


# ----------------------------------------------------------------------------- the index


@pytest.mark.parametrize("workers", [1, 2, 3, 4])  # whole files (1-3), records split (4)
def test_every_record_comes_once_with_its_place_in_the_listing(uneven, workers):
    facts = imagenet.split_facts(uneven, "train")
    assert facts.shard_records == (5, 0, 37)
    firsts = bootstrap_records.first_indices(facts.shard_records)
    assert firsts == [0, 5, 5]
    seen = []
    for worker in range(workers):
        seen += _pairs(imagenet.imagenet_records(uneven, True, 4, (workers, worker),
                                                 first_indices=firsts))  # fmt: skip
    assert sorted(seen) == list(enumerate(_in_listing_order(uneven)))


def test_the_count_cache_keeps_each_shards_records_and_an_old_cache_is_counted_again(uneven):
    first = imagenet.split_facts(uneven, "train")
    path = uneven / listing.CACHE_FILE
    kept = json.loads(path.read_text())
    assert kept["splits"]["train"]["shard_records"] == [
        ["train-00000-of-00003", 5], ["train-00001-of-00003", 0], ["train-00002-of-00003", 37]
    ]  # fmt: skip
    assert imagenet.split_facts(uneven, "train") == first  # from the cache
    del kept["splits"]["train"]["shard_records"]  # as a cache written before they were kept
    path.write_text(json.dumps(kept))
    assert imagenet.split_facts(uneven, "train").shard_records == (5, 0, 37)
    assert "shard_records" in json.loads(path.read_text())["splits"]["train"]


def test_the_expansion_gives_each_record_as_often_as_its_count():
    pairs = tf.data.Dataset.from_tensor_slices(  # two blocks of two records
        (tf.constant([[0, 1], [2, 3]], tf.int64), tf.constant([[b"a", b"b"], [b"c", b"d"]]))
    )
    counts = np.array([2, 0, 3, 1], np.int32)
    got = [r.numpy() for r in bootstrap_records.expanded(pairs, counts)]
    assert got == [b"a", b"a", b"c", b"c", b"c", b"d"]
    sample = np.array([3, 0, 2, 2, 0, 2])
    assert bootstrap_records.draw_counts(sample, 4).tolist() == counts.tolist()


# ----------------------------------------------------------------------------- a member's data


def _passing_records(monkeypatch):
    """The workload's decoding replaced by the serialized record itself: the stream then
    shows which record each example is (its shuffle and everything before are unchanged)."""
    monkeypatch.setattr(
        imagenet, "parse_example", lambda serialized, *args: (serialized, tf.constant(0))
    )


def _member_workload(data_dir, *extra):
    setup = config.prepare("image_classification", "tiny", [*MEMBER, *extra])
    return build_workload(setup.benchmark.name, setup.config, str(data_dir))


def _drawn(data_dir, member=1) -> Counter:
    records = _in_listing_order(data_dir)
    return Counter(records[i] for i in bootstrap.draw(10, member, len(records)))


def test_a_members_epoch_is_its_drawn_multiset_in_the_epochs_own_order(
    imagenet_dir,  # noqa: F811
    monkeypatch,
):
    _passing_records(monkeypatch)
    workload = _member_workload(imagenet_dir)
    drawn = _drawn(imagenet_dir)
    assert max(drawn.values()) > 1 and len(drawn) < 12  # with replacement: some twice, some not
    epochs = [[r.numpy() for r, _ in workload.dataset(True, seed, (1, 0))] for seed in (10, 11)]
    assert Counter(epochs[0]) == drawn == Counter(epochs[1])
    assert epochs[0] != epochs[1]  # each epoch's own shuffle
    again = [r.numpy() for r, _ in _member_workload(imagenet_dir).dataset(True, 10, (1, 0))]
    assert again == epochs[0]  # a resumed member's rebuilt stream: the same order
    for workers in (2, 3):  # whole files; records split by position
        parts = Counter()
        for worker in range(workers):
            parts.update(r.numpy() for r, _ in workload.dataset(True, 10, (workers, worker)))
        assert parts == drawn
    sample = workload.facts["training_sample"]
    assert sample["digest"] == bootstrap.digest(bootstrap.draw(10, 1, 12))
    assert sample["index"] == bootstrap_records.INDEX_METHOD and sample["draws"] == 12
    evaluation = [r.numpy() for r, _ in workload.dataset(False, 10, (1, 0))]
    assert len(evaluation) == 12  # the evaluation split is not sampled


def test_a_caching_member_keeps_each_record_once_and_draws_from_the_cache(
    imagenet_dir,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    _passing_records(monkeypatch)
    cache = tmp_path / "node-local"
    cache.mkdir()
    workload = _member_workload(imagenet_dir, "data.cache=true", f"data.cache_dir={cache}")
    drawn = _drawn(imagenet_dir)
    for seed in (10, 11):
        assert Counter(r.numpy() for r, _ in workload.dataset(True, seed, (1, 0))) == drawn
    files = imagenet.shard_files(imagenet_dir, "train")
    plain = imagenet.cache_prefix(str(cache), imagenet_dir, "train", files, (1, 0))
    indexed = imagenet.cache_prefix(str(cache), imagenet_dir, "train", files, (1, 0), True)
    assert plain != indexed  # a whole-split run's cached records are never read as indexed
    assert list(cache.glob(f"{Path(indexed).name}.index"))


def test_a_stopped_member_resumes_its_stream_at_the_same_batch(
    imagenet_dir,  # noqa: F811
    monkeypatch,
):
    """What the engine trains on: each epoch's stream (batches of 4, 3 an epoch) from its
    position on, as run/data_position.py opens it for a resumed run."""
    _passing_records(monkeypatch)
    setup = config.prepare("image_classification", "tiny", [*MEMBER, "training.deterministic=true"])
    engine = run.build_engine(setup, str(imagenet_dir))
    assert engine.steps_per_epoch == 3

    def batches(epochs_done: int, batches_done: int) -> list[list[bytes]]:
        stream = engine.train_batches(epochs_done, batches_done)
        return [[r for r in images.numpy()] for images, _ in stream]

    whole = batches(0, 0)
    assert len(whole) == 6
    drawn = _drawn(imagenet_dir)
    assert Counter(r for batch in whole[:3] for r in batch) == drawn
    assert Counter(r for batch in whole[3:] for r in batch) == drawn
    assert batches(0, 1) == whole[1:]
    assert batches(1, 2) == whole[5:]


def test_a_member_given_fewer_examples_than_the_shards_hold_is_refused_in_one_line(
    imagenet_dir,  # noqa: F811
):
    with pytest.raises(UserError) as raised:
        _member_workload(imagenet_dir, "data.train_examples=8")
    assert str(raised.value) == (
        "data.train_examples = 8, but a bootstrap sample (data.bootstrap_member) draws from "
        "all 12 records of the train shards: set it to 0 or 12"
    )


def test_the_draw_counts_and_their_table_are_built_at_imagenet_size_without_a_python_loop():
    """ImageNet's 1,281,167 training records: one count each, a numpy bincount, and the
    stream's lookup table one constant (a record near the end found in it)."""
    examples = 1_281_167
    sample = bootstrap.draw(10, 0, examples)
    counts = bootstrap_records.draw_counts(sample, examples)
    assert counts.shape == (examples,) and counts.sum() == examples
    last = int(sample.max())
    pairs = tf.data.Dataset.from_tensors((tf.constant([last], tf.int64), tf.constant([b"x"])))
    assert len(list(bootstrap_records.expanded(pairs, counts))) == counts[last] > 0
    shard_records = [1251] * 1024  # about ImageNet's train-00000 .. train-01023
    assert bootstrap_records.first_indices(shard_records)[-1] == 1251 * 1023


def test_the_ensemble_takes_imagenet_tfrecords_and_refuses_random_data():
    from types import SimpleNamespace

    from hpcai500_tf.run import ensemble

    backend = SimpleNamespace(saves_predictions=True, name="tensorflow")

    def check(*settings):
        args = SimpleNamespace(
            instances=2, resume=None, run_dir=None, config=None, set=settings,
            benchmark="image_classification", preset="tiny", workers=None,
        )  # fmt: skip
        ensemble.check_arguments(args, backend)

    check(*IMAGENET_FIXTURE_SETTINGS)
    check("data.source=procedural")
    with pytest.raises(UserError, match="needs source = 'procedural' or 'imagenet', not 'random'"):
        check("data.source=random")


@pytest.mark.slow  # two members on TFRecords: about a minute on 2 loaded cores
def test_two_members_on_tfrecords_make_one_ensemble_the_test_recomputes(
    imagenet_dir,  # noqa: F811
    tmp_path,
):
    import os
    import subprocess
    import sys

    from hpcai500_tf import record
    from hpcai500_tf.run import predictions, throughput

    root = Path(__file__).resolve().parents[1]
    given = [*IMAGENET_FIXTURE_SETTINGS, "training.batch_per_replica=4"]  # --ensemble: the rest
    settings = [part for setting in given for part in ("--set", setting)]
    command = [
        sys.executable, "-m", "hpcai500_tf.cli", "train", "image_classification", "--preset",
        "tiny", "--no-tensorboard", "--power-hz", "0", "--instances", "2", "--ensemble",
        "--data", str(imagenet_dir), *settings, "--out", str(tmp_path),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(command, env=env, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout
    (path,) = tmp_path.glob("*/throughput.json")
    data = throughput.load(path)
    assert (data["form"], data["status"]) == ("ensemble", "completed")
    held = []
    for index, member in enumerate(data["members"]):
        run_dir = path.parent / member["run_dir"]
        rec = record.load(run_dir / "record.json")
        sample = rec["layers"]["L9"]["training_sample"]
        assert sample["digest"] == bootstrap.digest(bootstrap.draw(10, index, 12))
        assert sample["index"] == bootstrap_records.INDEX_METHOD
        held.append(predictions.load(run_dir, rec["quality"]["curve"][-1]["epoch"]))
    assert np.array_equal(held[0][1], held[1][1]) and held[0][1].size == 12
    mean = (held[0][0] + held[1][0]) / 2
    assert throughput.score(path).quality == pytest.approx(np.mean(mean.argmax(1) == held[0][1]))


@pytest.mark.slow  # three runs of 12 examples in this process: ~20 s on 2 busy cores
def test_a_member_stopped_mid_epoch_resumes_on_its_tfrecords_to_an_uninterrupted_members_weights(
    imagenet_dir,  # noqa: F811
    tmp_path,
):
    """The lifecycle's own stop and resume (tests/test_stop_keeps_work.py's): the resumed
    member rebuilds its draw from its saved config and skips the batches it trained, so it
    ends with the weights of a member never stopped."""
    from tests.test_ensemble import resumed_member_equals_uninterrupted

    resumed_member_equals_uninterrupted(tmp_path, MEMBER, 2, 12, data_dir=str(imagenet_dir))
