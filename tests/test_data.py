import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from hpcai500_tf import config
from hpcai500_tf.data import imagenet, procedural, tfrecords
from hpcai500_tf.data.image_folder import convert
from hpcai500_tf.engine import run
from hpcai500_tf.errors import UserError
from hpcai500_tf.workloads import build_workload

ROOT = Path(__file__).resolve().parents[1]


def make_image_folder(root: Path, classes: int = 3, per_class: int = 4) -> Path:
    """A tiny image-folder tree: PNGs and JPEGs of various sizes, one folder per class."""
    rng = np.random.default_rng(0)
    for c in range(classes):
        folder = root / f"class_{c}"
        folder.mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 255, (40 + 4 * i, 48, 3), dtype=np.uint8)
            if i % 2:
                (folder / f"{i}.png").write_bytes(tf.io.encode_png(pixels).numpy())
            else:
                (folder / f"{i}.jpg").write_bytes(tf.io.encode_jpeg(pixels).numpy())
    return root


# The settings that read `imagenet_dir`: its 3 classes are labelled from 1, as ImageNet's
# TFRecords are, and its examples are counted from the shards (0).
IMAGENET_FIXTURE_SETTINGS = [
    "data.source=imagenet",
    "data.train_examples=0",
    "data.eval_examples=0",
    "data.label_offset=1",
    "data.num_classes=3",
]


@pytest.fixture(scope="module")
def imagenet_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("imagenet")
    images = make_image_folder(root / "images")
    convert(images, root / "records", "train", shards=2, first_label=1)
    convert(images, root / "records", "validation", shards=1, first_label=1)
    return root / "records"


def test_converter_writes_the_standard_layout(imagenet_dir):
    names = sorted(p.name for p in imagenet_dir.iterdir())
    assert names == ["train-00000-of-00002", "train-00001-of-00002", "validation-00000-of-00001"]
    assert sum(tfrecords.count_records(p) for p in imagenet_dir.glob("train-*")) == 12


def test_converter_refuses_to_overwrite_and_bad_sources(tmp_path, imagenet_dir):
    images = make_image_folder(tmp_path / "images", classes=1, per_class=1)
    with pytest.raises(ValueError, match="already exists"):
        convert(images, imagenet_dir, "validation", shards=1, first_label=1)
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "make_imagenet_tfrecords.py"),
            str(tmp_path / "missing"),
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "not a directory" in result.stderr


def test_converter_leaves_no_shard_when_one_fails(tmp_path):
    """A bad image in the last shard leaves neither the shards written before it nor a
    temporary: a partial set would train on part of the data and look valid."""
    images = make_image_folder(tmp_path / "images", classes=2, per_class=2)
    (images / "class_1" / "9.jpg").write_bytes(b"not an image")
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="9.jpg: not a readable image"):
        convert(images, out, "train", shards=3, first_label=1)
    assert list(out.iterdir()) == []


def test_converter_never_adds_to_a_split(tmp_path, imagenet_dir):
    """Shards of another count in the folder are refused before anything is written."""
    images = make_image_folder(tmp_path / "images", classes=1, per_class=2)
    out = tmp_path / "out"
    shutil.copytree(imagenet_dir, out)
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(ValueError, match="train-00000-of-00002: already exists"):
        convert(images, out, "train", shards=1, first_label=1)
    assert sorted(p.name for p in out.iterdir()) == before


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: (d / "train-00001-of-00002").unlink(), r"missing train-00001-of-00002\)"),
        (
            lambda d: shutil.copy(d / "train-00000-of-00002", d / "train-00000-of-00004"),
            "shards of different sets",
        ),
        (
            lambda d: shutil.copy(d / "train-00000-of-00002", d / "train-00002-of-00002"),
            "train-00002-of-00002 numbered beyond its set of 2",
        ),
        (
            lambda d: (d / "train-00000-of-00002.idx").write_text("0 10\n"),
            "train-00000-of-00002.idx is not named like the other train shards",
        ),
    ],
)
def test_a_split_must_be_one_whole_shard_set(tmp_path, imagenet_dir, change, message):
    data = tmp_path / "data"
    shutil.copytree(imagenet_dir, data)
    change(data)
    with pytest.raises(UserError, match=message):
        imagenet.shard_files(data, "train")
    assert imagenet.shard_files(data, "validation")  # the other split is judged alone


