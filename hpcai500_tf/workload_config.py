"""The `[data]` and `[model]` sections of each benchmark's run config, checked in pure Python
(no TensorFlow), so that every value of a run config is refused or accepted before TensorFlow
starts. The workloads build their data and models from these."""

from __future__ import annotations

from dataclasses import dataclass

from hpcai500_tf import validation
from hpcai500_tf.errors import UserError
from hpcai500_tf.models.kernel_choices import KERNEL_CHOICES

IMAGE_CLASSIFICATION_DATASETS = {
    "imagenet": "imagenet-1k",
    "procedural": "procedural-gratings",
    "random": "random (quality not measured)",
}

# The sources a bootstrap sample (an ensemble member's data) is drawn from, by benchmark:
# those whose training examples are read by index; and why the others are not.
BOOTSTRAP_SOURCES = {
    "image_classification": (
        ("procedural", "imagenet"),
        "random data is one example repeated and measures no quality",
    ),
    "extreme_weather": (("synthetic", "hdf5"), "random data measures no quality"),
}


def bootstrap_problem(benchmark_name: str, source: str) -> str | None:
    """Why `source` cannot give a bootstrap sample of `benchmark_name`'s training data, in
    one line; None where it can."""
    sources, why = BOOTSTRAP_SOURCES[benchmark_name]
    if source in sources:
        return None
    needed = " or ".join(f"'{name}'" for name in sources)
    return (
        f"bootstrap_member draws training examples by index: it needs source = {needed}, "
        f"not '{source}' ({why})"
    )


# Examples per year of extreme_weather's random data where synthetic_samples is 0.
RANDOM_EPOCH = 1024

EXTREME_WEATHER_DATASETS = {
    "hdf5": "extremeweather",
    "synthetic": "synthetic-extremeweather",
    "random": "random (quality not measured)",
}


@dataclass(frozen=True)
class ImageClassificationData:
    """`[data]` of image_classification: where images come from and how many."""

    source: str
    image_size: int
    num_classes: int
    label_offset: int
    train_examples: int
    eval_examples: int
    shuffle_buffer: int
    noise: float
    # Keep this worker's serialized records after the first pass (before decoding, so crops
    # still vary): in memory, or in tf.data cache files in `cache_dir` (a node-local directory).
    cache: bool = False
    cache_dir: str = ""
    # An ensemble member's index (`train --instances M --ensemble`): it trains on its bootstrap
    # sample of the training split (data/bootstrap.py); -1: on the whole split.
    bootstrap_member: int = -1

    def check(self) -> str | None:
        if self.source not in IMAGE_CLASSIFICATION_DATASETS:
            known = ", ".join(IMAGE_CLASSIFICATION_DATASETS)
            return f"source must be one of {known}, got '{self.source}'"
        if self.cache and self.source != "imagenet":
            return f"cache reads TFRecords once: it needs source = 'imagenet', not '{self.source}'"
        if self.cache_dir and not self.cache:
            return "cache_dir is where the cache goes: it needs cache = true"
        problem = validation.out_of_range(
            self,
            image_size=(16, 4096),
            num_classes=(2, 100_000),
            label_offset=(0, 100_000),
            train_examples=(0, validation.INT32_MAX),
            eval_examples=(0, validation.INT32_MAX),
            shuffle_buffer=(1, 10_000_000),
            noise=(0, 100),
            bootstrap_member=(-1, validation.INT32_MAX),
        )
        if problem:
            return problem
        if self.source != "imagenet" and (self.train_examples == 0 or self.eval_examples == 0):
            return "generated data needs train_examples and eval_examples > 0"
        if self.bootstrap_member >= 0:
            return bootstrap_problem("image_classification", self.source)
        return None

    def configured_examples(self) -> tuple[int | None, int | None]:
        """The (training, evaluation) examples the config alone fixes (generated data, or
        data.train_examples set over TFRecords); None where the shards' count is (every
        validation record is evaluated, whatever data.eval_examples says)."""
        evaluated = None if self.source == "imagenet" else self.eval_examples or None
        return self.train_examples or None, evaluated


# The model's forms that the reference and this project's earlier recipe differ in, each with
# what it means (docs/image_classification.md); the first of each is the reference's.
LOGITS_INITIALIZERS = {
    "variance_scaling": "truncated normal, variance 2 / fan-out (classes)",
    "normal_0.01": "normal, standard deviation 0.01",
}
STRIDE_PADDINGS = {
    "symmetric": "strided k x k convolutions pad (k - 1) // 2 before, the rest after",
    "same": "Keras 'same': on even inputs one pixel less before than after",
}
INPUT_NORMALISATIONS = {
    "mean_255": "(pixel - channel mean) / 255",
    "mean_std": "(pixel - channel mean) / channel standard deviation",
}


