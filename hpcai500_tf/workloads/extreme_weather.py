"""Extreme Weather Analytics: Faster R-CNN on ExtremeWeather, mAP at IoU 0.5.

Supplies model, data, loss and quality to the shared engine. Data are either ExtremeWeather
HDF5 files (`--data DIR`, split by year) or synthetic files in the same layout, generated once
into a cache directory (`data.source = "synthetic"`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import tensorflow as tf

from hpcai500_tf import config
from hpcai500_tf.config import section
from hpcai500_tf.data import extreme_weather as ew
from hpcai500_tf.data import listing
from hpcai500_tf.data.listing import cache_dir
from hpcai500_tf.errors import UserError
from hpcai500_tf.measure.mean_average_precision import mean_average_precision
from hpcai500_tf.models.faster_rcnn import FasterRCNN

DATASET_NAMES = {
    "hdf5": "extremeweather",
    "synthetic": "synthetic-extremeweather",
    "random": "random (quality not measured)",
}
RANDOM_EPOCH = 1024  # examples per epoch of random data when synthetic_samples is 0


@dataclass(frozen=True)
class DataConfig:
    source: str  # hdf5 | synthetic | random (throughput only, no files)
    train_years: list[int]
    eval_years: list[int]
    downsample: int  # average f x f pixel blocks (boxes scaled with them)
    synthetic_samples: int  # per year file (synthetic and random)
    synthetic_height: int  # synthetic and random images, before downsampling
    synthetic_width: int

    def check(self) -> str | None:
        if self.source not in DATASET_NAMES:
            return f"source must be one of {', '.join(DATASET_NAMES)}, got '{self.source}'"
        if not self.train_years or not self.eval_years:
            return "train_years and eval_years must name at least one year each"
        if set(self.train_years) & set(self.eval_years):
            return "a year cannot be in both train_years and eval_years"
        problem = config.out_of_range(
            self,
            train_years=(1, 9999),
            eval_years=(1, 9999),
            downsample=(1, 64),
            synthetic_samples=(0, 1_000_000),
            synthetic_height=(1, 16_384),
            synthetic_width=(1, 16_384),
        )
        if problem:
            return problem
        if self.source != "hdf5" and min(self.synthetic_height, self.synthetic_width) < 32:
            return "synthetic and random images need height and width >= 32"
        if self.source == "synthetic" and self.synthetic_samples < 1:
            return "synthetic data need synthetic_samples >= 1"
        return None


@dataclass(frozen=True)
class ModelConfig:
    width: float
    blocks: list[int]
    feature_stage: int  # 3 (stride 8) or 4 (stride 16, the C4 model)
    anchor_sizes: list[float]  # pixels of the (downsampled) input
    anchor_ratios: list[float]  # height / width
    pre_nms: int
    proposals_train: int
    proposals_eval: int
    rpn_batch: int
    roi_batch: int
    head_units: int
    max_detections: int
    bn_momentum: float
    bn_epsilon: float

    def check(self) -> str | None:
        if not 0 < self.width <= 16 or len(self.blocks) != 4:
            return f"width must be in (0, 16] and blocks four counts, got {self.width}"
        if self.feature_stage not in (3, 4):
            return f"feature_stage must be 3 or 4, got {self.feature_stage}"
        if not self.anchor_sizes or not self.anchor_ratios:
            return "anchor_sizes and anchor_ratios must not be empty"
        if min(self.anchor_sizes) <= 0 or min(self.anchor_ratios) <= 0:
            return "anchor sizes and ratios must be > 0"
        if not 0 < self.bn_momentum < 1 or not 0 < self.bn_epsilon <= 1:
            return "bn_momentum must be in (0, 1) and bn_epsilon in (0, 1]"
        return config.out_of_range(
            self,
            blocks=(1, 100),
            anchor_sizes=(0, 16_384),
            anchor_ratios=(0, 100),
            pre_nms=(1, 100_000),
            proposals_train=(1, 100_000),
            proposals_eval=(1, 100_000),
            rpn_batch=(1, 100_000),
            roi_batch=(4, 100_000),
            head_units=(1, 65_536),
            max_detections=(1, 10_000),
        )


class ExtremeWeather:
    name = "extreme_weather"
    quality_metric = "map_iou50"

    def __init__(self, preset: dict, data_dir: str | None):
        self.data = d = section(DataConfig, preset.get("data"), "data")
        self.model_config = section(ModelConfig, preset.get("model"), "model")
        self.data_name = DATASET_NAMES[d.source]
        self.facts: dict = {}  # L9 facts found in the files (none for random data)
        if d.source == "random":
            if data_dir is not None:
                raise UserError("random data read no files: drop --data")
            self.image_size = (
                d.synthetic_height // d.downsample,
                d.synthetic_width // d.downsample,
            )
            self.train_examples = (d.synthetic_samples or RANDOM_EPOCH) * len(d.train_years)
            self.eval_examples = (d.synthetic_samples or RANDOM_EPOCH) * len(d.eval_years)
            self.data_dir = None
            return
        if d.source == "hdf5":
            if data_dir is None:
                raise UserError("this preset reads ExtremeWeather .h5 files: pass --data DIR")
            directory = Path(data_dir)
        else:
            if data_dir is not None:
                raise UserError(
                    "this preset generates its data (synthetic); drop --data or use a preset "
                    "with data.source = 'hdf5'"
                )
            directory = ew.synthetic_dir(
                cache_dir(),
                sorted({*d.train_years, *d.eval_years}),
                d.synthetic_samples,
                d.synthetic_height,
                d.synthetic_width,
                seed=10,
            )
        self.data_dir = directory
        self.train_files = ew.year_files(directory, d.train_years)
        self.eval_files = ew.year_files(directory, d.eval_years)
        shapes = {}
        self.train_counts = [self._checked(f, shapes) for f in self.train_files]
        self.eval_counts = [self._checked(f, shapes) for f in self.eval_files]
        (height, width), *others = shapes.values()
        if others and any(shape != (height, width) for shape in others):
            raise UserError(f"{directory}: the files hold images of different sizes {shapes}")
        self.image_size = (height // d.downsample, width // d.downsample)
        self.train_examples = sum(self.train_counts)
        self.eval_examples = sum(self.eval_counts)
        self.stats = ew.normalization(self.train_files, directory)
        self._record_data_facts((height, width))

    def _record_data_facts(self, shape: tuple[int, int]) -> None:
        """What the checked files hold, compared with the benchmark's reference data: the
        year split (the project's own choice [U]), the published image shape and resolution.
        A difference is recorded, never silent: the run is then not rankable."""
        d = self.data
        reference = config.resolve_preset(config.load_benchmark(self.name), "reference")["data"]
        differences = []
        if d.source == "synthetic":
            differences.append("synthetic files generated by hpcai500-tf, not ExtremeWeather's")
        for key, years in (("train_years", d.train_years), ("eval_years", d.eval_years)):
            if sorted(years) != sorted(reference[key]):
                differences.append(
                    f"{key} {_years(years)} differ from the reference's {_years(reference[key])}"
                )
        height, width = shape
        if shape != ew.PUBLISHED_IMAGE_SHAPE:
            differences.append(
                f"images are {height}x{width}, the published data "
                + "x".join(map(str, ew.PUBLISHED_IMAGE_SHAPE))
            )
        if d.source == "hdf5" and differences:  # the files are not the reference's
            self.data_name = (
                f"extremeweather-format HDF5 ({len(d.train_years)} train and "
                f"{len(d.eval_years)} eval years, {height}x{width})"
            )
        if d.downsample != reference["downsample"]:
            differences.append(
                f"data.downsample {d.downsample}, the reference's {reference['downsample']}"
            )
        self.facts = {
            "train_years": d.train_years,
            "eval_years": d.eval_years,
            "samples_per_file": {
                path.name: count
                for path, count in zip(
                    self.train_files + self.eval_files,
                    self.train_counts + self.eval_counts,
                    strict=True,
                )
            },
            "train_examples": self.train_examples,
            "eval_examples": self.eval_examples,
            "image_shape": list(shape),
            "channels": len(ew.CHANNELS),
            "data_fingerprint": {
                "train": listing.fingerprint(self.train_files),
                "validation": listing.fingerprint(self.eval_files),
                "method": listing.FINGERPRINT_METHOD,
            },
            "data_differences": differences,
        }

    @staticmethod
    def _checked(path: Path, shapes: dict) -> int:
        count, height, width = ew.check_file(path)
        shapes[path.name] = (height, width)
        return count

    @property
    def measures_quality(self) -> bool:
        return self.data.source != "random"

    def build_model(self):
        m = self.model_config
        return FasterRCNN(
            (*self.image_size, len(ew.CHANNELS)),
            num_classes=len(ew.CLASSES),
            width=m.width,
            blocks=tuple(m.blocks),
            feature_stage=m.feature_stage,
            anchor_sizes=m.anchor_sizes,
            anchor_ratios=m.anchor_ratios,
            pre_nms=m.pre_nms,
            proposals_train=m.proposals_train,
            proposals_eval=m.proposals_eval,
            rpn_batch=m.rpn_batch,
            roi_batch=m.roi_batch,
            head_units=m.head_units,
            max_detections=m.max_detections,
            bn_momentum=m.bn_momentum,
            bn_epsilon=m.bn_epsilon,
        )

    def input_shape(self) -> tuple[int, int, int]:
        return (*self.image_size, len(ew.CHANNELS))

    def dataset(self, training: bool, seed: int, shard: tuple[int, int]) -> tf.data.Dataset:
        if self.data.source == "random":  # one example repeated: input cost ~0
            image = tf.random.stateless_normal([*self.input_shape()], [seed, 0])
            height, width = self.image_size
            boxes = -tf.ones([ew.MAX_BOXES, 5])
            boxes = tf.tensor_scatter_nd_update(
                boxes, [[0]], [[height / 4, width / 4, 3 * height / 4, 3 * width / 4, 1.0]]
            )
            return tf.data.Dataset.from_tensors((image, boxes)).repeat()
        files = self.train_files if training else self.eval_files
        counts = self.train_counts if training else self.eval_counts
        return ew.dataset(
            files, counts, self.stats, training, seed, shard, self.data.downsample,
            self.image_size,
        )  # fmt: skip

    def per_example_loss(self, model, images, labels, label_smoothing: float):
        return model.training_losses(images, labels)

    def empty_label(self):
        """One example's boxes for tracing and warm-up: no object."""
        return -tf.ones([ew.MAX_BOXES, 5], tf.float32)

    def eval_outputs(self, model, images, labels) -> dict:
        detections = model(images, training=False)
        return {**detections, "truth": labels}

    def quality(self, batches: list[dict]) -> float:
        """mAP at IoU 0.5 over the evaluation years (VOC all-point interpolation)."""
        detections, truth = [], []
        for batch in batches:
            for i in range(len(batch["valid"])):
                n = int(batch["valid"][i])
                detections.append(
                    (batch["boxes"][i, :n], batch["scores"][i, :n], batch["classes"][i, :n])
                )
                rows = batch["truth"][i]
                rows = rows[rows[:, 4] >= 0]
                truth.append((rows[:, :4], rows[:, 4].astype(int)))
        try:
            value, _ = mean_average_precision(detections, truth, len(ew.CLASSES), 0.5)
        except ValueError as error:
            raise UserError(f"evaluation: {error}") from None
        return value

    def workload_layer(self) -> dict:
        m = self.model_config
        return {
            "model": "faster_rcnn_resnet50_v1.5",
            "width": m.width,
            "blocks": m.blocks,
            "feature_stage": m.feature_stage,
            "image_size": list(self.image_size),
            "channels": len(ew.CHANNELS),
            "num_classes": len(ew.CLASSES),
            "anchor_sizes": m.anchor_sizes,
            "anchor_ratios": m.anchor_ratios,
            "proposals": [m.proposals_train, m.proposals_eval],
        }

    def dataset_name(self) -> str:
        """L9's dataset: "extremeweather" only for files of the reference split and shape."""
        return self.data_name

    def problem_layer(self) -> dict:
        """L9 facts found in the files (years, samples per file, image shape, fingerprints and
        every difference from the benchmark's reference data); empty for random data."""
        return dict(self.facts)

    def analytical_forward_flops(self, model) -> float:
        return model.analytical_forward_flops()


def _years(years: list[int]) -> str:
    return ",".join(map(str, sorted(years)))
