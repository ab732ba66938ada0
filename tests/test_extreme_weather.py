"""Extreme Weather Analytics: mAP, the HDF5 data path and its bad input, the synthetic data,
Faster R-CNN's pieces, and the benchmark end to end on the tiny preset."""

import json
import struct
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import tensorflow as tf

from hpcai500_tf import config, record
from hpcai500_tf.cli import main
from hpcai500_tf.data import extreme_weather as ew
from hpcai500_tf.errors import UserError
from hpcai500_tf.measure.mean_average_precision import average_precision, mean_average_precision
from hpcai500_tf.models import faster_rcnn as frcnn
from hpcai500_tf.models import kernels

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HPCAI500_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


# ------------------------------------------------------------------------ mAP


def _gt(*rows):
    rows = np.asarray(rows, float).reshape(-1, 5)
    return rows[:, :4], rows[:, 4].astype(int)


def _det(*rows):
    rows = np.asarray(rows, float).reshape(-1, 6)
    return rows[:, :4], rows[:, 4], rows[:, 5].astype(int)


def test_perfect_detections_score_one():
    truth = [_gt([0, 0, 10, 10, 0], [20, 20, 40, 40, 1]), _gt([5, 5, 15, 25, 0])]
    detections = [
        _det([0, 0, 10, 10, 0.9, 0], [20, 20, 40, 40, 0.8, 1]),
        _det([5, 5, 15, 25, 0.7, 0]),
    ]
    value, per_class = mean_average_precision(detections, truth, 4)
    assert value == 1.0 and per_class == {0: 1.0, 1: 1.0}


def test_no_detections_score_zero():
    assert mean_average_precision([_det()], [_gt([0, 0, 10, 10, 2])], 4)[0] == 0.0


def test_a_duplicate_is_a_false_positive():
    truth = [_gt([0, 0, 10, 10, 0])]
    # ranked: TP (recall 1, precision 1), then the duplicate (precision 1/2): AP stays 1
    assert mean_average_precision([_det([0, 0, 10, 10, 0.9, 0], [0, 0, 10, 10, 0.8, 0])], truth, 4)[
        0
    ] == pytest.approx(1.0)
    # the duplicate ranked first: FP then TP -> precision 1/2 at recall 1 -> AP 0.5
    two = [_gt([0, 0, 10, 10, 0], [50, 50, 60, 60, 0])]
    dets = [_det([50, 50, 60, 60, 0.95, 0], [50, 50, 60, 60, 0.9, 0], [0, 0, 10, 10, 0.8, 0])]
    # TP (r .5 p 1), FP (r .5 p .5), TP (r 1 p 2/3): AP = .5 x 1 + .5 x 2/3
    assert mean_average_precision(dets, two, 4)[0] == pytest.approx(0.5 + 0.5 * 2 / 3)


def test_shifted_detections_fall_below_iou_half():
    truth = [_gt([0, 0, 10, 10, 0])]
    shifted = _det([0, 4, 10, 14, 0.9, 0])  # IoU 60/140 = 0.43
    assert mean_average_precision([shifted], truth, 4)[0] == 0.0
    slight = _det([0, 2, 10, 12, 0.9, 0])  # IoU 80/120 = 0.67
    assert mean_average_precision([slight], truth, 4)[0] == 1.0


def test_classes_without_ground_truth_are_left_out_of_the_mean():
    truth = [_gt([0, 0, 10, 10, 0])]
    detections = [_det([0, 0, 10, 10, 0.9, 0], [30, 30, 40, 40, 0.99, 3])]  # class 3: no GT
    value, per_class = mean_average_precision(detections, truth, 4)
    assert value == 1.0 and list(per_class) == [0]
    with pytest.raises(ValueError, match="no ground-truth box"):
        mean_average_precision([_det()], [_gt()], 4)


def test_all_point_interpolation():
    # precision 1, 0.5, 2/3 at recall .5, .5, 1: envelope 1 then 2/3
    assert average_precision(np.array([0.5, 0.5, 1.0]), np.array([1.0, 0.5, 2 / 3])) == (
        pytest.approx(0.5 + 0.5 * 2 / 3)
    )


# ------------------------------------------------------------------------ data


def _write(path: Path, images=None, boxes=None, count=2, height=32, width=48):
    with h5py.File(path, "w") as handle:
        if images is not False:
            data = images if images is not None else np.ones((count, 16, height, width), "f4")
            handle.create_dataset("images", data=data)
        if boxes is not False:
            data = boxes if boxes is not None else -np.ones((count, 15, 5), "f4")
            handle.create_dataset("boxes", data=data)
    return path


