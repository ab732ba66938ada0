"""Extreme Weather Analytics: Faster R-CNN on ExtremeWeather, mAP at IoU 0.5.

Supplies model, data, loss and quality to the shared engine. Data are either ExtremeWeather
HDF5 files (`--data DIR`, split by year) or synthetic files in the same layout, generated once
into a cache directory (`data.source = "synthetic"`). An ensemble member
(`data.bootstrap_member`) trains on its bootstrap sample of the training years' samples
(data/bootstrap.py) and keeps each evaluation's detections, in evaluation order, for
run/predictions.py to save.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import numpy as np
import tensorflow as tf

from hpcai500_tf import config
from hpcai500_tf.data import bootstrap, listing
from hpcai500_tf.data import extreme_weather as ew
from hpcai500_tf.data.listing import cache_dir
from hpcai500_tf.errors import UserError
from hpcai500_tf.measure import detection_lists
from hpcai500_tf.measure.mean_average_precision import EWA_THRESHOLD, mean_average_precision
from hpcai500_tf.models.faster_rcnn import FasterRCNN
from hpcai500_tf.models.kernels import resolve
from hpcai500_tf.workload_config import EXTREME_WEATHER_DATASETS as DATASET_NAMES
from hpcai500_tf.workload_config import data_and_model


class ExtremeWeather:
    name = "extreme_weather"
    quality_metric = "map_iou50"
    objective = "faster_rcnn"  # the detector's own losses (models/faster_rcnn.py)
    input_dtype = tf.float32  # normalised physical fields (what every data source yields)

    def __init__(self, preset: dict, data_dir: str | None):
        self.data, self.model_config = data_and_model(self.name, preset)
        d = self.data
        self.xla = bool(preset.get("training", {}).get("xla", False))
        self.data_name = DATASET_NAMES[d.source]
        self.facts: dict = {}  # L9 facts found in the files (none for random data)
        # An ensemble member: its bootstrap sample of the training split, and the detections
        # its evaluation keeps (run/predictions.py saves them); None for any other run.
        self.sample, self.predictions = None, None
        if d.source == "random":
            if data_dir is not None:
                raise UserError("random data read no files: drop --data")
            self.image_size = (
                d.synthetic_height // d.downsample,
                d.synthetic_width // d.downsample,
            )
            self.train_examples = d.random_examples(d.train_years)
            self.eval_examples = d.random_examples(d.eval_years)
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
        seed = int(preset.get("training", {}).get("seed", 0))  # the run's, as L8 records it
        self.sample = bootstrap.member_sample(
            seed, d.bootstrap_member, self.train_examples, self.facts
        )

    @functools.cached_property
    def kernels(self) -> str:
        """What the model is built with and L7 records: "auto" resolved on this machine, on
        first use (after the data checks: resolving may build the native kernels first)."""
        return resolve(self.model_config.kernels, self.xla)

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

    @property
    def keeps_predictions(self) -> bool:
        """An ensemble member's: its evaluation keeps its detections, in evaluation order
        (the engine reads the split in order for it)."""
        return self.sample is not None

    def build_model(self):
        model = self.model_config  # its fields are the model's arguments, by name
        return FasterRCNN(
            (*self.image_size, len(ew.CHANNELS)),
            num_classes=len(ew.CLASSES),
            **{**dataclasses.asdict(model), "blocks": tuple(model.blocks), "kernels": self.kernels},
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
            self.image_size, sample=self.sample if training else None,
        )  # fmt: skip

    def data_warnings(self, workers: int) -> list[str]:
        """None for sharding (each worker's (file, sample) pairs are its own slice, whatever the
        file count); one per split whose files h5py must read (ew.reader): one sample at a
        time, about one core's worth a process."""
        if self.data.source == "random":
            return []
        warnings = []
        for files in (self.train_files, self.eval_files):
            kind, why = ew.reader(files)
            if kind == "h5py":
                warnings.append(
                    f"{why}: read through h5py, one sample at a time; `h5repack -l images:CONTI "
                    "-f images:NONE IN OUT` once lets its samples be read in parallel"
                )
        return warnings

    def per_example_loss(self, model, images, labels, label_smoothing: float):
        return model.training_losses(images, labels)

    def empty_label(self):
        """One example's boxes for tracing and warm-up: no object."""
        return -tf.ones([ew.MAX_BOXES, 5], tf.float32)

    def eval_outputs(self, model, images, labels) -> dict:
        detections = model(images, training=False)
        return {**detections, "truth": labels}

    def quality(self, batches: list[dict]) -> float:
        """mAP at IoU 0.5 over the evaluation years (VOC all-point interpolation); an ensemble
        member keeps its padded detections and the truth, in evaluation order, as
        `predictions`."""
        if not batches:
            raise UserError("evaluation: the evaluation split produced no images")
        names = ("boxes", "scores", "classes", "valid", "truth")
        held = {name: np.concatenate([batch[name] for batch in batches]) for name in names}
        detections = detection_lists.detections(*(held[name] for name in names[:4]))
        truth = detection_lists.ground_truth(held["truth"])
        try:
            value, _ = mean_average_precision(detections, truth, len(ew.CLASSES), EWA_THRESHOLD)
        except ValueError as error:
            raise UserError(f"evaluation: {error}") from None
        if self.keeps_predictions:
            self.predictions = {**held, "num_classes": len(ew.CLASSES)}
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


WORKLOAD = ExtremeWeather
