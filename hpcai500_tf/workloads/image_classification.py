"""Image classification: ResNet-50 v1.5, its data, its loss and top-1 accuracy.

The engine owns distribution, the loop and the record; this module supplies only what is
about images. Nothing here knows about strategies beyond the shard it is handed.

Every image source (ImageNet, procedural, random) yields uint8 pixels, the workload's
`input_dtype`: a quarter of float32's bytes through the input pipeline and onto the device.
`model_inputs` normalises them there, at the start of the train and evaluation steps, so the
model itself stays the plain ResNet-50.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter

import keras
import numpy as np
import tensorflow as tf

from hpcai500_tf import config
from hpcai500_tf.data import bootstrap, bootstrap_records, imagenet, listing, procedural
from hpcai500_tf.errors import UserError
from hpcai500_tf.models import resnet
from hpcai500_tf.models.kernels import resolve
from hpcai500_tf.workload_config import IMAGE_CLASSIFICATION_DATASETS as DATASET_NAMES
from hpcai500_tf.workload_config import data_and_model

SPLITS = {"train": "train_examples", "validation": "eval_examples"}  # as named in data.*


class ImageClassification:
    name = "image_classification"
    quality_metric = "top1_accuracy"
    objective = "softmax_cross_entropy"  # `loss`, label-smoothed by optimizer.label_smoothing
    input_dtype = tf.uint8  # what every data source yields; the engine checks it

    def __init__(self, preset: dict, data_dir: str | None):
        self.data, self.model_config = data_and_model(self.name, preset)
        self.xla = bool(preset.get("training", {}).get("xla", False))
        self.data_dir = data_dir
        # What procedural examples are drawn from: the run's seed, whatever orders them.
        self.content_seed = int(preset.get("training", {}).get("seed", 0))
        if self.data.source == "imagenet":
            if data_dir is None:
                raise UserError("this preset reads ImageNet TFRecords: pass --data DIR")
            imagenet.shard_files(data_dir, "train")
            imagenet.shard_files(data_dir, "validation")
        elif data_dir is not None:
            raise UserError(
                f"this preset generates its data ({self.data.source}); "
                "drop --data or use a preset with data.source = 'imagenet'"
            )
        self.data_name = DATASET_NAMES[self.data.source]
        self.facts: dict = {}  # L9 facts found in the data (none for generated data)
        # With data.cache, the datasets built, by (training, seed, shard): every evaluation
        # then iterates the same one, whose in-memory cache the first filled.
        self._cached: dict[tuple, tf.data.Dataset] = {}
        self.train_examples = self.data.train_examples
        self.eval_examples = self.data.eval_examples
        if self.data.source == "imagenet":
            self._verify_data()
        # An ensemble member: its bootstrap sample of the training split, and the evaluation
        # probabilities it keeps (run/predictions.py saves them); None for any other run.
        self.sample, self.predictions = self._bootstrap_sample(), None

    @functools.cached_property
    def kernels(self) -> str:
        """What the model is built with and L7 records: "auto" resolved on this machine, on
        first use (after the data checks: resolving may build the native kernels first)."""
        return resolve(self.model_config.kernels, self.xla)

    def _bootstrap_sample(self):
        """An ensemble member's draw (None for any other run); for TFRecords also each
        example's count (data/bootstrap_records.py)."""
        member, index = self.data.bootstrap_member, None
        if member >= 0 and self.data.source == "imagenet":
            counted = self.facts["train_examples"]
            if self.train_examples != counted:
                raise UserError(
                    f"data.train_examples = {self.train_examples:,}, but a bootstrap sample "
                    f"(data.bootstrap_member) draws from all {counted:,} records of the train "
                    f"shards: set it to 0 or {counted}"
                )
            index = bootstrap_records.INDEX_METHOD
        sample = bootstrap.member_sample(
            self.content_seed, member, self.train_examples, self.facts, index
        )
        if index:
            self._draw_counts = bootstrap_records.draw_counts(sample, self.train_examples)
        return sample

    def _verify_data(self) -> None:
        """Count and fingerprint both splits and sample their labels; compare them with the
        benchmark's reference data. A difference is recorded, never silent: L9 then names the
        data for what they are and lists each difference (the run is not rankable)."""
        d = self.data
        reference = config.resolve_preset(config.load_benchmark(self.name), "reference")["data"]
        splits = {split: imagenet.split_facts(self.data_dir, split) for split in SPLITS}
        self._first_indices = bootstrap_records.first_indices(splits["train"].shard_records)
        for split, facts in splits.items():
            if facts.records == 0:
                raise UserError(f"{self.data_dir}: the {split} shards hold no records")
        counted = {SPLITS[split]: facts.records for split, facts in splits.items()}
        self.train_examples = d.train_examples or counted["train_examples"]
        self.eval_examples = counted["eval_examples"]  # every record: no cap is applied
        differences = []
        for split, key in SPLITS.items():
            records = counted[key]
            if records != reference[key]:
                differences.append(
                    f"the {split} split holds {records:,} records, ImageNet-1k's {reference[key]:,}"
                )
            configured = getattr(d, key)
            if configured and configured != records and key == "eval_examples":
                differences.append(
                    f"data.eval_examples = {configured:,} is not applied: all {records:,} "
                    "records of the validation split are evaluated"
                )
            elif configured and configured != records:
                differences.append(
                    f"data.{key} = {configured:,} is used instead of the {records:,} records"
                )
        if (d.num_classes, d.label_offset) != (reference["num_classes"], reference["label_offset"]):
            differences.append(
                f"data.num_classes {d.num_classes} with label_offset {d.label_offset}, the "
                f"reference's {reference['num_classes']} with {reference['label_offset']}"
            )
        labels = Counter()
        for facts in splits.values():
            labels.update(facts.sampled_labels)
        low, high = d.label_offset, d.label_offset + d.num_classes - 1
        outside = sum(n for label, n in labels.items() if not low <= label <= high)
        if outside:
            differences.append(
                f"{outside} of {labels.total()} sampled labels lie outside {low}-{high} "
                "(data.label_offset to + data.num_classes - 1)"
            )
        if counted != {key: reference[key] for key in counted}:
            self.data_name = (
                f"imagenet-format TFRecords ({counted['train_examples']:,} train, "
                f"{counted['eval_examples']:,} validation records)"
            )
        self.facts = {
            **counted,
            "record_count_method": imagenet.COUNT_METHOD,
            "data_fingerprint": {
                **{split: facts.fingerprint for split, facts in splits.items()},
                "method": listing.FINGERPRINT_METHOD,
            },
            "label_check": {
                "method": imagenet.LABEL_SAMPLE_METHOD,
                "records": labels.total(),
                "min": min(labels, default=None),
                "max": max(labels, default=None),
                "allowed_min": low,
                "allowed_max": high,
                "outside": outside,
            },
            "data_differences": differences,
        }

    @property
    def keeps_predictions(self) -> bool:
        """An ensemble member's: its evaluation keeps its probabilities, in evaluation order
        (the engine reads the split in order for it)."""
        return self.sample is not None

    @property
    def measures_quality(self) -> bool:
        return self.data.source != "random"

    def build_model(self) -> keras.Model:
        model = dataclasses.asdict(self.model_config)  # the model's arguments, by name...
        model.pop("input_normalisation")  # ...but this one, which `model_inputs` applies
        return resnet.resnet50_v15(
            image_size=self.data.image_size,
            num_classes=self.data.num_classes,
            **{**model, "blocks": tuple(model["blocks"]), "kernels": self.kernels},
        )

    def input_shape(self) -> tuple[int, int, int]:
        return (self.data.image_size, self.data.image_size, 3)

    def dataset(self, training: bool, seed: int, shard: tuple[int, int]) -> tf.data.Dataset:
        """Unbatched (uint8 image, label) examples of one worker's shard. Parallel stages keep
        their order as the caller's `tf.data.Options().deterministic` says."""
        d = self.data
        if d.source == "random":
            return procedural.random_dataset(d.image_size, d.num_classes, seed)
        if d.source == "procedural":  # the examples are the run's; `seed` orders them
            examples = d.train_examples if training else d.eval_examples
            return procedural.procedural_dataset(
                examples, self.content_seed, d.image_size, d.num_classes, d.noise, training,
                shard, shuffle_seed=seed, sample=self.sample, train_examples=d.train_examples,
            )  # fmt: skip
        # With data.cache, every stream of a split (each epoch's, each evaluation) reads the
        # one cached dataset of its records, which the first pass filled; every evaluation
        # iterates the same dataset.
        key = (training, seed if not training else None, tuple(shard))
        if key in self._cached:
            return self._cached[key]
        sampled = training and self.sample is not None  # each record as often as drawn
        records = self._cached.get((training, tuple(shard)))
        if records is None:
            records = imagenet.imagenet_records(
                self.data_dir, training, seed, shard, d.cache, d.cache_dir,
                first_indices=self._first_indices if sampled else None,
            )  # fmt: skip
        drawn = bootstrap_records.expanded(records, self._draw_counts) if sampled else records
        dataset = imagenet.decoded(
            drawn, training, d.image_size, d.label_offset, seed, d.shuffle_buffer
        )
        if d.cache:
            self._cached[(training, tuple(shard))] = records
            if not training:
                self._cached[key] = dataset
        return dataset

    def data_warnings(self, workers: int) -> list[str]:
        """What the record should say about reading this data with `workers` workers."""
        if self.data.source != "imagenet":
            return []
        warnings = (imagenet.sharding_warning(self.data_dir, split, workers) for split in SPLITS)
        return [warning for warning in warnings if warning]

    def loss(self, labels, logits, label_smoothing: float):
        """Per-example cross entropy with label smoothing."""
        one_hot = tf.one_hot(labels, self.data.num_classes)
        return keras.losses.categorical_crossentropy(
            one_hot, logits, from_logits=True, label_smoothing=label_smoothing
        )

    def model_inputs(self, images):
        """The model's input from a batch of uint8 pixels: float32, normalised as
        `model.input_normalisation` says. Called inside the step, so it runs on the device."""
        return imagenet.normalise(images, self.model_config.input_normalisation)

    def per_example_loss(self, model, images, labels, label_smoothing: float):
        logits = model(self.model_inputs(images), training=True)
        return self.loss(labels, logits, label_smoothing)

    def empty_label(self):
        """One example's label for tracing and warm-up."""
        return tf.zeros([], tf.int32)

    def eval_outputs(self, model, images, labels) -> dict:
        """Per example: 1 where the top prediction is the label; an ensemble member's also
        its class probabilities (softmax, float32) and label."""
        logits = model(self.model_inputs(images), training=False)
        predicted = tf.argmax(logits, axis=-1, output_type=tf.int32)
        outputs = {"correct": tf.cast(tf.equal(predicted, labels), tf.float32)}
        if self.keeps_predictions:
            outputs["probabilities"] = tf.nn.softmax(tf.cast(logits, tf.float32), axis=-1)
            outputs["labels"] = labels
        return outputs

    def quality(self, batches: list[dict]) -> float:
        """Top-1 accuracy over every evaluated example (an ensemble member keeps its
        probabilities and labels, in evaluation order, as `predictions`)."""
        correct = np.concatenate([batch["correct"] for batch in batches])
        if correct.size == 0:
            raise UserError("the evaluation split produced no examples")
        if self.keeps_predictions:
            self.predictions = {
                key: np.concatenate([batch[key] for batch in batches])
                for key in ("probabilities", "labels")
            }
        return float(correct.mean())

    def workload_layer(self) -> dict:
        m = self.model_config
        return {
            "model": "resnet50_v1.5",
            "width": m.width,
            "blocks": m.blocks,
            "image_size": self.data.image_size,
            "num_classes": self.data.num_classes,
            # the forms the reference and this project's earlier recipe differ in
            "zero_init_residual": m.zero_init_residual,
            "logits_initializer": m.logits_initializer,
            "stride_padding": m.stride_padding,
            "input_normalisation": m.input_normalisation,
        }

    def dataset_name(self) -> str:
        """L9's dataset: "imagenet-1k" only for shards with ImageNet-1k's split sizes."""
        return self.data_name

    def problem_layer(self) -> dict:
        """L9 facts verified from the data (record counts, fingerprints, the label check and
        every difference from the benchmark's reference data); empty for generated data."""
        return dict(self.facts)

    def analytical_forward_flops(self, model: keras.Model) -> float:
        return resnet.analytical_forward_flops(model)


WORKLOAD = ImageClassification