def test_synthetic_files_have_the_published_layout(tmp_path):
    path = ew.write_synthetic(tmp_path / "climo_1979.h5", 3, 64, 96, seed=1)
    with h5py.File(path, "r") as handle:
        assert handle["images"].shape == (3, 16, 64, 96) and handle["images"].dtype == "f4"
        assert handle["boxes"].shape == (3, 15, 5)
        boxes = handle["boxes"][...]
    used = boxes[boxes[:, :, 4] >= 0]
    assert len(used) >= 3 and set(used[:, 4]) <= {0, 1, 2, 3}
    assert np.all(boxes[boxes[:, :, 4] < 0] == -1)
    assert ew.check_file(path) == (3, 64, 96)


def test_synthetic_features_sit_inside_their_boxes(tmp_path):
    rng = np.random.default_rng(3)
    for _ in range(5):
        image, boxes = ew.synthetic_sample(rng, 64, 96)
        psl = image[ew.CHANNELS.index("PSL")]
        for ymin, xmin, ymax, xmax, cls in boxes[boxes[:, 4] >= 0]:
            if cls < 3:  # a cyclone: its pressure minimum lies inside its box
                patch = psl[int(ymin) : int(ymax), int(xmin) : int(xmax)]
                assert patch.min() < psl.mean() - 1.0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"images": False}, "no 'images' dataset"),
        ({"boxes": False}, "no 'boxes' dataset"),
        ({"images": np.ones((2, 3, 32, 48), "f4")}, "'images' must be (N, 16, H, W)"),
        ({"images": np.ones((2, 16, 32, 48), "i4")}, "'images' must hold floats"),
        ({"boxes": -np.ones((2, 15, 4), "f4")}, "'boxes' must be (2, 15, 5)"),
        (
            {"images": np.ones((0, 16, 32, 48), "f4"), "boxes": -np.ones((0, 15, 5), "f4")},
            "holds no samples ('images' is empty)",
        ),
    ],
)
def test_malformed_files_are_named(tmp_path, kwargs, message):
    path = _write(tmp_path / "climo_1979.h5", **kwargs)
    with pytest.raises(UserError, match=re_escape(f"{path}: {message}")):
        ew.check_file(path)


def re_escape(text):
    import re

    return re.escape(text)


@pytest.mark.parametrize(
    "row, message",
    [
        ([0, 0, 40, 10, 1], "outside the 32x48 image"),
        ([5, 5, 5, 10, 1], "is empty or outside"),
        ([0, 0, 10, 10, 7], "box class 7 is unknown"),
    ],
)
def test_bad_boxes_name_file_and_sample(tmp_path, row, message):
    boxes = -np.ones((2, 15, 5), "f4")
    boxes[1, 0] = row
    path = _write(tmp_path / "climo_1979.h5", boxes=boxes)
    with pytest.raises(
        UserError, match=re_escape(f"{path}: sample 1: ") + ".*" + re_escape(message)
    ):
        ew.check_file(path)


def test_truncated_and_non_hdf5_files_are_refused(tmp_path):
    good = ew.write_synthetic(tmp_path / "climo_1979.h5", 2, 32, 48, seed=1)
    truncated = tmp_path / "climo_1980.h5"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 3])
    text = tmp_path / "climo_1981.h5"
    text.write_text("year,storms\n1981,12\n")
    for path in (truncated, text):
        with pytest.raises(UserError, match=re_escape(f"{path}: not a readable HDF5 file")):
            ew.check_file(path)


def test_a_non_finite_sample_is_never_a_zero_image(tmp_path):
    images = np.ones((2, 16, 32, 48), "f4")
    images[1, 3, 4, 5] = np.nan
    path = _write(tmp_path / "climo_1979.h5", images=images)
    with h5py.File(path, "r") as handle:
        ew.read_sample(handle, path, 0, 1)
        with pytest.raises(UserError, match=re_escape(f"{path}: sample 1: the image holds NaN")):
            ew.read_sample(handle, path, 1, 1)