@pytest.mark.parametrize("training", [True, False])
def test_pipeline_gives_model_sized_uint8_images_and_offset_labels(imagenet_dir, training):
    dataset = imagenet.imagenet_dataset(
        imagenet_dir, training, image_size=32, label_offset=1, seed=0
    )
    examples = list(dataset)
    assert len(examples) == 12
    assert {(tuple(image.shape), image.dtype) for image, _ in examples} == {((32, 32, 3), tf.uint8)}
    assert sorted({int(label) for _, label in examples}) == [0, 1, 2]
    pixels = np.stack([image.numpy() for image, _ in examples])
    assert pixels.std() > 20  # pixels (the source images are noise), not normalised values


def tiny_workload(*settings: str):
    setup = config.prepare("image_classification", "tiny", list(settings))
    return build_workload(setup.benchmark.name, setup.config, None)


@pytest.mark.parametrize(
    "normalisation, divisor",
    [("mean_255", (255.0,) * 3), ("mean_std", imagenet.CHANNEL_STDS)],
)
def test_normalising_uint8_in_the_step_matches_normalising_the_float_image(
    imagenet_dir, normalisation, divisor
):
    """The workload's `model_inputs` of the pipeline's uint8 pixels (run in a traced step, as
    on the device) equals the old float pipeline's output, the resized float image normalised,
    within the rounding to whole pixel levels: half a level over the divisor (255, the
    reference's, or the channel's std)."""
    workload = tiny_workload(f"model.input_normalisation={normalisation}")
    step = tf.function(workload.model_inputs)
    pipeline = imagenet.imagenet_dataset(imagenet_dir, False, 32, 1, 0)  # in record order
    records = tf.data.TFRecordDataset(imagenet.shard_files(imagenet_dir, "validation"))
    for serialized, (pixels, _) in zip(records, pipeline, strict=True):
        encoded = tf.io.parse_single_example(serialized, imagenet.FEATURES)["image/encoded"]
        resized = imagenet._eval_image(encoded, 32)
        before = (resized - imagenet.CHANNEL_MEANS) / divisor
        now = step(pixels[None])[0]
        assert now.dtype == tf.float32
        np.testing.assert_allclose(now, before, rtol=0, atol=0.5 / min(divisor) + 1e-5)


def test_every_image_source_gives_the_workloads_dtype():
    for source in ("procedural", "random"):
        workload = tiny_workload(f"data.source={source}")
        images, _ = workload.dataset(True, 0, (1, 0)).element_spec
        assert images.dtype == workload.input_dtype == tf.uint8, source


def _parallel_stages(dataset) -> dict:
    """The pipeline's parallel ops and their `deterministic` attribute."""
    graph = tf.compat.v1.GraphDef.FromString(dataset._as_serialized_graph().numpy())
    return {
        node.op: node.attr["deterministic"].s.decode()
        for node in graph.node
        if "deterministic" in node.attr
    }


@pytest.mark.parametrize("deterministic", [True, False])
def test_parallel_stages_keep_their_order_only_when_the_config_asks(imagenet_dir, deterministic):
    """The ImageNet interleave and map leave their order to the options the engine sets from
    training.deterministic (a hard-coded deterministic=True would show as "true")."""
    setup = config.prepare(
        "image_classification",
        "tiny",
        [
            f"training.deterministic={str(deterministic).lower()}",
            *IMAGENET_FIXTURE_SETTINGS,
            "training.batch_per_replica=4",
        ],
    )
    engine = run.build_engine(setup, str(imagenet_dir))
    dataset = engine._dataset(True, 0)  # the tiny preset's default strategy: a plain tf.data
    assert dataset.options().deterministic is deterministic
    assert _parallel_stages(dataset) == {
        "ParallelInterleaveDatasetV4": "default",
        "ParallelMapDatasetV2": "default",
    }