@dataclass(frozen=True)
class ImageClassificationModel:
    """`[model]` of image_classification: the ResNet-50 v1.5's size, initialisation, padding,
    input normalisation and kernels."""

    width: float
    blocks: list[int]
    zero_init_residual: bool
    bn_momentum: float
    bn_epsilon: float
    kernels: str  # auto | stock (models/kernels.py)
    # The defaults are the forms this project built before the keys existed: configs saved
    # then (run directories, records) load as what they ran. The presets name their own.
    logits_initializer: str = "normal_0.01"
    stride_padding: str = "same"
    input_normalisation: str = "mean_std"

    def check(self) -> str | None:
        if problem := _backbone_problem(self):
            return problem
        for name, choices in (
            ("logits_initializer", LOGITS_INITIALIZERS),
            ("stride_padding", STRIDE_PADDINGS),
            ("input_normalisation", INPUT_NORMALISATIONS),
        ):
            if problem := validation.choice_problem(name, getattr(self, name), choices):
                return problem
        return validation.out_of_range(self, blocks=(1, 100))


@dataclass(frozen=True)
class ExtremeWeatherData:
    """`[data]` of extreme_weather: which years, downsampling, synthetic sizes."""

    source: str  # hdf5 | synthetic | random (throughput only, no files)
    train_years: list[int]
    eval_years: list[int]
    downsample: int  # average f x f pixel blocks (boxes scaled with them)
    synthetic_samples: int  # per year file (synthetic and random)
    synthetic_height: int  # synthetic and random images, before downsampling
    synthetic_width: int
    # An ensemble member's index (`train --instances M --ensemble`): it trains on its bootstrap
    # sample of the training years' samples (data/bootstrap.py); -1: on all of them.
    bootstrap_member: int = -1

    def check(self) -> str | None:
        if self.source not in EXTREME_WEATHER_DATASETS:
            return (
                f"source must be one of {', '.join(EXTREME_WEATHER_DATASETS)}, got '{self.source}'"
            )
        if not self.train_years or not self.eval_years:
            return "train_years and eval_years must name at least one year each"
        if set(self.train_years) & set(self.eval_years):
            return "a year cannot be in both train_years and eval_years"
        problem = validation.out_of_range(
            self,
            train_years=(1, 9999),
            eval_years=(1, 9999),
            downsample=(1, 64),
            synthetic_samples=(0, 1_000_000),
            synthetic_height=(1, 16_384),
            synthetic_width=(1, 16_384),
            bootstrap_member=(-1, validation.INT32_MAX),
        )
        if problem:
            return problem
        if self.source != "hdf5" and min(self.synthetic_height, self.synthetic_width) < 32:
            return "synthetic and random images need height and width >= 32"
        if self.source == "synthetic" and self.synthetic_samples < 1:
            return "synthetic data need synthetic_samples >= 1"
        if self.bootstrap_member >= 0:
            return bootstrap_problem("extreme_weather", self.source)
        return None

    def random_examples(self, years: list[int]) -> int:
        """The examples random data (source = 'random') makes of `years`."""
        return (self.synthetic_samples or RANDOM_EPOCH) * len(years)

    def configured_examples(self) -> tuple[int | None, int | None]:
        """The (training, evaluation) examples the config alone fixes (random data); None
        where the years' files are counted."""
        if self.source != "random":
            return None, None
        return self.random_examples(self.train_years), self.random_examples(self.eval_years)


@dataclass(frozen=True)
class ExtremeWeatherModel:
    """`[model]` of extreme_weather: backbone, anchors, proposals, head, kernels."""

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
    kernels: str  # auto | stock (models/kernels.py)

    def check(self) -> str | None:
        if problem := _backbone_problem(self):
            return problem
        if self.feature_stage not in (3, 4):
            return f"feature_stage must be 3 or 4, got {self.feature_stage}"
        if not self.anchor_sizes or not self.anchor_ratios:
            return "anchor_sizes and anchor_ratios must not be empty"
        if min(self.anchor_sizes) <= 0 or min(self.anchor_ratios) <= 0:
            return "anchor sizes and ratios must be > 0"
        return validation.out_of_range(
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


def _backbone_problem(model) -> str | None:
    """What is wrong with the ResNet backbone settings both models share, or None."""
    if model.kernels not in KERNEL_CHOICES:
        return f"kernels must be one of {', '.join(KERNEL_CHOICES)}, got '{model.kernels}'"
    if not 0 < model.width <= 16:
        return f"width must be in (0, 16], got {model.width}"
    if len(model.blocks) != 4:
        return f"blocks must be four counts (one per stage), got {list(model.blocks)}"
    if not 0 < model.bn_momentum < 1 or not 0 < model.bn_epsilon <= 1:
        return "bn_momentum must be in (0, 1) and bn_epsilon in (0, 1]"
    return None


SECTIONS = {
    "image_classification": (ImageClassificationData, ImageClassificationModel),
    "extreme_weather": (ExtremeWeatherData, ExtremeWeatherModel),
}


def configured_examples(benchmark_name: str, run_config: dict) -> tuple[int | None, int | None]:
    """The (training, evaluation) examples a run config fixes before any data is read (None:
    counted from the data by the workload), so that what cannot be sharded is refused before
    any worker starts."""
    data, _ = data_and_model(benchmark_name, run_config)
    return data.configured_examples()


def data_and_model(benchmark_name: str, run_config: dict):
    """The checked `[data]` and `[model]` sections of a benchmark's run config."""
    if benchmark_name not in SECTIONS:
        raise UserError(f"benchmark '{benchmark_name}' has no training workload yet")
    data_class, model_class = SECTIONS[benchmark_name]
    return (
        validation.section(data_class, run_config.get("data"), "data"),
        validation.section(model_class, run_config.get("model"), "model"),
    )