def test_downsampling_averages_pixels_and_scales_boxes(tmp_path):
    images = np.arange(2 * 16 * 32 * 48, dtype="f4").reshape(2, 16, 32, 48)
    boxes = -np.ones((2, 15, 5), "f4")
    boxes[0, 0] = [4, 8, 20, 40, 2]
    path = _write(tmp_path / "climo_1979.h5", images=images, boxes=boxes)
    with h5py.File(path, "r") as handle:
        image, scaled = ew.read_sample(handle, path, 0, 4)
    assert image.shape == (8, 12, 16)
    assert image[0, 0, 0] == pytest.approx(images[0, 0, :4, :4].mean())
    assert scaled[0].tolist() == [1, 2, 5, 10, 2] and scaled[1].tolist() == [-1] * 5


# The two readers. Their images are equal bit for bit: the same float32 operations in the same
# order (no reductions, so no dependence on a CPU's vector width, e.g. AVX-512 on Xeon against
# AVX2 on Zen 3), on data without subnormal values (TensorFlow flushes those to zero).


def _write_layout(path: Path, layout: str, count=5, height=32, width=48, seed=0):
    """A file in the published layout whose `images` are stored as `layout` says."""
    rng = np.random.default_rng(seed)
    images = (rng.standard_normal((count, 16, height, width)) * 3 + 7).astype("f4")
    boxes = -np.ones((count, 15, 5), "f4")
    boxes[:, 0] = [3, 5, 21, 30, 1]
    boxes[1, 1] = [1, 2, 9, 11, 3]
    storage = {
        "contiguous": {},
        "contiguous-f8": {"dtype": "<f8"},
        "chunk-per-sample": {"chunks": (1, 16, height, width)},
        "chunk-per-2-samples": {"chunks": (2, 16, height, width)},
        "gzip": {"chunks": (1, 16, height, width), "compression": "gzip"},
        "shuffle": {"chunks": (1, 16, height, width), "shuffle": True},
        "fletcher32": {"chunks": (1, 16, height, width), "fletcher32": True},
        "chunk-per-channel": {"chunks": (1, 1, height, width)},
        "big-endian": {"dtype": ">f4"},
        "float16": {"dtype": "<f2"},
    }[layout]
    with h5py.File(path, "w") as handle:
        handle.create_dataset("boxes", data=boxes)
        dtype = storage.pop("dtype", "<f4")
        handle.create_dataset("images", data=images.astype(dtype), **storage)
    return path


PREAD = ["contiguous", "contiguous-f8", "chunk-per-sample", "chunk-per-2-samples"]
H5PY = ["gzip", "shuffle", "fletcher32", "chunk-per-channel", "big-endian", "float16"]


@pytest.mark.parametrize("layout", PREAD)
def test_whole_unfiltered_samples_take_the_pread_reader(tmp_path, layout):
    path = _write_layout(tmp_path / "climo_1979.h5", layout)
    assert ew.reader([path]) == ("pread", "")
    synthetic = ew.write_synthetic(tmp_path / "climo_1980.h5", 2, 32, 48, seed=1)
    assert ew.reader([path, synthetic]) == ("pread", "")


@pytest.mark.parametrize("layout", H5PY)
def test_filtered_or_split_samples_fall_back_to_h5py(tmp_path, layout):
    good = _write_layout(tmp_path / "climo_1979.h5", "contiguous")
    path = _write_layout(tmp_path / "climo_1980.h5", layout)
    kind, why = ew.reader([good, path])
    assert kind == "h5py" and why.startswith(f"{path}: 'images' ") and "\n" not in why
    with pytest.raises(UserError, match="the pread reader cannot read it"):
        _elements([good, path], read_with="pread")