def test_procedural_map_leaves_its_order_to_the_options():
    dataset = procedural.procedural_dataset(16, 7, 16, 10, 0.5, training=True)
    assert _parallel_stages(dataset) == {"ParallelMapDatasetV2": "default"}


def test_the_evaluation_order_does_not_depend_on_the_cores(tmp_path, monkeypatch):
    """An ensemble's members merge their evaluation rows by position: on nodes of other core
    counts the interleave read the validation files in another order, and the merge refused
    the whole ensemble ("labels differ")."""
    images = make_image_folder(tmp_path / "images", classes=3, per_class=4)
    convert(images, tmp_path / "records", "validation", shards=3, first_label=1)
    orders = []
    for cores in (1, 3):
        monkeypatch.setattr(imagenet.os, "sched_getaffinity", lambda pid, n=cores: set(range(n)))
        records = imagenet.imagenet_records(tmp_path / "records", False, 0)
        options = tf.data.Options()
        options.deterministic = True
        orders.append([r.numpy() for r in records.with_options(options)])
    assert len(orders[0]) == 12 and orders[0] == orders[1]


def test_interleave_width_is_the_cores_available_at_most_the_files(monkeypatch):
    monkeypatch.setattr(imagenet.os, "sched_getaffinity", lambda pid: set(range(12)))
    assert imagenet.interleave_width(1024) == 12
    assert imagenet.interleave_width(5) == 5
    assert imagenet.interleave_width(0) == 1


def test_a_float_image_source_for_a_uint8_workload_is_refused_in_one_line(monkeypatch):
    setup = config.prepare("image_classification", "tiny", [])
    engine = run.build_engine(setup, None)
    engine.check_data()  # the workload's own data pass
    floats = tf.data.Dataset.from_tensors((tf.zeros([16, 16, 3]), tf.zeros([], tf.int32)))
    monkeypatch.setattr(engine.workload, "dataset", lambda *args: floats.repeat())
    with pytest.raises(UserError) as raised:
        engine.check_data()
    message = str(raised.value)
    assert message == (
        "the training data gives float32 images of shape (16, 16, 3); "
        "the model expects uint8 (16, 16, 3)"
    )
    assert "\n" not in message
    assert engine.synthetic_batch()[0].dtype == tf.uint8


def test_worker_shards_split_the_data(imagenet_dir):
    seen = [
        len(list(imagenet.imagenet_dataset(imagenet_dir, False, 32, 1, 0, shard=(2, i))))
        for i in range(2)
    ]
    assert sum(seen) == 12 and min(seen) > 0


def test_missing_empty_and_corrupt_data(tmp_path, imagenet_dir):
    with pytest.raises(UserError, match="data directory not found"):
        imagenet.shard_files(tmp_path / "nope", "train")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no 'train-\\*' TFRecord shards"):
        imagenet.shard_files(tmp_path / "empty", "train")
    broken = tmp_path / "broken"
    broken.mkdir()
    data = (imagenet_dir / "train-00000-of-00002").read_bytes()
    (broken / "train-00000-of-00001").write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match="train-00000-of-00001: truncated TFRecord file"):
        imagenet.split_facts(broken, "train")


def test_procedural_data_is_deterministic_and_labelled():
    a = list(procedural.procedural_dataset(16, 7, 16, 10, 0.5, training=False))
    b = list(procedural.procedural_dataset(16, 7, 16, 10, 0.5, training=False))
    for (ia, la), (ib, lb) in zip(a, b, strict=True):
        np.testing.assert_array_equal(ia, ib)
        assert int(la) == int(lb)
    labels = [int(label) for _, label in a]
    assert all(0 <= label < 10 for label in labels) and len(set(labels)) > 3
    train = procedural.procedural_dataset(16, 7, 16, 10, 0.5, training=True)
    train_images = {image.numpy().tobytes() for image, _ in train}
    assert len(train_images) == 16
    assert train_images.isdisjoint({image.numpy().tobytes() for image, _ in a})


