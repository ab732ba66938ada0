"""Worker shards of the ImageNet pipeline are a partition of each split: every example read
exactly once over all workers, whatever the file count and the interleave's order."""

from collections import Counter

import pytest
import tensorflow as tf

from hpcai500_tf import config
from hpcai500_tf.data import imagenet
from hpcai500_tf.engine import run

from .test_data import IMAGENET_FIXTURE_SETTINGS, convert, make_image_folder

EXAMPLES = 12  # one image per class: the label names the example


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return make_image_folder(tmp_path_factory.mktemp("partition") / "images", EXAMPLES, 1)


def records(images, tmp_path, files: int):
    """Both splits of the EXAMPLES images in `files` TFRecord files each."""
    for split in ("train", "validation"):
        convert(images, tmp_path / "records", split, shards=files, first_label=1)
    return tmp_path / "records"


def labels_read(data_dir, training: bool, shard: tuple[int, int]) -> list[int]:
    """The labels one worker reads in one pass, with the order left non-deterministic."""
    options = tf.data.Options()
    options.deterministic = False
    dataset = imagenet.imagenet_dataset(data_dir, training, 16, 1, seed=0, shard=shard)
    return [int(label) for _, label in dataset.with_options(options)]


@pytest.mark.parametrize("training", [False, True], ids=["validation", "train"])
@pytest.mark.parametrize("workers, files", [(2, 1), (3, 2), (2, 3)])
def test_worker_shards_read_every_example_exactly_once(images, tmp_path, workers, files, training):
    data_dir = records(images, tmp_path, files)
    seen = Counter(
        label
        for index in range(workers)
        for label in labels_read(data_dir, training, (workers, index))
    )
    assert seen == Counter(range(EXAMPLES))


def test_the_split_by_position_holds_whatever_order_the_files_are_interleaved(
    images, tmp_path, monkeypatch
):
    """Each worker interleaving the files in another order (as a non-deterministic interleave
    may) still reads its own records: they are chosen within each file, before the interleave."""
    data_dir = records(images, tmp_path, 2)
    listed = imagenet.shard_files(data_dir, "validation")
    seen = Counter()
    for index in range(3):
        order = listed if index % 2 else listed[::-1]
        monkeypatch.setattr(imagenet, "shard_files", lambda *args, order=order: order)
        seen.update(labels_read(data_dir, False, (3, index)))
    assert seen == Counter(range(EXAMPLES))


class Messages:
    def __init__(self):
        self.lines = []

    def message(self, text: str) -> None:
        self.lines.append(text)


def test_fewer_files_than_workers_is_a_warning(images, tmp_path, monkeypatch):
    data_dir = records(images, tmp_path, 2)
    settings = [*IMAGENET_FIXTURE_SETTINGS, "data.num_classes=12", "training.batch_per_replica=4"]
    setup = config.prepare("image_classification", "tiny", settings)
    engine = run.build_engine(setup, str(data_dir))
    assert engine.workers == 1 and engine.check_data() == []
    assert engine.workload.data_warnings(2) == []
    view = Messages()
    monkeypatch.setattr(type(engine), "workers", property(lambda self: 3))
    warnings = engine.check_data(view)
    assert warnings == [
        f"the {split} split has 2 TFRecord file(s) for 3 workers: its records are split by "
        "position within each file, so every worker reads every file"
        for split in ("train", "validation")
    ]
    assert view.lines == warnings