def _elements(files, downsample=1, training=True, shard=(1, 0), read_with="auto", seed=5):
    stats = {"mean": list(np.linspace(6, 8, 16)), "std": list(np.linspace(2, 4, 16))}
    counts = [ew.check_file(path)[0] for path in files]
    _, height, width = ew.check_file(files[0])
    data = ew.dataset(
        files, counts, stats, training, seed, shard, downsample,
        (height // downsample, width // downsample), read_with,
    )  # fmt: skip
    return list(data.as_numpy_iterator())


@pytest.mark.parametrize("layout", PREAD)
@pytest.mark.parametrize("downsample, training, shard", [(1, True, (1, 0)), (2, False, (2, 1)),
                                                        (3, True, (2, 0))])  # fmt: skip
def test_both_readers_give_the_same_elements_in_the_same_order(
    tmp_path, layout, downsample, training, shard
):
    files = [
        _write_layout(tmp_path / "climo_1979.h5", layout, seed=1),
        _write_layout(tmp_path / "climo_1980.h5", "contiguous", count=3, seed=2),
    ]
    fast = _elements(files, downsample, training, shard, "pread")
    slow = _elements(files, downsample, training, shard, "h5py")
    assert len(fast) == len(slow) == len(range(shard[1], 8, shard[0]))
    for (image, boxes), (expected_image, expected_boxes) in zip(fast, slow, strict=True):
        assert image.dtype == expected_image.dtype == np.float32
        assert image.shape == expected_image.shape == (32 // downsample, 48 // downsample, 16)
        np.testing.assert_array_equal(image, expected_image)  # bit for bit, not approximately
        np.testing.assert_array_equal(boxes, expected_boxes)
    assert len({image.tobytes() for image, _ in fast}) == len(fast)  # distinct samples


def test_the_shuffled_order_follows_the_seed_for_both_readers(tmp_path):
    files = [_write_layout(tmp_path / "climo_1979.h5", "contiguous", count=8)]
    order = {
        (reader, seed): [image.tobytes() for image, _ in _elements(files, 1, True,
                                                                      read_with=reader, seed=seed)]
        for reader in ("pread", "h5py") for seed in (1, 2)
    }  # fmt: skip
    assert order["pread", 1] == order["h5py", 1] and order["pread", 2] == order["h5py", 2]
    assert order["pread", 1] != order["pread", 2]


def test_the_pread_reader_stops_on_a_non_finite_sample_naming_it(tmp_path):
    path = _write_layout(tmp_path / "climo_1979.h5", "contiguous")
    with h5py.File(path, "r+") as handle:
        handle["images"][3, 7, 2, 9] = np.nan
    assert ew.reader([path])[0] == "pread"
    with pytest.raises(tf.errors.OpError) as caught:
        _elements([path], training=False)
    from hpcai500_tf.engine.run import _user_error_inside

    assert str(_user_error_inside(caught.value)) == (
        f"{path}: sample 3: the image holds NaN or infinite values"
    )


def _truncate_keeping_the_superblock_valid(path: Path, cut: int) -> None:
    """Cut `cut` bytes off the end of a file and rewrite its version-0 superblock's end-of-file
    address (bytes 40-48), so that HDF5 still opens it and only a read would fail."""
    data = bytearray(path.read_bytes()[:-cut])
    assert data[8] == 0  # superblock version 0: h5py's default
    data[40:48] = struct.pack("<Q", len(data))
    path.write_bytes(bytes(data))


def test_image_bytes_past_the_end_of_the_file_are_refused_when_the_data_is_built(tmp_path):
    path = _write_layout(tmp_path / "climo_1979.h5", "chunk-per-sample")  # images written last
    _truncate_keeping_the_superblock_valid(path, 1000)
    with h5py.File(path, "r") as handle:  # HDF5 opens it: only reading sample 4 would fail
        assert handle["boxes"].shape == (5, 15, 5)
    size = path.stat().st_size
    message = f"{path}: truncated: sample 4's image ends at byte {size + 1000}, the file has {size}"
    for build in (lambda: ew.check_file(path), lambda: ew.reader([path])):
        with pytest.raises(UserError) as caught:
            build()
        assert str(caught.value) == message + " bytes"


def test_a_split_whose_files_h5py_must_read_is_warned_about(tmp_path):
    from hpcai500_tf.workloads import build_workload

    for year, layout in ((1979, "gzip"), (1980, "contiguous")):
        _write_layout(tmp_path / f"climo_{year}.h5", layout, height=64, width=96, count=4)
    setup = config.prepare("extreme_weather", "tiny", ["data.source=hdf5"])
    workload = build_workload("extreme_weather", setup.config, str(tmp_path))
    (warning,) = workload.data_warnings(1)
    assert warning.startswith(f"{tmp_path / 'climo_1979.h5'}: 'images' is filtered")
    assert "h5repack" in warning
    images, boxes = next(iter(workload.dataset(True, 0, (1, 0))))  # still read, through h5py
    assert images.shape == (32, 48, 16) and boxes.shape == (15, 5)


def test_normalisation_is_computed_once_and_kept_beside_the_data(tmp_path):
    path = ew.write_synthetic(tmp_path / "climo_1979.h5", 4, 32, 48, seed=1)
    stats = ew.normalization([path], tmp_path)
    assert len(stats["mean"]) == 16 and min(stats["std"]) > 0
    stored = json.loads((tmp_path / ew.STATS_FILE).read_text())
    assert stored["mean"] == stats["mean"]
    stored["mean"][0] = 123.0  # a kept file is trusted while the files match
    (tmp_path / ew.STATS_FILE).write_text(json.dumps(stored))
    assert ew.normalization([path], tmp_path)["mean"][0] == 123.0


@pytest.mark.parametrize(
    "damage",
    [b"\xff\xfe not UTF-8", b"[]", b'{"key": 1}', b"{", b"NaN-mean", b"short", b"zero-std",
     b"huge-int-std"],
)  # fmt: skip
def test_a_damaged_normalisation_file_is_computed_again_and_replaced(tmp_path, damage):
    path = ew.write_synthetic(tmp_path / "climo_1979.h5", 4, 32, 48, seed=1)
    stats = ew.normalization([path], tmp_path)
    kept = tmp_path / ew.STATS_FILE
    text = kept.read_text()
    if damage == b"NaN-mean":  # Python's json writes and reads NaN; JSON has none
        kept.write_text(text.replace(str(stats["mean"][0]), "NaN", 1))
    elif damage == b"short":
        kept.write_text(json.dumps({**stats, "mean": stats["mean"][:3]}))
    elif damage == b"zero-std":
        kept.write_text(json.dumps({**stats, "std": [0.0] * 16}))
    elif damage == b"huge-int-std":  # an int no float holds
        kept.write_text(json.dumps({**stats, "std": [10**400] * 16}))
    else:
        kept.write_bytes(damage)
    again = ew.normalization([path], tmp_path)
    assert again["mean"] == pytest.approx(stats["mean"]) and again["std"] == pytest.approx(
        stats["std"]
    )
    assert json.loads(kept.read_text())["key"] == stats["key"]


def test_year_files_and_missing_years(tmp_path):
    for year in (1979, 1980):
        _write(tmp_path / f"climo_{year}.h5")
    assert [p.name for p in ew.year_files(tmp_path, [1980])] == ["climo_1980.h5"]
    with pytest.raises(UserError, match="no .h5 file for year\\(s\\) 2005"):
        ew.year_files(tmp_path, [1979, 2005])


# ------------------------------------------------------------------------ Faster R-CNN pieces


def test_anchors_cover_every_cell_and_shape():
    anchors = frcnn.anchor_boxes(64, 96, 8, [16.0], [0.5, 1.0, 2.0])
    assert anchors.shape == (8 * 12 * 3, 4)
    first = anchors[:3]
    centres = (first[:, :2] + first[:, 2:]) / 2
    assert np.allclose(centres, 4.0)
    heights, widths = first[:, 2] - first[:, 0], first[:, 3] - first[:, 1]
    assert np.allclose(heights / widths, [0.5, 1.0, 2.0])
    assert np.allclose(np.sqrt(heights * widths), 16.0)


def test_box_coding_round_trips():
    anchors = tf.constant([[0.0, 0.0, 10.0, 20.0], [5.0, 5.0, 25.0, 15.0]])
    boxes = tf.constant([[1.0, 2.0, 12.0, 18.0], [4.0, 6.0, 30.0, 16.0]])
    for weights in ((1.0, 1.0, 1.0, 1.0), frcnn.HEAD_DELTA_WEIGHTS):
        decoded = frcnn.decode(frcnn.encode(boxes, anchors, weights), anchors, weights)
        assert np.allclose(decoded.numpy(), boxes.numpy(), atol=1e-4)


def test_sampling_takes_at_most_the_asked_count():
    candidates = tf.constant([[True, True, True, False, True], [False, True, False, False, False]])
    chosen = frcnn.sample(candidates, tf.constant([2, 3])).numpy()
    assert chosen[0].sum() == 2 and chosen[1].tolist() == [False, True, False, False, False]
    assert not np.any(chosen & ~candidates.numpy())


def _tiny_model():
    return frcnn.FasterRCNN(
        (32, 48, 16), num_classes=4, width=0.125, blocks=(1, 1, 1, 1), feature_stage=3,
        anchor_sizes=[8.0, 16.0], anchor_ratios=[1.0], pre_nms=50, proposals_train=8,
        proposals_eval=8, rpn_batch=16, roi_batch=8, head_units=16, max_detections=5,
    )  # fmt: skip


def test_losses_are_finite_with_and_without_objects():
    model = _tiny_model()
    images = tf.random.normal([2, 32, 48, 16])
    gt = -np.ones((2, 15, 5), "f4")
    gt[0, 0] = [4, 4, 20, 30, 1]
    losses = model.training_losses(images, tf.constant(gt))
    assert losses.shape == (2,) and np.all(np.isfinite(losses.numpy()))
    with tf.GradientTape() as tape:
        total = tf.reduce_sum(model.training_losses(images, tf.constant(gt)))
    gradients = tape.gradient(total, model.trainable_variables)
    assert all(np.all(np.isfinite(g.numpy())) for g in gradients if g is not None)


def test_inference_gives_fixed_size_detections():
    detections = _tiny_model()(tf.random.normal([3, 32, 48, 16]))
    assert detections["boxes"].shape == (3, 5, 4) and detections["classes"].shape == (3, 5)
    assert np.all(detections["valid"].numpy() <= 5)


# ------------------------------------------------------------------------ the benchmark


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    code = main(["train", "extreme_weather", "--preset", "tiny", "--set",
                 "training.target_quality=0.001", "--out", str(out)])  # fmt: skip
    (path,) = out.glob("*/record.json")
    return code, path, record.load(path)


def test_tiny_preset_trains_and_records(tiny_run):
    code, path, rec = tiny_run
    assert rec["benchmark"] == "extreme_weather" and rec["quality"]["metric"] == "map_iou50"
    assert rec["layers"]["L7"]["model"] == "faster_rcnn_resnet50_v1.5"
    assert rec["layers"]["L7"]["image_size"] == [32, 48]  # 64 x 96 downsampled by 2
    # auto, on this CPU-only machine: the workarounds, with the native batch norm on AMX
    assert rec["layers"]["L7"]["kernels"] == kernels.resolve("auto")
    assert rec["layers"]["L7"]["kernels"] in ("cpu-workarounds", "cpu-native-batch-norm")
    assert rec["layers"]["L9"]["dataset"] == "synthetic-extremeweather"
    assert len(rec["quality"]["curve"]) == 2
    flops = rec["flops"]
    assert flops["per_example_training"] > 2 * flops["analytical_per_example_forward"] * 0.5
    assert (
        "CropAndResize" in flops["uncounted_op_types"]
        or "CropAndResize" in flops["counted_op_types"]
    )
    assert (path.parent / "mlperf.log").read_text().count("eval_accuracy") == 2
    assert not rec["rankable"]


def test_random_data_is_a_throughput_only_run(tmp_path):
    setup = config.prepare("extreme_weather", "tiny", ["data.source=random"])
    from hpcai500_tf.engine import run

    rec, _ = run.run_benchmark(setup, None, tmp_path)
    assert rec["quality"]["measured"] is False and rec["flops"]["total"] is None
    assert rec["layers"]["L7"]["image_size"] == [32, 48]


def test_reference_preset_needs_data(capsys):
    assert main(["train", "extreme_weather", "--preset", "reference"]) == 2
    assert "pass --data DIR" in capsys.readouterr().err


def test_a_corrupt_sample_in_training_stops_with_one_line(tmp_path, capsys):
    data = tmp_path / "data"
    for year in (1979, 1980):
        ew.write_synthetic(data / f"climo_{year}.h5", 8, 64, 96, seed=year)
    with h5py.File(data / "climo_1979.h5", "r+") as handle:
        image = handle["images"][5]
        image[0, 0, 0] = np.inf
        handle["images"][5] = image
    args = ["train", "extreme_weather", "--preset", "tiny", "--data", str(data),
            "--set", "data.source=hdf5", "--out", str(tmp_path / "runs")]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("hpcai500-tf: error: ") and "sample 5" in err[-1]
    assert "climo_1979.h5" in err[-1] and "NaN or infinite" in err[-1]
    assert not list((tmp_path / "runs").glob("*/record.json"))


def test_the_generator_tool_writes_year_files(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "make_extreme_weather.py"), str(tmp_path),
         "--years", "1979", "--samples", "2", "--height", "64", "--width", "96"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert ew.check_file(tmp_path / "climo_1979.h5") == (2, 64, 96)
    again = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "make_extreme_weather.py"), str(tmp_path),
         "--years", "1979"], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert again.returncode == 2 and "not overwriting" in again.stderr


@pytest.mark.slow
def test_smoke_preset_reaches_its_target(tmp_path):
    setup = config.prepare("extreme_weather", "smoke")
    from hpcai500_tf.engine import run

    rec, _ = run.run_benchmark(setup, None, tmp_path)
    assert rec["quality"]["reached_target"], rec["quality"]["curve"]