def test_procedural_evaluation_examples_are_never_training_ones_at_reference_size():
    """Evaluation example i was training example 1,000,003 + i wherever a split had more
    (the reference preset's 1,281,167 on procedural data): 50,000 of 50,000 were trained on."""
    train_examples = 1_000_010
    evaluation = procedural.procedural_dataset(
        4, 7, 8, 10, 0.5, training=False, train_examples=train_examples
    )
    seen = {image.numpy().tobytes() for image, _ in evaluation}
    trained = {
        procedural.procedural_example(index, 7, 8, 10, 0.5)[0].numpy().tobytes()
        for index in range(procedural.EVAL_SEED_OFFSET, train_examples)
        if index < procedural.EVAL_SEED_OFFSET + 4
    }
    assert len(seen) == 4 and seen.isdisjoint(trained)
    first = procedural.procedural_example(train_examples, 7, 8, 10, 0.5)[0].numpy().tobytes()
    assert first in seen  # the keys past the training split's


def test_procedural_orientation_carries_the_class():
    """Without noise, the grating's orientation (from its spectrum peak) gives the label."""
    size, classes = 32, 4
    freqs = np.fft.fftfreq(size)
    hits = 0
    examples = list(procedural.procedural_dataset(100, 3, size, classes, 0.0, training=False))
    for image, label in examples:
        gray = image.numpy().mean(-1)
        spectrum = np.abs(np.fft.fft2(gray - gray.mean()))
        row, col = np.unravel_index(spectrum.argmax(), spectrum.shape)
        angle = np.arctan2(freqs[row], freqs[col]) % np.pi
        expected = np.pi * int(label) / classes
        distance = min(abs(angle - expected), np.pi - abs(angle - expected))
        hits += distance < np.radians(30)
    assert hits >= 0.8 * len(examples)


# ------------------------------------------------------------------------ data.cache


def _pixels_and_labels(dataset) -> tuple[np.ndarray, list[int]]:
    examples = list(dataset)
    return np.stack([image.numpy() for image, _ in examples]), [int(y) for _, y in examples]


def _stages(dataset) -> list[str]:
    """The dataset's ops, from its source to its output (a linear pipeline's graph order)."""
    graph = tf.compat.v1.GraphDef.FromString(dataset._as_serialized_graph().numpy())
    return [node.op for node in graph.node if "Dataset" in node.op]


def test_the_cache_holds_serialized_records_before_shuffling_and_decoding(imagenet_dir):
    dataset = imagenet.imagenet_dataset(imagenet_dir, True, 16, 1, 0, cache=True)
    assert _stages(dataset)[-4:] == [
        "ParallelInterleaveDatasetV4",  # this worker's records, read once
        "CacheDatasetV2",
        "ShuffleDatasetV3",
        "ParallelMapDatasetV2",  # decoding and the random crop: every epoch
    ]
    assert "CacheDatasetV2" not in _stages(imagenet.imagenet_dataset(imagenet_dir, True, 16, 1, 0))


@pytest.mark.parametrize("training", [True, False])
def test_a_cached_pass_reads_no_file(tmp_path, imagenet_dir, training):
    data = shutil.copytree(imagenet_dir, tmp_path / "data")
    dataset = imagenet.imagenet_dataset(data, training, 16, 1, 0, cache=True)
    pixels, labels = _pixels_and_labels(dataset)
    for shard in data.iterdir():
        shard.rename(shard.with_name(f"gone-{shard.name}"))
    again, labels_again = _pixels_and_labels(dataset)
    if training:  # reshuffled and cropped anew: the same records, in another order
        assert sorted(labels_again) == sorted(labels) and again.shape == pixels.shape
    else:
        assert labels_again == labels
        np.testing.assert_array_equal(again, pixels)


def test_a_cache_dir_keeps_records_for_a_new_pipeline_of_the_same_worker(tmp_path, imagenet_dir):
    data = shutil.copytree(imagenet_dir, tmp_path / "data")
    cache = tmp_path / "node-local"
    cache.mkdir()
    files = imagenet.shard_files(data, "validation")
    prefix = imagenet.cache_prefix(str(cache), data, "validation", files, (2, 1))
    imagenet._CLAIMED.pop(prefix).close()  # as a new process would find it:
    Path(f"{prefix}_0.lockfile").touch()  # with the lock file of a killed run, which is removed

    def build():
        return imagenet.imagenet_dataset(
            data, False, 16, 1, 0, (2, 1), cache=True, cache_dir=str(cache)
        )

    pixels, labels = _pixels_and_labels(build())
    assert sorted(p.name for p in cache.iterdir() if not p.name.endswith("-lock")) == [
        f"{Path(prefix).name}.data-00000-of-00001",
        f"{Path(prefix).name}.index",
    ]
    for shard in files:  # the same names and sizes, unreadable records
        Path(shard).write_bytes(bytes(Path(shard).stat().st_size))
    again, labels_again = _pixels_and_labels(build())
    assert labels_again == labels
    np.testing.assert_array_equal(again, pixels)
    other = imagenet.cache_prefix(str(cache), data, "validation", files, (2, 0))
    assert other != prefix  # another worker's records are never read for this one's


def test_instances_on_one_node_cache_the_same_records_in_copies_of_their_own(
    tmp_path, imagenet_dir
):
    """Each instance of --instances M is a one-worker run of the same data: all but one were
    refused ("another process is caching the same records") and counted as no model."""
    cache = tmp_path / "node-local"
    cache.mkdir()
    files = imagenet.shard_files(imagenet_dir, "train")
    first = imagenet.cache_prefix(str(cache), imagenet_dir, "train", files, (1, 0))
    script = (
        "import sys; from hpcai500_tf.data import imagenet as i; "
        "print(i.cache_prefix(sys.argv[1], sys.argv[2], 'train', "
        "i.shard_files(sys.argv[2], 'train'), (1, 0)))"
    )
    other = subprocess.run(
        [sys.executable, "-c", script, str(cache), str(imagenet_dir)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert other.returncode == 0, other.stderr[-2000:]
    assert other.stdout.split()[-1] == f"{first}-2"
    imagenet._CLAIMED.pop(first).close()


def test_a_cache_dir_that_is_not_a_directory_is_refused_in_one_line(tmp_path, imagenet_dir):
    taken = tmp_path / "a-file"
    taken.write_text("")
    for path, why in ((taken, "is not a directory"), (tmp_path / "missing", "does not exist")):
        with pytest.raises(UserError) as raised:
            imagenet.imagenet_dataset(imagenet_dir, True, 16, 1, 0, cache=True, cache_dir=str(path))
        assert str(raised.value).startswith(f"data.cache_dir '{path}' {why}")


def test_cache_settings_default_off_and_are_checked():
    from hpcai500_tf.workload_config import data_and_model

    preset = config.prepare("image_classification", "tiny", IMAGENET_FIXTURE_SETTINGS).config
    data, _ = data_and_model("image_classification", preset)
    assert (data.cache, data.cache_dir) == (False, "")  # not in the preset: the defaults
    for extra, message in [
        ({"cache_dir": "/scratch"}, "cache_dir is where the cache goes: it needs cache = true"),
        ({"cache": True, "source": "procedural"}, "it needs source = 'imagenet'"),
        ({"cache": "yes"}, "'data.cache' must be"),
    ]:
        with pytest.raises(UserError, match=message):
            data_and_model("image_classification", {**preset, "data": {**preset["data"], **extra}})
    cached = {**preset, "data": {**preset["data"], "cache": True}}
    assert data_and_model("image_classification", cached)[0].cache


def test_a_caching_workload_gives_each_evaluation_the_same_dataset(imagenet_dir):
    setup = config.prepare("image_classification", "tiny", IMAGENET_FIXTURE_SETTINGS)
    preset = {**setup.config, "data": {**setup.config["data"], "cache": True}}
    workload = build_workload(setup.benchmark.name, preset, str(imagenet_dir))
    assert workload.dataset(False, 0, (1, 0)) is workload.dataset(False, 0, (1, 0))
    plain = build_workload(setup.benchmark.name, setup.config, str(imagenet_dir))
    assert plain.dataset(False, 0, (1, 0)) is not plain.dataset(False, 0, (1, 0))
